// Host launcher of the Mimi transformer's streaming self-attention: RoPE on the new queries and keys,
// append of the new keys/values to a per-slot ring KV cache, and softmax attention over the ring with
// upstream's exact visibility rule (see src/backend/cpu_attention.h, including the quirk that hides
// the oldest slot once the ring has wrapped). fp32 throughout.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "mimi_types.cuh"

namespace ppx::kern::mimi {

struct AttentionParams {
  const float* qkv = nullptr;  // per slot [tokens][3 * dim]: q | k | v (un-rotated), at + slot * qkv_stride
  long long qkv_stride = 0;
  float* out = nullptr;        // per slot [tokens][dim]
  long long out_stride = 0;
  float* k_cache = nullptr;    // per slot [capacity][dim] rotated keys
  float* v_cache = nullptr;    // per slot [capacity][dim] values
  long long cache_stride = 0;
  const float* omega = nullptr;  // [head_dim / 2] RoPE angular frequencies (fp32, as the CPU computes them)
  int dim = 0, heads = 0;        // head_dim = dim / heads
  int capacity = 0;              // ring slots
  int context = 0;               // max query-key distance (+1); <= 0: unlimited
  int tokens = 0;                // new tokens per call; positions offset + t, offset = frame * tokens
  float scale = 0.f;             // softmax scale (1 / sqrt(head_dim))
  SlotInt frame;                 // calls since reset (read only)
};

// head_dim 32, 64 or 128; 1 or 2 tokens.
bool attention_supported(const AttentionParams& p);
size_t attention_smem_bytes(const AttentionParams& p);
// Block per (head, row): grid (heads, B), 256 threads.
void attention(const AttentionParams& p, const Batch& batch, cudaStream_t s);

}  // namespace ppx::kern::mimi
