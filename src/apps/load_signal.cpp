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

// The speech-like signal one sample at a time, before its level is set (speech_like_signal and
// encode_speech_like scale it by 0.5 / its peak): the same samples whether kept whole or streamed.
class SpeechLike {
 public:
  SpeechLike(uint64_t seed, int64_t frames)
      : total_(std::max<int64_t>(frames, 0) * kFrameSamples), rng_(seed * 0x2545F4914F6CDD1Dull + 12345) {
    base_f0_ = rng_.uniform(95, 200);
    vibrato_hz_ = rng_.uniform(4.5, 6.5);
    drift_hz_ = rng_.uniform(0.15, 0.4);
    drift_phase_ = rng_.uniform(0, 2 * std::numbers::pi);
    segs_ = schedule(rng_, total_, base_f0_);
    prev_f0_ = base_f0_;
  }
  int64_t total() const { return total_; }
  // The next sample; call it total() times.
  float next() {
    while (i_ >= bend_) next_block();
    double v = 0;
    for (int h = 0; h < harmonics_; ++h) {
      phase_[h] += kTwoPi * f0_ * (h + 1) / kSampleRate;
      if (phase_[h] > kTwoPi) phase_[h] -= kTwoPi;
      v += amp_[h] * std::sin(phase_[h]);
    }
    // Breath noise, louder at syllable edges.
    v += (0.002 + 0.01 * env_ * (1 - env_)) * rng_.uniform(-1, 1);
    ++i_;
    return static_cast<float>(v);
  }

 private:
  static constexpr int kMaxHarmonics = 48;
  static constexpr double kTopHz = 4000;
  static constexpr int64_t kBlock = 120;  // harmonic amplitudes are updated every 5 ms
  static constexpr double kTwoPi = 2 * std::numbers::pi;

  // Moves to the next block of kBlock samples (or a segment's shorter last one), in the next
  // segment with samples when this one is done, and sets its pitch, envelope and harmonics.
  void next_block() {
    if (started_) {
      b_ += kBlock;
      if (b_ >= end_) {
        if (segs_[si_].amp > 0) prev_f0_ = segs_[si_].f0;
        ++si_;
        enter_segment();
      }
    } else {
      started_ = true;
      enter_segment();
    }
    const Segment& s = segs_[si_];
    bend_ = std::min(end_, b_ + kBlock);
    i_ = b_;
    const double x = static_cast<double>(b_ - s.start) / static_cast<double>(s.len);  // 0..1
    const double t = static_cast<double>(b_) / kSampleRate;
    // The pitch glides from the last syllable's to this one's, with drift and vibrato.
    f0_ = (prev_f0_ + (s.f0 - prev_f0_) * std::min(1.0, 2 * x)) *
          (1 + 0.08 * std::sin(kTwoPi * drift_hz_ * t + drift_phase_)) *
          (1 + 0.015 * std::sin(kTwoPi * vibrato_hz_ * t));
    env_ = s.amp * std::pow(std::sin(std::numbers::pi * x), 2);
    harmonics_ = std::min(kMaxHarmonics, static_cast<int>(kTopHz / f0_));
    for (int h = 0; h < harmonics_; ++h) {
      const double fh = f0_ * (h + 1);
      amp_[h] = env_ / (h + 1) * (0.3 + 2.0 * bump(fh, s.f1, 180) + 1.2 * bump(fh, s.f2, 260));
    }
  }
  // Segment si_ (or the first after it that has samples before total_): its first block.
  void enter_segment() {
    for (;; ++si_) {
      if (si_ >= segs_.size()) throw Error("speech_like_signal: asked for more samples than it has");
      end_ = std::min(total_, segs_[si_].start + segs_[si_].len);
      b_ = segs_[si_].start;
      if (b_ < end_) return;
    }
  }

