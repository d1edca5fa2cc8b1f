// Small LM kernels: the input embedding sum, token sampling, per-step counters, weight filling.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace ppx::kern {

// x[b] = sum over audio streams k of tables[1 + k][tok[b][1 + k]], added left to right in bf16,
// then + tables[0][tok[b][0]] (text), as upstream; token -1 adds nothing, other negatives clamp to
// row 0. When use_ext[b] != 0, x[b] = ext[b] instead (a replayed voice-prompt embedding, fp32).
// tables: device array of `streams` pointers, table k has rows[k] rows of D.
void embed_sum(const __nv_bfloat16* const* tables, const int32_t* rows, int streams, const int32_t* tok,
               const int32_t* use_ext, const float* ext, int D, int B, __nv_bfloat16* x, cudaStream_t s);

struct SampleArgs {
  const float* logits = nullptr;  // [B, logits_stride] fp32 (bf16-valued)
  int64_t logits_stride = 0;
  int n = 0;                      // vocabulary
  // The session parameters temp, top_k, seed and counter are indexed by batch row b, or, when
  // `slot` is set, by slot[b] (the batched stepper keeps them per session slot).
  const int32_t* slot = nullptr;  // [B] or nullptr
  const float* temp = nullptr;    // [B] temperature; <= 0 means greedy
  const int32_t* top_k = nullptr; // [B] 0 = all
  const uint64_t* seed = nullptr; // [B]
  const uint64_t* counter = nullptr;  // [B] frame counter of the session (advanced per step)
  int stream_id = 0;              // distinguishes the draws of one step (0 text, 1 + s audio)
  const int32_t* force = nullptr;     // [B] or nullptr: >= 0 replaces the sampled token
  const int32_t* target = nullptr;    // [B] provided token of this stream
  const uint8_t* provided = nullptr;  // [B]
  int32_t* sampled = nullptr;     // [B] out: the sampled (or forced) token
  int32_t* next = nullptr;        // [B] out: provided ? target : sampled (the next depformer input)
};

// Greedy: argmax, lowest index on ties. Otherwise softmax(logits / temp) restricted to the top_k
// largest logits (all logits equal to the k-th largest are kept), drawn with the Gumbel-max trick
// from a counter-based hash of (seed, counter, stream_id, index): exactly categorical.
void sample_tokens(const SampleArgs& a, int B, cudaStream_t s);

// pos[slot[b]] += 1 and counter[slot[b]] += 1 for each batch row.
void advance(int32_t* pos, uint64_t* counter, const int32_t* slot, int B, cudaStream_t s);

// Up to kMaxCopySpans independent device-to-device copies in one launch, one block per span
// (inside a graph this is one node instead of one memcpy node per buffer).
constexpr int kMaxCopySpans = 8;
struct CopySpans {
  struct Span {
    const void* src = nullptr;
    void* dst = nullptr;
    size_t bytes = 0;
  };
  int n = 0;
  Span span[kMaxCopySpans];
  void add(const void* src, void* dst, size_t bytes);  // throws past kMaxCopySpans
};
void copy_spans(const CopySpans& c, cudaStream_t s);

// Deterministic pseudo-random bf16 fill: w[i] = offset + scale * u(seed, i), u uniform in [-1, 1).
void fill_random_bf16(__nv_bfloat16* w, int64_t n, uint64_t seed, float scale, float offset, cudaStream_t s);

// Elementwise fp32 -> bf16 (round to nearest even).
void f32_to_bf16(const float* src, __nv_bfloat16* dst, int64_t n, cudaStream_t s);

}  // namespace ppx::kern
