// The prompt cache's check, shared by the CPU and CUDA tests: a conversation whose system prompts
// were loaded from the cache produces exactly the tokens of one that replayed them, greedy and
// sampled, for the session that saved the entry, for another slot with the same seed and for
// another seed; a different prompt misses. The sessions run one after another (batching beside
// others is the scheduler tests' part).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "engine/scheduler.h"
#include "ppx/backend.h"
#include "ppx/conversation.h"

namespace ppx::test {

struct PromptRun {
  std::vector<int64_t> tokens;  // every output frame's tokens, in order
  bool cached = false;
};

// One conversation in `slot` of `sched`: its system prompts through the scheduler (and its cache,
// when it has one), then `frames` frames of a fixed signal.
inline PromptRun converse(ModelBackend& b, LmScheduler& sched, int slot, const SystemPrompt& p,
                          const LmGenConfig& gen, uint64_t seed, int frames) {
  auto codec = b.codec_stream(slot);
  auto st = sched.open(slot, gen, seed);
  Conversation conv(*codec, *st, gen);
  PromptRun r;
  EXPECT_TRUE(sched.run_system_prompts(*st, conv, p, {}, &r.cached));
  const int fs = codec->frame_samples();
  std::vector<float> pcm(static_cast<size_t>(fs));
  for (int f = 0; f < frames; ++f) {
    for (int i = 0; i < fs; ++i) {
      const float t = static_cast<float>(f * fs + i);
      pcm[static_cast<size_t>(i)] = 0.2f * std::sin(0.031f * t) * std::sin(0.0011f * t + 0.3f);
    }
    if (const auto fr = conv.step(pcm.data())) r.tokens.insert(r.tokens.end(), fr->tokens.begin(), fr->tokens.end());
  }
  return r;
}

inline void check_prompt_cache(ModelBackend& b, const ModelConfig& cfg, const SystemPrompt& p,
                               const SystemPrompt& other, size_t cache_bytes) {
  constexpr int kFrames = 6;
  for (const bool sampling : {false, true}) {
    SCOPED_TRACE(sampling ? "sampled" : "greedy");
    LmGenConfig gen = *cfg.lm_gen;
    gen.use_sampling = sampling;
    LmScheduler plain(b.lm_batch(2, -1));
    const PromptRun ref11 = converse(b, plain, 0, p, gen, 11, kFrames);
    const PromptRun ref12 = converse(b, plain, 1, p, gen, 12, kFrames);
    ASSERT_FALSE(ref11.tokens.empty());
    EXPECT_FALSE(ref11.cached);
    if (sampling) {
      EXPECT_NE(ref11.tokens, ref12.tokens) << "two seeds, one stream?";
    }
    LmScheduler sched(b.lm_batch(2, -1), {}, 0, cache_bytes);
    ASSERT_NE(sched.prompt_cache(), nullptr);
    const PromptRun a = converse(b, sched, 0, p, gen, 11, kFrames);  // replays and saves
    const PromptRun bb = converse(b, sched, 1, p, gen, 11, kFrames);  // loads into another slot
    const PromptRun c = converse(b, sched, 0, p, gen, 12, kFrames);   // loads, another seed
    const PromptRun d = converse(b, sched, 1, other, gen, 11, kFrames);  // another prompt: replays
    EXPECT_FALSE(a.cached);
    EXPECT_TRUE(bb.cached);
    EXPECT_TRUE(c.cached);
    EXPECT_FALSE(d.cached);
    EXPECT_EQ(a.tokens, ref11.tokens);
    EXPECT_EQ(bb.tokens, ref11.tokens);
    EXPECT_EQ(c.tokens, ref12.tokens);
    const PromptCache::Stats s = sched.prompt_cache()->stats();
    EXPECT_EQ(s.hits, 2);
    EXPECT_EQ(s.misses, 2);
    EXPECT_EQ(s.inserts, 2);
    EXPECT_EQ(s.entries, 2);
    EXPECT_GT(s.used_bytes, 0u);
  }
}

}  // namespace ppx::test
