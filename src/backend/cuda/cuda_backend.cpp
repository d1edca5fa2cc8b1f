// The CUDA backend: CudaMimi codec streams (one slot each, encode and decode captured as CUDA
// graphs including their host transfers) and CudaLm steppers.
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/cuda/cuda_lm.h"
#include "backend/cuda/cuda_lm_batch.h"
#include "backend/cuda/cuda_mimi.h"
#include "backend/cuda/cuda_util.h"
#include "ppx/backend.h"
#include "ppx/capacity.h"
#include "ppx/error.h"

namespace ppx {
namespace {

class CudaCodecStream : public CodecStream {
 public:
  CudaCodecStream(cuda::CudaMimi& mimi, int slot, int bins)
      : mimi_(mimi), slot_(slot), bins_(bins) {
    const int fs = mimi.frame_samples(), nq = mimi.num_codebooks();
    PPX_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking));
    d_pcm_in_.resize(fs);
    d_pcm_out_.resize(fs);
    d_codes_in_.resize(nq);
    d_codes_out_.resize(nq);
    h_pcm_in_ = cuda::PinnedBuffer<float>(fs);
    h_pcm_out_ = cuda::PinnedBuffer<float>(fs);
    h_codes_in_ = cuda::PinnedBuffer<int32_t>(nq);
    h_codes_out_ = cuda::PinnedBuffer<int32_t>(nq);
    reset();
    enc_ = cuda::capture_graph(s_, [&] {
      PPX_CUDA_CHECK(cudaMemcpyAsync(d_pcm_in_.get(), h_pcm_in_.get(), fs * sizeof(float),
                                     cudaMemcpyHostToDevice, s_));
      mimi_.encode(slot_, d_pcm_in_.get(), d_codes_out_.get(), s_);
      PPX_CUDA_CHECK(cudaMemcpyAsync(h_codes_out_.get(), d_codes_out_.get(), nq * sizeof(int32_t),
                                     cudaMemcpyDeviceToHost, s_));
    });
    dec_ = cuda::capture_graph(s_, [&] {
      PPX_CUDA_CHECK(cudaMemcpyAsync(d_codes_in_.get(), h_codes_in_.get(), nq * sizeof(int32_t),
                                     cudaMemcpyHostToDevice, s_));
      mimi_.decode(slot_, d_codes_in_.get(), d_pcm_out_.get(), s_);
      PPX_CUDA_CHECK(cudaMemcpyAsync(h_pcm_out_.get(), d_pcm_out_.get(), fs * sizeof(float),
                                     cudaMemcpyDeviceToHost, s_));
    });
  }
  ~CudaCodecStream() override {
    if (enc_) cudaGraphExecDestroy(enc_);
    if (dec_) cudaGraphExecDestroy(dec_);
    if (s_) cudaStreamDestroy(s_);
  }
  int frame_samples() const override { return mimi_.frame_samples(); }
  int num_codebooks() const override { return mimi_.num_codebooks(); }
  int codebook_size() const override { return bins_; }
  void reset() override {
    mimi_.reset_encoder(slot_, s_);
    mimi_.reset_decoder(slot_, s_);
    PPX_CUDA_CHECK(cudaStreamSynchronize(s_));
  }
  void encode(const float* pcm, int32_t* codes) override {
    std::copy_n(pcm, frame_samples(), h_pcm_in_.get());
    PPX_CUDA_CHECK(cudaGraphLaunch(enc_, s_));
    PPX_CUDA_CHECK(cudaStreamSynchronize(s_));
    std::copy_n(h_codes_out_.get(), num_codebooks(), codes);
  }
  void decode(const int32_t* codes, float* pcm) override {
    for (int q = 0; q < num_codebooks(); ++q) {
      if (codes[q] < 0 || codes[q] >= bins_) throw Error("mimi decode: code out of range");
    }
    std::copy_n(codes, num_codebooks(), h_codes_in_.get());
    PPX_CUDA_CHECK(cudaGraphLaunch(dec_, s_));
    PPX_CUDA_CHECK(cudaStreamSynchronize(s_));
    std::copy_n(h_pcm_out_.get(), frame_samples(), pcm);
  }

 private:
  cuda::CudaMimi& mimi_;
  int slot_, bins_;
  cudaStream_t s_ = nullptr;
  cudaGraphExec_t enc_ = nullptr, dec_ = nullptr;
  cuda::DeviceBuffer<float> d_pcm_in_, d_pcm_out_;
  cuda::DeviceBuffer<int32_t> d_codes_in_, d_codes_out_;
  cuda::PinnedBuffer<float> h_pcm_in_, h_pcm_out_;
  cuda::PinnedBuffer<int32_t> h_codes_in_, h_codes_out_;
};

