#include "engine/prompt_cache.h"

#include <openssl/evp.h>

#include <chrono>
#include <cstring>
#include <iterator>

#include "ppx/error.h"

namespace ppx {

namespace {

// A SHA-256 over tagged fields (a field's tag and length go in first, so no two different prompts
// hash the same bytes).
class Hasher {
 public:
  Hasher() : ctx_(EVP_MD_CTX_new()) {
    if (!ctx_ || EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr) != 1) throw Error("prompt cache: SHA-256 unavailable");
  }
  ~Hasher() { EVP_MD_CTX_free(ctx_); }
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;
  void bytes(const void* p, size_t n) {
    if (n && EVP_DigestUpdate(ctx_, p, n) != 1) throw Error("prompt cache: SHA-256 failed");
  }
  template <typename T>
  void field(char tag, const T* p, size_t n) {
    const uint64_t len = n * sizeof(T);
    bytes(&tag, 1);
    bytes(&len, sizeof len);
    bytes(p, len);
  }
  template <typename T>
  void value(char tag, T v) {
    field(tag, &v, 1);
  }
  std::string hex() {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    if (EVP_DigestFinal_ex(ctx_, md, &n) != 1) throw Error("prompt cache: SHA-256 failed");
    static const char* digits = "0123456789abcdef";
    std::string s;
    for (unsigned int i = 0; i < n; ++i) {
      s += digits[md[i] >> 4];
      s += digits[md[i] & 15];
    }
    return s;
  }

 private:
  EVP_MD_CTX* ctx_;
};

}  // namespace

std::string voice_prompt_digest(const SystemPrompt& p) {
  Hasher h;
  const char version[] = "ppx-voice-v1";
  h.field('V', version, sizeof version - 1);
  if (p.voice) {
    h.value('n', p.voice->n);
    h.value('d', p.voice->dim);
    h.field('e', p.voice->embeddings.data(), p.voice->embeddings.size());
    h.field('c', p.voice->cache.data(), p.voice->cache.size());
  } else if (!p.voice_audio.empty()) {
    h.field('a', p.voice_audio.data(), p.voice_audio.size());
  } else {
    h.value('0', 0);
  }
  return h.hex();
}

std::string prompt_cache_key(const SystemPrompt& p, const LmGenConfig& gen) {
  Hasher h;
  const char version[] = "ppx-prompt-v2";
  h.field('V', version, sizeof version - 1);
  const std::string voice = p.voice_digest.empty() ? voice_prompt_digest(p) : p.voice_digest;
  h.field('v', voice.data(), voice.size());
  h.field('t', p.text_tokens.data(), p.text_tokens.size());
  h.value('s', gen.audio_silence_frame_cnt);
  h.value('z', gen.zero_text_code);
  h.field('S', gen.silence_tokens.data(), gen.silence_tokens.size());
  h.field('W', gen.sine_tokens.data(), gen.sine_tokens.size());
  return h.hex();
}

PromptCache::Lease& PromptCache::Lease::operator=(Lease&& o) noexcept {
  if (this != &o) {
    release();
    cache_ = o.cache_;
    entry_ = o.entry_;
    o.cache_ = nullptr;
    o.entry_ = nullptr;
  }
  return *this;
}

void PromptCache::Lease::release() {
  if (cache_ && entry_) cache_->unpin(entry_);
  cache_ = nullptr;
  entry_ = nullptr;
}

void PromptCache::unpin(Entry* e) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    --e->pins;
    if (e->pins > 0 || (!e->dropped && e->ready)) return;
    // A reservation whose save failed or never got committed: its place is free again.
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (&*it == e) {
        entries_.erase(it);
        break;
      }
    }
  }
  cv_.notify_all();  // sessions waiting for it replay the prompt themselves
}

