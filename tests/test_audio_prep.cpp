// Voice-prompt audio preparation (loudness, normalisation, file -> 24 kHz frames) and the text
// tokenizer (SentencePiece wrapper, system-prompt wrapping).

#include <gtest/gtest.h>
#include <sndfile.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "ppx/audio.h"
#include "ppx/error.h"
#include "ppx/tokenizer.h"
#include "test_util.h"

using namespace ppx;

namespace {

std::vector<float> sine(double hz, double amplitude, int rate, double seconds) {
  std::vector<float> x(static_cast<size_t>(std::llround(rate * seconds)));
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = static_cast<float>(amplitude * std::sin(2.0 * std::numbers::pi * hz * i / rate));
  }
  return x;
}

// Writes interleaved float samples as a WAV with `channels` channels (32-bit float, exact).
void write_wav_float(const std::string& path, int rate, int channels,
                     const std::vector<float>& interleaved) {
  SF_INFO info{};
  info.samplerate = rate;
  info.channels = channels;
  info.format = SF_FORMAT_WAV | SF_FORMAT_FLOAT;
  SNDFILE* f = sf_open(path.c_str(), SFM_WRITE, &info);
  ASSERT_NE(f, nullptr) << sf_strerror(nullptr);
  const sf_count_t frames = static_cast<sf_count_t>(interleaved.size() / channels);
  EXPECT_EQ(sf_writef_float(f, interleaved.data(), frames), frames);
  sf_close(f);
}

size_t padded(size_t n, size_t frame) { return (n + frame - 1) / frame * frame; }

