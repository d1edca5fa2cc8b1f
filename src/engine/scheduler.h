// The frame scheduler: one thread that owns the sessions' LM state (an LmBatch) and runs one
// batched model step for every session with a step ready, back to back while steps are ready.
//
// Sessions reach it through the LmStepper that open() returns: its run() hands the request to the
// scheduler and blocks until the batch step that carries it is done (run_async() returns at once
// and calls back from the scheduler's thread instead), so a session has at most one step in flight
// and gets at most one step per batch step (a client that bursts audio cannot take
// the GPU from the others). Opening, resetting and closing a slot go through the same queue and run
// between batch steps, in the order they were asked for; they allocate nothing on the device.
// The network and session threads never touch the backend's LM themselves.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "engine/job_queue.h"
#include "engine/prompt_cache.h"
#include "engine/step_clock.h"
#include "ppx/conversation.h"
#include "ppx/lm_batch.h"
#include "ppx/lm_gen.h"

namespace ppx {

class LmScheduler {
 public:
  // What one batch step did, for metrics (called on the scheduler thread after each step).
  struct StepInfo {
    int batch = 0;        // sessions stepped
    double ms = 0;        // wall time of the batch step
    int waiting = 0;      // steps queued meanwhile (they run next)
  };
  using StepObserver = std::function<void(const StepInfo&)>;

  // prefill_chunk: prompt positions per prefill job; 0: the batch's prefill_rows(), 1: no prefill
  // (every prompt step a batch step). prompt_cache_bytes: the prompt cache's store (0: no cache;
  // a backend without a store keeps none either). Throws ppx::Error when the store does not fit.
  // step_clock: when given, each batch step is announced there with its expected time (a moving
  // average of the recent steps of its batch size; a size's first step is not announced), for the
  // codec scheduler's encode hold (step_clock.h); it must outlive the scheduler.
  explicit LmScheduler(std::unique_ptr<LmBatch> batch, StepObserver on_step = {}, int prefill_chunk = 0,
                       size_t prompt_cache_bytes = 0, StepClock* step_clock = nullptr);
  ~LmScheduler();  // serves what is queued, then stops
  LmScheduler(const LmScheduler&) = delete;
  LmScheduler& operator=(const LmScheduler&) = delete;

  int slots() const { return slots_; }
  const LmConfig& config() const { return batch_->config(); }
  // A session takes `slot` (see LmBatch::open); the returned stepper closes it when destroyed.
  // Throws what the backend's open() throws (ppx::Error, DeviceError).
  std::unique_ptr<LmStepper> open(int slot, const LmGenConfig& gen, uint64_t seed);

  // Runs the system prompts of `conv`, whose stepper is `stepper` (from open(), not yet stepped),
  // through the prompt cache: a known prompt is loaded into the slot (KV cache, position, random
  // counter) and the generation state, in one job, instead of being replayed; an unknown one is
  // replayed (Conversation::run_system_prompts, `on_step` as there) and then saved, when the cache
  // has room. The session's later tokens are the same either way. Without a cache, or for a
  // stepper of another kind, just the replay. `cached` tells which happened.
  bool run_system_prompts(LmStepper& stepper, Conversation& conv, const SystemPrompt& p,
                          const std::function<bool(int64_t, int64_t)>& on_step = {}, bool* cached = nullptr);
  // The prompt cache, or nullptr when there is none.
  PromptCache* prompt_cache() { return cache_.get(); }

  // Totals since start.
  struct Totals {
    int64_t steps = 0;      // batch steps
    int64_t items = 0;      // session steps in them
    int max_batch = 0;
    int64_t prefills = 0;           // prefill jobs
    int64_t prefill_positions = 0;  // prompt positions in them
    int64_t prefill_deferrals = 0;  // passes that put a prefill job off (live steps late or no time left)
  };
  // System prompts take the time the live sessions leave instead of slowing them: a pass that has
  // live steps runs its prefill job only if none of those steps waited longer than
  // kPrefillMaxStepWaitMs in the queue and the job's estimated time (its positions times the
  // measured time per position) is covered by credit, earned by the time the scheduler waited for
  // work plus a share of each batch step's time (at most kPrefillMaxShare; halved after a pass
  // with a late step, grown back in 25 passes without one), up to kPrefillMaxCreditMs. A pass
  // without steps runs it at once. On a full server prompt starts therefore wait rather than
  // delay everyone's frames.
  static constexpr double kPrefillMaxStepWaitMs = 25;
  static constexpr double kPrefillMaxCreditMs = 100;
  static constexpr double kPrefillMaxShare = 1.0;
  Totals totals();
  // Jobs (steps, slot control, prefill) queued and not yet taken by a pass.
  size_t queued() { return queue_.queued(); }

 private:
  class SlotStepper;
  enum class Kind { kStep, kOpen, kReset, kClose, kPrefill, kSavePrefix, kLoadPrefix };
  struct Job {
    Kind kind = Kind::kStep;
    BatchStep step;
    const StepRequest* prefill = nullptr;  // kPrefill: `prefill_n` requests of step.slot
    int prefill_n = 0;
    std::chrono::steady_clock::time_point queued{};  // kStep: when it was queued
    size_t offset = 0;             // kSavePrefix, kLoadPrefix: the place in the store
    LmBatch::PrefixInfo prefix;    // kSavePrefix: out; kLoadPrefix: in
    const LmGenConfig* gen = nullptr;
    uint64_t seed = 0;
    bool done = false;
    std::exception_ptr error;
    std::function<void()> on_done;  // posted jobs
  };
  void loop();

  std::unique_ptr<LmBatch> batch_;
  StepObserver on_step_;
  int slots_ = 0;
  int prefill_chunk_ = 1;
  std::unique_ptr<PromptCache> cache_;  // nullptr: none
  StepClock* step_clock_ = nullptr;
  JobQueue<Job> queue_{"LM scheduler"};
  Totals totals_;  // under the queue's lock
  std::thread thread_;
};

}  // namespace ppx