  int64_t total_;
  Rng rng_;
  double base_f0_ = 0, vibrato_hz_ = 0, drift_hz_ = 0, drift_phase_ = 0;
  std::vector<Segment> segs_;
  size_t si_ = 0;
  bool started_ = false;
  int64_t b_ = 0, end_ = 0, bend_ = 0, i_ = 0;  // block start, segment end, block end, next sample
  double prev_f0_ = 0, f0_ = 0, env_ = 0;
  int harmonics_ = 0;
  double phase_[kMaxHarmonics] = {};
  double amp_[kMaxHarmonics] = {};
};

// The gain that brings a signal's peak to -6 dBFS (1 for silence).
float level_gain(float peak) { return peak > 0 ? 0.5f / peak : 1.f; }

// Pages of `frames` frames, frame k's samples written by fill(k, out).
template <typename Fill>
std::shared_ptr<const EncodedStream> encode_frames(int64_t frames, Fill&& fill) {
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
  s->frames.reserve(static_cast<size_t>(std::max<int64_t>(frames, 0)));
  std::vector<float> pcm(kFrameSamples);
  for (int64_t k = 0; k < frames; ++k) {
    fill(k, pcm.data());
    s->frames.push_back(message(w.encode_frame(pcm.data(), kFrameSamples)));
  }
  return s;
}

}  // namespace

std::vector<float> speech_like_signal(uint64_t seed, int64_t frames) {
  SpeechLike gen(seed, frames);
  std::vector<float> out(static_cast<size_t>(gen.total()), 0.f);
  float peak = 0;
  for (float& v : out) {
    v = gen.next();
    peak = std::max(peak, std::abs(v));
  }
  const float g = level_gain(peak);
  for (float& v : out) v *= g;
  return out;
}

std::shared_ptr<const EncodedStream> encode_speech_like(uint64_t seed, int64_t frames, int64_t whole_samples) {
  // Up to whole_samples the signal is made once and kept whole for its level; longer, it is made
  // twice, a first pass for the level and then frame by frame (the same pages).
  if (frames * kFrameSamples <= whole_samples) return encode_stream(speech_like_signal(seed, frames));
  float peak = 0;
  {
    SpeechLike gen(seed, frames);
    for (int64_t i = 0; i < gen.total(); ++i) peak = std::max(peak, std::abs(gen.next()));
  }
  const float g = level_gain(peak);
  SpeechLike gen(seed, frames);
  return encode_frames(frames, [&](int64_t, float* out) {
    for (int i = 0; i < kFrameSamples; ++i) out[i] = gen.next() * g;
  });
}

namespace {

// A file's first channel at 24 kHz; throws naming the file when it has no samples.
std::vector<float> file_pcm(const std::string& path) {
  const Audio a = read_audio(path);  // refuses a file without samples
  std::vector<float> x = resample(take_channel(a, 0), a.sample_rate, kSampleRate);
  if (x.empty()) throw Error("--input '" + path + "' has no samples");
  return x;
}

}  // namespace

std::vector<float> file_signal(const std::string& path, int64_t frames) {
  const std::vector<float> x = file_pcm(path);
  std::vector<float> out(static_cast<size_t>(frames * kFrameSamples));
  for (size_t i = 0; i < out.size(); ++i) out[i] = x[i % x.size()];
  return out;
}

std::shared_ptr<const EncodedStream> encode_file(const std::string& path, int64_t frames) {
  const std::vector<float> x = file_pcm(path);
  size_t at = 0;  // the file repeats
  return encode_frames(frames, [&](int64_t, float* out) {
    for (int i = 0; i < kFrameSamples; ++i) {
      out[i] = x[at];
      at = at + 1 == x.size() ? 0 : at + 1;
    }
  });
}

std::shared_ptr<const EncodedStream> encode_stream(const std::vector<float>& pcm) {
  return encode_frames(static_cast<int64_t>(pcm.size() / kFrameSamples),
                       [&](int64_t k, float* out) { std::copy_n(pcm.data() + k * kFrameSamples, kFrameSamples, out); });
}

}  // namespace ppx::load
