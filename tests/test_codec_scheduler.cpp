// The codec scheduler (src/engine/codec_scheduler.h) on the CPU tiny Mimi: batched sessions equal
// sessions alone, bad codes and slots are clear errors that leave the others running.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "codec_test_util.h"
#include "ppx/backend.h"
#include "engine/codec_scheduler.h"
#include "engine/step_clock.h"
#include "ppx/config.h"
#include "ppx/error.h"
#include "ppx/mimi.h"
#include "ppx/safetensors.h"
#include "ppx/weights.h"
#include "test_util.h"

using namespace ppx;

namespace {

struct TinyMimi {
  ModelConfig cfg = load_config(test::data("tiny_config_a.json"));
  FileWeights mw{std::make_shared<const SafeTensors>(test::data("mimi_tiny_a.safetensors"))};
  std::unique_ptr<ModelBackend> backend = make_cpu_backend(std::make_unique<Mimi>(cfg.mimi, mw), nullptr);
};

TEST(CodecScheduler, BatchedEqualsAloneOnCpu) {
  TinyMimi t;
  test::codec_batched_equals_alone(*t.backend, 6);
}

TEST(CodecScheduler, BadCodesAndSlotsAreClearErrors) {
  TinyMimi t;
  CodecScheduler sched(t.backend->codec_batch(2));
  EXPECT_THROW(sched.open(2), Error);
  EXPECT_THROW(sched.open(-1), Error);
  auto a = sched.open(0);
  const int fs = a->frame_samples(), nq = a->num_codebooks();
  std::vector<int32_t> bad(nq, t.cfg.mimi.quantizer.bins);  // one past the last code
  std::vector<float> pcm(fs, 0.1f);
  std::vector<int32_t> codes(nq);
  EXPECT_THROW(a->decode(bad.data(), pcm.data()), Error);
  // The stream and the scheduler go on.
  a->encode(pcm.data(), codes.data());
  for (int32_t c : codes) EXPECT_TRUE(c >= 0 && c < t.cfg.mimi.quantizer.bins);
  a->decode(codes.data(), pcm.data());
  EXPECT_EQ(sched.totals().encodes, 1);
}

// Counts the completions of async codec calls (each must succeed) and waits for them.
struct Completions {
  std::mutex mu;
  std::condition_variable cv;
  int n = 0;
  CodecStream::Done callback() {
    return [this](std::exception_ptr e) {
      EXPECT_FALSE(e);
      std::lock_guard<std::mutex> lk(mu);
      ++n;
      cv.notify_all();
    };
  }
  bool wait_for(int want) {
    std::unique_lock<std::mutex> lk(mu);
    return cv.wait_for(lk, std::chrono::seconds(20), [&] { return n == want; });
  }
};

// The gather hook (CodecScheduler's gather_ms): with 8 streams open, a pass that found one encode
// waits for a second (a quarter of 8) before it runs, so two encodes posted one after the other run
// as one batched call; the codes are those of the blocking calls without the hook.
TEST(CodecScheduler, GatherMergesPassesAndKeepsTheCodes) {
  TinyMimi t;
  CodecScheduler plain(t.backend->codec_batch(8));
  CodecScheduler gathering(t.backend->codec_batch(8), {}, /*gather_ms=*/1000);
  std::vector<std::unique_ptr<CodecStream>> a, b;
  for (int i = 0; i < 8; ++i) {
    a.push_back(plain.open(i));
    b.push_back(gathering.open(i));
  }
  const int fs = a[0]->frame_samples(), nq = a[0]->num_codebooks();
  std::vector<float> pcm0(static_cast<size_t>(fs)), pcm1(static_cast<size_t>(fs));
  for (int n = 0; n < fs; ++n) {
    pcm0[static_cast<size_t>(n)] = 0.3f * std::sin(0.02f * static_cast<float>(n));
    pcm1[static_cast<size_t>(n)] = 0.2f * std::sin(0.05f * static_cast<float>(n));
  }
  std::vector<int32_t> want0(static_cast<size_t>(nq)), want1(want0.size()), got0(want0.size()), got1(want0.size());
  a[0]->encode(pcm0.data(), want0.data());
  a[1]->encode(pcm1.data(), want1.data());
  Completions done;
  const CodecStream::Done count = done.callback();
  b[0]->encode_async(pcm0.data(), got0.data(), count);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the pass has its first job and waits
  b[1]->encode_async(pcm1.data(), got1.data(), count);
  ASSERT_TRUE(done.wait_for(2));
  EXPECT_EQ(got0, want0);
  EXPECT_EQ(got1, want1);
  EXPECT_EQ(gathering.totals().passes, 1);
  EXPECT_EQ(gathering.totals().max_encodes, 2);
  EXPECT_THROW(CodecScheduler(t.backend->codec_batch(1), {}, -1), Error);
}

TEST(StepClock, AnnouncesOnlyKnownSteps) {
  StepClock c;
  EXPECT_FALSE(c.current());
  c.end();  // nothing announced: no-op
  EXPECT_FALSE(c.current());
  c.begin(0);  // unknown length: not announced
  EXPECT_FALSE(c.current());
  const auto before = StepClock::Clock::now();
  c.begin(50);
  const auto a = c.current();
  ASSERT_TRUE(a);
  EXPECT_GE(a->expected_end, before + std::chrono::milliseconds(50));
  EXPECT_LE(a->expected_end, StepClock::Clock::now() + std::chrono::milliseconds(50));
  c.end();
  EXPECT_FALSE(c.current());
  c.begin(10);
  ASSERT_TRUE(c.current());
  EXPECT_NE(c.current()->seq, a->seq);
}

// The encode hold (CodecScheduler's hold_for): encodes taken while an announced LM step runs wait
// until shortly before its expected end and run as one pass, with the codes of blocking calls
// without the hold; a decode, the step's end or no step at all ends or skips the wait.
TEST(CodecScheduler, HoldRunsEncodesBeforeTheStepEnds) {
  using Clock = StepClock::Clock;
  const auto ms_since = [](Clock::time_point t) {
    return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
  };
  TinyMimi t;
  CodecScheduler plain(t.backend->codec_batch(4));
  StepClock clock;
  CodecScheduler holding(t.backend->codec_batch(4), {}, 0, &clock);
  std::vector<std::unique_ptr<CodecStream>> a, b;
  for (int i = 0; i < 4; ++i) {
    a.push_back(plain.open(i));
    b.push_back(holding.open(i));
  }
  const int fs = a[0]->frame_samples(), nq = a[0]->num_codebooks();
  std::vector<std::vector<float>> pcm(4, std::vector<float>(static_cast<size_t>(fs)));
  for (int i = 0; i < 4; ++i)
    for (int n = 0; n < fs; ++n)
      pcm[static_cast<size_t>(i)][static_cast<size_t>(n)] =
          0.3f * std::sin(0.01f * static_cast<float>((i + 1) * n));
  std::vector<std::vector<int32_t>> want(4, std::vector<int32_t>(static_cast<size_t>(nq))), got = want;
  for (int i = 0; i < 4; ++i) a[static_cast<size_t>(i)]->encode(pcm[static_cast<size_t>(i)].data(), want[static_cast<size_t>(i)].data());

  // (Each part waits until the scheduler has taken its encode before it goes on: on a slow machine
  // (ASan, qemu) the thread may take a while to get there.)
  // 1. Two encodes during a step expected to last 1.5 s: held until about its end, one pass.
  Completions done;
  const CodecStream::Done count = done.callback();
  const auto t0 = Clock::now();
  clock.begin(1500);
  b[0]->encode_async(pcm[0].data(), got[0].data(), count);
  test::poll_until([&] { return holding.queued() == 0; });
  b[1]->encode_async(pcm[1].data(), got[1].data(), count);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  {
    std::lock_guard<std::mutex> lk(done.mu);
    EXPECT_EQ(done.n, 0) << "an encode ran " << ms_since(t0) << " ms into a 1500 ms step";
  }
  ASSERT_TRUE(done.wait_for(2));
  EXPECT_GE(ms_since(t0), 1450);  // the lead: 1 ms plus 1.25x the encode passes so far (none)
  EXPECT_EQ(got[0], want[0]);
  EXPECT_EQ(got[1], want[1]);
  CodecScheduler::Totals tot = holding.totals();
  EXPECT_EQ(tot.passes, 1);
  EXPECT_EQ(tot.max_encodes, 2);
  EXPECT_EQ(tot.held_passes, 1);
  EXPECT_GE(tot.held_ms, 250);

  // 2. A decode ends the wait: the held encode and the decode run at once, in one pass.
  clock.end();
  clock.begin(10000);
  const auto t1 = Clock::now();
  std::vector<float> out(static_cast<size_t>(fs));
  b[2]->encode_async(pcm[2].data(), got[2].data(), count);
  test::poll_until([&] { return holding.queued() == 0; });
  b[3]->decode_async(want[3].data(), out.data(), count);
  ASSERT_TRUE(done.wait_for(4));
  EXPECT_LT(ms_since(t1), 5000);
  EXPECT_EQ(got[2], want[2]);
  tot = holding.totals();
  EXPECT_EQ(tot.passes, 2);
  EXPECT_EQ(tot.held_passes, 2);

  // 3. The step's end ends the wait (if the scheduler had not begun it yet, there is none).
  const auto t2 = Clock::now();
  b[3]->encode_async(pcm[3].data(), got[3].data(), count);
  test::poll_until([&] { return holding.queued() == 0; });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  clock.end();
  ASSERT_TRUE(done.wait_for(5));
  EXPECT_LT(ms_since(t2), 5000);
  EXPECT_EQ(got[3], want[3]);

  // 4. No step announced: no wait, no held pass.
  const int64_t held = holding.totals().held_passes;
  const auto t3 = Clock::now();
  b[0]->encode_async(pcm[0].data(), got[0].data(), count);
  ASSERT_TRUE(done.wait_for(6));
  EXPECT_LT(ms_since(t3), 5000);
  EXPECT_EQ(holding.totals().held_passes, held);
}

}  // namespace

