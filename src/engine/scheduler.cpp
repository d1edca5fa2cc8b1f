#include "engine/scheduler.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "engine/moving_average.h"
#include "ppx/error.h"

namespace ppx {

std::vector<int> batch_buckets(int slots) {
  std::vector<int> b;
  for (int n = 1; n < slots && n <= 64; n *= 2) b.push_back(n);
  for (int n = 80; n < slots; n += 16) b.push_back(n);
  if (slots >= 1) b.push_back(slots);
  return b;
}

// A session's view of the scheduler: an LmStepper whose calls are jobs of its slot. Prompt steps
// are kept and handed over in chunks (see the header).
class LmScheduler::SlotStepper : public LmStepper {
 public:
  SlotStepper(LmScheduler& s, int slot) : s_(s), slot_(slot) {}
  ~SlotStepper() override {
    kept_.clear();  // the session is gone: its prompt no longer matters
    // Closed without waiting: the job deletes itself once run, and a later open() of the slot is
    // queued behind it.
    auto j = std::make_unique<Job>();
    j->kind = Kind::kClose;
    j->step.slot = slot_;
    try {
      s_.queue_.post_owned(std::move(j));
    } catch (...) {
      // Stopped: the slot's state goes with the scheduler.
    }
  }
  const LmConfig& config() const override { return s_.config(); }
  int depformer_steps() const override { return s_.batch_->depformer_steps(); }
  void reset() override {
    kept_.clear();  // position 0 again: the kept steps would have been undone
    // Nothing has run since the open (LmGen resets its stepper as it starts): the slot is as a
    // reset leaves it, so no job (and no wait).
    if (calls_ == 0 && positions_ == 0) return;
    positions_ = 0;
    Job j;
    j.kind = Kind::kReset;
    j.step.slot = slot_;
    s_.queue_.submit(j);
  }
  void run(const StepRequest& req, StepResult& out, StepLogits* logits) override {
    const LmConfig& c = config();
    const int K = c.n_q + 1;
    ++positions_;
    ++calls_;
    if (s_.prefill_chunk_ > 1 && logits == nullptr && std::all_of(req.provided, req.provided + K, [](uint8_t p) {
          return p != 0;
        })) {
      keep(req);
      // Every stream is provided, so LmGen reads none of the result: give the provided tokens.
      out.text = req.target[0];
      out.audio.assign(c.dep_q, -1);
      for (int st = 0; st < depformer_steps(); ++st) out.audio[st] = req.target[1 + st];
      if (static_cast<int>(kept_.size()) >= s_.prefill_chunk_) flush();
      return;
    }
    flush();
    Job j;
    j.step = BatchStep{slot_, &req, &out, logits};
    j.queued = std::chrono::steady_clock::now();
    s_.queue_.submit(j);
  }
  void run_async(const StepRequest& req, StepResult& out, Done done) override {
    // A live step (not every stream provided): the kept prompt steps were handed over when the
    // prompts ended (flush()); should any be left, they go first, waiting.
    flush();
    ++positions_;
    ++calls_;
    async_.step = BatchStep{slot_, &req, &out, nullptr};
    async_.queued = std::chrono::steady_clock::now();
    s_.queue_.post(async_, [this, done = std::move(done)] { done(async_.error); });
  }

  // Model calls since open or reset (the slot's position), and since open (its random counter).
  int positions() const { return positions_; }
  int64_t calls_since_open() const { return calls_; }
  LmScheduler& scheduler() { return s_; }
  // Hands the kept prompt steps over as a prefill job, waiting for it.
  void flush() {
    if (kept_.empty()) return;
    const std::vector<Kept> kept = std::move(kept_);  // kept_ is empty whatever submit does
    kept_.clear();
    std::vector<StepRequest> reqs(kept.size());
    for (size_t i = 0; i < kept.size(); ++i) {
      const Kept& k = kept[i];
      reqs[i] = StepRequest{k.input.data(), k.embedding.empty() ? nullptr : k.embedding.data(), k.target.data(),
                            k.provided.data(), nullptr};
    }
    Job j;
    j.kind = Kind::kPrefill;
    j.step.slot = slot_;
    j.prefill = reqs.data();
    j.prefill_n = static_cast<int>(reqs.size());
    s_.queue_.submit(j);
  }
  // The prompt cache's copies, as jobs in order with the steps (kept prompt steps go first).
  LmBatch::PrefixInfo save_prefix(size_t offset) {
    flush();
    Job j;
    j.kind = Kind::kSavePrefix;
    j.step.slot = slot_;
    j.offset = offset;
    s_.queue_.submit(j);
    return j.prefix;
  }
  void load_prefix(const LmBatch::PrefixInfo& info, size_t offset) {
    kept_.clear();
    Job j;
    j.kind = Kind::kLoadPrefix;
    j.step.slot = slot_;
    j.offset = offset;
    j.prefix = info;
    s_.queue_.submit(j);
    positions_ = info.positions;
    calls_ = info.positions;
  }

