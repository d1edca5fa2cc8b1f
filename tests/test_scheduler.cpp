// The frame scheduler (src/engine/scheduler.h) on the CPU tiny model: a session's tokens are the
// same whether it runs alone or batched beside 63 others that join and leave mid-stream, greedy
// and sampled, with system prompts of 0..14 steps prefilled in chunks; a failing batch step fails
// the sessions in it and nothing else.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <future>
#include <memory>
#include <optional>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "ppx/backend.h"
#include "engine/scheduler.h"
#include "engine/step_clock.h"
#include "ppx/config.h"
#include "ppx/error.h"
#include "ppx/lm.h"
#include "ppx/lm_gen.h"
#include "ppx/safetensors.h"
#include "ppx/weights.h"
#include "scheduler_test_util.h"
#include "test_util.h"

using namespace ppx;
using ppx::test::make_script;
using ppx::test::play;
using ppx::test::Script;

namespace {

struct TinyLm {
  ModelConfig cfg = load_config(test::data("tiny_config_a.json"));
  FileWeights lw{std::make_shared<const SafeTensors>(test::data("lm_tiny_a.safetensors"))};
  std::unique_ptr<ModelBackend> backend = make_cpu_backend(nullptr, std::make_unique<Lm>(*cfg.lm, lw));
};

// `slots` sessions on a batch of as many slots, then `sessions - slots` more that reuse the
// slots others left.
void batched_equals_alone(bool sampling, int slots, int sessions) {
  TinyLm t;
  const int half = t.cfg.lm->n_q / 2;
  std::vector<Script> scripts;
  for (int i = 0; i < sessions; ++i) scripts.push_back(make_script(t.cfg, i, sampling));
  // Alone: a fresh stepper per session, no scheduler.
  std::vector<std::vector<int64_t>> alone(sessions);
  for (int i = 0; i < sessions; ++i) {
    auto st = t.backend->lm_stepper(scripts[i].gen, scripts[i].seed, -1);
    alone[i] = play(*st, scripts[i], half);
    ASSERT_FALSE(alone[i].empty());
  }
  // Batched: the first slots start staggered and end at different lengths; sessions slots.. take
  // the slot of session i - slots as soon as it leaves, while the others are mid-stream.
  LmScheduler sched(t.backend->lm_batch(slots, -1));
  std::vector<std::vector<int64_t>> batched(sessions);
  std::vector<std::thread> threads;
  for (int slot = 0; slot < slots; ++slot) {
    threads.emplace_back([&, slot] {
      std::this_thread::sleep_for(std::chrono::microseconds(200 * (slot % 8)));
      for (int i = slot; i < sessions; i += slots) {
        auto st = sched.open(slot, scripts[i].gen, scripts[i].seed);
        batched[i] = play(*st, scripts[i], half);
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int i = 0; i < sessions; ++i) EXPECT_EQ(batched[i], alone[i]) << "session " << i;
  const auto tot = sched.totals();
  EXPECT_GT(tot.max_batch, 1) << "the scheduler never batched";
  EXPECT_LE(tot.max_batch, slots);
  int64_t want = 0, prompts = 0;
  for (const auto& s : scripts) {
    want += s.prompt_steps + s.steps;
    prompts += s.prompt_steps;
  }
  // Every step that called the model (all but the first of each session: t = 0 makes no call),
  // the prompts' (but the first) through prefill jobs.
  EXPECT_EQ(tot.items + tot.prefill_positions, want - sessions);
  EXPECT_GT(tot.prefill_positions, prompts / 2) << "the prompts were not prefilled";
  EXPECT_GT(tot.prefills, 0);
}

// An LmBatch that forwards to `inner`: the tests below override what they change.
struct ForwardingBatch : LmBatch {
  std::unique_ptr<LmBatch> inner;
  const LmConfig& config() const override { return inner->config(); }
  int slots() const override { return inner->slots(); }
  int depformer_steps() const override { return inner->depformer_steps(); }
  void open(int s, const LmGenConfig& g, uint64_t seed) override { inner->open(s, g, seed); }
  void reset(int s) override { inner->reset(s); }
  void run(const BatchStep* st, int n) override { inner->run(st, n); }
  void prefill(int s, const StepRequest* r, int n) override { inner->prefill(s, r, n); }
  int prefill_rows() const override { return inner->prefill_rows(); }
};

}  // namespace

// The CUDA batch's graph sizes: ascending, the last `slots`, every n in 1..slots held by one with
// at most 15 padding rows above 64 (a power of two below), as before up to 64.
TEST(Scheduler, BatchBucketsHoldEverySizeWithLittlePadding) {
  EXPECT_EQ(ppx::batch_buckets(1), (std::vector<int>{1}));
  EXPECT_EQ(ppx::batch_buckets(5), (std::vector<int>{1, 2, 4, 5}));
  EXPECT_EQ(ppx::batch_buckets(64), (std::vector<int>{1, 2, 4, 8, 16, 32, 64}));
  EXPECT_EQ(ppx::batch_buckets(148), (std::vector<int>{1, 2, 4, 8, 16, 32, 64, 80, 96, 112, 128, 144, 148}));
  for (int slots : {1, 2, 3, 63, 64, 65, 79, 80, 81, 100, 160, 256}) {
    const std::vector<int> b = ppx::batch_buckets(slots);
    ASSERT_FALSE(b.empty());
    EXPECT_EQ(b.back(), slots);
    EXPECT_TRUE(std::is_sorted(b.begin(), b.end()));
    EXPECT_EQ(std::adjacent_find(b.begin(), b.end()), b.end()) << "a size twice";
    for (int n = 1; n <= slots; ++n) {
      const int got = *std::lower_bound(b.begin(), b.end(), n);
      if (n > 64) {
        EXPECT_LT(got - n, 16) << slots << " slots, " << n << " rows";
      } else {
        EXPECT_LT(got, 2 * n) << slots << " slots, " << n << " rows";
      }
    }
  }
}

TEST(Scheduler, GreedyTokensAloneEqualBeside63Others) { batched_equals_alone(false, 64, 80); }

TEST(Scheduler, SampledTokensAloneEqualBeside63Others) { batched_equals_alone(true, 64, 80); }

// The same at 8 slots: what the sanitizer and qemu stages of CI run (64 threads on two cores are
// ~80x slower under ASan, minutes a test).
TEST(Scheduler, GreedyTokensAloneEqualBeside7Others) { batched_equals_alone(false, 8, 12); }

TEST(Scheduler, SampledTokensAloneEqualBeside7Others) { batched_equals_alone(true, 8, 12); }

// A batch whose step throws fails exactly the sessions in it; the scheduler goes on serving.
TEST(Scheduler, AFailedStepFailsItsSessionsOnly) {
  TinyLm t;
  struct Failing : ForwardingBatch {
    bool fail = false;
    int prefill_rows() const override { return 1; }  // the default prefill: its steps go through run()
    void prefill(int s, const StepRequest* r, int n) override { LmBatch::prefill(s, r, n); }
    void run(const BatchStep* st, int n) override {
      if (fail) throw DeviceError("injected");
      inner->run(st, n);
    }
  };
  auto f = std::make_unique<Failing>();
  f->inner = t.backend->lm_batch(2, -1);
  Failing* fp = f.get();
  LmScheduler sched(std::move(f));
  const Script s = make_script(t.cfg, 1, false);
  const int half = t.cfg.lm->n_q / 2;
  auto st = sched.open(0, s.gen, s.seed);
  fp->fail = true;
  EXPECT_THROW(play(*st, s, half), DeviceError);
  fp->fail = false;
  auto st2 = sched.open(1, s.gen, s.seed);
  EXPECT_EQ(play(*st2, s, half), play(*t.backend->lm_stepper(s.gen, s.seed, -1), s, half));
  EXPECT_THROW(sched.open(2, s.gen, s.seed), Error);  // out of range
}

// The step clock (step_clock.h): the first batch step is not announced (no time known yet for its
// size), every later one (of the same size: one session) is, each with its own sequence number and
// an expected end after the step began, and none is in progress between steps.
TEST(Scheduler, StepClockAnnouncesBatchStepsAfterTheFirst) {
  TinyLm t;
  struct Watching : ForwardingBatch {
    StepClock* clock = nullptr;
    std::vector<std::optional<StepClock::Step>> seen;  // scheduler thread, read after the steps
    std::vector<StepClock::Clock::time_point> at;        // when each step ran
    int prefill_rows() const override { return 1; }
    void prefill(int s, const StepRequest* r, int n) override { LmBatch::prefill(s, r, n); }
    void run(const BatchStep* st, int n) override {
      seen.push_back(clock->current());
      at.push_back(StepClock::Clock::now());
      inner->run(st, n);
    }
  };
  StepClock clock;
  auto w = std::make_unique<Watching>();
  w->inner = t.backend->lm_batch(1, -1);
  w->clock = &clock;
  Watching* wp = w.get();
  LmScheduler sched(std::move(w), {}, 0, 0, &clock);
  const Script s = make_script(t.cfg, 1, false);
  auto st = sched.open(0, s.gen, s.seed);
  const int steps = t.cfg.lm->n_q / 2;
  EXPECT_EQ(play(*st, s, steps), play(*t.backend->lm_stepper(s.gen, s.seed, -1), s, steps));
  EXPECT_FALSE(clock.current());  // between steps
  const int n = static_cast<int>(wp->seen.size());  // the script's steps (its delay included)
  ASSERT_GE(n, 2);
  EXPECT_FALSE(wp->seen[0]);
  for (int i = 1; i < n; ++i) {
    ASSERT_TRUE(wp->seen[static_cast<size_t>(i)]) << "step " << i;
    EXPECT_GT(wp->seen[static_cast<size_t>(i)]->seq, i > 1 ? wp->seen[static_cast<size_t>(i - 1)]->seq : 0);
    EXPECT_GT(wp->seen[static_cast<size_t>(i)]->expected_end, wp->at[static_cast<size_t>(i)] - std::chrono::seconds(1));
  }
}

// Prompt prefill takes the time live sessions leave: while their steps wait in the queue longer
// than kPrefillMaxStepWaitMs, prefill jobs are put off (and run once the steps are served in time);
// every session's tokens stay those it gets alone. Deterministic: the first batch step is held
// until a second session's step has waited 100 ms behind it with a prefill job beside it.
TEST(Scheduler, PrefillWaitsWhileLiveStepsAreLate) {
  TinyLm t;
  struct Gated : ForwardingBatch {
    std::promise<void> release;
    std::shared_future<void> gate = release.get_future().share();
    std::atomic<int> runs{0};
    void run(const BatchStep* st, int n) override {
      if (runs++ == 0) gate.wait();
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      inner->run(st, n);
    }
    int prefill_rows() const override { return 4; }
  };
  auto gated = std::make_unique<Gated>();
  gated->inner = t.backend->lm_batch(3, -1);
  Gated* g = gated.get();
  LmScheduler sched(std::move(gated));
  const int half = t.cfg.lm->n_q / 2;
  Script live_a = make_script(t.cfg, 4, true), live_b = make_script(t.cfg, 8, true);
  live_a.prompt_steps = live_b.prompt_steps = 0;
  // The joining session: 4 prompt positions (every stream given), one prefill job.
  const int K = t.cfg.lm->n_q + 1;
  const std::vector<int64_t> tokens(static_cast<size_t>(K), 1);
  const std::vector<uint8_t> given(static_cast<size_t>(K), 1);
  const StepRequest prompt_req{tokens.data(), nullptr, tokens.data(), given.data(), nullptr};
  std::vector<int64_t> out_a, out_b;
  {
    auto sa = sched.open(0, live_a.gen, live_a.seed);
    auto sb = sched.open(1, live_b.gen, live_b.seed);
    auto sj = sched.open(2, live_a.gen, 7);
    LmGen gen_b(*sb, live_b.gen);  // its reset now, not behind the held step
    std::thread ta([&] { out_a = play(*sa, live_a, half); });
    while (g->runs.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    // The first batch step (a's) is held: b's first step and j's prefill job queue behind it.
    std::thread tb([&] { out_b = test::play_on(gen_b, live_b, half); });
    std::thread tj([&] {
      StepResult r;
      for (int i = 0; i < 4; ++i) sj->run(prompt_req, r, nullptr);  // the 4th hands the job over
    });
    // b's step and j's prefill job are queued behind the held step, then wait past the 25 ms.
    test::poll_until([&] { return sched.queued() >= 2; });
    std::this_thread::sleep_for(std::chrono::milliseconds(2 * static_cast<int>(LmScheduler::kPrefillMaxStepWaitMs)));
    g->release.set_value();
    ta.join();
    tb.join();
    tj.join();
  }
  EXPECT_EQ(out_a, play(*t.backend->lm_stepper(live_a.gen, live_a.seed, -1), live_a, half));
  EXPECT_EQ(out_b, play(*t.backend->lm_stepper(live_b.gen, live_b.seed, -1), live_b, half));
  const auto tot = sched.totals();
  EXPECT_GT(tot.prefill_deferrals, 0) << "no prefill job was put off while a live step waited";
  EXPECT_EQ(tot.prefill_positions, 4);
}

// Slot control does not wait for the batch step of its pass: a stepper's reset() returns as soon
// as its pass has reset the slot, while that pass's step still runs (a joining session's calls
// wait for at most the step in progress). Deterministic: every batch step is held until the test
// lets it go.
TEST(Scheduler, SlotControlDoesNotWaitForItsPassBatchStep) {
  TinyLm t;
  struct Held : ForwardingBatch {
    std::mutex mu;
    std::condition_variable cv;
    int runs = 0, allowed = 0;  // run k goes on once allowed > k
    void run(const BatchStep* st, int n) override {
      {
        std::unique_lock<std::mutex> lk(mu);
        const int k = runs++;
        cv.notify_all();
        cv.wait(lk, [&] { return allowed > k; });
      }
      inner->run(st, n);
    }
    void allow(int n) {
      std::lock_guard<std::mutex> lk(mu);
      allowed = n;
      cv.notify_all();
    }
    bool wait_runs(int n) {
      std::unique_lock<std::mutex> lk(mu);
      return cv.wait_for(lk, std::chrono::seconds(20), [&] { return runs >= n; });
    }
  };
  auto held = std::make_unique<Held>();
  held->inner = t.backend->lm_batch(3, -1);
  Held* h = held.get();
  // Declared in the order that lets a failed assertion end the test without waiting for ever or
  // touching what is gone: the callbacks' targets outlive the scheduler, the held steps are let go
  // first (`release`), and the reset in flight ends before the stepper it uses.
  StepResult ra, rb, rc;
  std::promise<void> a_done, b_done, c_done;
  LmScheduler sched(std::move(held));
  const Script s = make_script(t.cfg, 2, false);
  const int half = t.cfg.lm->n_q / 2;
  auto sa = sched.open(0, s.gen, s.seed);
  auto sb = sched.open(1, s.gen, s.seed + 1);
  auto sc = sched.open(2, s.gen, s.seed + 2);
  LmGen ga(*sa, s.gen), gb(*sb, s.gen), gc(*sc, s.gen);
  std::future<void> reset;
  struct Release {
    Held* h;
    ~Release() { h->allow(1 << 30); }
  } release{h};
  for (LmGen* g : {&ga, &gb, &gc}) ASSERT_FALSE(g->step(s.user.data(), nullptr, std::nullopt));  // t = 0: no call
  auto step = [&](LmStepper& st, LmGen& g, StepResult& r, std::promise<void>& done) {
    st.run_async(*g.begin_step(s.user.data() + half, nullptr, std::nullopt), r, [&](std::exception_ptr e) {
      EXPECT_FALSE(e);
      done.set_value();
    });
  };
  // Pass 1: c's step (let through), so that c's reset below has something to undo.
  step(*sc, gc, rc, c_done);
  ASSERT_TRUE(h->wait_runs(1));
  h->allow(1);
  ASSERT_EQ(c_done.get_future().wait_for(std::chrono::seconds(20)), std::future_status::ready);
  gc.end_step(rc);
  // Pass 2: b's step, held.
  step(*sb, gb, rb, b_done);
  ASSERT_TRUE(h->wait_runs(2));
  // Pass 3 will hold a's step and c's reset.
  step(*sa, ga, ra, a_done);
  reset = std::async(std::launch::async, [&] { sc->reset(); });
  test::poll_until([&] { return sched.queued() >= 2; });
  ASSERT_EQ(sched.queued(), 2u);
  h->allow(2);  // pass 2's step ends; pass 3 resets slot 2 and holds at its step
  ASSERT_TRUE(h->wait_runs(3));
  EXPECT_EQ(reset.wait_for(std::chrono::seconds(20)), std::future_status::ready)
      << "reset() waited for the batch step of its pass";
  h->allow(1000);
  EXPECT_EQ(a_done.get_future().wait_for(std::chrono::seconds(20)), std::future_status::ready);
  EXPECT_EQ(b_done.get_future().wait_for(std::chrono::seconds(20)), std::future_status::ready);
  ga.end_step(ra);
  gb.end_step(rb);
  reset.get();
}

// A failed open is its caller's error, and the slot opens again afterwards.
TEST(Scheduler, AFailedOpenIsTheCallersErrorAndTheSlotOpensAgain) {
  TinyLm t;
  struct BadOpen : ForwardingBatch {
    std::atomic<bool> fail{true};
    void open(int s, const LmGenConfig& g, uint64_t seed) override {
      if (fail) throw DeviceError("injected open failure");
      inner->open(s, g, seed);
    }
  };
  auto b = std::make_unique<BadOpen>();
  b->inner = t.backend->lm_batch(1, -1);
  BadOpen* bp = b.get();
  LmScheduler sched(std::move(b));
  Script s = make_script(t.cfg, 3, false);
  s.prompt_steps = 0;
  const int half = t.cfg.lm->n_q / 2;
  EXPECT_THROW(sched.open(0, s.gen, s.seed), DeviceError);
  bp->fail = false;
  auto st = sched.open(0, s.gen, s.seed);
  EXPECT_EQ(play(*st, s, half), play(*t.backend->lm_stepper(s.gen, s.seed, -1), s, half));
}
