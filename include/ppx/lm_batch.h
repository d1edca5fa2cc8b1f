// The LM of many sessions at once: per-session model state lives in slots sized at startup, and
// one run() makes one model call for every session that has a step ready. A backend that can
// batch its kernels reads the weights once per run() for all of them; one that cannot loops over
// its slots. Either way a session's tokens are those it would get alone (greedy: exactly; sampled:
// the same random stream, since each slot keeps its own seed and counter).
//
// Who calls what: the frame scheduler (src/engine/scheduler.h) owns the LmBatch and is the only
// thread that calls into it; sessions reach it through an LmStepper that the scheduler hands out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ppx/config.h"
#include "ppx/error.h"
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
  // The prompt cache's store (src/engine/prompt_cache.h): an arena of bytes that holds slot
  // prefixes. A prefix is what the first `positions` steps of a slot left behind: its KV cache
  // rows, its position and its random stream's place. Loading one into a freshly opened slot leaves
  // the slot as if it had run those steps itself, so the session's later tokens are the same
  // (greedy and sampled: a slot's random stream is its own seed and counter; a prefix carries the
  // counter, never the seed). Positions must lie inside the context (no ring wrap).
  struct PrefixInfo {
    int positions = 0;
    uint64_t counter = 0;  // the slot's random counter after those steps (backends that count)
  };
  // Bytes of a prefix of `positions` steps in the store; 0: this backend keeps none.
  virtual size_t prefix_bytes(int positions) const {
    (void)positions;
    return 0;
  }
  // Makes the store `bytes` long (startup; on CUDA device memory). Throws ppx::Error when it does
  // not fit.
  virtual void reserve_prefix_store(size_t bytes) {
    if (bytes > 0) throw Error("this backend has no prompt cache store");
  }
  // Copies the prefix of `slot` (all its steps so far) to store bytes [offset, offset +
  // prefix_bytes(positions)).
  virtual PrefixInfo save_prefix(int slot, size_t offset) {
    (void)slot;
    (void)offset;
    throw Error("this backend has no prompt cache store");
  }
  // Loads a saved prefix into `slot` (open, not yet stepped).
  virtual void load_prefix(int slot, const PrefixInfo& info, size_t offset) {
    (void)slot;
    (void)info;
    (void)offset;
    throw Error("this backend has no prompt cache store");
  }
  // Called once by the thread that will make every other call (the scheduler's), before any:
  // binds that thread to the backend's device.
  virtual void attach_thread() {}
};

// The batch sizes a backend that captures one graph per size (CUDA) makes for `slots` sessions;
// a step of n sessions runs the smallest that holds n, its other rows padding. Powers of two up to
// 64, then every 16 (the batched GEMM takes 64 rows a launch in tiles of 8, and its cost grows with
// the rows: a 95-row step padded to 128 paid for 33 rows of nothing), and `slots` itself.
std::vector<int> batch_buckets(int slots);

}  // namespace ppx
