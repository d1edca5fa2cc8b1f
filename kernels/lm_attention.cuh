// Attention of the LM at decode time (one new token per session and step), bf16 KV cache in a
// ring with upstream's exact visibility rule (see src/backend/cpu_attention.h):
//   after the write, E = pos + 1 tokens exist; slot idx carries
//   delta = idx - E % C, label = delta <= 0 ? E + delta : E + delta - C (none if idx >= E),
//   and the query at position pos sees it iff label >= 0, pos - label >= 0 and, when
//   context > 0, pos - label < context.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace ppx::kern {

struct RingArgs {
  __nv_bfloat16* k = nullptr;  // [slots, C, H * hd] (bf16 cache)
  __nv_bfloat16* v = nullptr;  // [slots, C, H * hd]
  const int32_t* pos = nullptr;   // [slots] position of this step's token (tokens before it)
  const int32_t* slot = nullptr;  // [B] cache slot of each batch row
  int C = 0, H = 0, hd = 0, context = 0;  // context 0 = unlimited
  // fp8 cache (--kv-fp8; the temporal transformer only): when k8 is set, keys and values live in
  // k8 / v8 [slots, C, H * hd] (or [slots, H, C, hd] with fp8_by_head) as e4m3 with one scale per
  // (slot, position, head) in k_scale / v_scale [slots, H, fp8_scale_pitch(C)], and k / v are
  // unused. A scale is a power of two held as its biased exponent in one byte (fp8_scale_value: the
  // smallest 2^e that brings the head's largest magnitude to at most 448, so the codes are the
  // values times an exact power of two; byte 127 for zeros). A head's scales are contiguous over
  // the positions, so a warp's 16 keys take 16 bytes of each. Needs hd / 2 to divide 256 (hd 32,
  // 64 or 128).
  __nv_fp8_e4m3* k8 = nullptr;
  __nv_fp8_e4m3* v8 = nullptr;
  uint8_t* k_scale = nullptr;
  uint8_t* v_scale = nullptr;
  // The fp8 cache laid out [slots, H, C, hd], a head's keys contiguous over the positions (a 16-key
  // chunk is 2 KiB in one piece), instead of [slots, C, H * hd]: CudaLm's layout as shipped since
  // v0.34 (attention_fp8_by_head). rope_append writes it and every attention kernel reads it.
  bool fp8_by_head = false;
  // [B] or nullptr: each row's own position (prompt prefill: rows of one slot at consecutive
  // positions); nullptr: pos[slot[b]].
  const int32_t* row_pos = nullptr;

  // This ring over an fp8 cache: k and v cleared, the codes, scales and layout set.
  RingArgs over_fp8(__nv_fp8_e4m3* k8_codes, __nv_fp8_e4m3* v8_codes, uint8_t* k_scales, uint8_t* v_scales,
                    bool by_head) const {
    RingArgs r = *this;
    r.k = r.v = nullptr;
    r.k8 = k8_codes;
    r.v8 = v8_codes;
    r.k_scale = k_scales;
    r.v_scale = v_scales;
    r.fp8_by_head = by_head;
    return r;
  }
};

// The fp8 cache's scales per (slot, head): the ring's C positions padded to 16, so that every
// 16-key chunk's 16 scale bytes are one aligned 16-byte piece.
inline constexpr int fp8_scale_pitch(int C) { return (C + 15) / 16 * 16; }
// A stored scale byte's value: 2^(byte - 127). rope_append writes bytes 1..254 only.
__host__ __device__ inline float fp8_scale_value(uint8_t e) {
#ifdef __CUDA_ARCH__
  return __int_as_float(static_cast<int>(e) << 23);
#else
  const uint32_t bits = static_cast<uint32_t>(e) << 23;
  float f;
  __builtin_memcpy(&f, &bits, sizeof f);
  return f;
#endif
}

// Temporal transformer: applies RoPE (fp32, interleaved pairs) to q and k of qkv [B, 3*H*hd],
// writes the rotated q to q_out [B, H*hd] and appends rotated k and v at ring slot pos % C (in
// fp8 with their per-head scales when r.k8 is set).
void rope_append(const __nv_bfloat16* qkv, __nv_bfloat16* q_out, const RingArgs& r, int B, float max_period,
                 cudaStream_t s);

// Split-K attention over the ring: out [B, H*hd] bf16. `work` is scratch of
// attention_work_floats(B, H, hd, C) floats. With r.row_pos, row b attends as the query of position
// row_pos[b] (the keys of earlier rows of this step appended by rope_append before).
size_t attention_work_floats(int B, int H, int hd, int C);
// Blocks per (head, row) of ring_attention at batch B. Policies (benchmarks only): 1 keeps a block
// per chunk of the ring at every batch (the grid before v0.15); 2 runs the fp8 cache through the
// scalar kernel (before v0.18) instead of the tensor-core one; 3 and 5 run the tensor-core kernel with
// 3 and 4 stages (shipped: 4 from 64 rows, else 3; up to 4 rows always 3); 4 runs
// v0.18's tensor-core kernel (before the lean one of v0.27). fp8: the fp8 cache's tensor-core kernel (hd 128), whose parts follow its resident blocks;
// it is readied on the current device first (throws where it does not fit).
int attention_parts(int B, int H, int C, bool fp8 = false);
// Readies the fp8 tensor-core kernel on the current device (its shared memory size; the resident
// blocks that attention_parts plans with). Call it before the first attention is captured into a
// CUDA graph (CudaLm does); ring_attention readies the device itself otherwise, and refuses (throws)
// when the kernel does not fit it.
void attention_init();
void attention_set_policy(int policy);
// A measurement hook (personaplex-bench --attention-parts, the kernel bench's sweep): the fp8
// tensor-core kernel's launches from 5 rows take this many parts (clamped to the context's 64-key
// splits) instead of the plan's; 0, the default, keeps the plan's.
void attention_set_parts(int parts);
// CudaLm lays its fp8 caches out by head (RingArgs::fp8_by_head) when this is true when it is built:
// the default, as shipped since docs/PERF.md v0.34 (the 64-row full-context step 0.2 ms shorter on
// an H100); false, a measurement hook (personaplex-bench --kv-fp8-by-position), keeps v0.33's
// layout by position.
void attention_set_fp8_by_head(bool on);
bool attention_fp8_by_head();
void ring_attention(const __nv_bfloat16* q, const RingArgs& r, int B, float* work, __nv_bfloat16* out,
                    cudaStream_t s);

// Depformer step `step` (no RoPE; the ring is per frame with capacity C = dep_q and no context
// limit): appends k, v of qkv [B, 3*H*hd] at slot `step` and attends over steps 0..step.
// `r.pos` is unused.
void depformer_attention(const __nv_bfloat16* qkv, const RingArgs& r, int B, int step, __nv_bfloat16* out,
                         cudaStream_t s);

}  // namespace ppx::kern