void expect_error_naming(const std::function<void()>& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no ppx::Error, expected one naming " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace

// ---- loudness ----

TEST(AudioLoudness, FullScaleSineIsMinus3Lufs) {
  // BS.1770: a full-scale 997 Hz sine in one channel reads -3.01 LUFS.
  EXPECT_NEAR(loudness_lufs(sine(997, 1.0, 48000, 5.0), 48000), -3.01, 0.01);
  EXPECT_NEAR(loudness_lufs(sine(997, 1.0, 24000, 5.0), 24000), -3.01, 0.05);
  // 20 dB down reads 20 LU lower.
  EXPECT_NEAR(loudness_lufs(sine(997, 0.1, 24000, 5.0), 24000), -23.01, 0.05);
}

TEST(AudioLoudness, UpstreamMeterMatchesPyloudnorm) {
  // pyloudnorm's own test suite expects -3.0523438444331137 for its 1 s, 1 kHz full-scale sine at
  // 44.1 kHz (16-bit file; ours is synthesised, so phase and quantisation differ slightly; on that
  // very file this meter gives -3.05234384, libebur128 -3.0074).
  EXPECT_NEAR(upstream_loudness_lufs(sine(1000, 1.0, 44100, 1.0), 44100), -3.0523, 0.01);
  // pyloudnorm reads slightly below the ITU-matched libebur128 (cookbook K-weighting).
  const auto s = sine(997, 1.0, 24000, 5.0);
  const double diff = loudness_lufs(s, 24000) - upstream_loudness_lufs(s, 24000);
  EXPECT_GT(diff, 0.0);
  EXPECT_LT(diff, 0.15);
  std::mt19937 rng(7);
  std::normal_distribution<float> noise(0.f, 0.1f);
  std::vector<float> n(48000);
  for (float& v : n) v = noise(rng);
  EXPECT_NEAR(upstream_loudness_lufs(n, 24000), loudness_lufs(n, 24000), 0.15);
}

TEST(AudioLoudness, SilenceAndShortAudioAreMinusInfinity) {
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(loudness_lufs(std::vector<float>(24000, 0.f), 24000), -inf);
  EXPECT_EQ(upstream_loudness_lufs(std::vector<float>(24000, 0.f), 24000), -inf);
  EXPECT_EQ(loudness_lufs({}, 24000), -inf);
  EXPECT_EQ(upstream_loudness_lufs({}, 24000), -inf);
  // Shorter than one 400 ms block: no measurement (pyloudnorm raises).
  EXPECT_EQ(upstream_loudness_lufs(sine(440, 0.5, 24000, 0.39), 24000), -inf);
  EXPECT_EQ(loudness_lufs(sine(440, 0.5, 24000, 0.39), 24000), -inf);
  // Exactly 400 ms is accepted by pyloudnorm.
  EXPECT_TRUE(std::isfinite(upstream_loudness_lufs(sine(440, 0.5, 24000, 0.4), 24000)));
  // Everything below the -70 LUFS absolute gate.
  EXPECT_EQ(upstream_loudness_lufs(sine(997, 1e-4, 24000, 2.0), 24000), -inf);
  EXPECT_THROW(loudness_lufs({0.f}, 0), Error);
  EXPECT_THROW(upstream_loudness_lufs({0.f}, -1), Error);
}

TEST(AudioLoudness, NormalizeReachesTargetWithOneGain) {
  const auto x = sine(1000, 0.03, 24000, 3.0);
  const auto y = normalize_loudness(x, 24000);
  ASSERT_EQ(y.size(), x.size());
  EXPECT_NEAR(upstream_loudness_lufs(y, 24000), -24.0, 1e-3);
  EXPECT_NEAR(loudness_lufs(y, 24000), -24.0, 0.1);
  const double gain = static_cast<double>(y[100]) / x[100];
  for (size_t i = 1; i < x.size(); i += 997) {
    if (std::abs(x[i]) > 1e-3f) {
      EXPECT_NEAR(y[i] / x[i], gain, 1e-5 * gain);
    }
  }
  // Other targets; no clipping or limiting: a loud target pushes peaks past full scale.
  EXPECT_NEAR(upstream_loudness_lufs(normalize_loudness(x, 24000, -16.0), 24000), -16.0, 1e-3);
  const auto loud = normalize_loudness(x, 24000, 0.0);
  float peak = 0.f;
  for (float v : loud) peak = std::max(peak, std::abs(v));
  EXPECT_GT(peak, 1.2f);
}

TEST(AudioLoudness, NormalizeLeavesUnmeasurableAudioUnchanged) {
  const std::vector<float> zeros(24000, 0.f);
  EXPECT_EQ(normalize_loudness(zeros, 24000), zeros);
  const auto short_sine = sine(440, 0.5, 24000, 0.2);
  EXPECT_EQ(normalize_loudness(short_sine, 24000), short_sine);
}

// ---- voice-prompt files ----

TEST(AudioPrep, SpeechFileAt16kHz) {
  const std::string path = test::data("speech_16k.wav");
  const Audio in = read_audio(path);
  ASSERT_EQ(in.sample_rate, 16000);
  const size_t n24 = static_cast<size_t>(std::llround(in.frames() * 24000.0 / 16000.0));
  const auto out = prepare_voice_audio(path);
  ASSERT_EQ(out.size(), padded(n24, 1920));
  EXPECT_EQ(out.size() % 1920, 0u);
  const std::vector<float> body(out.begin(), out.begin() + static_cast<long>(n24));
  EXPECT_NEAR(upstream_loudness_lufs(body, 24000), -24.0, 1e-3);
  for (size_t i = n24; i < out.size(); ++i) ASSERT_EQ(out[i], 0.f) << i;
  // Same result as the steps done one by one.
  const auto manual = normalize_loudness(resample(take_channel(in, 0), 16000, 24000), 24000);
  for (size_t i = 0; i < n24; ++i) ASSERT_EQ(out[i], manual[i]) << i;
}

TEST(AudioPrep, ResamplesToTargetRateAndPads) {
  // 44.1 kHz, 2.0 s -> 48000 samples at 24 kHz = exactly 25 frames, nothing added.
  const std::string p44 = test::scratch("prep_44k.wav");
  write_wav_pcm16(p44, 44100, sine(440, 0.25, 44100, 2.0));
  const auto a = prepare_voice_audio(p44);
  EXPECT_EQ(a.size(), 48000u);
  EXPECT_NEAR(upstream_loudness_lufs(a, 24000), -24.0, 1e-3);
  // 16 kHz, 1.3 s -> 31200 samples -> 17 frames (32640 samples), zero tail.
  const std::string p16 = test::scratch("prep_16k.wav");
  write_wav_pcm16(p16, 16000, sine(300, 0.5, 16000, 1.3));
  const auto b = prepare_voice_audio(p16);
  EXPECT_EQ(b.size(), 32640u);
  for (size_t i = 31200; i < b.size(); ++i) ASSERT_EQ(b[i], 0.f) << i;
  const std::vector<float> body(b.begin(), b.begin() + 31200);
  EXPECT_NEAR(upstream_loudness_lufs(body, 24000), -24.0, 1e-3);
  // Other frame sizes and rates.
  EXPECT_EQ(prepare_voice_audio(p16, 16000, 1000).size(), 21000u);
}

TEST(AudioPrep, StereoUsesChannelZero) {
  const auto left = sine(440, 0.3, 48000, 1.5);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-0.9f, 0.9f);
  std::vector<float> stereo(left.size() * 2);
  for (size_t i = 0; i < left.size(); ++i) {
    stereo[2 * i] = left[i];
    stereo[2 * i + 1] = u(rng);
  }
  const std::string ps = test::scratch("prep_stereo.wav");
  const std::string pm = test::scratch("prep_left.wav");
  write_wav_float(ps, 48000, 2, stereo);
  write_wav_float(pm, 48000, 1, left);
  const auto from_stereo = prepare_voice_audio(ps);
  const auto from_mono = prepare_voice_audio(pm);
  ASSERT_EQ(from_stereo.size(), padded(36000, 1920));
  EXPECT_EQ(from_stereo, from_mono);
}

