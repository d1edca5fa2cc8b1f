#include "apps/load_signal.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "ppx/audio.h"
#include "ppx/error.h"
#include "ppx/ogg_opus.h"

namespace ppx::load {

namespace {

// SplitMix64: portable, so the signal is the same everywhere (std distributions are not).
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform(double lo, double hi) {
    return lo + (hi - lo) * static_cast<double>(next() >> 11) * 0x1.0p-53;
  }

 private:
  uint64_t s_;
};

// One syllable (voiced) or pause (amp 0), in samples.
struct Segment {
  int64_t start = 0, len = 0;
  double amp = 0, f0 = 0, f1 = 0, f2 = 0;  // peak amplitude, f0 at its end, formants (Hz)
};

std::vector<Segment> schedule(Rng& rng, int64_t total, double base_f0) {
  std::vector<Segment> segs;
  int64_t t = 0;
  while (t < total) {
    // A phrase of syllables, then a pause.
    const double phrase_s = rng.uniform(1.2, 3.5);
    const int64_t phrase_end = t + static_cast<int64_t>(phrase_s * kSampleRate);
    while (t < phrase_end && t < total) {
      Segment s;
      s.start = t;
      s.len = static_cast<int64_t>(rng.uniform(0.14, 0.32) * kSampleRate);
      s.amp = rng.uniform(0.45, 1.0);
      s.f0 = base_f0 * rng.uniform(0.8, 1.3);
      s.f1 = rng.uniform(300, 850);
      s.f2 = rng.uniform(900, 2300);
      segs.push_back(s);
      t += s.len;
    }
    Segment pause;
    pause.start = t;
    pause.len = static_cast<int64_t>(rng.uniform(0.25, 0.9) * kSampleRate);
    pause.f0 = segs.empty() ? base_f0 : segs.back().f0;
    segs.push_back(pause);
    t += pause.len;
  }
  return segs;
}

double bump(double f, double centre, double width) {
  const double d = (f - centre) / width;
  return std::exp(-d * d);
}

}  // namespace

std::vector<float> speech_like_signal(uint64_t seed, int64_t frames) {
  const int64_t total = frames * kFrameSamples;
  std::vector<float> out(static_cast<size_t>(std::max<int64_t>(total, 0)), 0.f);
  if (total <= 0) return out;
  Rng rng(seed * 0x2545F4914F6CDD1Dull + 12345);
  const double base_f0 = rng.uniform(95, 200);
  const double vibrato_hz = rng.uniform(4.5, 6.5), drift_hz = rng.uniform(0.15, 0.4);
  const double drift_phase = rng.uniform(0, 2 * std::numbers::pi);
  const std::vector<Segment> segs = schedule(rng, total, base_f0);
  constexpr int kMaxHarmonics = 48;
  constexpr double kTopHz = 4000;
  constexpr int64_t kBlock = 120;  // harmonic amplitudes are updated every 5 ms
  double phase[kMaxHarmonics] = {};
  double amp[kMaxHarmonics] = {};
  double prev_f0 = base_f0;
  const double two_pi = 2 * std::numbers::pi;
  for (const Segment& s : segs) {
    const int64_t end = std::min(total, s.start + s.len);
    for (int64_t b = s.start; b < end; b += kBlock) {
      const int64_t bend = std::min(end, b + kBlock);
      const double x = static_cast<double>(b - s.start) / static_cast<double>(s.len);  // 0..1
      const double t = static_cast<double>(b) / kSampleRate;
      // The pitch glides from the last syllable's to this one's, with drift and vibrato.
      const double f0 = (prev_f0 + (s.f0 - prev_f0) * std::min(1.0, 2 * x)) *
                        (1 + 0.08 * std::sin(two_pi * drift_hz * t + drift_phase)) *
                        (1 + 0.015 * std::sin(two_pi * vibrato_hz * t));
      const double env = s.amp * std::pow(std::sin(std::numbers::pi * x), 2);
      const int harmonics = std::min(kMaxHarmonics, static_cast<int>(kTopHz / f0));
      for (int h = 0; h < harmonics; ++h) {
        const double fh = f0 * (h + 1);
        amp[h] = env / (h + 1) * (0.3 + 2.0 * bump(fh, s.f1, 180) + 1.2 * bump(fh, s.f2, 260));
      }
      for (int64_t i = b; i < bend; ++i) {
        double v = 0;
        for (int h = 0; h < harmonics; ++h) {
          phase[h] += two_pi * f0 * (h + 1) / kSampleRate;
          if (phase[h] > two_pi) phase[h] -= two_pi;
          v += amp[h] * std::sin(phase[h]);
        }
        // Breath noise, louder at syllable edges.
        v += (0.002 + 0.01 * env * (1 - env)) * rng.uniform(-1, 1);
        out[static_cast<size_t>(i)] = static_cast<float>(v);
      }
    }
    if (s.amp > 0) prev_f0 = s.f0;
  }
  float peak = 0;
  for (float v : out) peak = std::max(peak, std::abs(v));
  if (peak > 0) {
    const float g = 0.5f / peak;  // -6 dBFS
    for (float& v : out) v *= g;
  }
  return out;
}

std::vector<float> file_signal(const std::string& path, int64_t frames) {
  const Audio a = read_audio(path);  // refuses a file without samples
  const std::vector<float> x = resample(take_channel(a, 0), a.sample_rate, kSampleRate);
  if (x.empty()) throw Error("--input '" + path + "' has no samples");
  std::vector<float> out(static_cast<size_t>(frames * kFrameSamples));
  for (size_t i = 0; i < out.size(); ++i) out[i] = x[i % x.size()];
  return out;
}

std::shared_ptr<const EncodedStream> encode_stream(const std::vector<float>& pcm) {
  auto s = std::make_shared<EncodedStream>();
  OggOpusWriter w(kSampleRate);
  auto message = [](const std::vector<uint8_t>& page) {
    std::vector<uint8_t> m(1 + page.size());
    m[0] = 0x01;
    std::copy(page.begin(), page.end(), m.begin() + 1);
    return m;
  };
  s->head = message(w.head_page());
  s->tags = message(w.tags_page());
  for (size_t i = 0; i + kFrameSamples <= pcm.size(); i += kFrameSamples)
    s->frames.push_back(message(w.encode_frame(pcm.data() + i, kFrameSamples)));
  return s;
}

}  // namespace ppx::load