PromptCache::Acquired PromptCache::acquire(const std::string& key, size_t reserve_bytes,
                                           const std::function<bool()>& keep_waiting) {
  std::unique_lock<std::mutex> lk(mu_);
  bool waited = false;
  while (true) {
    Entry* pending = nullptr;
    for (Entry& e : entries_) {
      if (e.key != key || e.dropped) continue;
      if (!e.ready) {
        pending = &e;
        break;
      }
      ++e.pins;
      e.last_use = ++clock_;
      ++stats_.hits;
      stats_.waits += waited ? 1 : 0;
      return Acquired{Lease(this, &e), true};
    }
    if (!pending) {
      // Unknown: a miss, and (asked for) the place to save it, in the same step, so that of the
      // sessions arriving together with a new prompt one replays it and the others wait.
      ++stats_.misses;
      return Acquired{reserve_bytes > 0 ? reserve_locked(key, reserve_bytes) : Lease(), false};
    }
    if (!keep_waiting) break;
    // Another session is saving this prompt: wait for its commit (or its failure).
    cv_.wait_for(lk, std::chrono::milliseconds(20));
    waited = true;
    lk.unlock();
    const bool go_on = keep_waiting();
    lk.lock();
    if (!go_on) break;
  }
  ++stats_.misses;
  return Acquired{Lease(), false};
}

PromptCache::Lease PromptCache::lookup(const std::string& key, const std::function<bool()>& keep_waiting) {
  return acquire(key, 0, keep_waiting).lease;
}

PromptCache::Lease PromptCache::reserve(const std::string& key, size_t bytes) {
  std::lock_guard<std::mutex> lk(mu_);
  for (const Entry& e : entries_) {
    if (e.key == key && !e.dropped) return Lease();  // there, or being saved by another session
  }
  return reserve_locked(key, bytes);
}

PromptCache::Lease PromptCache::reserve_locked(const std::string& key, size_t bytes) {
  if (bytes == 0 || bytes > capacity_) {
    ++stats_.skipped;
    return Lease();
  }
  // Evict only if that can make room: some run between entries that cannot go (held, or not yet
  // saved) must hold `bytes`.
  {
    size_t start = 0;
    bool feasible = false;
    for (const Entry& e : entries_) {
      if (e.pins == 0 && e.ready) continue;  // could be evicted
      if (e.offset - start >= bytes) feasible = true;
      start = e.offset + e.bytes;
    }
    if (!feasible && capacity_ - start < bytes) {
      ++stats_.skipped;
      return Lease();
    }
  }
  while (true) {
    // First fit: the lowest gap between entries (sorted by offset) that holds `bytes`.
    size_t at = 0;
    auto it = entries_.begin();
    for (; it != entries_.end(); ++it) {
      if (it->offset - at >= bytes) break;
      at = it->offset + it->bytes;
    }
    if (it != entries_.end() || capacity_ - at >= bytes) {
      Entry& e = *entries_.insert(it, Entry{});
      e.key = key;
      e.offset = at;
      e.bytes = bytes;
      e.pins = 1;
      e.last_use = ++clock_;
      return Lease(this, &e);
    }
    // No gap: drop the least recently used entry nobody holds, then look again.
    auto victim = entries_.end();
    for (auto v = entries_.begin(); v != entries_.end(); ++v) {
      if (v->pins == 0 && v->ready && (victim == entries_.end() || v->last_use < victim->last_use)) victim = v;
    }
    if (victim == entries_.end()) {
      ++stats_.skipped;
      return Lease();
    }
    entries_.erase(victim);
    ++stats_.evictions;
  }
}

void PromptCache::commit(const Lease& l, const LmBatch::PrefixInfo& prefix, LmGen::State gen) {
  if (!l || l.cache_ != this) throw Error("prompt cache: commit without a reservation");
  std::lock_guard<std::mutex> lk(mu_);
  l.entry_->prefix = prefix;
  l.entry_->gen = std::move(gen);
  l.entry_->ready = true;
  ++stats_.inserts;
  cv_.notify_all();
}

void PromptCache::abandon(const Lease& l) {
  if (!l || l.cache_ != this) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    l.entry_->dropped = true;
  }
  cv_.notify_all();
}

PromptCache::Stats PromptCache::stats() {
  std::lock_guard<std::mutex> lk(mu_);
  Stats s = stats_;
  s.entries = 0;
  s.used_bytes = 0;
  for (const Entry& e : entries_) {
    if (!e.ready || e.dropped) continue;
    ++s.entries;
    s.used_bytes += e.bytes;
  }
  s.capacity_bytes = capacity_;
  return s;
}

}  // namespace ppx
