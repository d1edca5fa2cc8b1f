// Loudness measurement and upstream's voice-prompt preparation: read, first channel, resample,
// normalise to -24 LUFS, pad to whole frames.
//
// Two meters live here. loudness_lufs() is the standard BS.1770-4 measurement through libebur128.
// upstream_loudness_lufs() reproduces pyloudnorm's meter (what PersonaPlex's `normalize_audio`
// calls) so that the gain applied to a voice prompt matches upstream to ~1e-6 dB; the two meters
// differ by up to ~0.1 LU because pyloudnorm approximates the K-weighting with cookbook biquads.

#include <ebur128.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>
#include <numbers>
#include <string>
#include <vector>

#include "ppx/audio.h"
#include "ppx/error.h"

namespace ppx {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Gating parameters shared by BS.1770-4 and pyloudnorm.
constexpr double kBlockSeconds = 0.4;    // gating block length T_g
constexpr double kBlockStep = 0.25;      // 1 - 75 % overlap, as a fraction of T_g
constexpr double kAbsoluteGate = -70.0;  // LUFS
constexpr double kRelativeGate = -10.0;  // LU below the absolute-gated loudness
constexpr double kLoudnessOffset = -0.691;

struct Ebur128Deleter {
  void operator()(ebur128_state* st) const { ebur128_destroy(&st); }
};
using Ebur128Ptr = std::unique_ptr<ebur128_state, Ebur128Deleter>;

// Normalised biquad (a0 == 1).
struct Biquad {
  double b0, b1, b2, a1, a2;
};

// RBJ audio-EQ-cookbook high shelf; gain in dB.
Biquad high_shelf(double gain_db, double q, double fc, double rate) {
  const double a = std::pow(10.0, gain_db / 40.0);
  const double w0 = 2.0 * std::numbers::pi * (fc / rate);
  const double alpha = std::sin(w0) / (2.0 * q);
  const double c = std::cos(w0);
  const double sa = 2.0 * std::sqrt(a) * alpha;
  const double a0 = (a + 1) - (a - 1) * c + sa;
  return {a * ((a + 1) + (a - 1) * c + sa) / a0, -2 * a * ((a - 1) + (a + 1) * c) / a0,
          a * ((a + 1) + (a - 1) * c - sa) / a0, 2 * ((a - 1) - (a + 1) * c) / a0,
          ((a + 1) - (a - 1) * c - sa) / a0};
}

// RBJ audio-EQ-cookbook second-order high pass.
Biquad high_pass(double q, double fc, double rate) {
  const double w0 = 2.0 * std::numbers::pi * (fc / rate);
  const double alpha = std::sin(w0) / (2.0 * q);
  const double c = std::cos(w0);
  const double a0 = 1 + alpha;
  return {(1 + c) / 2 / a0, -(1 + c) / a0, (1 + c) / 2 / a0, -2 * c / a0, (1 - alpha) / a0};
}

// In-place filtering from rest (transposed direct form II, as scipy.signal.lfilter), computed in
// double and stored back as float like pyloudnorm does on a float32 array.
void apply_biquad(const Biquad& f, std::vector<float>& x) {
  double z1 = 0.0, z2 = 0.0;
  for (float& v : x) {
    const double in = v;
    const double out = f.b0 * in + z1;
    z1 = f.b1 * in - f.a1 * out + z2;
    z2 = f.b2 * in - f.a2 * out;
    v = static_cast<float>(out);
  }
}

double block_loudness(double mean_square) {
  return kLoudnessOffset + 10.0 * std::log10(mean_square);
}

}  // namespace

double loudness_lufs(const std::vector<float>& mono, int sample_rate) {
  if (sample_rate <= 0) throw Error("loudness: bad sample rate " + std::to_string(sample_rate));
  Ebur128Ptr st(ebur128_init(1, static_cast<unsigned long>(sample_rate), EBUR128_MODE_I));
  if (!st) throw Error("loudness: libebur128 rejects sample rate " + std::to_string(sample_rate));
  constexpr size_t kChunk = size_t{1} << 16;
  for (size_t off = 0; off < mono.size(); off += kChunk) {
    const size_t n = std::min(kChunk, mono.size() - off);
    if (ebur128_add_frames_float(st.get(), mono.data() + off, n) != EBUR128_SUCCESS) {
      throw Error("loudness: libebur128 failed to add frames");
    }
  }
  double lufs = 0.0;
  if (ebur128_loudness_global(st.get(), &lufs) != EBUR128_SUCCESS) {
    throw Error("loudness: libebur128 failed to compute integrated loudness");
  }
  // libebur128 reports -HUGE_VAL when no block passes the gates.
  return std::isfinite(lufs) ? lufs : kNegInf;
}

