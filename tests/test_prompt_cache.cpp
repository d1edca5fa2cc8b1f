// The prompt cache (src/engine/prompt_cache.h): its placement, LRU and holding rules, its keys, and
// on the CPU tiny model a conversation that loads its system prompts from the cache equals one that
// replays them (tests/prompt_cache_test_util.h; the CUDA run is in test_cuda_lm.cpp).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/prompt_cache.h"
#include "engine/scheduler.h"
#include "ppx/backend.h"
#include "ppx/config.h"
#include "ppx/conversation.h"
#include "ppx/lm.h"
#include "ppx/mimi.h"
#include "ppx/safetensors.h"
#include "ppx/weights.h"
#include "prompt_cache_test_util.h"
#include "test_util.h"
#include "tiny_model_util.h"

using namespace ppx;

namespace {

LmGen::State state_of(int64_t offset) {
  LmGen::State s;
  s.offset = offset;
  return s;
}

}  // namespace

TEST(PromptCache, HitAfterCommitOnly) {
  PromptCache c(100);
  EXPECT_FALSE(c.lookup("a"));
  PromptCache::Lease r = c.reserve("a", 40);
  ASSERT_TRUE(r);
  EXPECT_EQ(r.entry().offset, 0u);
  EXPECT_FALSE(c.lookup("a")) << "visible before its save was queued";
  EXPECT_FALSE(c.reserve("a", 40)) << "a second save of a key being saved";
  c.commit(r, LmBatch::PrefixInfo{7, 9}, state_of(5));
  r.release();
  PromptCache::Lease h = c.lookup("a");
  ASSERT_TRUE(h);
  EXPECT_EQ(h.entry().prefix.positions, 7);
  EXPECT_EQ(h.entry().prefix.counter, 9u);
  EXPECT_EQ(h.entry().gen.offset, 5);
  EXPECT_FALSE(c.reserve("a", 40)) << "a key already there";
  const PromptCache::Stats s = c.stats();
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(s.misses, 2);
  EXPECT_EQ(s.inserts, 1);
  EXPECT_EQ(s.entries, 1);
  EXPECT_EQ(s.used_bytes, 40u);
}

TEST(PromptCache, EvictsLeastRecentlyUsedUnheldFirstFit) {
  PromptCache c(100);
  for (const char* k : {"a", "b"}) {
    PromptCache::Lease r = c.reserve(k, 40);
    ASSERT_TRUE(r);
    c.commit(r, {}, {});
  }
  c.lookup("a").release();  // a is now more recent than b
  PromptCache::Lease r = c.reserve("c", 40);  // no gap of 40 (20 left): b goes
  ASSERT_TRUE(r);
  EXPECT_EQ(r.entry().offset, 40u) << "first fit: b's place";
  c.commit(r, {}, {});
  r.release();
  EXPECT_FALSE(c.lookup("b"));
  EXPECT_TRUE(c.lookup("a"));
  EXPECT_EQ(c.stats().evictions, 1);
  // Held entries stay: with a and c both held, nothing can make room.
  PromptCache::Lease ha = c.lookup("a"), hc = c.lookup("c");
  EXPECT_FALSE(c.reserve("d", 40));
  EXPECT_EQ(c.stats().skipped, 1);
  hc.release();
  PromptCache::Lease d = c.reserve("d", 40);
  ASSERT_TRUE(d);
  EXPECT_EQ(d.entry().offset, 40u);
  EXPECT_TRUE(c.lookup("a")) << "the held entry survived";
  // Larger than the whole store: never cached.
  EXPECT_FALSE(c.reserve("e", 101));
  // A small one fits the tail gap without evicting anything.
  PromptCache::Lease f = c.reserve("f", 20);
  ASSERT_TRUE(f);
  EXPECT_EQ(f.entry().offset, 80u);
  EXPECT_EQ(c.stats().evictions, 2);  // b, then c for d
}

