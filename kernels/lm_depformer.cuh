// One depformer step of the LM as a single persistent (cooperative) kernel launch, for B batch
// rows: every layer (RMSNorm + QKV, attention over the steps so far with the K/V append, output
// projection + residual, RMSNorm + gate/up with the SiLU gate, down projection + residual) and the
// head's fp32 logits. The step's input projection does not depend on the sampled tokens, so it is
// computed for all steps before the first (depformer_in: one batched GEMV, `pre` below); the step
// adds the token embedding to it. The rounding points are those of the per-op kernels in
// lm_gemv.cuh (RMSNorm in fp32 with eps, projection outputs rounded to bf16 before the residual
// add, silu(g) * u rounded once, logits = float(bf16(acc))); only the fp32 accumulation order of a
// row differs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace ppx::kern {

constexpr int kDepMaxLayers = 8;
constexpr int kDepMaxBatch = 4;
constexpr int kDepMaxRing = 32;  // one key per lane in the attention

// Grid-wide phases of one step: 4 per layer (QKV, attention + output projection, gate/up, down),
// then the head.
__host__ __device__ constexpr int dep_phase_count(int layers) { return 4 * layers + 1; }

// The weights of one layer at one depformer step (all row-major, bf16).
struct DepLayerWeights {
  const __nv_bfloat16* norm1 = nullptr;    // [DD]
  const __nv_bfloat16* qkv = nullptr;      // [3 DD, DD]
  const __nv_bfloat16* out = nullptr;      // [DD, DD]
  const __nv_bfloat16* norm2 = nullptr;    // [DD]
  const __nv_bfloat16* gate_up = nullptr;  // [2 DH, DD]: gate rows, then up rows
  const __nv_bfloat16* down = nullptr;     // [DD, DH]
};

struct DepStepArgs {
  int B = 1;  // batch rows, 1..kDepMaxBatch
  int DD = 0, DH = 0;  // depformer width, depformer FFN hidden width
  int heads = 1, layers = 0, card = 0;
  int ring = 0;  // ring capacity (dep_q); step < ring
  int step = 0;
  float eps = 1e-8f;
  // This step's input projection of the temporal output, bf16(W_in[step] out_norm(x)): [B, pre_stride].
  const __nv_bfloat16* pre = nullptr;
  int64_t pre_stride = 0;
  const __nv_bfloat16* emb = nullptr;       // [emb_rows, DD] this step's token embedding
  int emb_rows = 0;
  const int32_t* token = nullptr;           // [B] previous token; -1 adds nothing
  DepLayerWeights layer[kDepMaxLayers];
  const __nv_bfloat16* w_head = nullptr;    // [card, DD]
  // Per-session K/V ring: [layers, slots, ring, DD]; batch row b uses slot[b].
  __nv_bfloat16* k_ring = nullptr;
  __nv_bfloat16* v_ring = nullptr;
  int64_t ring_layer_stride = 0;  // elements between layers (>= slots * ring * DD)
  const int32_t* slot = nullptr;  // [B]
  // Scratch, device: z [B, DD] (the residual stream), qkv [B, 3 DD], gu [B, DH].
  __nv_bfloat16 *z = nullptr, *qkv = nullptr, *gu = nullptr;
  float* logits = nullptr;  // [B, logits_stride]
  int64_t logits_stride = 0;
  // One arrival counter per stream of launches (a session), zeroed once before the first launch;
  // the barrier leaves it ready for the next launch.
  unsigned* barrier = nullptr;
  // Measurement only (nullptr in production): the first and the last block write clock64() at
  // the start of each phase, after its input staging, once its weights are in shared memory,
  // after its GEMV and at its end: [2][5 * dep_phase_count].
  long long* trace = nullptr;
  // Weight copies with an L2 evict-first policy (measured against none: docs/PERF.md, v8).
  bool evict_first = true;
  // The attention reads the earlier steps' keys and values from shared memory, copied in with the
  // output projection's weights (where the plan found room: DepPlan::kv_fits), instead of from L2.
  bool kv_in_ring = true;
  // Shared-memory layout, set by depformer_step from the plan.
  int kmax = 0, part_floats = 0, own_rows = 0;
  unsigned wcap = 0;  // bytes of the weight ring
};

struct DepPlan {
  int blocks = 0;  // 0: the persistent kernel cannot run here (see why)
  int threads = 0;
  size_t smem = 0;  // dynamic shared memory per block
  int kmax = 0, part_floats = 0, own_rows = 0;
  unsigned wcap = 0;
  bool kv_fits = false;  // the attention phase's slice with the keys and values fits the ring
  std::string why;
};

// Checks the device (compute capability 9.0+ for the bulk copies, cooperative launch, occupancy)
// and the shapes of `a` (B, DD, DH, heads, layers, card, ring), sets the kernel's shared-memory
// attribute and returns the launch shape: one block per multiprocessor, at most max_blocks when
// > 0. Call before graph capture.
DepPlan depformer_plan(const DepStepArgs& a, int max_blocks = 0);

// Enqueues step a.step (one cooperative launch, capturable into a CUDA graph) with a plan made
// for the same shapes. Throws std::runtime_error when the launch fails.
void depformer_step(const DepStepArgs& a, const DepPlan& plan, cudaStream_t s);

}  // namespace ppx::kern