 private:
  // One kept prompt step: its request's arrays, owned.
  struct Kept {
    std::vector<int64_t> input, target;
    std::vector<uint8_t> provided;
    std::vector<float> embedding;  // empty: none
  };
  void keep(const StepRequest& req) {
    const LmConfig& c = config();
    const int K = c.n_q + 1;
    Kept k;
    k.input.assign(req.input, req.input + K);
    k.target.assign(req.target, req.target + K);
    k.provided.assign(req.provided, req.provided + K);
    if (req.embedding) k.embedding.assign(req.embedding, req.embedding + c.dim);
    kept_.push_back(std::move(k));
  }

  LmScheduler& s_;
  int slot_;
  std::vector<Kept> kept_;
  Job async_;  // the posted step in flight
  int positions_ = 0;
  int64_t calls_ = 0;
};

LmScheduler::LmScheduler(std::unique_ptr<LmBatch> batch, StepObserver on_step, int prefill_chunk,
                         size_t prompt_cache_bytes, StepClock* step_clock)
    : batch_(std::move(batch)), on_step_(std::move(on_step)), step_clock_(step_clock) {
  if (!batch_) throw Error("LmScheduler: no LM batch");
  slots_ = batch_->slots();
  prefill_chunk_ = std::max(1, std::min(prefill_chunk > 0 ? prefill_chunk : batch_->prefill_rows(), batch_->prefill_rows()));
  if (prompt_cache_bytes > 0 && batch_->prefix_bytes(1) > 0) {
    batch_->reserve_prefix_store(prompt_cache_bytes);
    cache_ = std::make_unique<PromptCache>(prompt_cache_bytes);
  }
  thread_ = std::thread([this] { loop(); });
}

bool LmScheduler::run_system_prompts(LmStepper& stepper, Conversation& conv, const SystemPrompt& p,
                                     const std::function<bool(int64_t, int64_t)>& on_step, bool* cached) {
  if (cached) *cached = false;
  auto* slot = dynamic_cast<SlotStepper*>(&stepper);
  // Only a slot that has not stepped since it was opened: a prefix carries the random counter of
  // a fresh slot (a reset keeps the counter where it was).
  // The prompt's last kept steps are handed over before this returns, so that the session's
  // first live step (possibly run_async()) does not wait for them.
  const bool ours = slot && &slot->scheduler() == this;
  if (!cache_ || !ours || slot->calls_since_open() != 0) {
    const bool done = conv.run_system_prompts(p, on_step);
    if (done && ours) slot->flush();
    return done;
  }
  conv.check_system_prompts(p);  // the same refusals as a replay, before any lookup
  const LmGenConfig& gen = conv.gen_config();
  const std::string key = prompt_cache_key(p, gen);
  const int64_t total = system_prompt_steps(p, conv.frame_samples(), gen.audio_silence_frame_cnt);
  // A known prompt is loaded; while another session saves this one, it is waited for (the
  // session's own checks go on meanwhile); an unknown one gets its place reserved before the
  // replay, so that sessions arriving with it meanwhile wait for it instead of replaying it too.
  // The model calls (positions) are one fewer than the prompt steps (the first step makes none); a
  // prompt without any is not worth keeping (0: no reservation).
  const int64_t calls = std::min<int64_t>(total - 1, batch_->config().context - 1);
  const size_t bytes = calls > 0 ? batch_->prefix_bytes(static_cast<int>(calls)) : 0;
  PromptCache::Acquired got = cache_->acquire(key, bytes, [&] { return !on_step || on_step(0, total); });
  if (got.hit) {
    const PromptCache::Entry& e = got.lease.entry();
    slot->load_prefix(e.prefix, e.offset);
    conv.restore_prompts(e.gen);
    if (cached) *cached = true;
    return !on_step || on_step(total, total);
  }
  PromptCache::Lease room = std::move(got.lease);
  bool done = false;
  bool abandoned = false;
  try {
    done = conv.run_system_prompts(p, on_step);
    const int positions = slot->positions();
    if (!done || !room || positions <= 0 || positions >= batch_->config().context ||
        batch_->prefix_bytes(positions) > room.entry().bytes) {
      abandoned = true;
      cache_->abandon(room);  // nothing (or nothing that fits) to save: waiting sessions replay
      if (done) slot->flush();
      return done;
    }
    const LmBatch::PrefixInfo info = slot->save_prefix(room.entry().offset);
    cache_->commit(room, info, conv.lm_gen().state());
  } catch (...) {
    if (!abandoned) cache_->abandon(room);
    throw;
  }
  return true;
}

LmScheduler::~LmScheduler() {
  queue_.stop();
  thread_.join();
}

std::unique_ptr<LmStepper> LmScheduler::open(int slot, const LmGenConfig& gen, uint64_t seed) {
  if (slot < 0 || slot >= slots_) throw Error("LM slot " + std::to_string(slot) + " out of range");
  // Waited for (at most the batch step in progress: slot control is finished before its pass's
  // step). Not waiting was tried: a client that connects and leaves at once then started its
  // prompt replay before its leaving was seen, and that work delayed the live sessions on a CPU
  // server (SoakTest.BesideChurnIdleConnectionsAndBadVoiceNames).
  Job j;
  j.kind = Kind::kOpen;
  j.step.slot = slot;
  j.gen = &gen;
  j.seed = seed;
  queue_.submit(j);
  return std::make_unique<SlotStepper>(*this, slot);
}

LmScheduler::Totals LmScheduler::totals() {
  return queue_.locked([&] { return totals_; });
}

void LmScheduler::loop() {
  // A thread that cannot use the device fails every job with that error, so sessions see why.
  std::exception_ptr attach_error;
  try {
    batch_->attach_thread();
  } catch (...) {
    attach_error = std::current_exception();
  }
  std::vector<Job*> jobs;
  std::vector<BatchStep> steps;
  std::vector<Job*> step_jobs, later, control;
  std::vector<char> busy(static_cast<size_t>(slots_), 0);

  // Prefill's share (see kPrefillMaxStepWaitMs): credit that prefill jobs beside live steps
  // spend, earned by the time this thread waited for work and by a share of the batch steps' time;
  // the share grows while the live steps are served in time and halves when one was late (so it
  // settles at what the device has to spare). A job runs when the credit covers its estimated time
  // (its positions times the measured time per position).
  using Clock = std::chrono::steady_clock;
  double credit_ms = 0, ms_per_position = 0, share = kPrefillMaxShare / 2;
  // Per batch size, a moving average of its steps' time: step_clock_'s expectation (a size not yet
  // seen is not announced; one average over all sizes would overestimate the smaller steps of a
  // server whose batch sizes alternate, and a step that ends before its announced end costs the
  // encodes held for it that step).
  std::vector<double> step_ms_avg(static_cast<size_t>(slots_) + 1, 0);
  auto t_wait = Clock::now();
  while (queue_.take(jobs)) {
    credit_ms = std::min(kPrefillMaxCreditMs,
                         credit_ms + std::chrono::duration<double, std::milli>(Clock::now() - t_wait).count());
    // Slot control first, in the order asked (a session has one job at a time, so a slot's open
    // always precedes its first step). Then one batch step for every step job.
    steps.clear();
    step_jobs.clear();
    Job* prefill = nullptr;  // one prefill job per pass, after the batch step
    later.clear();
    for (Job* j : jobs) {
      if (attach_error) {
        j->error = attach_error;
        continue;
      }
      if (j->kind == Kind::kPrefill) {
        if (prefill)
          later.push_back(j);
        else
          prefill = j;
        continue;
      }
      if (j->kind == Kind::kStep) {
        const int s = j->step.slot;
        if (s < 0 || s >= slots_ || busy[static_cast<size_t>(s)]) {
          j->error = std::make_exception_ptr(Error("LM slot " + std::to_string(s) + " stepped twice in one batch"));
          continue;
        }
        busy[static_cast<size_t>(s)] = 1;
        steps.push_back(j->step);
        step_jobs.push_back(j);
        continue;
      }
      control.push_back(j);
      try {
        switch (j->kind) {
          case Kind::kOpen: batch_->open(j->step.slot, *j->gen, j->seed); break;
          case Kind::kReset: batch_->reset(j->step.slot); break;
          case Kind::kClose: batch_->close(j->step.slot); break;
          case Kind::kSavePrefix: j->prefix = batch_->save_prefix(j->step.slot, j->offset); break;
          case Kind::kLoadPrefix: batch_->load_prefix(j->step.slot, j->prefix, j->offset); break;
          case Kind::kStep:
          case Kind::kPrefill: break;  // taken apart above
        }
      } catch (...) {
        j->error = std::current_exception();
      }
    }
    // Slot control is done: its callers go on now, not after the batch step (a joining session's
    // open and prompt-cache load each wait for at most the step in progress, not also this one).
    if (!control.empty()) {
      queue_.finish(control, {});
      std::erase_if(jobs, [&](Job* j) { return std::find(control.begin(), control.end(), j) != control.end(); });
      control.clear();
    }
    // Prefill beside live steps only while they are served in time and within the time they left
    // (see kPrefillMaxStepWaitMs). Every pass with steps tells whether they were: the share moves.
    bool deferred = false;
    if (!step_jobs.empty()) {
      auto oldest = step_jobs.front()->queued;
      for (const Job* j : step_jobs) oldest = std::min(oldest, j->queued);
      const bool late = std::chrono::duration<double, std::milli>(Clock::now() - oldest).count() > kPrefillMaxStepWaitMs;
      share = late ? share / 2 : std::min(kPrefillMaxShare, share + kPrefillMaxShare / 25);
      // (A job estimated above the credit's cap runs once the credit is full.)
      if (prefill && (late || credit_ms < std::min(kPrefillMaxCreditMs, ms_per_position * prefill->prefill_n))) {
        later.insert(later.begin(), prefill);
        prefill = nullptr;
        deferred = true;
      }
    }
    double ms = 0;
    if (!steps.empty()) {
      const auto t0 = std::chrono::steady_clock::now();
      double& avg = step_ms_avg[steps.size()];
      if (step_clock_) step_clock_->begin(avg);
      try {
        batch_->run(steps.data(), static_cast<int>(steps.size()));
      } catch (...) {
        // A failed batch step fails every session in it (a device error is the device's, not one
        // session's).
        for (Job* j : step_jobs) j->error = std::current_exception();
      }
      if (step_clock_) step_clock_->end();
      ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      avg = moving_average(avg, ms, 0.25);
      credit_ms = std::min(kPrefillMaxCreditMs, credit_ms + share * ms);
      for (const BatchStep& s : steps) busy[static_cast<size_t>(s.slot)] = 0;
    }
    int64_t prefilled = 0;
    if (prefill) {
      const auto t0 = Clock::now();
      try {
        batch_->prefill(prefill->step.slot, prefill->prefill, prefill->prefill_n);
        prefilled = prefill->prefill_n;
      } catch (...) {
        prefill->error = std::current_exception();
      }
      const double pms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      credit_ms = std::max(0.0, credit_ms - pms);
      if (prefilled > 0) {
        const double per = pms / static_cast<double>(prefilled);
        ms_per_position = moving_average(ms_per_position, per, 0.2);
      }
    }
    // Prefill jobs past the first stay queued (at the front) for the next passes.
    std::erase_if(jobs, [&](Job* j) { return std::find(later.begin(), later.end(), j) != later.end(); });
    const int waiting = static_cast<int>(queue_.finish(jobs, later, [&](size_t) {
      if (prefill) {
        ++totals_.prefills;
        totals_.prefill_positions += prefilled;
      }
      totals_.prefill_deferrals += deferred ? 1 : 0;
      if (!steps.empty()) {
        ++totals_.steps;
        totals_.items += static_cast<int64_t>(steps.size());
        totals_.max_batch = std::max(totals_.max_batch, static_cast<int>(steps.size()));
      }
    }));
    if (!steps.empty() && on_step_) {
      try {
        on_step_(StepInfo{static_cast<int>(steps.size()), ms, waiting});
      } catch (...) {
        // Metrics must not stop the scheduler.
      }
    }
    t_wait = Clock::now();
  }
}

}  // namespace ppx