TEST(AudioPrep, SilentFileGivesZeros) {
  const std::string p = test::scratch("prep_silence.wav");
  write_wav_pcm16(p, 24000, std::vector<float>(30000, 0.f));
  const auto out = prepare_voice_audio(p);
  ASSERT_EQ(out.size(), padded(30000, 1920));
  for (float v : out) ASSERT_EQ(v, 0.f);
}

TEST(AudioPrep, BadFilesThrowNamingTheFile) {
  const std::string garbage = test::scratch("prep_garbage.wav");
  std::mt19937 rng(11);
  std::vector<char> bytes(4096);
  for (char& c : bytes) c = static_cast<char>(rng() & 0xFF);
  test::write_bytes(garbage, bytes);
  expect_error_naming([&] { prepare_voice_audio(garbage); }, "prep_garbage.wav");

  const std::string missing = test::scratch("prep_does_not_exist.wav");
  std::filesystem::remove(missing);
  expect_error_naming([&] { prepare_voice_audio(missing); }, "prep_does_not_exist.wav");

  const std::string empty = test::scratch("prep_empty.wav");
  write_wav_pcm16(empty, 24000, {});
  expect_error_naming([&] { prepare_voice_audio(empty); }, "prep_empty.wav");

  // Shorter than pyloudnorm's 400 ms block after resampling: upstream raises too.
  const std::string short_file = test::scratch("prep_short.wav");
  write_wav_pcm16(short_file, 16000, sine(440, 0.5, 16000, 0.3));
  expect_error_naming([&] { prepare_voice_audio(short_file); }, "prep_short.wav");

  // One sample at 96 kHz resamples to nothing (soxr once got a null output buffer: a crash).
  EXPECT_TRUE(resample({0.5f}, 96000, 24000).empty());
  const std::string one = test::scratch("prep_one_sample.wav");
  write_wav_pcm16(one, 96000, {0.5f});
  expect_error_naming([&] { prepare_voice_audio(one); }, "prep_one_sample.wav");
  // Rates and lengths a voice cannot have are refused before resampling (a 1 Hz file of a few
  // thousand samples took seconds of CPU to upsample).
  const std::string slow = test::scratch("prep_1hz.wav");
  write_wav_pcm16(slow, 1, std::vector<float>(2000, 0.1f));
  expect_error_naming([&] { prepare_voice_audio(slow); }, "prep_1hz.wav");
  try {
    prepare_voice_audio(slow);
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sample rate 1 Hz"), std::string::npos) << e.what();
  }
  const std::string long_file = test::scratch("prep_long.wav");
  write_wav_pcm16(long_file, kMinVoiceRateHz, std::vector<float>(static_cast<size_t>(kMinVoiceRateHz * (kMaxVoiceSeconds + 1)), 0.1f));
  try {
    prepare_voice_audio(long_file);
    ADD_FAILURE() << "a voice over kMaxVoiceSeconds was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("s cap"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("prep_long.wav"), std::string::npos) << e.what();
  }
}

// ---- tokenizer ----

TEST(Tokenizer, TinyModelLoadsWithUpstreamSpecialIds) {
  const TextTokenizer tok(test::data("tiny_spm_1000.model"));
  EXPECT_EQ(tok.vocab_size(), 1000);
  EXPECT_EQ(tok.id_to_piece(0), "<unk>");
  EXPECT_EQ(tok.id_to_piece(1), "<s>");
  EXPECT_EQ(tok.id_to_piece(2), "</s>");
  EXPECT_EQ(tok.id_to_piece(3), "<pad>");
  EXPECT_EQ(tok.id_to_piece(4), "<system>");
  EXPECT_THROW(tok.id_to_piece(1000), Error);
  EXPECT_THROW(tok.id_to_piece(-1), Error);
}

