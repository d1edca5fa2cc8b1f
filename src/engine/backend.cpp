#include "ppx/backend.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "ppx/error.h"
#include "ppx/lm.h"
#include "ppx/mimi.h"
#include "ppx/ring_kv.h"

namespace ppx {
namespace {

// A CPU stepper that owns its sampler.
class OwningCpuStepper : public LmStepper {
 public:
  OwningCpuStepper(const Lm& lm, const LmGenConfig& gen, uint64_t seed, int dep_steps)
      : sampler_(gen, seed), inner_(lm, sampler_, dep_steps) {}
  const LmConfig& config() const override { return inner_.config(); }
  void reset() override { inner_.reset(); }
  void run(const StepRequest& r, StepResult& o, StepLogits* l) override { inner_.run(r, o, l); }
  int depformer_steps() const override { return inner_.depformer_steps(); }
  LmState& state() { return inner_.state(); }

 private:
  Sampler sampler_;
  CpuLmStepper inner_;
};

// The CPU reference has no batched kernels: a batch step runs its slots' steppers one by one.
class CpuLmBatch : public LmBatch {
 public:
  CpuLmBatch(const Lm& lm, int slots, int dep_steps) : lm_(lm), dep_steps_(dep_steps), slots_(slots) {}
  const LmConfig& config() const override { return lm_.config(); }
  int slots() const override { return static_cast<int>(slots_.size()); }
  int depformer_steps() const override { return dep_steps_ < 0 ? lm_.config().dep_q : dep_steps_; }
  void open(int slot, const LmGenConfig& gen, uint64_t seed) override {
    at(slot) = std::make_unique<OwningCpuStepper>(lm_, gen, seed, dep_steps_);
  }
  void reset(int slot) override { stepper(slot).reset(); }
  void run(const BatchStep* steps, int n) override {
    for (int i = 0; i < n; ++i) stepper(steps[i].slot).run(*steps[i].req, *steps[i].out, steps[i].logits);
  }
  // The default prefill (exact: the steps themselves); the scheduler still hands them over in
  // chunks, so the CPU runs the same queueing as the GPU.
  int prefill_rows() const override { return 16; }

  // The prompt cache's store in host memory: keys then values of every layer, fp32, for each of
  // the prefix's positions. It grows to what is used, up to the reserved size.
  size_t prefix_bytes(int positions) const override {
    const LmConfig& c = lm_.config();
    return static_cast<size_t>(positions) * c.num_layers * 2 * c.dim * sizeof(float);
  }
  void reserve_prefix_store(size_t bytes) override { store_cap_ = bytes; }
  PrefixInfo save_prefix(int slot, size_t offset) override {
    LmState& st = stepper(slot).state();
    const LmConfig& c = lm_.config();
    if (st.pos <= 0 || st.pos >= c.context || static_cast<int>(st.kv.size()) != c.num_layers)
      throw Error("save_prefix: slot " + std::to_string(slot) + " is at position " + std::to_string(st.pos) +
                  " (a prefix needs 1 to " + std::to_string(c.context - 1) + ")");
    const int P = static_cast<int>(st.pos);
    const size_t n = prefix_bytes(P);
    if (offset + n > store_cap_) throw Error("save_prefix: past the end of the prompt cache store");
    if (store_.size() < offset + n) store_.resize(offset + n);
    const size_t row = static_cast<size_t>(c.dim) * P;  // floats of one layer's keys (or values)
    float* dst = reinterpret_cast<float*>(store_.data() + offset);
    for (const cpu::RingKv& kv : st.kv) {
      std::copy_n(kv.k.data(), row, dst);
      std::copy_n(kv.v.data(), row, dst + row);
      dst += 2 * row;
    }
    return PrefixInfo{P, 0};
  }
  void load_prefix(int slot, const PrefixInfo& info, size_t offset) override {
    LmState& st = stepper(slot).state();
    const LmConfig& c = lm_.config();
    const int P = info.positions;
    if (P <= 0 || P >= c.context || offset + prefix_bytes(P) > store_.size())
      throw Error("load_prefix: no prefix of " + std::to_string(P) + " positions at that place");
    if (static_cast<int>(st.kv.size()) != c.num_layers) lm_.init_state(st);
    const size_t row = static_cast<size_t>(c.dim) * P;
    const float* src = reinterpret_cast<const float*>(store_.data() + offset);
    for (cpu::RingKv& kv : st.kv) {
      std::copy_n(src, row, kv.k.data());
      std::copy_n(src + row, row, kv.v.data());
      kv.end = P;
      src += 2 * row;
    }
    st.pos = P;
  }