// An entry that cannot fit however many free entries go evicts none of them.
TEST(PromptCache, NoEvictionThatCannotMakeRoom) {
  PromptCache c(100);
  PromptCache::Lease held = c.reserve("saving", 50);  // [0, 50), held while its prompt replays
  ASSERT_TRUE(held);
  for (const char* k : {"b", "d"}) {  // [50, 75), [75, 100)
    PromptCache::Lease r = c.reserve(k, 25);
    ASSERT_TRUE(r);
    c.commit(r, {}, {});
  }
  EXPECT_FALSE(c.reserve("big", 60)) << "no run of 60 bytes can be freed";
  EXPECT_EQ(c.stats().evictions, 0);
  EXPECT_TRUE(c.lookup("b"));
  EXPECT_TRUE(c.lookup("d"));
  PromptCache::Lease r = c.reserve("fits", 50);  // b and d may go for this one
  ASSERT_TRUE(r);
  EXPECT_EQ(r.entry().offset, 50u);
  EXPECT_EQ(c.stats().evictions, 2);
}

TEST(PromptCache, AbandonedOrUncommittedReservationsFreeTheirPlace) {
  PromptCache c(50);
  {
    PromptCache::Lease r = c.reserve("a", 50);
    ASSERT_TRUE(r);
    c.abandon(r);
  }
  EXPECT_FALSE(c.lookup("a"));
  { PromptCache::Lease r = c.reserve("b", 50); }  // released without a commit
  PromptCache::Lease r = c.reserve("a", 50);
  ASSERT_TRUE(r) << "the place was not freed";
  EXPECT_EQ(r.entry().offset, 0u);
  EXPECT_EQ(c.stats().entries, 0) << "uncommitted entries are not counted";
}

