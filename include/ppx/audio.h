// Audio file I/O and conversion: WAV (any format libsndfile reads) in, 16-bit PCM WAV out,
// resampling with soxr (very high quality), channel selection.
#pragma once

#include <string>
#include <vector>

namespace ppx {

struct Audio {
  int sample_rate = 0;
  int channels = 0;
  std::vector<float> samples;  // interleaved [frames, channels]
  size_t frames() const { return channels ? samples.size() / channels : 0; }
};

// Reads an audio file. Throws ppx::Error naming the file when it cannot be read or decoded.
Audio read_audio(const std::string& path);
// Writes mono 16-bit PCM WAV; samples are clamped to [-1, 1].
void write_wav_pcm16(const std::string& path, int sample_rate, const std::vector<float>& mono);
// Channel `ch` of interleaved audio.
std::vector<float> take_channel(const Audio& a, int ch);
// Resamples mono audio from `from_hz` to `to_hz` (identity when equal).
std::vector<float> resample(const std::vector<float>& x, int from_hz, int to_hz);

}  // namespace ppx