// Every session's codec in one CudaMimi, one batched launch sequence per direction and call. The
// sequence for a batch of n (host-to-device copies of the slot ids and inputs, the kernels, the
// copy back) is captured as a CUDA graph the first time n occurs and replayed after: the slot ids
// are read from device memory, so one graph serves any n slots.
class CudaCodecBatch : public CodecBatch {
 public:
  CudaCodecBatch(cuda::CudaMimi& mimi, int slots, int bins, int device)
      : mimi_(mimi), slots_(slots), bins_(bins), device_(device), fs_(mimi.frame_samples()),
        ncb_(mimi.num_codebooks()), enc_graphs_(static_cast<size_t>(slots) + 1, nullptr),
        dec_graphs_(static_cast<size_t>(slots) + 1, nullptr) {
    if (slots < 1 || slots > mimi.slots())
      throw Error("codec batch of " + std::to_string(slots) + " slots: the codec has " + std::to_string(mimi.slots()));
    PPX_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking));
    const size_t n = static_cast<size_t>(slots);
    d_ids_.resize(n);
    d_pcm_in_.resize(n * fs_);
    d_pcm_out_.resize(n * fs_);
    d_codes_in_.resize(n * ncb_);
    d_codes_out_.resize(n * ncb_);
    h_ids_ = cuda::PinnedBuffer<int>(n);
    h_pcm_in_ = cuda::PinnedBuffer<float>(n * fs_);
    h_pcm_out_ = cuda::PinnedBuffer<float>(n * fs_);
    h_codes_in_ = cuda::PinnedBuffer<int32_t>(n * ncb_);
    h_codes_out_ = cuda::PinnedBuffer<int32_t>(n * ncb_);
  }
  ~CudaCodecBatch() override {
    for (auto* v : {&enc_graphs_, &dec_graphs_})
      for (cudaGraphExec_t g : *v)
        if (g) cudaGraphExecDestroy(g);
    if (s_) cudaStreamDestroy(s_);
  }
  int slots() const override { return slots_; }
  int frame_samples() const override { return static_cast<int>(fs_); }
  int num_codebooks() const override { return static_cast<int>(ncb_); }
  int codebook_size() const override { return bins_; }
  void attach_thread() override { PPX_CUDA_CHECK(cudaSetDevice(device_)); }
  void reset(int slot) override {
    check(&slot, 1);
    mimi_.reset_encoder(slot, s_);
    mimi_.reset_decoder(slot, s_);
    PPX_CUDA_CHECK(cudaStreamSynchronize(s_));
  }
  void encode(const int* slots, int n, const float* pcm, int32_t* codes) override {
    check(slots, n);
    std::copy_n(slots, n, h_ids_.get());
    std::copy_n(pcm, static_cast<size_t>(n) * fs_, h_pcm_in_.get());
    replay(enc_graphs_, n, [&] {
      PPX_CUDA_CHECK(cudaMemcpyAsync(d_ids_.get(), h_ids_.get(), n * sizeof(int), cudaMemcpyHostToDevice, s_));
      PPX_CUDA_CHECK(cudaMemcpyAsync(d_pcm_in_.get(), h_pcm_in_.get(), static_cast<size_t>(n) * fs_ * sizeof(float),
                                     cudaMemcpyHostToDevice, s_));
      mimi_.encode_batch(d_ids_.get(), n, d_pcm_in_.get(), d_codes_out_.get(), s_);
      PPX_CUDA_CHECK(cudaMemcpyAsync(h_codes_out_.get(), d_codes_out_.get(),
                                     static_cast<size_t>(n) * ncb_ * sizeof(int32_t), cudaMemcpyDeviceToHost, s_));
    });
    std::copy_n(h_codes_out_.get(), static_cast<size_t>(n) * ncb_, codes);
  }
  void decode(const int* slots, int n, const int32_t* codes, float* pcm) override {
    check(slots, n);
    for (size_t i = 0; i < static_cast<size_t>(n) * ncb_; ++i)
      if (codes[i] < 0 || codes[i] >= bins_) throw Error("mimi decode: code out of range");
    std::copy_n(slots, n, h_ids_.get());
    std::copy_n(codes, static_cast<size_t>(n) * ncb_, h_codes_in_.get());
    replay(dec_graphs_, n, [&] {
      PPX_CUDA_CHECK(cudaMemcpyAsync(d_ids_.get(), h_ids_.get(), n * sizeof(int), cudaMemcpyHostToDevice, s_));
      PPX_CUDA_CHECK(cudaMemcpyAsync(d_codes_in_.get(), h_codes_in_.get(),
                                     static_cast<size_t>(n) * ncb_ * sizeof(int32_t), cudaMemcpyHostToDevice, s_));
      mimi_.decode_batch(d_ids_.get(), n, d_codes_in_.get(), d_pcm_out_.get(), s_);
      PPX_CUDA_CHECK(cudaMemcpyAsync(h_pcm_out_.get(), d_pcm_out_.get(), static_cast<size_t>(n) * fs_ * sizeof(float),
                                     cudaMemcpyDeviceToHost, s_));
    });
    std::copy_n(h_pcm_out_.get(), static_cast<size_t>(n) * fs_, pcm);
  }

 private:
  void check(const int* slots, int n) const {
    if (n < 1 || n > slots_) throw Error("codec batch of " + std::to_string(n) + " (1 .. " + std::to_string(slots_) + ")");
    for (int i = 0; i < n; ++i)
      if (slots[i] < 0 || slots[i] >= slots_) throw Error("codec slot " + std::to_string(slots[i]) + " out of range");
  }
  // Runs the graph of batch size n (capturing `body` into it the first time), then waits for it.
  template <typename F>
  void replay(std::vector<cudaGraphExec_t>& graphs, int n, F&& body) {
    cudaGraphExec_t& g = graphs[static_cast<size_t>(n)];
    if (!g) g = cuda::capture_graph(s_, body);
    PPX_CUDA_CHECK(cudaGraphLaunch(g, s_));
    PPX_CUDA_CHECK(cudaStreamSynchronize(s_));
  }

  cuda::CudaMimi& mimi_;
  int slots_, bins_, device_;
  size_t fs_, ncb_;
  cudaStream_t s_ = nullptr;
  std::vector<cudaGraphExec_t> enc_graphs_, dec_graphs_;  // by batch size
  cuda::DeviceBuffer<int> d_ids_;
  cuda::DeviceBuffer<float> d_pcm_in_, d_pcm_out_;
  cuda::DeviceBuffer<int32_t> d_codes_in_, d_codes_out_;
  cuda::PinnedBuffer<int> h_ids_;
  cuda::PinnedBuffer<float> h_pcm_in_, h_pcm_out_;
  cuda::PinnedBuffer<int32_t> h_codes_in_, h_codes_out_;
};

