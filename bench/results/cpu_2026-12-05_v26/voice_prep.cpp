// Host cost of a voice prompt at a session's start: a synthetic speech-like WAV of 232 s (the
// longest voice the 3000-frame context holds beside the default prompts) and of 10 s, prepared
// (decode, resample, loudness) and hashed for the prompt cache key as a session did before the
// VoiceCache, then through the VoiceCache (first call prepares, later calls hit). Median of 5.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/prompt_cache.h"
#include "engine/voice_cache.h"
#include "ppx/audio.h"

namespace {
double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}
template <typename F>
double median_ms(int reps, F&& f) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(ms_since(t0));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}
}  // namespace

int main() {
  constexpr int kRate = 24000, kFrame = 1920;
  for (const double seconds : {232.0, 10.0}) {
    const std::string path =
        (std::filesystem::temp_directory_path() / ("voice_prep_" + std::to_string(static_cast<int>(seconds)) + ".wav"))
            .string();
    std::vector<float> x(static_cast<size_t>(seconds * kRate));
    double phase = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double t = static_cast<double>(i) / kRate;
      phase += 2 * M_PI * (120 + 30 * std::sin(2 * M_PI * 0.3 * t)) / kRate;
      const double env = std::max(0.0, std::sin(2 * M_PI * 2.5 * t)) * (std::fmod(t, 4.0) > 3.4 ? 0.0 : 1.0);
      x[i] = static_cast<float>(0.25 * env * (0.5 * std::sin(phase) + 0.25 * std::sin(2 * phase)));
    }
    ppx::write_wav_pcm16(path, kRate, x);
    const double prep = median_ms(5, [&] { (void)ppx::prepare_voice_audio(path, kRate, kFrame); });
    ppx::SystemPrompt p;
    p.voice_audio = ppx::prepare_voice_audio(path, kRate, kFrame);
    const double hash = median_ms(5, [&] { (void)ppx::voice_prompt_digest(p); });
    ppx::VoiceCache cache(ppx::kVoiceCacheBytes);
    const auto t0 = std::chrono::steady_clock::now();
    (void)cache.get(path, kRate, kFrame);
    const double first = ms_since(t0);
    const double hit = median_ms(5, [&] {
      ppx::SystemPrompt q;
      ppx::set_prompt_voice(q, *cache.get(path, kRate, kFrame));  // what a session start does now
    });
    std::printf("voice %3.0f s: prepare %.1f ms, hash %.1f ms (per session before); VoiceCache first %.1f ms, "
                "hit + copy into the prompt %.2f ms\n",
                seconds, prep, hash, first, hit);
  }
  return 0;
}
