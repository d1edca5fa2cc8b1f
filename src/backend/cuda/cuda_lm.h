// The PersonaPlex LM on CUDA in bf16 (weights, activations, KV cache; fp32 accumulation, norms,
// RoPE and softmax), one CUDA graph per frame step: embedding, 32 temporal layers, text head and
// sampling, and every depformer step with its sampling, so the 16 sequential depformer steps never
// wait for the host. Only the step's tokens cross to the host.
//
// Numerics follow upstream's bf16 run: RMSNorm in fp32 with eps 1e-8, RoPE in fp32, projection
// outputs rounded to bf16 before the residual add, silu(g) * u rounded once, logits from bf16.
//
// The depformer steps run as per-op kernels (about 33 launches per step), or with
// PPX_DEP_PERSISTENT=1 as one persistent cooperative kernel per step on sm_90+
// (kernels/lm_depformer.cuh), an experiment that measured ~10% slower (docs/PERF.md, v0.4).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/cuda_util.h"
#include "lm_depformer.cuh"
#include "ppx/config.h"
#include "ppx/lm_gen.h"

namespace ppx {
class WeightSource;
}

namespace ppx::cuda {

class CudaLm {
 public:
  // From a checkpoint (any float dtype per tensor, upstream keys, 8-step layout expanded).
  CudaLm(const LmConfig& c, WeightSource& w);
  // Full-size random weights generated on the device (benchmarks: no checkpoint needed).
  CudaLm(const LmConfig& c, uint64_t seed);
  ~CudaLm();
  const LmConfig& config() const { return c_; }
  size_t weight_bytes() const { return weight_bytes_; }

  struct Temporal {
    const __nv_bfloat16 *in_proj, *out_proj, *norm1, *norm2, *lin_in, *lin_out;
  };
  struct Depformer {
    const __nv_bfloat16 *norm1, *norm2, *in_proj, *out_proj;  // in/out_proj hold all steps
    std::vector<const __nv_bfloat16*> lin_in, lin_out;         // per step
  };
  std::vector<const __nv_bfloat16*> emb;  // [n_q] audio tables [card+1, dim]
  const __nv_bfloat16* text_emb = nullptr;
  std::vector<Temporal> layers;
  const __nv_bfloat16* out_norm = nullptr;
  const __nv_bfloat16* text_linear = nullptr;
  std::vector<const __nv_bfloat16*> depformer_in, depformer_emb, linears;
  const __nv_bfloat16* depformer_in_all = nullptr;  // [dep_q * depformer_dim, dim]: depformer_in[0..]
  const __nv_bfloat16* depformer_text_emb = nullptr;
  std::vector<Depformer> dep_layers;
  DeviceBuffer<const __nv_bfloat16*> emb_tables;  // [n_q + 1]: text, then audio
  DeviceBuffer<int32_t> emb_rows;                 // [n_q + 1]

