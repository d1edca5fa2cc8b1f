// The prompt cache: what a session's system prompts (voice, silences, text, silences) leave in its
// LM slot and generation state, computed once per distinct prompt and copied into later sessions'
// slots, so that a conversation with a known prompt starts without replaying it.
//
// This object is the bookkeeping: keys, an LRU of entries and where each lies in the backend's
// store (LmBatch::reserve_prefix_store: a byte arena, device memory on CUDA). The copies
// themselves are the frame scheduler's jobs (LmScheduler::run_system_prompts), queued in order
// with the batch steps, so a save always lands before any load of that entry. Entries are placed
// first-fit in the arena; to make room the least recently used entries that no session is loading
// are dropped. An entry is visible to lookups only once its save is queued ahead of them; sessions
// that arrive with the same prompt meanwhile wait for it rather than replaying it too.
//
// Thread-safe: sessions look up and insert from their own threads.
#pragma once

#include <cstddef>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>

#include "ppx/conversation.h"
#include "ppx/lm_batch.h"
#include "ppx/lm_gen.h"

namespace ppx {

// The cache key of a system prompt: SHA-256 (hex) of everything the prompt steps read: the voice
// (its embeddings and token cache, or its audio samples), the text tokens and the generation
// settings the prompt phases use (silence and sine tokens, the silence length, the zero text code).
// The model and its speed flags are fixed for the life of a cache, so they are not part of it.
std::string prompt_cache_key(const SystemPrompt& p, const LmGenConfig& gen);
// SHA-256 (hex) of the prompt's voice alone (what prompt_cache_key hashes of it; p.voice_digest is
// ignored): computed once per prepared voice by VoiceCache and carried in SystemPrompt::voice_digest.
std::string voice_prompt_digest(const SystemPrompt& p);

class PromptCache {
 public:
  struct Entry {
    std::string key;
    size_t offset = 0, bytes = 0;  // where it lies in the store
    LmBatch::PrefixInfo prefix;    // what the backend's save returned
    LmGen::State gen;              // the generation state after the prompts
    bool ready = false;            // its save is queued: loads may follow
    bool dropped = false;          // its save failed: erased once released
    int pins = 0;                  // sessions holding it (not evicted meanwhile)
    uint64_t last_use = 0;
  };
  // A held entry (a hit being loaded, or a reservation being saved); released when destroyed.
  class Lease {
   public:
    Lease() = default;
    Lease(PromptCache* c, Entry* e) : cache_(c), entry_(e) {}
    Lease(Lease&& o) noexcept : cache_(o.cache_), entry_(o.entry_) { o.cache_ = nullptr, o.entry_ = nullptr; }
    Lease& operator=(Lease&& o) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease() { release(); }
    explicit operator bool() const { return entry_ != nullptr; }
    // Valid while held. The store place and prefix do not change once reserved.
    const Entry& entry() const { return *entry_; }
    void release();

   private:
    friend class PromptCache;
    PromptCache* cache_ = nullptr;
    Entry* entry_ = nullptr;
  };

  // `capacity_bytes`: the store's size (0: the cache is off; every lookup misses).
  explicit PromptCache(size_t capacity_bytes) : capacity_(capacity_bytes) {}
  PromptCache(const PromptCache&) = delete;
  PromptCache& operator=(const PromptCache&) = delete;

  size_t capacity() const { return capacity_; }
  // A ready entry of `key`, held (a hit), or an empty lease (a miss). While another session is
  // saving that key (reserved, not yet committed) and `keep_waiting` is given, waits for it instead
  // of missing, calling keep_waiting() every 20 ms; false from it ends the wait with a miss.
  Lease lookup(const std::string& key, const std::function<bool()>& keep_waiting = {});
  // lookup() and, on a miss, reserve() in one step: `hit` with the entry held, or a miss with a
  // held reservation of `reserve_bytes` (empty: no room, or reserve_bytes 0, or the wait was given
  // up). What a session starting its prompts asks.
  struct Acquired {
    Lease lease;
    bool hit = false;
  };
  Acquired acquire(const std::string& key, size_t reserve_bytes, const std::function<bool()>& keep_waiting = {});
  // Room for a new entry of `bytes` bytes under `key`, held and not yet ready; an empty lease when
  // the key is already there (another session is saving it), the entry would not fit in the whole
  // store, or every entry in the way is held.
  Lease reserve(const std::string& key, size_t bytes);
  // The save of a reserved entry is queued: it becomes visible to lookups.
  void commit(const Lease& l, const LmBatch::PrefixInfo& prefix, LmGen::State gen);
  // The save of a reserved entry failed: it is dropped (when the lease is released).
  void abandon(const Lease& l);

  struct Stats {
    int64_t hits = 0, misses = 0, inserts = 0, evictions = 0, skipped = 0;  // skipped: not cached
    int64_t waits = 0;  // hits that waited for another session's save
    int entries = 0;
    size_t used_bytes = 0, capacity_bytes = 0;
  };
  Stats stats();

 private:
  void unpin(Entry* e);
  Lease reserve_locked(const std::string& key, size_t bytes);  // under mu_, the key absent

  const size_t capacity_;
  std::mutex mu_;
  std::condition_variable cv_;  // an entry was committed or dropped
  std::list<Entry> entries_;  // sorted by offset (first-fit placement)
  uint64_t clock_ = 0;
  Stats stats_;
};

}  // namespace ppx