namespace {

// A codec batch that records its calls (kind, slot) and holds its first call until released.
struct Recording : CodecBatch {
  std::unique_ptr<CodecBatch> inner;
  std::mutex mu;
  std::condition_variable cv;
  bool held = false, released = false;
  std::vector<std::pair<char, int>> calls;  // 'r', 'e', 'd' and the slot
  int slots() const override { return inner->slots(); }
  int frame_samples() const override { return inner->frame_samples(); }
  int num_codebooks() const override { return inner->num_codebooks(); }
  int codebook_size() const override { return inner->codebook_size(); }
  void hold_first() {
    std::unique_lock<std::mutex> lk(mu);
    if (!held) {
      held = true;
      cv.notify_all();
      cv.wait(lk, [&] { return released; });
    }
  }
  void record(char k, const int* slots, int n) {
    std::lock_guard<std::mutex> lk(mu);
    for (int i = 0; i < n; ++i) calls.emplace_back(k, slots[i]);
  }
  void reset(int slot) override {
    record('r', &slot, 1);
    inner->reset(slot);
  }
  void encode(const int* slots, int n, const float* pcm, int32_t* codes) override {
    hold_first();
    record('e', slots, n);
    inner->encode(slots, n, pcm, codes);
  }
  void decode(const int* slots, int n, const int32_t* codes, float* pcm) override {
    hold_first();
    record('d', slots, n);
    inner->decode(slots, n, codes, pcm);
  }
};

}  // namespace