 private:
  std::unique_ptr<OwningCpuStepper>& at(int slot) {
    if (slot < 0 || slot >= slots()) throw Error("LM slot " + std::to_string(slot) + " out of range");
    return slots_[static_cast<size_t>(slot)];
  }
  OwningCpuStepper& stepper(int slot) {
    auto& s = at(slot);
    if (!s) throw Error("LM slot " + std::to_string(slot) + " is not open");
    return *s;
  }
  const Lm& lm_;
  int dep_steps_;
  std::vector<std::unique_ptr<OwningCpuStepper>> slots_;
  size_t store_cap_ = 0;
  std::vector<uint8_t> store_;  // the prompt cache's store, grown on demand
};

class CpuBackend : public ModelBackend {
 public:
  CpuBackend(std::unique_ptr<Mimi> mimi, std::unique_ptr<Lm> lm) : mimi_(std::move(mimi)), lm_(std::move(lm)) {}
  std::string device() const override { return "cpu"; }
  std::unique_ptr<CodecStream> codec_stream(int) override {
    if (!mimi_) throw Error("this CPU backend was built without Mimi");
    return std::make_unique<CpuCodecStream>(*mimi_);
  }
  std::unique_ptr<LmStepper> lm_stepper(const LmGenConfig& gen, uint64_t seed, int dep_steps) override {
    if (!lm_) throw Error("this CPU backend was built without the LM");
    return std::make_unique<OwningCpuStepper>(*lm_, gen, seed, dep_steps);
  }
  std::unique_ptr<LmBatch> lm_batch(int slots, int dep_steps) override {
    if (!lm_) throw Error("this CPU backend was built without the LM");
    return std::make_unique<CpuLmBatch>(*lm_, slots, dep_steps);
  }
  const Mimi* cpu_mimi() const override { return mimi_.get(); }

 private:
  std::unique_ptr<Mimi> mimi_;
  std::unique_ptr<Lm> lm_;
};

}  // namespace

CodecStream& LoopCodecBatch::stream(int slot) {
  if (slot < 0 || slot >= slots()) throw Error("codec slot " + std::to_string(slot) + " out of range");
  auto& s = streams_[static_cast<size_t>(slot)];
  if (!s) s = make_(slot);
  return *s;
}

std::unique_ptr<CodecBatch> ModelBackend::codec_batch(int slots) {
  if (slots < 1) throw Error("a codec batch needs at least one slot");
  const std::unique_ptr<CodecStream> probe = codec_stream(0);
  return std::make_unique<LoopCodecBatch>(
      slots, probe->frame_samples(), probe->num_codebooks(), probe->codebook_size(), [this](int slot) { return codec_stream(slot); },
      [this] { attach_thread(); });
}

std::unique_ptr<ModelBackend> make_cpu_backend(std::unique_ptr<Mimi> mimi, std::unique_ptr<Lm> lm) {
  return std::make_unique<CpuBackend>(std::move(mimi), std::move(lm));
}

#ifndef PPX_HAVE_CUDA
std::string cuda_device_problem(int) {
  return "this build has no CUDA backend (configure with a CUDA toolkit, PPX_CUDA=ON)";
}

std::unique_ptr<ModelBackend> make_cuda_backend(const ModelConfig&, WeightSource&, WeightSource*, uint64_t, int, bool,
                                                const CudaOptions&) {
  throw Error("--device cuda: this build has no CUDA backend (configure with a CUDA toolkit, PPX_CUDA=ON)");
}
#endif

}  // namespace ppx
