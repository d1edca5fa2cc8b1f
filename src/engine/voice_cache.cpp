#include "engine/voice_cache.h"

#include <filesystem>
#include <system_error>

#include "engine/prompt_cache.h"

namespace ppx {

PreparedVoice prepare_voice(const std::string& path, int sample_rate, int frame_samples) {
  PreparedVoice v;
  SystemPrompt& p = v.prompt;
  load_voice_prompt(p, path, sample_rate, frame_samples);
  p.voice_digest = voice_prompt_digest(p);
  v.bytes = p.voice_audio.size() * sizeof(float);
  if (p.voice) v.bytes += p.voice->embeddings.size() * sizeof(float) + p.voice->cache.size() * sizeof(int64_t);
  return v;
}

void set_prompt_voice(SystemPrompt& p, const PreparedVoice& v) {
  p.voice = v.prompt.voice;
  p.voice_audio = v.prompt.voice_audio;
  p.voice_digest = v.prompt.voice_digest;
}

std::shared_ptr<const PreparedVoice> VoiceCache::get(const std::string& path, int sample_rate, int frame_samples) {
  // The file as it is now: a voice prepared from another size or time is stale. (A file that
  // cannot be inspected gets no key: prepare_voice reports why it cannot be read.)
  std::error_code ec1, ec2;
  const auto size = std::filesystem::file_size(path, ec1);
  const auto mtime = std::filesystem::last_write_time(path, ec2);
  std::string key;
  if (!ec1 && !ec2) {
    key = path + '\n' + std::to_string(size) + '\n' + std::to_string(mtime.time_since_epoch().count()) + '\n' +
          std::to_string(sample_rate) + '\n' + std::to_string(frame_samples);
    std::lock_guard<std::mutex> lk(mu_);
    for (auto it = lru_.begin(); it != lru_.end(); ++it) {
      if (it->key != key) continue;
      lru_.splice(lru_.begin(), lru_, it);
      ++stats_.hits;
      return lru_.front().voice;
    }
    ++stats_.misses;
  }
  auto v = std::make_shared<const PreparedVoice>(prepare_voice(path, sample_rate, frame_samples));
  if (key.empty() || v->bytes > cap_) return v;
  std::lock_guard<std::mutex> lk(mu_);
  // The same file prepared by another session meanwhile, or an older version of it (a key of the
  // same path): replaced.
  for (auto it = lru_.begin(); it != lru_.end();) {
    if (it->key.compare(0, path.size() + 1, path + '\n') == 0) {
      stats_.bytes -= it->voice->bytes;
      it = lru_.erase(it);
    } else {
      ++it;
    }
  }
  while (!lru_.empty() && stats_.bytes + v->bytes > cap_) {
    stats_.bytes -= lru_.back().voice->bytes;
    lru_.pop_back();
    ++stats_.evictions;
  }
  lru_.push_front(Entry{key, v});
  stats_.bytes += v->bytes;
  return v;
}

VoiceCache::Stats VoiceCache::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  Stats s = stats_;
  s.entries = lru_.size();
  return s;
}

}  // namespace ppx
