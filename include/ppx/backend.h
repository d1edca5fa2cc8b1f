// The backend interface: a loaded model on one backend (the CPU reference or the CUDA engine), from
// which sessions take their codec streams and LM steppers, and the frame schedulers their batches
// (ppx/lm_batch.h, ppx/codec_batch.h). Weights are shared by all sessions of a backend. The
// implementations live with their code: src/engine/backend.cpp (CPU), src/backend/cuda (CUDA).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "ppx/capacity.h"
#include "ppx/codec_batch.h"
#include "ppx/config.h"
#include "ppx/conversation.h"
#include "ppx/lm_batch.h"
#include "ppx/lm_gen.h"

namespace ppx {

class WeightSource;
class Mimi;
class Lm;

class ModelBackend {
 public:
  virtual ~ModelBackend() = default;
  virtual std::string device() const = 0;  // "cpu" or "cuda: <GPU>"
  // A codec stream for one session. `slot` indexes preallocated per-session state.
  virtual std::unique_ptr<CodecStream> codec_stream(int slot) = 0;
  // The codec of `slots` sessions for the codec scheduler (src/engine/codec_scheduler.h), made
  // once at startup; it uses the same per-slot state as codec_stream(slot), so a slot is used
  // through one or the other. This default loops over codec_stream()s (LoopCodecBatch); CUDA
  // launches each layer once for the whole batch.
  virtual std::unique_ptr<CodecBatch> codec_batch(int slots);
  // An LM stepper for one session, sampling with `gen` (greedy when !gen.use_sampling).
  virtual std::unique_ptr<LmStepper> lm_stepper(const LmGenConfig& gen, uint64_t seed, int dep_steps = -1) = 0;
  // The LM state of `slots` sessions for the frame scheduler (src/engine/scheduler.h), made once
  // at startup. dep_steps < 0: all depformer steps.
  virtual std::unique_ptr<LmBatch> lm_batch(int slots, int dep_steps) = 0;
  // The CPU Mimi when this is the CPU backend (golden checks decode with it), else nullptr.
  virtual const Mimi* cpu_mimi() const { return nullptr; }
  // Makes this backend's device current on the calling thread (CUDA: cudaSetDevice, which is per
  // host thread). A thread other than the one that made the backend calls it before its first
  // codec stream or stepper call; the server's session workers do.
  virtual void attach_thread() {}
  // How many sessions this device can hold (include/ppx/capacity.h), computed when the model
  // loaded: the server's default --max-sessions. nullopt where it is not modelled (the CPU
  // backend, whose default stays 1).
  virtual std::optional<Capacity> capacity() const { return std::nullopt; }
};

// Takes ownership of CPU models.
std::unique_ptr<ModelBackend> make_cpu_backend(std::unique_ptr<Mimi> mimi, std::unique_ptr<Lm> lm);

// How the CUDA engine runs, chosen on the command line (ModelFlags in src/apps/model_loading.h);
// the defaults are the stock engine. Every choice the CUDA backend makes comes from here: it reads
// no environment switches.
struct CudaOptions {
  // --w8a16: the LM's linear layers run with fp8 e4m3 weights and per-row scales, quantized at
  // load (cuda::CudaLmOptions::w8a16).
  bool w8a16 = false;
  // --w8-format: with w8a16, int8 weights (true, the default) or fp8 e4m3 (cuda::CudaLmOptions::w8_int8).
  bool w8_int8 = true;
  // --kv-fp8: the temporal transformer's KV cache in fp8 e4m3 with per-(position, head) scales
  // (cuda::CudaLmOptions::kv_fp8): half the cache memory and attention bytes.
  bool kv_fp8 = false;
  // Programmatic dependent launch for the Mimi kernels where the device supports it (compute
  // capability 9.0+; measured faster, docs/PERF.md v0.2). --no-mimi-pdl turns it off.
  bool mimi_pdl = true;
  // --mimi-fp16: Mimi's long and transposed convolutions on tensor cores with fp16 weights and
  // inputs, fp32 sums (cuda::CudaMimi's fp16; accuracy in docs/QUALITY.md).
  bool mimi_fp16 = false;
  // --device cuda:N: the device index among the visible ones (CUDA_VISIBLE_DEVICES), made current
  // by make_cuda_backend on its calling thread and by ModelBackend::attach_thread on others.
  int device = 0;
  // The server's prompt cache store (--prompt-cache-mb), allocated later by the LM batch: the
  // computed capacity keeps this much device memory free for it (Capacity::prompt_cache_bytes);
  // kPromptCacheAuto (ppx/capacity.h): auto_prompt_cache_bytes() of the free memory.
  size_t prompt_cache_bytes = 0;
};

// The CUDA engine. `lm_weights` nullptr: full-size random LM weights generated on the device
// (seed `random_seed`). `codec_slots`: codec streams that can exist at once; 0: the computed
// capacity's sessions (the LM loads first, then the device's copy rate and free memory are
// measured, then the codec is built with that many slots). Throws ppx::Error
// when the build has no CUDA backend or no GPU is usable.
// `with_lm` false builds the codec only (lm_stepper then throws).
std::unique_ptr<ModelBackend> make_cuda_backend(const ModelConfig& cfg, WeightSource& mimi_weights,
                                                WeightSource* lm_weights, uint64_t random_seed, int codec_slots,
                                                bool with_lm = true, const CudaOptions& options = {});

// Why the CUDA engine cannot run on visible device `device` ("" when it can): no CUDA backend in
// this build, no usable device, no device of that index, or a compute capability below 8.0 (the
// oldest the kernels are built for). Never throws; the tools call it before anything loads and
// name the flag that asked for CUDA.
std::string cuda_device_problem(int device = 0);

// Runs a second codec stream on the same audio and discards its output: upstream's server runs
// such an "other_mimi", and the stock benchmark reproduces its cost.
class MirroredCodecStream : public CodecStream {
 public:
  MirroredCodecStream(std::unique_ptr<CodecStream> main, std::unique_ptr<CodecStream> shadow)
      : main_(std::move(main)), shadow_(std::move(shadow)), scratch_codes_(main_->num_codebooks()),
        scratch_pcm_(main_->frame_samples()) {}
  int frame_samples() const override { return main_->frame_samples(); }
  int num_codebooks() const override { return main_->num_codebooks(); }
  int codebook_size() const override { return main_->codebook_size(); }
  void reset() override {
    main_->reset();
    shadow_->reset();
  }
  void encode(const float* pcm, int32_t* codes) override {
    main_->encode(pcm, codes);
    shadow_->encode(pcm, scratch_codes_.data());
  }
  void decode(const int32_t* codes, float* pcm) override {
    main_->decode(codes, pcm);
    shadow_->decode(codes, scratch_pcm_.data());
  }

 private:
  std::unique_ptr<CodecStream> main_, shadow_;
  std::vector<int32_t> scratch_codes_;
  std::vector<float> scratch_pcm_;
};

}  // namespace ppx