// A slot's calls run in the order asked, also when a reset (posted, not waited for) and another
// call of the slot meet a pass that already carries one of its calls: a decode, a reset and an
// encode of one slot, queued together, run as decode, reset, encode.
TEST(CodecScheduler, ASlotsCallsRunInTheOrderAsked) {
  TinyMimi t;
  auto rec = std::make_unique<Recording>();
  rec->inner = t.backend->codec_batch(2);
  Recording* r = rec.get();
  CodecScheduler sched(std::move(rec));
  auto other = sched.open(1);
  auto a1 = sched.open(0), a2 = sched.open(0);  // two streams of slot 0, as a misbehaving caller
  const int fs = other->frame_samples(), nq = other->num_codebooks();
  std::vector<float> pcm(static_cast<size_t>(fs), 0.1f), out(static_cast<size_t>(fs));
  std::vector<int32_t> codes_b(static_cast<size_t>(nq)), codes_a(static_cast<size_t>(nq), 1), codes_a2(static_cast<size_t>(nq));
  Completions done;
  const CodecStream::Done count = done.callback();
  other->encode_async(pcm.data(), codes_b.data(), count);  // pass 1, held
  {
    std::unique_lock<std::mutex> lk(r->mu);
    ASSERT_TRUE(r->cv.wait_for(lk, std::chrono::seconds(20), [&] { return r->held; }));
  }
  a1->decode_async(codes_a.data(), out.data(), count);
  a2->reset();
  a2->encode_async(pcm.data(), codes_a2.data(), count);
  test::poll_until([&] { return sched.queued() >= 3; });
  EXPECT_EQ(sched.queued(), 3u);
  {
    std::lock_guard<std::mutex> lk(r->mu);
    r->released = true;
    r->cv.notify_all();
  }
  ASSERT_TRUE(done.wait_for(3));
  std::vector<std::pair<char, int>> slot0;
  {
    std::lock_guard<std::mutex> rl(r->mu);
    for (const auto& c : r->calls)
      if (c.second == 0) slot0.push_back(c);
  }
  // The opens' resets of slot 0 first, then the three calls as asked.
  ASSERT_GE(slot0.size(), 3u);
  const std::vector<std::pair<char, int>> tail(slot0.end() - 3, slot0.end());
  EXPECT_EQ(tail, (std::vector<std::pair<char, int>>{{'d', 0}, {'r', 0}, {'e', 0}}));
}

// The gather hook never holds a pass without frames: the resets that open() posts run at once even
// when every pass may wait 1 s for more frames (a session's open must not wait for other sessions'
// audio).
TEST(CodecScheduler, GatherDoesNotHoldResets) {
  TinyMimi t;
  auto rec = std::make_unique<Recording>();
  rec->inner = t.backend->codec_batch(8);
  rec->released = true;  // no call is held
  Recording* r = rec.get();
  CodecScheduler sched(std::move(rec), {}, /*gather_ms=*/1000);
  const auto resets = [&] {
    std::lock_guard<std::mutex> lk(r->mu);
    return static_cast<int>(std::count_if(r->calls.begin(), r->calls.end(), [](const auto& c) { return c.first == 'r'; }));
  };
  // One open at a time, each reset alone in its pass: from the 8th stream on, a pass that counted
  // resets would wait for a second job (a quarter of 8).
  std::vector<std::unique_ptr<CodecStream>> streams;
  for (int i = 0; i < 8; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    streams.push_back(sched.open(i));
    test::poll_until([&] { return resets() == i + 1; });
    EXPECT_EQ(resets(), i + 1);
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0.9) << "open " << i;
  }
  EXPECT_EQ(sched.totals().passes, 0);  // passes count frames only
}
