// The LM of many sessions on CUDA in one batch step (ppx::LmBatch): every kernel of the step
// (embedding, 32 temporal layers, text head, depformer steps, sampling) runs once over all
// sessions with a step ready, each batch row reading and writing its own session slot (KV cache,
// depformer ring, position, random stream, sampling parameters). The weights are read once per
// chunk of kern::kMaxGemvBatch rows instead of once per session.
//
// Everything is made at construction: per-slot state for `slots` sessions plus one scratch slot
// (what padding rows of a batch write), the row buffers for max(`slots`, kPrefillRows) rows, and
// one CUDA graph per batch-size bucket (ppx::batch_buckets: 1, 2, 4, ... 64, then every 16, and
// `slots`); a step of n sessions replays the smallest bucket that holds n, its spare rows padding.
// open() writes a slot's parameters and zeroes its position and counter: no allocation, no capture.
//
// Prompt prefill (prefill()): up to prefill_rows() consecutive positions of one slot whose streams
// are all provided go through the temporal transformer as the rows of one pass (every row at its
// own position: it appends its keys and values, then attends to the ring as that position's query),
// without the text head, the depformer or sampling; the slot's position and random counter then
// move on as n steps would have moved them. Positions must stay inside the ring (pos + n <=
// context, which system prompts do); past it the steps run one by one. Direct launches, no graph.
//
// Numerics: up to a batch of 4 the batch-1 stepper's (CudaLmStepper) row by row (the same kernels;
// a row's results do not depend on the other rows). Above 4 the projections run as tensor-core
// GEMMs (kernels/lm_gemm.cu) whose fp32 sums are ordered differently, so they agree with the
// batch-1 stepper to rounding (a bf16 output can differ in its last bit). Unlike that stepper every
// depformer step runs inside the step (nothing deferred to overlap the codec): with --dep-q-exit 8
// there is nothing to defer.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "backend/cuda/cuda_lm.h"
#include "backend/cuda/cuda_util.h"
#include "ppx/lm_batch.h"

namespace ppx::cuda {

class CudaLmBatch : public LmBatch {
 public:
  static constexpr int kPrefillRows = 64;  // prompt positions per prefill pass (at least)
  // dep_steps < 0: all dep_q depformer steps. `device`: the device the LM lives on.
  CudaLmBatch(const CudaLm& lm, int slots, int dep_steps, int device);
  ~CudaLmBatch() override;
  CudaLmBatch(const CudaLmBatch&) = delete;
  CudaLmBatch& operator=(const CudaLmBatch&) = delete;

  const LmConfig& config() const override { return lm_.config(); }
  int slots() const override { return slots_; }
  int depformer_steps() const override { return dep_steps_; }
  void attach_thread() override;
  void open(int slot, const LmGenConfig& gen, uint64_t seed) override;
  void reset(int slot) override;
  void run(const BatchStep* steps, int n) override;
  void prefill(int slot, const StepRequest* reqs, int n) override;
  int prefill_rows() const override { return rows_; }
  // The prompt cache's store: device memory; a prefix is its keys layer by layer, then its values
  // (bf16; or fp8 keys, fp8 values, then their scale bytes), one device copy per layer and tensor,
  // queued on the batch's stream behind the slot's steps.
  size_t prefix_bytes(int positions) const override;
  void reserve_prefix_store(size_t bytes) override;
  PrefixInfo save_prefix(int slot, size_t offset) override;
  void load_prefix(int slot, const PrefixInfo& info, size_t offset) override;

  // Device time of the last run() (ms), measured with events.
  float last_step_ms() const { return last_ms_; }
  // The batch-size buckets that have a captured graph.
  const std::vector<int>& buckets() const { return buckets_; }

 private:
  kern::GemmScratch gemm_scratch();
  TemporalIo temporal_io(int B);  // the temporal pass over rows 0..B-1 of the request block
  void enqueue_step(int B, cudaStream_t s);
  void enqueue_sample(int B, int stream_index, const float* logits, int64_t stride, int n, cudaStream_t s);
  void check_slot(int slot) const;
  void set_slot_position(int slot, int32_t pos, uint64_t counter);
  // Copies a slot's first `positions` KV rows to (to_store) or from the store at `offset`.
  void copy_prefix(int slot, int positions, size_t offset, bool to_store);

  const CudaLm& lm_;
  int slots_, rows_, dep_steps_, device_;
  int K_, S_, R_;  // streams (n_q + 1), depformer steps (dep_q), int32 words of a request row block
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ev0_ = nullptr, ev1_ = nullptr;
  float last_ms_ = 0;
  std::vector<int> buckets_;
  std::vector<cudaGraphExec_t> graphs_;  // per bucket

  // Per-slot state, slots_ + 1 slots (the last is the scratch slot of padding rows).
  TemporalKv kv_;
  DeviceBuffer<__nv_bfloat16> dk_cache_, dv_cache_;
  DeviceBuffer<int32_t> pos_, top_k_text_, top_k_audio_;
  DeviceBuffer<uint64_t> counter_, seed_;
  DeviceBuffer<float> temp_text_, temp_audio_;

  // Row buffers, rows_ rows. The request block in_ holds, for the B rows of a step:
  //   tokens [B, K] | force [1 + S, B] | target [K, B] | use_ext [B] | slot [B]
  // laid out for the bucket size B (so the graph of bucket B reads exactly what run() uploads).
  DeviceBuffer<int32_t> in_;
  DeviceBuffer<uint8_t> provided_;  // [K, B]
  DeviceBuffer<float> ext_;         // [B, D]
  DeviceBuffer<__nv_bfloat16> x_, qkv_, q_, att_, gu_, z_, dqkv_, datt_, dgu_, dpre_;
  DeviceBuffer<__nv_bfloat16> xstage_;  // [rows, max K]: the GEMMs' staged activations (kern::GemmScratch)
  DeviceBuffer<float> ws_;              // the GEMMs' split-K partial sums (kern::gemm_ws_floats)
  kern::GemmChain chain_;               // a split-K epilogue left for the next GEMM (gemm_scratch())
  DeviceBuffer<float> work_, text_logits_, audio_logits_;  // logits [B, V], [B, S * card]
  DeviceBuffer<int32_t> sampled_, next_;                   // [1 + S, B], [B]
  PinnedBuffer<int32_t> h_in_;
  PinnedBuffer<uint8_t> h_prov_;
  PinnedBuffer<float> h_ext_;
  PinnedBuffer<int32_t> h_out_;  // sampled [1 + S, B]
  // Prefill: row positions [rows] (pinned copy), and every slot's position and counter as the host
  // knows them (what the device's pos_ and counter_ hold after the queued work).
  DeviceBuffer<int32_t> row_pos_;
  PinnedBuffer<int32_t> h_row_pos_;
  std::vector<int64_t> host_pos_;
  std::vector<uint64_t> host_counter_;
  DeviceBuffer<uint8_t> store_;  // the prompt cache's store (reserve_prefix_store)
};

}  // namespace ppx::cuda
