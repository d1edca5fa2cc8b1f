// Internal to the temporal attention (lm_attention.cu and lm_attention_fp8.cu): what the split-K
// kernels and the fp8 cache's tensor-core kernel share (the chunking of the ring, a block's
// partial output for attention_combine_kernel), and the tensor-core kernel's plan and launch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "lm_attention.cuh"

namespace ppx::kern::attn_impl {

constexpr int kSplit = 64;  // ring slots per block in the split-K attention (16 per warp)
constexpr int kAttnWarps = 4;

// The ring entries that can hold a key after the write of position qpos: idx < E until the ring
// has wrapped, all C after. Chunks of kSplit entries past them are empty.
__device__ __forceinline__ int live_chunks(int qpos, int C) { return (min(qpos + 1, C) + kSplit - 1) / kSplit; }

__device__ __forceinline__ int row_position(const RingArgs& r, int b) {
  return r.row_pos ? r.row_pos[b] : r.pos[r.slot[b]];
}

// Warp 0 of a split-K block, after every warp put its (m, l, acc[n]) into sm, sl, sacc (m = -inf
// when it saw no visible key; the caller's barrier published them): merges them and writes part
// `part` of row b, head h as (m, l, acc[n]) for attention_combine_kernel.
template <int N>
__device__ __forceinline__ void write_block_part(const float* sm, const float* sl, const float (*sacc)[N], float* work,
                                                 int64_t row_head, int parts, int part, int lane) {
  float M = -INFINITY;
#pragma unroll
  for (int w = 0; w < kAttnWarps; ++w) M = fmaxf(M, sm[w]);
  float L = 0.f, f[kAttnWarps];
#pragma unroll
  for (int w = 0; w < kAttnWarps; ++w) {
    f[w] = sm[w] == -INFINITY ? 0.f : expf(sm[w] - M);
    L += sl[w] * f[w];
  }
  float* wp = work + (row_head * parts + part) * (2 + N);
  if (lane == 0) {
    wp[0] = M;
    wp[1] = L;
  }
  for (int d = lane; d < N; d += 32) {
    float o = 0.f;
#pragma unroll
    for (int w = 0; w < kAttnWarps; ++w) o += sacc[w][d] * f[w];
    wp[2 + d] = o;
  }
}

}  // namespace ppx::kern::attn_impl

// The fp8 cache's attention on tensor cores (head size 128; lm_attention_fp8.cu). `policy` is
// attention_set_policy()'s (lm_attention.cuh says what each means).
namespace ppx::kern::attn_fp8 {

// Whether ring_attention takes this kernel for r (an fp8 cache of head size 128, policy != 2).
bool applies(const RingArgs& r, int policy);
// The kernel a launch at batch B takes: its stages, lean or v0.18's, and its parts (blocks per
// head and row). Readies the kernel it picks on the current device; throws where it does not fit.
struct Plan {
  int stages;
  bool lean;
  int parts;
};
Plan plan(int B, int H, int C, int policy, int forced_parts = 0);
// Writes the plan's parts into `work` (grid (H, parts, B)), for attention_combine_kernel.
void launch(const __nv_bfloat16* q, const RingArgs& r, int B, const Plan& p, float* work, cudaStream_t s);
// Readies the shipped kernels (3 and 4 stages) on the current device, outside stream capture.
void init();
// Readies what `policy` adds (4: v0.18's kernel).
void ready_policy(int policy);

}  // namespace ppx::kern::attn_fp8