// The LM's share of the options.
cuda::CudaLmOptions lm_options(const CudaOptions& o) {
  cuda::CudaLmOptions l;
  l.w8a16 = o.w8a16;
  l.w8_int8 = o.w8_int8;
  l.kv_fp8 = o.kv_fp8;
  return l;
}

// The device's copy rate in bytes per second (read plus written, as personaplex-bench-kernels
// counts it): a few device-to-device copies of 256 MiB, a few milliseconds in all. Measured rather
// than looked up by GPU name, so that a new device needs no table.
double measure_copy_bandwidth(cudaStream_t s) {
  constexpr size_t kBytes = size_t{256} << 20;
  constexpr int kReps = 4;
  cuda::DeviceBuffer<uint8_t> a(kBytes), b(kBytes);
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  PPX_CUDA_CHECK(cudaEventCreate(&e0));
  PPX_CUDA_CHECK(cudaEventCreate(&e1));
  PPX_CUDA_CHECK(cudaMemsetAsync(a.get(), 1, kBytes, s));
  PPX_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), kBytes, cudaMemcpyDeviceToDevice, s));  // warm-up
  PPX_CUDA_CHECK(cudaEventRecord(e0, s));
  for (int i = 0; i < kReps; ++i)
    PPX_CUDA_CHECK(cudaMemcpyAsync(i % 2 ? a.get() : b.get(), i % 2 ? b.get() : a.get(), kBytes,
                                   cudaMemcpyDeviceToDevice, s));
  PPX_CUDA_CHECK(cudaEventRecord(e1, s));
  PPX_CUDA_CHECK(cudaEventSynchronize(e1));
  float ms = 0;
  PPX_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return ms > 0 ? 2.0 * kBytes * kReps / (ms * 1e-3) : 0.0;
}

// The capacity model's inputs on this device, measured after the LM loaded and before the codec
// and the batch allocate (ppx/capacity.h).
Capacity measure_capacity(const ModelConfig& cfg, const cuda::CudaLm& lm, const CudaOptions& opt) {
  cudaStream_t s = nullptr;
  PPX_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  double bw = 0;
  try {
    bw = measure_copy_bandwidth(s);
  } catch (...) {
    cudaStreamDestroy(s);
    throw;
  }
  PPX_CUDA_CHECK(cudaStreamDestroy(s));
  size_t free_b = 0, total_b = 0;
  PPX_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  CapacityInputs in;
  in.lm = *cfg.lm;
  in.kv = lm.kv_fp8() ? KvDtype::kFp8 : KvDtype::kBf16;
  in.weight_bytes = static_cast<double>(lm.weight_bytes());
  in.free_bytes = static_cast<double>(free_b);
  in.bandwidth = bw;
  in.codec_bytes_per_session = static_cast<double>(codec_slot_bytes_estimate(cfg.mimi));
  in.prompt_cache_bytes = opt.prompt_cache_bytes == kPromptCacheAuto ? auto_prompt_cache_bytes(in.free_bytes)
                                                                     : static_cast<double>(opt.prompt_cache_bytes);
  return compute_capacity(in);
}

