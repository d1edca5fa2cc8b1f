// A ModelBackend for server tests that delegates to a real one and injects failures on demand:
// a throwing device() (as a /health handler would meet a broken device), a throwing lm_stepper()
// or LM slot open (session setup fails), and a DeviceError from a model step (the GPU became
// unusable). It also counts the steppers and open LM slots alive, so a test can tell whether a
// session outlived stop().
#pragma once

#include <atomic>
#include <memory>
#include <stdexcept>

#include "ppx/backend.h"
#include "ppx/error.h"

namespace ppx::server_test {

class FaultyBackend : public ModelBackend {
 public:
  explicit FaultyBackend(ModelBackend& inner) : inner_(inner) {}

  std::atomic<bool> device_throws{false};
  std::atomic<bool> stepper_throws{false};
  std::atomic<bool> step_device_error{false};  // every model step throws DeviceError
  std::atomic<int> live_steppers{0};

  std::string device() const override {
    if (device_throws) throw std::runtime_error("injected failure in device()");
    return inner_.device();
  }
  std::unique_ptr<CodecStream> codec_stream(int slot) override { return inner_.codec_stream(slot); }
  std::unique_ptr<LmStepper> lm_stepper(const LmGenConfig& gen, uint64_t seed,
                                        int dep_steps) override {
    if (stepper_throws) throw Error("injected failure in lm_stepper()");
    return std::make_unique<Stepper>(*this, inner_.lm_stepper(gen, seed, dep_steps));
  }
  std::unique_ptr<LmBatch> lm_batch(int slots, int dep_steps) override {
    return std::make_unique<Batch>(*this, inner_.lm_batch(slots, dep_steps));
  }

 private:
  class Batch : public LmBatch {
   public:
    Batch(FaultyBackend& b, std::unique_ptr<LmBatch> inner) : b_(b), inner_(std::move(inner)) {}
    const LmConfig& config() const override { return inner_->config(); }
    int slots() const override { return inner_->slots(); }
    int depformer_steps() const override { return inner_->depformer_steps(); }
    void open(int slot, const LmGenConfig& gen, uint64_t seed) override {
      if (b_.stepper_throws) throw Error("injected failure in lm_stepper()");
      inner_->open(slot, gen, seed);
      ++b_.live_steppers;
    }
    void reset(int slot) override { inner_->reset(slot); }
    void close(int slot) override {
      --b_.live_steppers;
      inner_->close(slot);
    }
    void run(const BatchStep* steps, int n) override {
      if (b_.step_device_error) throw DeviceError("injected: CUDA error cudaErrorIllegalAddress");
      inner_->run(steps, n);
    }

   private:
    FaultyBackend& b_;
    std::unique_ptr<LmBatch> inner_;
  };
  class Stepper : public LmStepper {
   public:
    Stepper(FaultyBackend& b, std::unique_ptr<LmStepper> inner) : b_(b), inner_(std::move(inner)) {
      ++b_.live_steppers;
    }
    ~Stepper() override { --b_.live_steppers; }
    const LmConfig& config() const override { return inner_->config(); }
    void reset() override { inner_->reset(); }
    int depformer_steps() const override { return inner_->depformer_steps(); }
    void run(const StepRequest& req, StepResult& out, StepLogits* logits) override {
      if (b_.step_device_error) throw DeviceError("injected: CUDA error cudaErrorIllegalAddress");
      inner_->run(req, out, logits);
    }

   private:
    FaultyBackend& b_;
    std::unique_ptr<LmStepper> inner_;
  };
  ModelBackend& inner_;
};

}  // namespace ppx::server_test
