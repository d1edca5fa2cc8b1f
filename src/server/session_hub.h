// What every chat session shares with the server, apart from the network: options, the loaded
// model, the session slots and their worker threads, the live-session list (to end them all on
// stop), the connection count, the server's state (serving, draining, device failed) and the
// metrics.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>

#include "engine/codec_scheduler.h"
#include "engine/scheduler.h"
#include "engine/voice_cache.h"
#include "server/end_reason.h"
#include "server/metrics.h"
#include "server/server.h"

namespace ppx::server {

class SessionCore;

// Connections still waiting for their request head (and the TLS handshake before it), oldest
// first. A connection arriving at the --max-connections limit closes the oldest of them that has
// waited at least a second instead of being refused, so that clients that trickle their heads, or
// never send one, cannot keep /health and new sessions out (a real client's head takes
// milliseconds).
class HeadWaiters {
 public:
  // Registers a waiter; `close` ends it (called once at most, on any thread). Returns its id.
  uint64_t add(std::function<void()> close);
  void remove(uint64_t id);  // a no-op when already gone
  // Closes the oldest waiter that has waited at least `min_age`; false when there is none.
  bool close_oldest(std::chrono::steady_clock::duration min_age);

 private:
  struct Waiter {
    std::chrono::steady_clock::time_point since;
    std::function<void()> close;
  };
  std::mutex mu_;
  uint64_t next_ = 1;
  std::map<uint64_t, Waiter> waiters_;  // by id: oldest first
};

struct SessionHub {
  ServerOptions opts;
  ServerModel model;
  Metrics metrics;
  std::mutex backend_mu;  // creating codec streams
  // Voice prompts read and prepared once, shared by the sessions that choose them while the file
  // is unchanged (engine/voice_cache.h).
  VoiceCache voices{kVoiceCacheBytes};

  // The live sessions' events (session_core.h): run by executor_threads (--session-threads),
  // which the Server starts and joins on stop, once every session has ended.
  boost::asio::io_context executor;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> executor_guard;
  std::vector<std::thread> executor_threads;

  // Declared after `executor`, so destroyed (their threads joined) before it: a scheduler thread
  // hands a frame back by posting to its session's strand, and may still be inside that post
  // (dropping its copy of the strand, which touches the executor) after the session, the last one,
  // has ended on the executor and the server has stopped.
  // Every session's LM state and the thread that steps them all, batched (max_sessions slots; a
  // session's LM slot is its session slot).
  std::unique_ptr<LmScheduler> scheduler;
  // Every session's codec state and the thread that encodes and decodes their frames, batched
  // (null with --per-session-codec: each session then takes its own codec stream).
  std::unique_ptr<CodecScheduler> codec;

  std::atomic<int> connections{0};  // open client connections (ConnectionSlot holders)
  HeadWaiters head_waiters;
  std::atomic<int> websockets{0};   // WebSocket sessions not yet destroyed
  // Called (once, on a session worker) when a DeviceError makes the device unusable.
  std::function<void(const std::string&)> on_device_error;

  std::mutex mu;  // guards everything below
  std::condition_variable cv;
  std::vector<bool> slot_used;
  // The worker thread of each slot (a session's prompt phase), joined on reuse and on stop.
  std::vector<std::thread> slot_threads;
  int in_use = 0;
  int reserved = 0;  // slots promised to upgrades that have not taken theirs yet
  int workers = 0;  // sessions that have not ended yet (their slot is released as they end)
  bool draining = false, stopping = false, stopped = false;
  std::string device_error;  // non-empty once the device failed
  std::list<std::weak_ptr<SessionCore>> sessions;

  // Takes a free slot and registers `s` as a live session with a running worker, in one step (so
  // that stop() cannot miss it). Returns the slot, or -1 (all taken), -2 (draining or stopping).
  // `reserved`: the session holds a SlotReservation, which this call consumes whatever it returns.
  int acquire_slot(const std::shared_ptr<SessionCore>& s, bool reserved);
  // A slot promised to an upgrade that passed the busy check (SlotReservation): false when the
  // sessions in use and the promised slots already fill every slot.
  bool reserve_slot();
  void unreserve_slot();
  // Starts the slot's worker thread (joining the slot's previous, finished one first). On failure
  // (thread creation) releases the slot and rethrows.
  void start_worker(int slot, std::function<void()> body);
  // Called by a session as its very last step (on its worker thread or the executor).
  void release_slot(int slot);
  int sessions_in_use();
  // One consistent reading of the slots (for /health): sessions in use, slots promised to
  // upgrades whose sessions have not started (SlotReservation), and unavailable()'s answer.
  struct SlotState {
    int in_use = 0, reserved = 0;
    std::string unavailable;
  };
  SlotState slot_state();
  // Ends every live session with `why` (its protocol's fatal message + close unless the client
  // already left).
  void kill_all(SessionEnd why, const std::string& message);
  // "" while the server accepts sessions; else why not ("draining", "device failed: ...").
  std::string unavailable();
  std::string unavailable_locked() const;  // the same, `mu` held
};

// Counts an open client connection for as long as it lives (movable, so that an HTTP connection
// can hand its count to the WebSocket session it becomes).
class ConnectionSlot {
 public:
  ConnectionSlot() = default;
  explicit ConnectionSlot(std::shared_ptr<SessionHub> hub) : hub_(std::move(hub)) {
    if (hub_) ++hub_->connections;
  }
  ~ConnectionSlot() {
    if (hub_) --hub_->connections;
  }
  ConnectionSlot(ConnectionSlot&& o) noexcept : hub_(std::move(o.hub_)) {}
  ConnectionSlot& operator=(ConnectionSlot&&) = delete;
  ConnectionSlot(const ConnectionSlot&) = delete;

 private:
  std::shared_ptr<SessionHub> hub_;
};

// A slot promised to a WebSocket upgrade from the busy check (before the 101) until its session
// takes it (SessionHub::acquire_slot) or gives up: two upgrades at once cannot both pass the
// check for the one free slot, so a full server answers HTTP 503 (which a load balancer retries)
// rather than a busy error after the upgrade.
class SlotReservation {
 public:
  SlotReservation() = default;
  explicit SlotReservation(std::shared_ptr<SessionHub> hub) {
    if (hub->reserve_slot()) hub_ = std::move(hub);
  }
  ~SlotReservation() { release(); }
  SlotReservation(SlotReservation&& o) noexcept : hub_(std::move(o.hub_)) {}
  SlotReservation& operator=(SlotReservation&& o) noexcept {
    if (this != &o) {
      release();
      hub_ = std::move(o.hub_);
    }
    return *this;
  }
  SlotReservation(const SlotReservation&) = delete;
  explicit operator bool() const { return hub_ != nullptr; }
  void release() {  // the promise is given back
    if (hub_) hub_->unreserve_slot();
    hub_.reset();
  }
  void consumed() { hub_.reset(); }  // acquire_slot took it

 private:
  std::shared_ptr<SessionHub> hub_;
};

}  // namespace ppx::server
