// The event-driven conversation step the server's live sessions run on (JobQueue::post,
// Conversation::step_async through the codec and LM schedulers, on the CPU tiny model): sessions
// driven by completion callbacks alone, with no thread of their own, give exactly the tokens and
// audio of blocking sessions run alone; errors reach the callback.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <functional>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/codec_scheduler.h"
#include "engine/job_queue.h"
#include "engine/scheduler.h"
#include "ppx/backend.h"
#include "ppx/config.h"
#include "ppx/conversation.h"
#include "ppx/error.h"
#include "ppx/error_text.h"
#include "ppx/lm.h"
#include "ppx/mimi.h"
#include "ppx/safetensors.h"
#include "ppx/weights.h"
#include "test_util.h"
#include "tiny_model_util.h"

using namespace ppx;

namespace {

struct TestJob {
  int value = 0;
  bool done = false;
  std::exception_ptr error;
  std::function<void()> on_done;
};

// A worker that runs every pass's jobs (a value < 0 fails) and finishes them.
void serve(JobQueue<TestJob>& q) {
  std::vector<TestJob*> jobs;
  while (q.take(jobs)) {
    for (TestJob* j : jobs)
      if (j->value < 0) j->error = std::make_exception_ptr(Error("negative"));
    q.finish(jobs, {});
  }
}

TEST(JobQueue, PostedJobsCallBackOnTheWorkerAndMayFreeThemselves) {
  JobQueue<TestJob> q("test queue");
  std::thread worker([&] { serve(q); });
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int> seen;
  std::vector<std::thread::id> threads;
  int failed = 0;
  for (int i = 0; i < 5; ++i) {
    auto* j = new TestJob;
    j->value = i == 3 ? -1 : i;
    q.post(*j, [&, j] {
      std::lock_guard<std::mutex> lk(mu);
      seen.push_back(j->value);
      threads.push_back(std::this_thread::get_id());
      failed += j->error ? 1 : 0;
      delete j;  // allowed: the queue no longer touches it
      cv.notify_all();
    });
  }
  TestJob sync;  // a blocking submit beside posted jobs
  sync.value = 7;
  q.submit(sync);
  EXPECT_TRUE(sync.done);
  {
    std::unique_lock<std::mutex> lk(mu);
    ASSERT_TRUE(cv.wait_for(lk, std::chrono::seconds(10), [&] { return seen.size() == 5; }));
  }
  EXPECT_EQ(seen, (std::vector<int>{0, 1, 2, -1, 4}));  // in the order posted
  EXPECT_EQ(failed, 1);
  for (auto id : threads) EXPECT_EQ(id, worker.get_id());
  q.stop();
  worker.join();
  TestJob late;
  EXPECT_THROW(q.post(late, [] {}), Error);
  EXPECT_THROW(q.submit(late), Error);
}

using test::TinyModel;

// Session i's input: a tone and a little noise, different per session.
std::vector<float> session_audio(int i, int frames, int fs) {
  std::vector<float> x(static_cast<size_t>(frames) * fs);
  uint32_t r = 12345u + 977u * static_cast<uint32_t>(i);
  for (size_t n = 0; n < x.size(); ++n) {
    r = r * 1664525u + 1013904223u;
    const float noise = static_cast<float>(r >> 8) / 16777216.f - 0.5f;
    x[n] = 0.3f * std::sin(0.01f * static_cast<float>(n) * (1.f + 0.2f * static_cast<float>(i))) + 0.05f * noise;
  }
  return x;
}

struct Output {
  std::vector<int64_t> tokens;
  std::vector<float> pcm;
};

void append(Output& o, const FrameOut& f) {
  o.tokens.insert(o.tokens.end(), f.tokens.begin(), f.tokens.end());
  o.pcm.insert(o.pcm.end(), f.pcm.begin(), f.pcm.end());
}

SystemPrompt short_prompt(int i) {
  SystemPrompt p;
  for (int k = 0; k < 3 + i % 5; ++k) p.text_tokens.push_back(5 + (i * 13 + k * 7) % 50);
  return p;
}

// A codec stream that hands every call to `inner` (the tests' wrappers override what they change).
struct Forwarding : CodecStream {
  std::unique_ptr<CodecStream> inner;
  int frame_samples() const override { return inner->frame_samples(); }
  int num_codebooks() const override { return inner->num_codebooks(); }
  int codebook_size() const override { return inner->codebook_size(); }
  void reset() override { inner->reset(); }
  void encode(const float* pcm, int32_t* codes) override { inner->encode(pcm, codes); }
  void decode(const int32_t* codes, float* pcm) override { inner->decode(codes, pcm); }
  void encode_async(const float* pcm, int32_t* codes, Done done) override { inner->encode_async(pcm, codes, done); }
  void decode_async(const int32_t* codes, float* pcm, Done done) override { inner->decode_async(codes, pcm, done); }
};

// One session that steps itself from its own completion callbacks, with up to `depth` frames in
// flight (Conversation pipelines them).
struct ChainedSession {
  std::unique_ptr<CodecStream> codec;
  std::unique_ptr<LmStepper> stepper;
  std::unique_ptr<Conversation> conv;
  std::vector<float> audio;
  int fs = 0, frames = 0, depth = 1;
  int issued = 0, completed = 0;  // issued: under mu (step() runs from callbacks and the starter)
  int overlapped = 0;             // completions with a later frame still in flight
  std::mutex mu;
  Output out;
  std::exception_ptr error;
  std::function<void()> ended;

