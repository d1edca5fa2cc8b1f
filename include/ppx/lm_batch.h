// The LM of many sessions at once: per-session model state lives in slots sized at startup, and
// one run() makes one model call for every session that has a step ready. A backend that can
// batch its kernels reads the weights once per run() for all of them; one that cannot loops over
// its slots. Either way a session's tokens are those it would get alone (greedy: exactly; sampled:
// the same random stream, since each slot keeps its own seed and counter).
//
// Who calls what: the frame scheduler (src/engine/scheduler.h) owns the LmBatch and is the only
// thread that calls into it; sessions reach it through an LmStepper that the scheduler hands out.
#pragma once

#include <cstdint>

#include "ppx/config.h"
#include "ppx/lm_gen.h"

namespace ppx {

// One session's part of a batched step: its request in, its result (and, when asked, logits) out.
struct BatchStep {
  int slot = 0;
  const StepRequest* req = nullptr;
  StepResult* out = nullptr;
  StepLogits* logits = nullptr;  // nullptr: not asked for
};

class LmBatch {
 public:
  virtual ~LmBatch() = default;
  virtual const LmConfig& config() const = 0;
  virtual int slots() const = 0;
  // Depformer steps run per call (--dep-q-exit), as LmStepper::depformer_steps().
  virtual int depformer_steps() const = 0;
  // A session takes `slot`: empty KV cache, position 0, sampling from `gen` with a fresh random
  // stream seeded by `seed` (what a newly made stepper would have). The CUDA backend allocates
  // nothing here (its slots are made at startup).
  virtual void open(int slot, const LmGenConfig& gen, uint64_t seed) = 0;
  // Position 0 again for the session in `slot` (LmStepper::reset()); its sampling stays.
  virtual void reset(int slot) = 0;
  // The session left `slot`; it may be opened again.
  virtual void close(int slot) { (void)slot; }
  // One model call for each of the n steps; their slots are distinct and open.
  virtual void run(const BatchStep* steps, int n) = 0;
  // Prompt prefill: n consecutive steps of the session in `slot` whose streams are all provided
  // and whose results nobody reads (a system prompt). Leaves what n run() calls of that slot would
  // (KV cache, position, random stream) and nothing else: no depformer, no sampling, no results.
  // A backend that can runs the n positions as one pass of the temporal transformer (every
  // projection a GEMM over n rows); this default runs them as n steps, so it is exact.
  virtual void prefill(int slot, const StepRequest* reqs, int n) {
    StepResult r;
    for (int i = 0; i < n; ++i) {
      BatchStep s{slot, reqs + i, &r, nullptr};
      run(&s, 1);
    }
  }
  // The most positions one prefill() call takes; 1 when batching them gains nothing.
  virtual int prefill_rows() const { return 1; }
  // Called once by the thread that will make every other call (the scheduler's), before any:
  // binds that thread to the backend's device.
  virtual void attach_thread() {}
};

}  // namespace ppx