 private:
  void allocate();
  void finish_tables();
  LmConfig c_;
  DeviceBuffer<__nv_bfloat16> arena_;
  size_t weight_bytes_ = 0;
};

// The depformer's device buffers for B batch rows (layouts as in kern::DepStepArgs).
struct DepformerIo {
  int B = 1;
  const __nv_bfloat16* x = nullptr;  // [B, dim] temporal output
  const int32_t* token = nullptr;    // [B] the previous stream's token (-1: none)
  __nv_bfloat16* k_ring = nullptr;   // [depformer layers, slots, dep_q, depformer_dim]
  __nv_bfloat16* v_ring = nullptr;
  int64_t ring_layer_stride = 0;
  const int32_t* slot = nullptr;     // [B]
  __nv_bfloat16 *z = nullptr, *qkv = nullptr, *att = nullptr, *gu = nullptr;  // scratch
  __nv_bfloat16* pre = nullptr;      // [B, pre_stride]: every step's input projection (persistent kernel)
  int64_t pre_stride = 0;            // >= dep_q * depformer_dim
  float* logits = nullptr;           // [B, logits_stride]; step s writes columns [s card, (s + 1) card)
  int64_t logits_stride = 0;
  unsigned* barrier = nullptr;       // persistent kernel only
};

// The persistent kernel's path: enqueue_depformer_inputs computes io.pre for steps [0, steps)
// (bf16(depformer_in[s] out_norm(x)), one GEMV: it does not depend on the sampled tokens), then
// each step is one kern::depformer_step with these arguments.
void enqueue_depformer_inputs(const CudaLm& lm, const DepformerIo& io, int steps, cudaStream_t s);
kern::DepStepArgs depformer_step_args(const CudaLm& lm, const DepformerIo& io, int step);
// The same step as per-op kernels; fused_attention computes the attention inside the output
// projection's input staging (B == 1 only).
void enqueue_depformer_kernels(const CudaLm& lm, const DepformerIo& io, int step, bool fused_attention,
                               cudaStream_t s);

// kAuto: the per-op kernels, or the persistent kernel with PPX_DEP_PERSISTENT=1 where the device
// can run it (the fallback is logged).
enum class DepformerPath { kAuto, kKernels, kPersistent };

struct SamplingParams {
  float temp_text = 0.7f, temp_audio = 0.8f;  // <= 0: greedy
  int top_k_text = 25, top_k_audio = 250;
  uint64_t seed = 42424242;
  static SamplingParams from(const LmGenConfig& g, uint64_t seed);
};

// One session's state (KV cache, buffers) and the captured step graph.
class CudaLmStepper : public LmStepper {
 public:
  // dep_steps < 0: all dep_q depformer steps (upstream). kPersistent throws where unsupported.
  CudaLmStepper(const CudaLm& lm, const SamplingParams& sp, int dep_steps = -1,
                DepformerPath path = DepformerPath::kAuto);
  ~CudaLmStepper() override;
  const LmConfig& config() const override { return lm_.config(); }
  void reset() override;
  void run(const StepRequest& req, StepResult& out, StepLogits* logits) override;
  // Device time of the last run (ms), measured with events around the graph launch.
  float last_step_ms() const { return last_ms_; }
  bool persistent_depformer() const { return dep_persistent_; }

 private:
  void enqueue_step(cudaStream_t s);  // the graph body
  void capture_graph();
  DepformerIo depformer_io() const;
  const CudaLm& lm_;
  SamplingParams sp_;
  int dep_steps_;
  bool separate_dep_attention_ = true;  // false with PPX_DEP_ATTN_FUSED=1 (slower; for comparison)
  bool dep_persistent_ = false;
  bool dep_kv_in_ring_ = true;  // PPX_DEP_KV=0: the persistent kernel reads keys/values from L2
  kern::DepPlan dep_plan_;
  cudaStream_t stream_ = nullptr;
  cudaGraphExec_t graph_ = nullptr;
  cudaEvent_t ev0_ = nullptr, ev1_ = nullptr;
  float last_ms_ = 0;
  // Per-session device state, batch B = 1 in slot 0.
  DeviceBuffer<__nv_bfloat16> k_cache_, v_cache_, dk_cache_, dv_cache_;
  DeviceBuffer<__nv_bfloat16> x_, qkv_, q_, att_, gu_, z_, dqkv_, datt_, dgu_, dpre_;
  DeviceBuffer<float> work_, logits_, ext_;
  // req_ = tokens [K] | force [1 + S] | target [K] | use_ext [1]  (the uploaded request)
  DeviceBuffer<int32_t> req_, pos_, slot_, sampled_, next_, top_k_;
  DeviceBuffer<uint8_t> provided_;
  DeviceBuffer<float> temp_;
  DeviceBuffer<uint64_t> seed_, counter_;
  DeviceBuffer<unsigned> dep_barrier_;
  // Host staging (pinned), same layouts: request in, results out.
  PinnedBuffer<int32_t> h_req_;
  PinnedBuffer<uint8_t> h_prov_;
  PinnedBuffer<int32_t> h_out_;  // sampled [1 + S]
  PinnedBuffer<float> h_ext_;
};

}  // namespace ppx::cuda