  // Frame 0 only: the others are given from callbacks, so the order frames take `k` is the order
  // the conversation gets them. (The starter giving frame 1 while frame 0's callback gives frame 2
  // could swap them: a thread preempted between taking its k and step_async.) Frame 0's callback
  // gives frames 1 and 2 itself, and runs on the codec's or the LM's thread, which frame 1 needs,
  // so no other callback gives a frame meanwhile; after that, frame k's callback gives frame k + 2
  // only once frame k + 1 has been given.
  void start() { step(); }
  void step() {
    int k = 0;
    {
      std::lock_guard<std::mutex> lk(mu);
      if (issued == frames || error) return;
      k = issued++;
    }
    conv->step_async(audio.data() + static_cast<size_t>(k) * fs, [this, k](std::optional<FrameOut> f, std::exception_ptr e) {
      bool end = false;
      {
        std::lock_guard<std::mutex> lk(mu);
        EXPECT_EQ(k, completed) << "frames completed out of order";
        ++completed;
        if (issued > completed) ++overlapped;
        if (e && !error) error = e;
        if (!error && f) append(out, *f);
        // The session ends with its last frame back (nothing of it in flight any more).
        end = completed == issued && (error || completed == frames);
      }
      if (end) return ended();
      step();  // from the scheduler's thread: no thread of the session's own
      if (k == 0)
        for (int i = 1; i < depth; ++i) step();
    });
  }
};

// With `depth` frames of each session in flight (1: one at a time; Conversation::kMaxFramesInFlight:
// pipelined, a frame's encode and step overlapping the previous one's decode).
void callback_driven_sessions_equal_blocking_ones_alone(int depth) {
  TinyModel t;
  const LmGenConfig gen = *t.cfg.lm_gen;
  constexpr int kSessions = 12, kFrames = 14;
  const int fs = t.backend->codec_stream(0)->frame_samples();
  std::vector<Output> alone(kSessions);
  for (int i = 0; i < kSessions; ++i) {
    auto codec = t.backend->codec_stream(0);
    codec->reset();
    auto st = t.backend->lm_stepper(gen, 100 + i, -1);
    Conversation conv(*codec, *st, gen);
    ASSERT_TRUE(conv.run_system_prompts(short_prompt(i)));
    const std::vector<float> audio = session_audio(i, kFrames, fs);
    for (int k = 0; k < kFrames; ++k)
      if (auto f = conv.step(audio.data() + static_cast<size_t>(k) * fs)) append(alone[i], *f);
    ASSERT_FALSE(alone[i].tokens.empty());
  }
  CodecScheduler codec(t.backend->codec_batch(kSessions));
  LmScheduler lm(t.backend->lm_batch(kSessions, -1));
  std::vector<ChainedSession> s(kSessions);
  std::mutex mu;
  std::condition_variable cv;
  int ended = 0;
  for (int i = 0; i < kSessions; ++i) {
    ChainedSession& c = s[i];
    c.codec = codec.open(i);
    c.stepper = lm.open(i, gen, 100 + i);
    c.conv = std::make_unique<Conversation>(*c.codec, *c.stepper, gen);
    ASSERT_TRUE(lm.run_system_prompts(*c.stepper, *c.conv, short_prompt(i)));
    c.audio = session_audio(i, kFrames, fs);
    c.fs = fs;
    c.frames = kFrames;
    c.depth = depth;
    c.ended = [&] {
      std::lock_guard<std::mutex> lk(mu);
      ++ended;
      cv.notify_all();
    };
  }
  for (auto& c : s) c.start();  // every session starts; from here on callbacks drive them
  {
    std::unique_lock<std::mutex> lk(mu);
    ASSERT_TRUE(cv.wait_for(lk, std::chrono::seconds(60), [&] { return ended == kSessions; }));
  }
  for (int i = 0; i < kSessions; ++i) {
    if (s[i].error) std::rethrow_exception(s[i].error);
    EXPECT_EQ(s[i].out.tokens, alone[i].tokens) << "session " << i;
    EXPECT_EQ(s[i].out.pcm, alone[i].pcm) << "session " << i;
  }
  EXPECT_NE(alone[0].tokens, alone[1].tokens);
  EXPECT_GT(lm.totals().max_batch, 1) << "the scheduler never batched";
  EXPECT_GT(codec.totals().max_encodes, 1);
  int overlapped = 0;
  for (auto& c : s) overlapped += c.overlapped;
  if (depth == 1) {
    EXPECT_EQ(overlapped, 0);
  } else {
    EXPECT_GT(overlapped, kSessions * (kFrames - depth) / 2) << "the frames did not overlap";
  }
}

TEST(SessionLoop, CallbackDrivenSessionsEqualBlockingOnesAlone) { callback_driven_sessions_equal_blocking_ones_alone(1); }

TEST(SessionLoop, PipelinedSessionsEqualBlockingOnesAlone) {
  ASSERT_GE(Conversation::kMaxFramesInFlight, 2);
  callback_driven_sessions_equal_blocking_ones_alone(Conversation::kMaxFramesInFlight);
}

// A frame past the pipeline's depth is refused at once, and nothing is lost: the frames in flight
// complete.
TEST(SessionLoop, AFrameBeyondThePipelineIsRefused) {
  TinyModel t;
  const LmGenConfig gen = *t.cfg.lm_gen;
  // The scheduler's codec stream, with its encodes held back until release(): nothing completes
  // while the frames are given.
  struct Gated : Forwarding {
    std::mutex m;
    bool open = false;
    std::vector<std::function<void()>> held;
    void encode_async(const float* pcm, int32_t* codes, Done done) override {
      {
        std::lock_guard<std::mutex> lk(m);
        if (!open) {
          held.push_back([this, pcm, codes, done] { inner->encode_async(pcm, codes, done); });
          return;
        }
      }
      inner->encode_async(pcm, codes, std::move(done));
    }
    void release() {
      std::vector<std::function<void()>> h;
      {
        std::lock_guard<std::mutex> lk(m);
        open = true;
        h.swap(held);
      }
      for (auto& f : h) f();
    }
  };
  CodecScheduler codec(t.backend->codec_batch(1));
  LmScheduler lm(t.backend->lm_batch(1, -1));
  Gated cs;
  cs.inner = codec.open(0);
  auto st = lm.open(0, gen, 7);
  Conversation conv(cs, *st, gen);
  const int fs = cs.frame_samples();
  const std::vector<float> audio = session_audio(0, Conversation::kMaxFramesInFlight + 1, fs);
  std::mutex mu;
  std::condition_variable cv;
  int done = 0;
  for (int k = 0; k < Conversation::kMaxFramesInFlight; ++k)
    conv.step_async(audio.data() + static_cast<size_t>(k) * fs, [&](std::optional<FrameOut>, std::exception_ptr e) {
      std::lock_guard<std::mutex> lk(mu);
      EXPECT_FALSE(e);
      ++done;
      cv.notify_all();
    });
  EXPECT_EQ(conv.frames_in_flight(), Conversation::kMaxFramesInFlight);
  EXPECT_THROW(conv.step_async(audio.data(), [](std::optional<FrameOut>, std::exception_ptr) {}), Error);
  cs.release();
  std::unique_lock<std::mutex> lk(mu);
  ASSERT_TRUE(cv.wait_for(lk, std::chrono::seconds(20), [&] { return done == Conversation::kMaxFramesInFlight; }));
  EXPECT_EQ(conv.frames_in_flight(), 0);
}

// An error of any stage reaches the frame's callback once, and the session can step again.
TEST(SessionLoop, AFailedStageReachesTheCallback) {
  TinyModel t;
  const LmGenConfig gen = *t.cfg.lm_gen;
  // A codec stream (the default, blocking async calls) that fails the calls it is told to.
  struct Flaky : CodecStream {
    std::unique_ptr<CodecStream> inner;
    bool fail_encode = false, fail_decode = false;
    int frame_samples() const override { return inner->frame_samples(); }
    int num_codebooks() const override { return inner->num_codebooks(); }
    int codebook_size() const override { return inner->codebook_size(); }
    void reset() override { inner->reset(); }
    void encode(const float* pcm, int32_t* codes) override {
      if (fail_encode) throw Error("encode failed");
      inner->encode(pcm, codes);
    }
    void decode(const int32_t* codes, float* pcm) override {
      if (fail_decode) throw Error("decode failed");
      inner->decode(codes, pcm);
    }
  };
  Flaky cs;
  cs.inner = t.backend->codec_stream(0);
  cs.inner->reset();
  LmScheduler lm(t.backend->lm_batch(1, -1));
  auto st = lm.open(0, gen, 1);
  Conversation conv(cs, *st, gen);
  const int fs = cs.frame_samples();
  const std::vector<float> audio = session_audio(0, 8, fs);
  std::mutex mu;
  std::condition_variable cv;
  struct Got {
    int calls = 0;
    bool frame = false;
    std::string error;
  };
  auto step = [&](int k) {
    Got g;
    conv.step_async(audio.data() + static_cast<size_t>(k) * fs, [&](std::optional<FrameOut> f, std::exception_ptr e) {
      std::lock_guard<std::mutex> lk(mu);
      ++g.calls;
      g.frame = f.has_value();
      g.error = error_text(e);
      cv.notify_all();
    });
    std::unique_lock<std::mutex> lk(mu);
    EXPECT_TRUE(cv.wait_for(lk, std::chrono::seconds(20), [&] { return g.calls > 0; }));
    return g;
  };
  cs.fail_encode = true;
  Got g = step(0);
  EXPECT_EQ(g.calls, 1);
  EXPECT_EQ(g.error, "encode failed");
  cs.fail_encode = false;
  for (int k = 1; k < 5; ++k) EXPECT_EQ(step(k).error, "");  // the tiny model speaks from its third step
  cs.fail_decode = true;
  g = step(5);
  EXPECT_EQ(g.calls, 1);
  EXPECT_EQ(g.error, "decode failed");
  EXPECT_FALSE(g.frame);
  cs.fail_decode = false;
  g = step(6);
  EXPECT_EQ(g.error, "");
  EXPECT_TRUE(g.frame);
}

// Pipelined: a frame that fails fails the frame in flight behind it, if any, with the same error (its
// model state followed the failed one's); frames before it are unaffected, and the session steps on.
TEST(SessionLoop, APipelinedFailureFailsTheFrameBehindIt) {
  TinyModel t;
  const LmGenConfig gen = *t.cfg.lm_gen;
  // The scheduler's codec stream, whose decode_async fails on the call it is told to.
  struct FlakyAsync : Forwarding {
    std::atomic<int> decodes{0};
    int fail_decode = -1;
    void decode_async(const int32_t* codes, float* pcm, Done done) override {
      if (decodes++ == fail_decode) return done(std::make_exception_ptr(Error("decode failed")));
      inner->decode_async(codes, pcm, done);
    }
  };
  CodecScheduler codec(t.backend->codec_batch(1));
  LmScheduler lm(t.backend->lm_batch(1, -1));
  FlakyAsync cs;
  cs.inner = codec.open(0);
  auto st = lm.open(0, gen, 3);
  Conversation conv(cs, *st, gen);
  ASSERT_TRUE(lm.run_system_prompts(*st, conv, short_prompt(1)));
  const int fs = cs.frame_samples();
  constexpr int kFrames = 12;
  const std::vector<float> audio = session_audio(1, kFrames, fs);
  cs.fail_decode = 4;  // the fifth frame with output
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> got(kFrames);  // per frame: "" or the error
  std::vector<char> had_output(kFrames, 0);
  int issued = 0, completed = 0;
  std::function<void()> step = [&] {
    int k = 0;
    {
      std::lock_guard<std::mutex> lk(mu);
      if (issued == kFrames) return;
      k = issued++;
    }
    conv.step_async(audio.data() + static_cast<size_t>(k) * fs, [&, k](std::optional<FrameOut> f, std::exception_ptr e) {
      const std::string err = error_text(e);
      step();  // first: once the last completion is counted the test may end
      if (k == 0)  // the pipeline fills from here (why: ChainedSession::start)
        for (int i = 1; i < Conversation::kMaxFramesInFlight; ++i) step();
      std::lock_guard<std::mutex> lk(mu);
      got[static_cast<size_t>(k)] = err;
      had_output[static_cast<size_t>(k)] = f.has_value();
      ++completed;
      cv.notify_all();
    });
  };
  step();
  std::unique_lock<std::mutex> lk(mu);
  ASSERT_TRUE(cv.wait_for(lk, std::chrono::seconds(60), [&] { return completed == kFrames; }));
  int first_failed = -1, failures = 0;
  for (int k = 0; k < kFrames; ++k) {
    if (got[k].empty()) continue;
    EXPECT_EQ(got[k], "decode failed") << "frame " << k;
    EXPECT_FALSE(had_output[k]);
    if (first_failed < 0) first_failed = k;
    ++failures;
  }
  ASSERT_GE(first_failed, 0) << "no decode failed";
  // The failed frame and those in flight behind it (whether the next one was given before the
  // failure depends on timing).
  EXPECT_LE(failures, Conversation::kMaxFramesInFlight);
  for (int k = first_failed; k < first_failed + failures; ++k) EXPECT_FALSE(got[k].empty()) << "frame " << k;
  for (int k = first_failed + failures; k < kFrames; ++k) EXPECT_TRUE(had_output[k]) << "frame " << k << " after the failure";
}

}  // namespace
