// The server's prepared voice prompts: a voice file read, decoded and made ready for the system
// prompt phase once, then shared by every session that asks for it while the file is unchanged.
//
// Preparing a voice is host work on the session's start path: a .pt voice is parsed, an audio
// voice is decoded, resampled to the model rate and loudness-normalised (a 232-second WAV took
// ~207 ms on one core of the development VM, and 19 ms more to hash), and either is hashed for the
// prompt cache key (bench/results/cpu_2026-12-05_v26). With
// the prompt cache a known prompt otherwise starts in a few milliseconds, so without this cache
// the voice preparation would dominate a cached start.
//
// Entries are keyed by the file's path, size and modification time (a file replaced in place is
// prepared again); least recently used entries leave when their bytes exceed the cap; a voice
// larger than the whole cap is prepared for its session and not kept. Failures are not cached.
// Thread-safe: sessions prepare voices from their own threads; two sessions asking for the same
// unprepared voice at once may both prepare it (the later result replaces the earlier).
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>

#include "ppx/conversation.h"

namespace ppx {

// The server's cap (host memory): a 10-second WAV voice prepares to ~1 MB, a .pt voice to a few
// hundred KB, the longest voice that fits the context (~230 s) to ~22 MB.
inline constexpr size_t kVoiceCacheBytes = size_t{256} << 20;

struct PreparedVoice {
  SystemPrompt prompt;  // the voice (load_voice_prompt) and its voice_digest; no text tokens
  size_t bytes = 0;     // what the voice holds
};

// load_voice_prompt() and the voice's digest. Throws ppx::Error as load_voice_prompt does.
PreparedVoice prepare_voice(const std::string& path, int sample_rate, int frame_samples);

// Copies a prepared voice into a system prompt (its voice fields and digest).
void set_prompt_voice(SystemPrompt& p, const PreparedVoice& v);

class VoiceCache {
 public:
  explicit VoiceCache(size_t capacity_bytes) : cap_(capacity_bytes) {}

  // The prepared voice of `path` (sample rate and frame size as prepare_voice): from the cache
  // when the file's size and modification time are those it was prepared from, else prepared now
  // (and kept when it fits).
  std::shared_ptr<const PreparedVoice> get(const std::string& path, int sample_rate, int frame_samples);

  struct Stats {
    size_t bytes = 0, entries = 0;
    uint64_t hits = 0, misses = 0, evictions = 0;
  };
  Stats stats() const;

 private:
  struct Entry {
    std::string key;
    std::shared_ptr<const PreparedVoice> voice;
  };
  const size_t cap_;
  mutable std::mutex mu_;
  std::list<Entry> lru_;  // most recently used first
  Stats stats_;
};

}  // namespace ppx
