// The PersonaPlex LM on CUDA in bf16 (weights, activations, KV cache; fp32 accumulation, norms,
// RoPE and softmax), captured as CUDA graphs (one, or three with deferred steps, below):
// embedding, 32 temporal layers, text head and sampling, and every depformer step with its
// sampling, so the 16 sequential depformer steps never wait for the host. Only the step's tokens
// cross to the host.
//
// CudaLmOptions::w8a16 stores the linear layers' weights in 8 bits (int8, or fp8 e4m3) with
// per-row scales instead (LinearWeight; everything else as above).
//
// Numerics follow upstream's bf16 run: RMSNorm in fp32 with eps 1e-8, RoPE in fp32, projection
// outputs rounded to bf16 before the residual add, silu(g) * u rounded once, logits from bf16.
//
// The depformer steps run as per-op kernels, about 32 launches per step with its sampling: the
// input projections of all steps come first, as one GEMV (they do not depend on the sampled
// tokens), then each step's QKV projection (adding the previous token's embedding while staging
// its RMSNorm), attention, output projection, FFN and head. (A persistent cooperative kernel per
// step, a fused depformer attention and programmatic dependent launch for the LM kernels measured
// slower and left the code on 2026-12-03: docs/PERF.md.)
//
// Deferred depformer steps. Steps n_q/2 .. dep_q-1 predict the user's codebooks. In conversation
// the user's tokens are always provided, so those steps cannot change any returned token; upstream
// still computes them, and so do we, but off the critical path: the frame step is three graphs,
//   main  = uploads, temporal transformer, text head and sampling   (stream A)
//   dep   = depformer steps 0 .. n_q/2-1, their sampling, tokens out (stream A, after the
//           previous frame's tail: they share the depformer's buffers)
//   tail  = depformer steps n_q/2 .. dep_steps-1                     (stream B, after dep)
// and run() returns once `dep` is done; the tail overlaps Mimi decode and the next frame. It reads
// private copies of its inputs (x, request, counter, last token) taken at the end of `dep`, and its
// sampling draws the same counter-based random numbers as a serial run. run() waits for the tail
// when its results are needed: logits requested, or a tail stream not provided.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/cuda_util.h"
#include "lm_attention.cuh"
#include "lm_gemv.cuh"
#include "ppx/config.h"
#include "ppx/lm_gen.h"

namespace ppx {
class WeightSource;
}

namespace ppx::cuda {

struct CudaLmOptions {
  // w8a16: every linear layer's weight (temporal QKV / output / FFN projections, text head,
  // depformer input projections, depformer QKV / output / FFN projections, depformer heads) is
  // quantized at load to 8 bits with one fp32 scale per output row (w8_int8 below) and
  // the GEMVs read it so; activations, embeddings, norms and the KV cache stay bf16. The bf16
  // copies of the linear weights are freed. From ppx::CudaOptions::w8a16 (--w8a16).
  bool w8a16 = false;
  // With w8a16: int8 (scale = max|row| / 127, kern::quantize_int8_rows; what ships, --w8-format
  // int8) or, when false, fp8 e4m3: the same bytes and GEMV family. int8 measured 4-5x more
  // accurate and ~4% slower per frame (docs/QUALITY.md, docs/PERF.md v0.10).
  bool w8_int8 = true;
  // kv_fp8: every stepper keeps the temporal transformer's keys and values in fp8 e4m3 with one
  // scale byte per (position, head) (kern::RingArgs::k8), half the bytes of the bf16 cache; the
  // depformer's per-frame ring stays bf16. From ppx::CudaOptions::kv_fp8 (--kv-fp8).
  bool kv_fp8 = false;
};

// A linear layer's weight [rows, cols] (row-major) as the GEMVs read it: bf16 (w), or fp8 e4m3
// (w8) or int8 (wi8) with one fp32 dequantization scale per row (w_scale). Exactly one of w, w8
// and wi8 is set.
struct LinearWeight {
  const __nv_bfloat16* w = nullptr;
  const __nv_fp8_e4m3* w8 = nullptr;
  const int8_t* wi8 = nullptr;
  const float* w_scale = nullptr;
  // With wi8 under kern::gemm_set_policy(3) when the model was built: its values as bf16 (exact),
  // for that measurement hook's cuBLAS GEMM (kern::GemvArgs::wq).
  const __nv_bfloat16* wq = nullptr;
  int64_t cols = 0;
  bool fp8() const { return w8 != nullptr; }
  bool int8() const { return wi8 != nullptr; }
  // Rows [first, ...): one step's slice of a weight that holds all depformer steps.
  LinearWeight rows_from(int64_t first) const;
  // The one place where the weight type reaches a GEMV: sets a.w, or a.w8 and a.w_scale (the
  // others null). Throws ppx::Error when a.K is not this weight's column count.
  void set(kern::GemvArgs& a) const;
};

class CudaLm {
 public:
  // From a checkpoint (any float dtype per tensor, upstream keys, 8-step layout expanded).
  CudaLm(const LmConfig& c, WeightSource& w, const CudaLmOptions& opt = {});
  // Full-size random weights generated on the device (benchmarks: no checkpoint needed).
  CudaLm(const LmConfig& c, uint64_t seed, const CudaLmOptions& opt = {});
  ~CudaLm();
  const LmConfig& config() const { return c_; }
  const CudaLmOptions& options() const { return opt_; }
  bool w8a16() const { return opt_.w8a16; }
  bool kv_fp8() const { return opt_.kv_fp8; }
  // With kv_fp8: the steppers' fp8 caches laid out by head (kern::RingArgs::fp8_by_head), from
  // kern::attention_fp8_by_head() when this model was built (true as shipped since v0.34).
  bool kv_fp8_by_head() const { return opt_.kv_fp8 && kv_by_head_; }
  // Device bytes of the weights the step reads: the bf16 arena (everything, or with w8a16 the
  // embeddings and norms only), plus with w8a16 the fp8 weights and their scales.
  size_t weight_bytes() const { return weight_bytes_; }