TEST(Tokenizer, EncodeRoundTripsThroughPieces) {
  const TextTokenizer tok(test::data("tiny_spm_1000.model"));
  const std::string text = "<system> Hello there. <system>";
  const std::vector<int> ids = tok.encode(text);
  ASSERT_FALSE(ids.empty());
  std::string joined;
  int system_tags = 0;
  for (int id : ids) {
    ASSERT_GE(id, 4) << "no special ids from plain text";
    ASSERT_LT(id, 1000);
    const std::string piece = tok.id_to_piece(id);
    if (piece == "<system>") ++system_tags;
    joined += piece;
  }
  EXPECT_EQ(system_tags, 2);
  // "▁" (U+2581) marks spaces; the dummy prefix adds one at the start.
  std::string decoded;
  for (size_t i = 0; i < joined.size();) {
    if (joined.compare(i, 3, "\xE2\x96\x81") == 0) {
      decoded += ' ';
      i += 3;
    } else {
      decoded += joined[i++];
    }
  }
  EXPECT_EQ(decoded, " " + text);
  EXPECT_TRUE(tok.encode("").empty());
  // Stable ids for a fixed model (catches an accidental retrain).
  EXPECT_EQ(ids, (std::vector<int>{6, 4, 137, 827, 444, 5, 6, 4}));
}

TEST(Tokenizer, BadModelThrowsNamingTheFile) {
  expect_error_naming([] { TextTokenizer t(test::scratch("no_such_tokenizer.model")); },
                      "no_such_tokenizer.model");
  const std::string garbage = test::scratch("garbage_tokenizer.model");
  test::write_bytes(garbage, std::vector<char>{'n', 'o', 't', ' ', 'a', ' ', 'm', 'o', 'd', 'e',
                                              'l', '\x01', '\x02', '\xff'});
  expect_error_naming([&] { TextTokenizer t(garbage); }, "garbage_tokenizer.model");
}

TEST(Tokenizer, FromSerializedBytes) {
  const std::vector<char> raw = test::read_bytes(test::data("tiny_spm_1000.model"));
  const TextTokenizer tok =
      TextTokenizer::from_serialized(std::string(raw.begin(), raw.end()), "embedded:tiny");
  EXPECT_EQ(tok.vocab_size(), 1000);
  const TextTokenizer from_file(test::data("tiny_spm_1000.model"));
  const std::string text = "Good morning, how are you?";
  EXPECT_EQ(tok.encode(text), from_file.encode(text));
  expect_error_naming([] { TextTokenizer::from_serialized("\x01\x02garbage", "embedded:bad"); },
                      "embedded:bad");
  expect_error_naming([] { TextTokenizer::from_serialized("", "embedded:empty"); },
                      "embedded:empty");
  expect_error_naming([&] { tok.id_to_piece(5000); }, "embedded:tiny");
}

TEST(TokenizerWrap, SystemPromptRules) {
  EXPECT_EQ(wrap_system_prompt(""), "");
  EXPECT_EQ(wrap_system_prompt("You are kind."), "<system> You are kind. <system>");
  EXPECT_EQ(wrap_system_prompt("  \tYou are kind.\n "), "<system> You are kind. <system>");
  EXPECT_EQ(wrap_system_prompt("<system> Already. <system>"), "<system> Already. <system>");
  EXPECT_EQ(wrap_system_prompt("  <system> Already. <system>\n"), "<system> Already. <system>");
  EXPECT_EQ(wrap_system_prompt("<system>"), "<system>");
  // Only one side tagged: wrapped again, as upstream.
  EXPECT_EQ(wrap_system_prompt("<system> Half."), "<system> <system> Half. <system>");
  // Whitespace-only is non-empty upstream, so it is wrapped around nothing.
  EXPECT_EQ(wrap_system_prompt("   "), "<system>  <system>");
  // Python's strip also removes Unicode spaces (here U+00A0 and U+3000).
  EXPECT_EQ(wrap_system_prompt("\xC2\xA0Hi\xE3\x80\x80"), "<system> Hi <system>");
  // Interior whitespace is kept.
  EXPECT_EQ(wrap_system_prompt("a  b"), "<system> a  b <system>");
}