// A session that asks for a prompt another session is saving waits for that save instead of
// replaying the prompt too; a failed save, or a session that stops waiting, gets a miss.
TEST(PromptCache, LookupWaitsForASaveInFlight) {
  PromptCache c(100);
  for (const int outcome : {0, 1, 2}) {  // commit, abandon, stop waiting
    SCOPED_TRACE(outcome);
    const std::string key = outcome == 0 ? "k0" : outcome == 1 ? "k1" : "k2";
    PromptCache::Lease r = c.reserve(key, 10);
    ASSERT_TRUE(r);
    std::atomic<int> calls{0};
    bool hit = false;
    std::thread waiter([&] {
      hit = static_cast<bool>(c.lookup(key, [&] { return ++calls < 1000 && outcome != 2; }));
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (outcome == 0) c.commit(r, {}, {});
    if (outcome == 1) c.abandon(r);
    r.release();
    waiter.join();
    EXPECT_EQ(hit, outcome == 0);
    EXPECT_GE(calls.load(), 1);
    if (outcome == 2) {
      EXPECT_EQ(calls.load(), 1);
    }
  }
  EXPECT_EQ(c.stats().waits, 1);
  EXPECT_EQ(c.stats().hits, 1);
  EXPECT_EQ(c.stats().misses, 2);
  EXPECT_FALSE(c.lookup("k1")) << "the abandoned save left an entry";
}

TEST(PromptCache, ZeroCapacityCachesNothing) {
  PromptCache c(0);
  EXPECT_FALSE(c.reserve("a", 1));
  EXPECT_FALSE(c.lookup("a"));
}

TEST(PromptCache, KeysTellPromptsApart) {
  const LmGenConfig gen;
  SystemPrompt a;
  a.text_tokens = {1, 2, 3};
  SystemPrompt b = a;
  EXPECT_EQ(prompt_cache_key(a, gen), prompt_cache_key(b, gen));
  EXPECT_EQ(prompt_cache_key(a, gen).size(), 64u);
  b.text_tokens = {1, 2, 4};
  EXPECT_NE(prompt_cache_key(a, gen), prompt_cache_key(b, gen));
  b = a;
  b.voice_audio = {0.f};
  EXPECT_NE(prompt_cache_key(a, gen), prompt_cache_key(b, gen));
  b = a;
  b.voice = VoiceEmbeddings{};
  EXPECT_NE(prompt_cache_key(a, gen), prompt_cache_key(b, gen));
  LmGenConfig g2 = gen;
  g2.audio_silence_frame_cnt += 1;
  EXPECT_NE(prompt_cache_key(a, gen), prompt_cache_key(a, g2));
  g2 = gen;
  g2.temp = 0.1;  // sampling does not touch the prompts' state
  g2.top_k = 3;
  EXPECT_EQ(prompt_cache_key(a, gen), prompt_cache_key(a, g2));
  // Token boundaries are part of the key: {1, 23} and {12, 3} differ.
  SystemPrompt x, y;
  x.text_tokens = {1, 23};
  y.text_tokens = {12, 3};
  EXPECT_NE(prompt_cache_key(x, gen), prompt_cache_key(y, gen));
}

namespace {

using test::TinyModel;

// A voice prompt of `frames` frames of a tone, as prepare_voice_audio would hand it over.
std::vector<float> tone(int frames, int fs) {
  std::vector<float> v(static_cast<size_t>(frames) * fs);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.25f * std::sin(0.05f * static_cast<float>(i));
  return v;
}

}  // namespace

TEST(PromptCache, CachedPromptsGiveTheReplayedTokensCpu) {
  TinyModel t;
  const int fs = t.backend->codec_stream(0)->frame_samples();
  SystemPrompt voice_pt;
  voice_pt.voice = load_voice_embeddings(test::data("voice_tiny_a.pt"));
  voice_pt.text_tokens = {5, 17, 300, 42};
  SystemPrompt audio;
  audio.voice_audio = tone(3, fs);
  audio.text_tokens = {9, 8, 7};
  test::check_prompt_cache(*t.backend, t.cfg, voice_pt, audio, 64u << 20);
  // The other way round, with a prompt of text only.
  SystemPrompt text_only;
  text_only.text_tokens = {11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23};  // the tiny context is 24
  test::check_prompt_cache(*t.backend, t.cfg, audio, text_only, 64u << 20);
}

// A cache too small for a prompt keeps nothing and costs nothing: the session replays.
TEST(PromptCache, PromptLargerThanTheStoreIsReplayed) {
  TinyModel t;
  SystemPrompt p;
  p.text_tokens = {5, 6, 7};
  LmScheduler sched(t.backend->lm_batch(1, -1), {}, 0, 64);
  LmGenConfig gen = *t.cfg.lm_gen;
  gen.use_sampling = false;
  for (int i = 0; i < 2; ++i) EXPECT_FALSE(test::converse(*t.backend, sched, 0, p, gen, 1, 2).cached);
  EXPECT_EQ(sched.prompt_cache()->stats().skipped, 2);
}

// Sessions that start together with a new prompt: one replays and saves it, the others wait for
// that save and load it; every one's tokens are the replay's.
TEST(PromptCache, SessionsArrivingTogetherReplayAPromptOnce) {
  TinyModel t;
  SystemPrompt p;
  p.voice = load_voice_embeddings(test::data("voice_tiny_a.pt"));
  p.text_tokens = {5, 17, 300, 42};
  LmGenConfig gen = *t.cfg.lm_gen;
  constexpr int kSessions = 4;
  LmScheduler plain(t.backend->lm_batch(1, -1));
  const test::PromptRun ref = test::converse(*t.backend, plain, 0, p, gen, 21, 4);
  LmScheduler sched(t.backend->lm_batch(kSessions, -1), {}, 0, 64u << 20);
  std::vector<test::PromptRun> runs(kSessions);
  std::vector<std::thread> threads;
  for (int i = 0; i < kSessions; ++i)
    threads.emplace_back([&, i] { runs[static_cast<size_t>(i)] = test::converse(*t.backend, sched, i, p, gen, 21, 4); });
  for (auto& th : threads) th.join();
  int cached = 0;
  for (const auto& r : runs) {
    EXPECT_EQ(r.tokens, ref.tokens);
    cached += r.cached ? 1 : 0;
  }
  EXPECT_EQ(cached, kSessions - 1);
  const PromptCache::Stats s = sched.prompt_cache()->stats();
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(s.hits, kSessions - 1);
  EXPECT_EQ(s.inserts, 1);
}