  struct Temporal {
    LinearWeight in_proj, out_proj, lin_in, lin_out;
    const __nv_bfloat16 *norm1 = nullptr, *norm2 = nullptr;
  };
  struct Depformer {
    const __nv_bfloat16 *norm1 = nullptr, *norm2 = nullptr;
    LinearWeight in_proj, out_proj;             // hold all steps
    std::vector<LinearWeight> lin_in, lin_out;  // per step
  };
  std::vector<const __nv_bfloat16*> emb;  // [n_q] audio tables [card+1, dim]
  const __nv_bfloat16* text_emb = nullptr;
  std::vector<Temporal> layers;
  const __nv_bfloat16* out_norm = nullptr;
  LinearWeight text_linear;
  std::vector<LinearWeight> depformer_in, linears;
  std::vector<const __nv_bfloat16*> depformer_emb;
  LinearWeight depformer_in_all;  // [dep_q * depformer_dim, dim]: depformer_in[0..]
  const __nv_bfloat16* depformer_text_emb = nullptr;
  std::vector<Depformer> dep_layers;
  DeviceBuffer<const __nv_bfloat16*> emb_tables;  // [n_q + 1]: text, then audio
  DeviceBuffer<int32_t> emb_rows;                 // [n_q + 1]

 private:
  // One state-dict tensor and where it lives: offsets in elements of arena_ (bf16), and for a
  // linear weight under w8a16 of arena8_ and scales_ (then it has no bf16 copy).
  struct Tensor {
    std::string key;
    std::vector<int64_t> shape;
    bool linear = false;
    size_t off = 0, off8 = 0, off_scale = 0;
    bool in_fp8 = false;
  };
  void allocate();
  void bind();              // the pointers above from tensors_ and the arenas
  void quantize_linears();  // w8a16: fp8 weights and scales; the bf16 arena keeps the rest only
  void finish_tables();
  LmConfig c_;
  CudaLmOptions opt_;
  bool kv_by_head_ = kern::attention_fp8_by_head();
  std::vector<Tensor> tensors_;
  DeviceBuffer<__nv_bfloat16> arena_;
  DeviceBuffer<__nv_fp8_e4m3> arena8_;
  DeviceBuffer<float> scales_;
  // int8 weights built under kern::gemm_set_policy(3): arena8_'s values as bf16 (a measurement
  // hook). Not counted in weight_bytes(): the capacity model's bytes per step then understate
  // what policy 3's batched steps read (free memory is measured after loading, so the memory
  // limit is right).
  DeviceBuffer<__nv_bfloat16> arena_q_;
  size_t weight_bytes_ = 0;
};

// The depformer's device buffers for B batch rows (row-major; batch row b at b * the row stride).
struct DepformerIo {
  int B = 1;
  const __nv_bfloat16* x = nullptr;  // [B, dim] temporal output
  const int32_t* token = nullptr;    // [B] the previous stream's token (-1: none)
  // Per-session K/V ring [depformer layers, slots, dep_q, depformer_dim]; batch row b uses slot[b].
  __nv_bfloat16* k_ring = nullptr;
  __nv_bfloat16* v_ring = nullptr;
  int64_t ring_layer_stride = 0;     // elements between layers (>= slots * dep_q * depformer_dim)
  const int32_t* slot = nullptr;     // [B]
  // Scratch: z [B, DD] (the residual stream), qkv [B, 3 DD], att [B, DD], gu [B, DH].
  __nv_bfloat16 *z = nullptr, *qkv = nullptr, *att = nullptr, *gu = nullptr;
  __nv_bfloat16* pre = nullptr;      // [B, pre_stride]: every step's input projection
  int64_t pre_stride = 0;            // >= dep_q * depformer_dim
  float* logits = nullptr;           // [B, logits_stride]; step s writes columns [s card, (s + 1) card)
  int64_t logits_stride = 0;
  kern::GemmScratch gemm;            // lets B > 4 run as tensor-core GEMMs (kern::GemvArgs::gemm)
};

// The temporal transformer's device buffers for B batch rows: the embedding of the request's tokens
// through every layer (KV caches of `slots` rings, batch row b in ring slot[b] at pos[slot[b]]) and
// the text head's logits. Used by the batch-1 stepper (one ring) and by CudaLmBatch.
struct TemporalIo {
  int B = 1;
  const int32_t* tok = nullptr;      // [B, K] input tokens (-1: none)
  const int32_t* use_ext = nullptr;  // [B] 1: add ext's row (a voice-prompt embedding)
  const float* ext = nullptr;        // [B, dim]
  const int32_t* pos = nullptr;      // [slots] position of this step's token in each ring
  const int32_t* slot = nullptr;     // [B]
  const int32_t* row_pos = nullptr;  // [B] or nullptr: rows at their own positions (kern::RingArgs)
  // KV caches [layers, slots, context, dim]: bf16 k / v, or (--kv-fp8) k8 / v8 (by head, with
  // CudaLm::kv_fp8_by_head: [layers, slots, heads, context, head dim]) with per-head scale bytes
  // [layers, slots, heads, kern::fp8_scale_pitch(context)]; the layer strides in elements.
  __nv_bfloat16 *k = nullptr, *v = nullptr;
  __nv_fp8_e4m3 *k8 = nullptr, *v8 = nullptr;
  uint8_t *k_scale = nullptr, *v_scale = nullptr;
  size_t layer_kv = 0, layer_sc = 0;
  // Scratch: x [B, dim] (the residual stream, the output), qkv [B, 3 dim], q, att [B, dim],
  // gu [B, 2 ffn], work (kern::attention_work_floats), gemm as in DepformerIo.
  __nv_bfloat16 *x = nullptr, *qkv = nullptr, *q = nullptr, *att = nullptr, *gu = nullptr;
  float* work = nullptr;
  kern::GemmScratch gemm;
  float* text_logits = nullptr;      // [B, text_card] out; nullptr: no text head (prompt prefill)
};
void enqueue_temporal(const CudaLm& lm, const TemporalIo& io, cudaStream_t s);

// The temporal transformer's KV cache of `slots` slots in TemporalIo's layout: bf16 k / v, or with
// --kv-fp8 the e4m3 codes k8 / v8 and the scale bytes (the others stay empty). Its size is
// ppx::temporal_kv_bytes (the capacity model and CudaLmBatch's memory check use that).
struct TemporalKv {
  DeviceBuffer<__nv_bfloat16> k, v;
  DeviceBuffer<__nv_fp8_e4m3> k8, v8;
  DeviceBuffer<uint8_t> k_scale, v_scale;
  // Allocates (the scales' padding zeroed on `s`, the stream the steps run on: the attention's
  // 16-byte copies read it).
  void allocate(const LmConfig& c, size_t slots, bool fp8, cudaStream_t s);
  // Points io's caches here and sets its layer strides.
  void bind(TemporalIo& io, const LmConfig& c, size_t slots) const;
};

// y[B, N] = W[N, K] x (+ the prologue and epilogue of `in` and `out`), contiguous rows (x stride K,
// or 2K for kSiluGate; y stride N, or N / 2 for kGateUp).
// `gemm` (kern::GemmScratch, or empty): lets B > 4 run as one tensor-core GEMM (kern::GemvArgs).
// defer: the caller's next enqueue_gemv on `gemm` reads y (kern::GemvArgs::defer, a GEMM chain).
void enqueue_gemv(kern::GemvIn in, kern::GemvOut out, const LinearWeight& w, const __nv_bfloat16* x, int N, int K,
                  __nv_bfloat16* y, const __nv_bfloat16* alpha, int B, cudaStream_t s,
                  const kern::GemmScratch& gemm = {}, bool defer = false);

// enqueue_depformer_inputs computes io.pre for steps [first, first + steps): bf16(depformer_in[s]
// out_norm(x)), one GEMV (it does not depend on the sampled tokens). enqueue_depformer_kernels
// then runs one step from io.pre as per-op kernels; its first QKV projection adds the previous
// token's embedding while staging its RMSNorm.
void enqueue_depformer_inputs(const CudaLm& lm, const DepformerIo& io, int first, int steps, cudaStream_t s);
void enqueue_depformer_kernels(const CudaLm& lm, const DepformerIo& io, int step, cudaStream_t s);

struct SamplingParams {
  float temp_text = 0.7f, temp_audio = 0.8f;  // <= 0: greedy
  int top_k_text = 25, top_k_audio = 250;
  uint64_t seed = 42424242;
  static SamplingParams from(const LmGenConfig& g, uint64_t seed);
};

// One session's state (KV cache, buffers) and the captured step graph.
class CudaLmStepper : public LmStepper {
 public:
  // dep_steps < 0: all dep_q depformer steps (upstream). defer_user_steps: run the user streams'
  // depformer steps after run() returns (see above; what ships). false runs every step inside
  // run(), for tests that compare the two.
  CudaLmStepper(const CudaLm& lm, const SamplingParams& sp, int dep_steps = -1, bool defer_user_steps = true);
  ~CudaLmStepper() override;
  const LmConfig& config() const override { return lm_.config(); }
  void reset() override;
  void run(const StepRequest& req, StepResult& out, StepLogits* logits) override;
  double deferred_ms() const override { return last_tail_ms_; }
  int depformer_steps() const override { return dep_steps_; }
  // Device time of the last run (ms) until its tokens were ready, measured with events.
  float last_step_ms() const { return last_ms_; }
  // First deferred depformer step (== depformer steps run: none deferred).
  int tail_begin() const { return tail_begin_; }

