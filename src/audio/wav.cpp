#include <sndfile.h>
#include <soxr.h>

#include <algorithm>
#include <cmath>

#include "ppx/audio.h"
#include "ppx/error.h"

namespace ppx {

Audio read_audio(const std::string& path) {
  SF_INFO info{};
  SNDFILE* f = sf_open(path.c_str(), SFM_READ, &info);
  if (!f) throw Error("audio file '" + path + "' cannot be read as audio (libsndfile: " + sf_strerror(nullptr) + ")");
  if (info.channels <= 0 || info.samplerate <= 0 || info.frames < 0) {
    sf_close(f);
    throw Error("audio file '" + path + "': bad header");
  }
  if (info.frames > (int64_t{1} << 34) / info.channels) {
    sf_close(f);
    throw Error("audio file '" + path + "': too long");
  }
  Audio a;
  a.sample_rate = info.samplerate;
  a.channels = info.channels;
  a.samples.resize(static_cast<size_t>(info.frames) * info.channels);
  const sf_count_t got = sf_readf_float(f, a.samples.data(), info.frames);
  sf_close(f);
  if (got < 0) throw Error("audio file '" + path + "': read error");
  if (got == 0) throw Error("audio file '" + path + "' has no samples");  // no caller can use none
  a.samples.resize(static_cast<size_t>(got) * info.channels);
  return a;
}

void write_wav_pcm16(const std::string& path, int sample_rate, const std::vector<float>& mono) {
  SF_INFO info{};
  info.samplerate = sample_rate;
  info.channels = 1;
  info.format = SF_FORMAT_WAV | SF_FORMAT_PCM_16;
  SNDFILE* f = sf_open(path.c_str(), SFM_WRITE, &info);
  if (!f) throw Error("cannot write '" + path + "': " + sf_strerror(nullptr));
  std::vector<short> pcm(mono.size());
  for (size_t i = 0; i < mono.size(); ++i) {
    const float v = std::clamp(mono[i], -1.f, 1.f);
    pcm[i] = static_cast<short>(std::lrint(v * 32767.f));
  }
  const sf_count_t n = sf_write_short(f, pcm.data(), static_cast<sf_count_t>(pcm.size()));
  const int closed = sf_close(f);  // the header's sizes are written here
  if (n != static_cast<sf_count_t>(pcm.size()) || closed != 0)
    throw Error("cannot write '" + path + "': " + (n != static_cast<sf_count_t>(pcm.size()) ? "short write" : sf_error_number(closed)));
}

std::vector<float> take_channel(const Audio& a, int ch) {
  if (ch < 0 || ch >= a.channels) throw Error("audio has no channel " + std::to_string(ch));
  std::vector<float> out(a.frames());
  for (size_t i = 0; i < out.size(); ++i) out[i] = a.samples[i * a.channels + ch];
  return out;
}

std::vector<float> resample(const std::vector<float>& x, int from_hz, int to_hz) {
  if (from_hz == to_hz || x.empty()) return x;
  const size_t out_len = static_cast<size_t>(std::llround(static_cast<double>(x.size()) * to_hz / from_hz));
  if (out_len == 0) return {};  // a few samples at a far higher rate (soxr would get no output buffer)
  std::vector<float> y(out_len);
  size_t done = 0;
  const soxr_quality_spec_t q = soxr_quality_spec(SOXR_VHQ, 0);
  const soxr_io_spec_t io = soxr_io_spec(SOXR_FLOAT32_I, SOXR_FLOAT32_I);
  const soxr_error_t err =
      soxr_oneshot(from_hz, to_hz, 1, x.data(), x.size(), nullptr, y.data(), y.size(), &done, &io, &q, nullptr);
  if (err) throw Error(std::string("resampling failed: ") + err);
  y.resize(done);
  y.resize(out_len, 0.f);
  return y;
}

}  // namespace ppx