class CudaBackend : public ModelBackend {
 public:
  // The LM loads first, so that the capacity is measured with its weights in place and the codec
  // (codec_slots 0) can be built with that many slots.
  CudaBackend(const ModelConfig& cfg, WeightSource& mw, WeightSource* lw, uint64_t seed, int slots,
              bool with_lm, const CudaOptions& opt)
      : lm_(!with_lm ? nullptr
            : lw     ? std::make_unique<cuda::CudaLm>(*cfg.lm, *lw, lm_options(opt))
                     : std::make_unique<cuda::CudaLm>(*cfg.lm, seed, lm_options(opt))),
        capacity_(lm_ ? std::optional<Capacity>(measure_capacity(cfg, *lm_, opt)) : std::nullopt),
        slots_(slots > 0 ? slots : capacity_ ? capacity_->sessions : 1),
        mimi_(cfg.mimi, mw, slots_, opt.mimi_pdl, opt.mimi_fp16),
        bins_(cfg.mimi.quantizer.bins),
        device_index_(opt.device),
        device_("cuda: " + cuda::device_description()) {}
  // Cached: /health asks for it, and must not touch a device that may have failed.
  std::string device() const override { return device_; }
  void attach_thread() override { PPX_CUDA_CHECK(cudaSetDevice(device_index_)); }
  std::unique_ptr<CodecStream> codec_stream(int slot) override {
    if (slot < 0 || slot >= slots_)
      throw Error("codec slot " + std::to_string(slot) + " out of range");
    return std::make_unique<CudaCodecStream>(mimi_, slot, bins_);
  }
  std::unique_ptr<CodecBatch> codec_batch(int slots) override {
    return std::make_unique<CudaCodecBatch>(mimi_, slots, bins_, device_index_);
  }
  std::unique_ptr<LmStepper> lm_stepper(const LmGenConfig& gen, uint64_t seed,
                                        int dep_steps) override {
    if (!lm_) throw Error("this CUDA backend was built without the LM");
    return std::make_unique<cuda::CudaLmStepper>(*lm_, cuda::SamplingParams::from(gen, seed),
                                                 dep_steps);
  }
  std::unique_ptr<LmBatch> lm_batch(int slots, int dep_steps) override {
    if (!lm_) throw Error("this CUDA backend was built without the LM");
    return std::make_unique<cuda::CudaLmBatch>(*lm_, slots, dep_steps, device_index_);
  }
  std::optional<Capacity> capacity() const override { return capacity_; }

 private:
  std::unique_ptr<cuda::CudaLm> lm_;
  std::optional<Capacity> capacity_;
  int slots_;
  cuda::CudaMimi mimi_;
  int bins_;
  int device_index_;
  std::string device_;
};

}  // namespace

std::string cuda_device_problem(int dev) {
  const int count = cuda::device_count();
  if (count == 0) return "no usable CUDA device (driver or GPU missing)";
  if (dev < 0 || dev >= count)
    return "no CUDA device " + std::to_string(dev) + ": " + std::to_string(count) +
           " visible (0.." + std::to_string(count - 1) + "; CUDA_VISIBLE_DEVICES selects which)";
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
    cudaGetLastError();
    return "cannot query the CUDA device";
  }
  if (major < 8)
    return "the GPU has compute capability " + std::to_string(major) + "." + std::to_string(minor) +
           "; the kernels need 8.0 or newer (sm_80 .. sm_121)";
  return "";
}

std::unique_ptr<ModelBackend> make_cuda_backend(const ModelConfig& cfg, WeightSource& mimi_weights,
                                                WeightSource* lm_weights, uint64_t random_seed,
                                                int codec_slots, bool with_lm, const CudaOptions& options) {
  if (cuda::device_count() == 0)
    throw Error("--device cuda: no usable CUDA device (driver or GPU missing)");
  if (const std::string why = cuda_device_problem(options.device); !why.empty())
    throw Error("--device cuda:" + std::to_string(options.device) + ": " + why);
  if (with_lm && !cfg.lm) throw Error("the config has no lm section");
  // Everything below (weights, graphs, streams) lives on that device; other threads that use the
  // backend make it current with attach_thread().
  PPX_CUDA_CHECK(cudaSetDevice(options.device));
  return std::make_unique<CudaBackend>(cfg, mimi_weights, lm_weights, random_seed, codec_slots,
                                       with_lm, options);
}

}  // namespace ppx