 private:
  // Where a sampling kernel reads its request and writes its token (the live buffers, or the
  // tail's private copies).
  struct SampleIo {
    const int32_t* req;  // req_ layout
    const uint8_t* provided;
    const uint64_t* counter;
    int32_t* sampled;  // indexed by stream - first_stream
    int first_stream;
    int32_t* next;
  };
  SampleIo live_sample_io() { return {req_.get(), provided_.get(), counter_.get(), sampled_.get(), 0, next_.get()}; }
  void enqueue_sample(const SampleIo& io, int stream_index, const float* logits, int n, cudaStream_t s);
  void enqueue_main(cudaStream_t s);  // uploads, temporal transformer, text head and sampling
  void enqueue_dep(cudaStream_t s);   // depformer steps [0, tail_begin_), tokens out
  void enqueue_tail(cudaStream_t s);  // depformer steps [tail_begin_, dep_steps_)
  void capture_graphs();
  void sync_all();
  DepformerIo depformer_io() const;
  const CudaLm& lm_;
  SamplingParams sp_;
  int dep_steps_;
  int tail_begin_ = 0;
  cudaStream_t stream_ = nullptr, tail_stream_ = nullptr;
  // graph_main_ holds the depformer too when nothing is deferred (graph_dep_ and graph_tail_ null).
  cudaGraphExec_t graph_main_ = nullptr, graph_dep_ = nullptr, graph_tail_ = nullptr;
  cudaEvent_t ev0_ = nullptr, ev1_ = nullptr, dep_done_ = nullptr;
  cudaEvent_t tail_ev_[2][2] = {};  // [frame parity][start, end]
  bool tail_ran_ = false;  // a previous run launched a tail (every run does)
  int parity_ = 0;
  float last_ms_ = 0, last_tail_ms_ = 0;
  // Per-session device state, batch B = 1 in slot 0.
  TemporalKv kv_;
  DeviceBuffer<__nv_bfloat16> dk_cache_, dv_cache_;
  DeviceBuffer<__nv_bfloat16> x_, qkv_, q_, att_, gu_, z_, dqkv_, datt_, dgu_, dpre_;
  DeviceBuffer<float> work_, logits_, ext_;
  // req_ = tokens [K] | force [1 + S] | target [K] | use_ext [1]  (the uploaded request)
  DeviceBuffer<int32_t> req_, pos_, slot_, sampled_, next_, top_k_;
  DeviceBuffer<uint8_t> provided_;
  DeviceBuffer<float> temp_;
  DeviceBuffer<uint64_t> seed_, counter_;
  // The tail's private inputs (copied at the end of `dep`) and outputs.
  DeviceBuffer<__nv_bfloat16> tx_;
  DeviceBuffer<int32_t> treq_, tnext_, tsampled_;
  DeviceBuffer<uint8_t> tprov_;
  DeviceBuffer<uint64_t> tcounter_;
  // Host staging (pinned), same layouts: request in, results out.
  PinnedBuffer<int32_t> h_req_;
  PinnedBuffer<uint8_t> h_prov_;
  PinnedBuffer<int32_t> h_out_;  // sampled [1 + S]
  PinnedBuffer<float> h_ext_;
  PinnedBuffer<int32_t> h_tail_out_;  // the tail's sampled tokens
};

}  // namespace ppx::cuda
