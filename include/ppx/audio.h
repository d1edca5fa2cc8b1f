// Audio file I/O and conversion: WAV (any format libsndfile reads) in, 16-bit PCM WAV out,
// resampling with soxr (very high quality), channel selection.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ppx {

struct Audio {
  int sample_rate = 0;
  int channels = 0;
  std::vector<float> samples;  // interleaved [frames, channels]
  size_t frames() const { return channels ? samples.size() / channels : 0; }
};

// Reads an audio file. Throws ppx::Error naming the file when it cannot be read or decoded, or
// holds no samples.
Audio read_audio(const std::string& path);
// Writes mono 16-bit PCM WAV; samples are clamped to [-1, 1].
void write_wav_pcm16(const std::string& path, int sample_rate, const std::vector<float>& mono);
// Channel `ch` of interleaved audio.
std::vector<float> take_channel(const Audio& a, int ch);
// Resamples mono audio from `from_hz` to `to_hz` (identity when equal).
std::vector<float> resample(const std::vector<float>& x, int from_hz, int to_hz);

// ---- Loudness and voice-prompt preparation (upstream LMGen.load_voice_prompt) ----

// Integrated loudness of mono audio in LUFS, measured with libebur128: ITU-R BS.1770-4
// K-weighting (filters matched to the standard's coefficients), 400 ms blocks every 100 ms, EBU
// R128 gating (absolute -70 LUFS, relative -10 LU). Returns -infinity for silence, for audio whose
// every block is below the absolute gate and for audio shorter than one 400 ms block (empty input
// included). Throws ppx::Error for a sample rate libebur128 rejects.
double loudness_lufs(const std::vector<float>& mono, int sample_rate);

// Integrated loudness of mono audio in LUFS exactly as upstream measures it before normalising:
// pyloudnorm's `Meter(rate).integrated_loudness` (default "K-weighting"). Same gating as above,
// but its K-weighting is two RBJ-cookbook biquads (high shelf +4 dB at 1500 Hz, Q 1/sqrt(2); high
// pass 38 Hz, Q 0.5) applied with float32 storage as for upstream's float32 audio, and its block
// count is round((T - 0.4) / 0.1) + 1, so a final partial block may count. Reads 0.04-0.12 LU
// below loudness_lufs depending on rate (about 0.08 at 24 kHz). Returns -infinity where pyloudnorm
// returns -inf (no block passes the gates), and also for audio shorter than 400 ms, which
// pyloudnorm refuses with a ValueError. Throws ppx::Error for a non-positive sample rate.
double upstream_loudness_lufs(const std::vector<float>& mono, int sample_rate);

// Upstream's loudness normalisation of a voice prompt (moshi/models/lm.py `normalize_audio`:
// pyloudnorm `integrated_loudness` then `pyloudnorm.normalize.loudness`): every sample is
// multiplied by one gain 10^((target_lufs - L) / 20) with L = upstream_loudness_lufs(mono), in
// double, rounded to float. No clipping, no peak limiting: samples may leave [-1, 1] (upstream
// only warns). Where L is -infinity (silence, everything below -70 LUFS, or shorter than 400 ms)
// the input is returned unchanged; upstream would produce NaN/inf samples there (infinite gain),
// or raise for < 400 ms.
std::vector<float> normalize_loudness(const std::vector<float>& mono, int sample_rate,
                                      double target_lufs = -24.0);

// Voice prompt files, audio or .pt embeddings, larger than this are refused before being read
// (a real PersonaPlex voice .pt is a few MiB; 64 MiB is 23 minutes of 24 kHz 16-bit mono).
inline constexpr uint64_t kMaxVoiceFileBytes = uint64_t{64} << 20;
// Voice prompt audio: sample rates outside [kMinVoiceRateHz, kMaxVoiceRateHz] and durations over
// kMaxVoiceSeconds (longer than any LM context: 3000 steps are 240 s) are refused before
// resampling, which for a few samples at an extreme rate would take long or produce nothing.
inline constexpr int kMinVoiceRateHz = 4000;
inline constexpr int kMaxVoiceRateHz = 768000;
inline constexpr double kMaxVoiceSeconds = 600;
// Throws ppx::Error naming `path` and the cap when `path` is larger than kMaxVoiceFileBytes
// (a missing or unreadable file is left to the reader to report).
void check_voice_file_size(const std::string& path);

// Whole voice-prompt audio preparation, in upstream's order: read the file (any format, rate and
// channel count libsndfile reads), take channel 0, resample to `sample_rate` (soxr), normalise to
// -24 LUFS with normalize_loudness at `sample_rate`, then zero-pad the end to a multiple of
// `frame_samples` (nothing added when already a multiple). Throws ppx::Error naming the file when
// it is larger than kMaxVoiceFileBytes (checked before reading), cannot be read or decoded,
// holds no samples, has a sample rate or duration out of the bounds above, or is shorter than
// 400 ms
// (upstream's pyloudnorm raises "Audio must have length greater than the block size"). Silent
// audio of 400 ms or more comes back as zeros (upstream would produce NaN samples).
// Upstream normalises all channels together and pyloudnorm then rejects anything but mono
// ("five channels or less" on the [C, T] array); here multichannel files use channel 0, which is
// the channel upstream's frame iterator feeds to Mimi.
std::vector<float> prepare_voice_audio(const std::string& path, int sample_rate = 24000,
                                       int frame_samples = 1920);

}  // namespace ppx
