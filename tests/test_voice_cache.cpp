// The server's voice prompt cache (src/engine/voice_cache.h): a voice is prepared once while its
// file is unchanged, equals what preparing it directly gives, is prepared again when the file
// changes, leaves in LRU order beyond the cap, and failures are not kept; the prompt cache key is
// the same with the carried voice digest as without it.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/prompt_cache.h"
#include "engine/voice_cache.h"
#include "ppx/audio.h"
#include "ppx/conversation.h"
#include "ppx/error.h"
#include "ppx/lm_gen.h"
#include "test_util.h"

using namespace ppx;

namespace {

constexpr int kRate = 24000, kFrame = 1920;

// A voiced tone of `seconds` at 24 kHz (loud enough for the loudness measure).
std::string write_voice(const std::string& name, double seconds, double hz = 180.0) {
  const std::string path = test::scratch(name);
  std::vector<float> x(static_cast<size_t>(seconds * kRate));
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = 0.3f * static_cast<float>(std::sin(2 * M_PI * hz * static_cast<double>(i) / kRate));
  write_wav_pcm16(path, kRate, x);
  return path;
}

}  // namespace

TEST(VoiceCache, PreparesAVoiceOnceWhileItsFileIsUnchanged) {
  const std::string path = write_voice("voice_once.wav", 1.5);
  VoiceCache c(size_t{64} << 20);
  const auto a = c.get(path, kRate, kFrame);
  const auto b = c.get(path, kRate, kFrame);
  EXPECT_EQ(a.get(), b.get());
  const auto st = c.stats();
  EXPECT_EQ(st.hits, 1u);
  EXPECT_EQ(st.misses, 1u);
  EXPECT_EQ(st.entries, 1u);
  EXPECT_EQ(st.bytes, a->prompt.voice_audio.size() * sizeof(float));
  // What preparing it directly gives, and the digest of that voice.
  EXPECT_EQ(a->prompt.voice_audio, prepare_voice_audio(path, kRate, kFrame));
  EXPECT_FALSE(a->prompt.voice);
  SystemPrompt p;
  p.voice_audio = a->prompt.voice_audio;
  EXPECT_EQ(a->prompt.voice_digest, voice_prompt_digest(p));
}

TEST(VoiceCache, PtVoicesAreKeptWithTheirDigest) {
  VoiceCache c(size_t{64} << 20);
  const auto v = c.get(test::data("voice_tiny_a.pt"), kRate, kFrame);
  ASSERT_TRUE(v->prompt.voice);
  EXPECT_TRUE(v->prompt.voice_audio.empty());
  SystemPrompt p;
  p.voice = load_voice_embeddings(test::data("voice_tiny_a.pt"));
  EXPECT_EQ(v->prompt.voice_digest, voice_prompt_digest(p));
  EXPECT_EQ(v->prompt.voice->embeddings, p.voice->embeddings);
  EXPECT_EQ(c.get(test::data("voice_tiny_a.pt"), kRate, kFrame).get(), v.get());
}

TEST(VoiceCache, AReplacedFileIsPreparedAgain) {
  const std::string path = write_voice("voice_replaced.wav", 1.0);
  VoiceCache c(size_t{64} << 20);
  const auto a = c.get(path, kRate, kFrame);
  write_voice("voice_replaced.wav", 2.0, 240.0);  // another size (the time may not move)
  const auto b = c.get(path, kRate, kFrame);
  EXPECT_NE(a.get(), b.get());
  EXPECT_GT(b->prompt.voice_audio.size(), a->prompt.voice_audio.size());
  EXPECT_NE(a->prompt.voice_digest, b->prompt.voice_digest);
  EXPECT_EQ(c.stats().entries, 1u);  // the stale version left
  EXPECT_EQ(c.get(path, kRate, kFrame).get(), b.get());
}

TEST(VoiceCache, LeastRecentlyUsedVoicesLeaveBeyondTheCap) {
  const std::string p1 = write_voice("voice_lru1.wav", 1.0), p2 = write_voice("voice_lru2.wav", 1.0),
                    p3 = write_voice("voice_lru3.wav", 1.0);
  const size_t one = prepare_voice_audio(p1, kRate, kFrame).size() * sizeof(float);
  VoiceCache c(2 * one + one / 2);  // two fit
  const auto v1 = c.get(p1, kRate, kFrame);
  c.get(p2, kRate, kFrame);
  c.get(p1, kRate, kFrame);  // p1 most recent: p2 leaves next
  c.get(p3, kRate, kFrame);
  auto st = c.stats();
  EXPECT_EQ(st.entries, 2u);
  EXPECT_EQ(st.evictions, 1u);
  EXPECT_LE(st.bytes, 2 * one + one / 2);
  EXPECT_EQ(c.get(p1, kRate, kFrame).get(), v1.get());  // still there
  const uint64_t misses = c.stats().misses;
  c.get(p2, kRate, kFrame);  // gone: prepared again
  EXPECT_EQ(c.stats().misses, misses + 1);

  // A voice larger than the whole cap is prepared for its caller and not kept.
  VoiceCache small(one / 2);
  const auto big = small.get(p1, kRate, kFrame);
  EXPECT_FALSE(big->prompt.voice_audio.empty());
  EXPECT_EQ(small.stats().entries, 0u);
  EXPECT_EQ(small.stats().bytes, 0u);
}

TEST(VoiceCache, FailuresAreReportedAndNotKept) {
  VoiceCache c(size_t{64} << 20);
  EXPECT_THROW(c.get(test::scratch("no_such_voice.wav"), kRate, kFrame), Error);
  const std::string bad = test::scratch("voice_bad.wav");
  test::write_bytes(bad, std::vector<char>(100, 'x'));
  EXPECT_THROW(c.get(bad, kRate, kFrame), Error);
  const std::string short_voice = write_voice("voice_short.wav", 0.1);  // under the 400 ms loudness block
  EXPECT_THROW(c.get(short_voice, kRate, kFrame), Error);
  EXPECT_EQ(c.stats().entries, 0u);
  EXPECT_EQ(c.stats().bytes, 0u);
}

TEST(VoiceCache, PromptKeyIsTheSameWithTheCarriedDigest) {
  const std::string path = write_voice("voice_key.wav", 1.0);
  VoiceCache c(size_t{64} << 20);
  const auto v = c.get(path, kRate, kFrame);
  LmGenConfig gen;
  SystemPrompt with, without;
  set_prompt_voice(with, *v);
  without.voice_audio = v->prompt.voice_audio;
  with.text_tokens = without.text_tokens = {1, 2, 3};
  EXPECT_FALSE(with.voice_digest.empty());
  EXPECT_TRUE(without.voice_digest.empty());
  EXPECT_EQ(prompt_cache_key(with, gen), prompt_cache_key(without, gen));
  // Another voice or no voice: another key.
  SystemPrompt none;
  none.text_tokens = with.text_tokens;
  EXPECT_NE(prompt_cache_key(with, gen), prompt_cache_key(none, gen));
  without.voice_audio[0] += 0.5f;
  EXPECT_NE(prompt_cache_key(with, gen), prompt_cache_key(without, gen));
}
