// The audio personaplex-load streams: a deterministic speech-like signal per seed, or a file, cut
// into 80 ms frames and encoded once, before any session starts, into the WebSocket messages the
// web client sends (0x01 + one Ogg page: OpusHead, OpusTags, then one 80 ms Opus packet per page).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ppx::load {

inline constexpr int kSampleRate = 24000;
inline constexpr int kFrameSamples = 1920;  // 80 ms at 24 kHz
inline constexpr double kFrameMs = 80.0;

// `frames` frames (frames * kFrameSamples samples at 24 kHz) of a speech-like signal: voiced
// "syllables" (harmonics of a fundamental that glides between ~90 and ~260 Hz with vibrato,
// shaped by two moving formant bumps) at ~4 per second under a smooth envelope, with pauses
// between phrases and a little noise. Peak level about -6 dBFS. The same seed gives the same
// samples on every machine (no <random> distributions); different seeds give different voices,
// rhythms and phrases.
std::vector<float> speech_like_signal(uint64_t seed, int64_t frames);

// A file's first channel (any format libsndfile reads: WAV, FLAC, Ogg Vorbis/Opus), resampled to
// 24 kHz and repeated (or cut) to exactly `frames` frames. Throws ppx::Error naming the file when
// it cannot be read or holds no samples.
std::vector<float> file_signal(const std::string& path, int64_t frames);

// The pages of speech_like_signal(seed, frames) and of file_signal(path, frames), made a frame at a
// time: past ~11.6 minutes the PCM is never held whole (a day of it is 8.3 GB of floats), only the
// pages (~0.3 KB a frame); the speech-like signal is then generated twice (first for its level).
struct EncodedStream;
// `whole_samples`: the longest signal kept whole (64 MB of floats, ~11.6 minutes; tests lower it).
inline constexpr int64_t kWholeSignalSamples = (int64_t{64} << 20) / 4;
std::shared_ptr<const EncodedStream> encode_speech_like(uint64_t seed, int64_t frames,
                                                        int64_t whole_samples = kWholeSignalSamples);
std::shared_ptr<const EncodedStream> encode_file(const std::string& path, int64_t frames);

// One session's outgoing messages, immutable and shared by the sessions that stream the same
// audio: `head` and `tags` (0x01 + OpusHead page, 0x01 + OpusTags page), then `frames[k]`
// (0x01 + the page of frame k).
struct EncodedStream {
  std::vector<uint8_t> head, tags;
  std::vector<std::vector<uint8_t>> frames;
};

// Encodes `pcm` (a multiple of kFrameSamples samples at 24 kHz) with the project's Ogg Opus
// writer, one 80 ms packet per page.
std::shared_ptr<const EncodedStream> encode_stream(const std::vector<float>& pcm);

}  // namespace ppx::load