double upstream_loudness_lufs(const std::vector<float>& mono, int sample_rate) {
  if (sample_rate <= 0) throw Error("loudness: bad sample rate " + std::to_string(sample_rate));
  const double rate = sample_rate;
  // pyloudnorm util.valid_audio refuses `len < block_size * rate`.
  if (static_cast<double>(mono.size()) < kBlockSeconds * rate) return kNegInf;

  std::vector<float> k = mono;
  apply_biquad(high_shelf(4.0, 1.0 / std::numbers::sqrt2, 1500.0, rate), k);
  apply_biquad(high_pass(0.5, 38.0, rate), k);

  // Block layout as pyloudnorm: count rounded half-to-even (np.round), bounds truncated, and the
  // mean square always divided by the full block length even for a partial last block.
  const double seconds = static_cast<double>(k.size()) / rate;
  const long n_blocks =
      std::lrint(std::nearbyint((seconds - kBlockSeconds) / (kBlockSeconds * kBlockStep))) + 1;
  const double inv_len = 1.0 / (kBlockSeconds * rate);
  std::vector<double> z(static_cast<size_t>(std::max(n_blocks, 0L)));
  std::vector<double> l(z.size());
  for (size_t j = 0; j < z.size(); ++j) {
    const double jd = static_cast<double>(j);
    const size_t lo = static_cast<size_t>(kBlockSeconds * (jd * kBlockStep) * rate);
    const size_t hi =
        std::min(k.size(), static_cast<size_t>(kBlockSeconds * (jd * kBlockStep + 1.0) * rate));
    double sum = 0.0;
    for (size_t i = lo; i < hi; ++i) sum += static_cast<double>(k[i]) * k[i];
    z[j] = inv_len * sum;
    l[j] = block_loudness(z[j]);
  }

  // Absolute gate (>= -70), relative threshold, then both gates (strictly above each).
  double sum = 0.0;
  size_t n = 0;
  for (size_t j = 0; j < z.size(); ++j) {
    if (l[j] >= kAbsoluteGate) {
      sum += z[j];
      ++n;
    }
  }
  if (n == 0) return kNegInf;  // pyloudnorm: mean of nothing -> NaN -> nan_to_num 0 -> -inf
  const double relative = block_loudness(sum / static_cast<double>(n)) + kRelativeGate;
  sum = 0.0;
  n = 0;
  for (size_t j = 0; j < z.size(); ++j) {
    if (l[j] > relative && l[j] > kAbsoluteGate) {
      sum += z[j];
      ++n;
    }
  }
  if (n == 0 || sum <= 0.0) return kNegInf;
  return block_loudness(sum / static_cast<double>(n));
}

std::vector<float> normalize_loudness(const std::vector<float>& mono, int sample_rate,
                                      double target_lufs) {
  const double lufs = upstream_loudness_lufs(mono, sample_rate);
  if (!std::isfinite(lufs)) return mono;
  const double gain = std::pow(10.0, (target_lufs - lufs) / 20.0);
  std::vector<float> out(mono.size());
  for (size_t i = 0; i < mono.size(); ++i) {
    out[i] = static_cast<float>(gain * static_cast<double>(mono[i]));
  }
  return out;
}

void check_voice_file_size(const std::string& path) {
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (!ec && size > kMaxVoiceFileBytes) {
    throw Error("voice prompt '" + path + "': file is " + std::to_string(size) +
                " bytes, over the " + std::to_string(kMaxVoiceFileBytes >> 20) +
                " MiB cap for voice files");
  }
}

std::vector<float> prepare_voice_audio(const std::string& path, int sample_rate,
                                       int frame_samples) {
  check_voice_file_size(path);
  if (sample_rate <= 0 || frame_samples <= 0) {
    throw Error("voice prompt '" + path + "': bad sample rate or frame size");
  }
  const Audio audio = read_audio(path);
  if (audio.sample_rate < kMinVoiceRateHz || audio.sample_rate > kMaxVoiceRateHz) {
    throw Error("voice prompt '" + path + "': sample rate " + std::to_string(audio.sample_rate) + " Hz, outside the " +
                std::to_string(kMinVoiceRateHz) + " to " + std::to_string(kMaxVoiceRateHz) + " Hz a voice may have");
  }
  const double seconds = static_cast<double>(audio.frames()) / audio.sample_rate;
  if (seconds > kMaxVoiceSeconds) {
    throw Error("voice prompt '" + path + "': " + std::to_string(std::lrint(seconds)) + " s long, over the " +
                std::to_string(std::lrint(kMaxVoiceSeconds)) + " s cap (a voice prompt must fit the LM context)");
  }
  std::vector<float> x = resample(take_channel(audio, 0), audio.sample_rate, sample_rate);
  if (seconds < kBlockSeconds || static_cast<double>(x.size()) < kBlockSeconds * sample_rate) {
    throw Error("voice prompt '" + path + "': " + std::to_string(x.size()) + " samples at " +
                std::to_string(sample_rate) +
                " Hz, shorter than the 400 ms needed to measure its loudness");
  }
  x = normalize_loudness(x, sample_rate, -24.0);
  const size_t fs = static_cast<size_t>(frame_samples);
  if (const size_t rem = x.size() % fs; rem != 0) x.resize(x.size() + (fs - rem), 0.f);
  return x;
}

}  // namespace ppx
