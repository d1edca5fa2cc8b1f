// The PersonaPlex WebSocket server (protocol: docs/PROTOCOL.md): HTTP routes /health,
// /health/live, /health/ready, /metrics, /api/voices, /api/chat and /v1/realtime (WebSocket; two protocol adapters over one session core,
// session_core.h), the built-in web client at / and optional static files;
// plain HTTP, or HTTPS/WSS only when given a certificate.
//
// Threading: Asio I/O threads do all network work (accept, HTTP, WebSocket reads and writes); each
// session's compute (voice loading, system prompts, Mimi + LM steps, Opus) runs on that
// session's own worker thread, which owns the Conversation, its CodecStream and LmStepper. The
// two sides meet in one mutex-guarded input queue (client input chunks) and in messages posted to
// the connection's strand for writing. A session holds one of --max-sessions slots from its
// WebSocket upgrade until its worker has finished; the worker ends within a fraction of a second
// after the client closes, errors out, or sends no audio for idle_timeout_s. Worker threads are
// joined before stop() returns, so none outlives the model. An upgrade that finds every slot in
// use (or the server draining) is refused before it happens with HTTP 503 + Retry-After; one that
// loses the last slot to another session between that check and its start gets the protocol's
// busy error after the upgrade.
//
// Failure containment: every request handler and session catches what it throws (HTTP 500, or
// the protocol's error message + close on the WebSocket) and the I/O threads survive anything that escapes a handler. The
// exception is a DeviceError (the GPU is unusable): the server then tells every client, /health
// answers 503, and wait() returns kExitDeviceError so that the process exits non-zero.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ppx/backend.h"
#include "ppx/config.h"
#include "ppx/tokenizer.h"

namespace ppx::server {

struct ServerOptions {
  std::string host = "0.0.0.0";
  uint16_t port = 8998;  // 0: any free port (see Server::port())
  std::string voice_dir;
  std::string static_dir;  // empty: no static files
  std::string ssl_dir;     // non-empty: TLS with ssl_dir/cert.pem and ssl_dir/key.pem
  int max_sessions = 1;
  // Where max_sessions came from, for /health's capacity: "given" (--max-sessions), "computed"
  // (the capacity model, include/ppx/capacity.h) or "default" (the CPU backend's 1).
  std::string max_sessions_source = "default";
  double idle_timeout_s = 10.0;  // a chat client that sends no audio for this long is dropped
  int io_threads = 2;
  // Threads of the session executor, which runs every live conversation's events (audio
  // decoding and encoding, pacing; session_core.h). 0: automatic (default_session_threads()).
  int session_threads = 0;
  double ping_interval_s = 2.0;  // 0x06 messages while the system prompts run
  int max_connections = 0;  // open connections (HTTP + WebSocket); 0: default_max_connections()
  std::string api_key;      // non-empty: /api/* (and /metrics with metrics_auth) need it
  bool metrics_auth = false;
  std::vector<std::string>
      allowed_origins;                // non-empty: WebSocket upgrades with another Origin get 403
  double drain_timeout_s = 10.0;      // shutdown(): how long live conversations may go on
  double max_session_duration_s = 0;  // 0: unlimited
  // Sessions' codec frames go through the codec scheduler, batched (true); false: each session
  // runs its own codec stream on its worker (--per-session-codec, for comparison).
  bool codec_batch = true;
  // The prompt cache's store (--prompt-cache-mb): sessions whose voice and text prompt were seen
  // before load the state those prompts left instead of replaying them. 0: no cache.
  size_t prompt_cache_bytes = 0;
};

// 4 connections per session slot plus 64 for HTTP requests, within the file-descriptor limit.
int default_max_connections(int max_sessions);
// A quarter of the CPU threads, at least 2 and at most 8. A live /api/chat session needs ~0.4 ms
// of CPU per 80 ms frame (Opus encode 0.33 ms, decode 0.07 ms, measured on one core of the 2-core
// development VM: bench/results/cpu_2026-12-05_v24), so 4 threads keep up with ~800 sessions.
int default_session_threads();

// wait()'s result: what the process should exit with.
inline constexpr int kExitOk = 0;
inline constexpr int kExitDeviceError = 3;

// What the sessions need from the loaded model. Everything referenced must outlive the Server.
struct ServerModel {
  ModelBackend* backend = nullptr;
  const TextTokenizer* tokenizer = nullptr;
  LmGenConfig gen;  // defaults; sampling parameters of a request override them
  int sample_rate = 24000;
  int frame_samples = 1920;
  std::string description;  // reported by /health
  int device_index = -1;     // the CUDA device (--device cuda:N), reported by /health; -1: the CPU
  int dep_steps = -1;        // --dep-q-exit (-1: all depformer steps)
  std::string speed_flags;   // the speed flags in effect, reported by /health
  std::optional<Capacity> capacity;  // the device's capacity (ModelBackend::capacity()), for /health
};


class Server {
 public:
  // Binds and listens (throws ppx::Error when it cannot); serving starts with start().
  Server(const ServerOptions& opts, const ServerModel& model);
  ~Server();  // stop()s
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Throws ppx::Error naming the file when ssl_dir's cert.pem/key.pem cannot serve TLS; lets a
  // tool fail before it spends minutes loading a model.
  static void check_tls(const std::string& ssl_dir);
  // Throws ppx::Error when the server could not listen on host:port (a host that is neither an
  // address nor a name that resolves, a port in use, no permission), for the same reason.
  static void check_listen(const std::string& host, uint16_t port);

  uint16_t port() const;  // the bound port
  bool tls() const;       // serving HTTPS/WSS
  void start();           // starts the I/O threads; returns at once
  // Graceful shutdown, from any thread, returns at once (later calls do nothing): new sessions are
  // refused (HTTP 503), live conversations go on for up to opts.drain_timeout_s, then each gets
  // 0x05 + close, and the server stops.
  void shutdown();
  // Immediate stop: every session gets 0x05 + close now; waits for the session workers (however
  // long a model step takes), the closes (at most ~2 s) and the I/O threads.
  void stop();
  // Blocks until the server has stopped (stop(), shutdown() or a device failure); returns
  // kExitOk, or kExitDeviceError after a DeviceError.
  int wait();
  int sessions_in_use() const;
  int connections() const;  // open client connections

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace ppx::server
