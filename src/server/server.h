// The PersonaPlex WebSocket server (protocol: docs/PROTOCOL.md): HTTP routes /health, /metrics,
// /api/voices, /api/chat (WebSocket), the built-in web client at / and optional static files;
// plain HTTP, or HTTPS/WSS only when given a certificate.
//
// Threading: Asio I/O threads do all network work (accept, HTTP, WebSocket reads and writes); each
// chat session's compute (voice loading, system prompts, Mimi + LM steps, Opus) runs on that
// session's own worker thread, which owns the Conversation, its CodecStream and LmStepper. The
// two sides meet in one mutex-guarded input queue (client audio bytes) and in messages posted to
// the connection's strand for writing. A session holds one of --max-sessions slots from its
// WebSocket upgrade until its worker has finished; the worker ends within a fraction of a second
// after the client closes, errors out, or sends no audio for idle_timeout_s.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "apps/model_loading.h"
#include "engine/backend.h"
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
  double idle_timeout_s = 10.0;  // a chat client that sends no audio for this long is dropped
  int io_threads = 2;
  double ping_interval_s = 2.0;  // 0x06 messages while the system prompts run
};

// What the sessions need from the loaded model. Everything referenced must outlive the Server.
struct ServerModel {
  ModelBackend* backend = nullptr;
  const TextTokenizer* tokenizer = nullptr;
  LmGenConfig gen;  // defaults; sampling parameters of a request override them
  int sample_rate = 24000;
  int frame_samples = 1920;
  std::string description;  // reported by /health
};

// The parts of a loaded model (which must outlive the Server) that the server uses.
ServerModel server_model(const app::LoadedModel& m);

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

  uint16_t port() const;  // the bound port
  bool tls() const;       // serving HTTPS/WSS
  void start();           // starts the I/O threads; returns at once
  // Closes the listener and every connection, waits for the I/O threads and session workers.
  void stop();
  // Blocks until stop() is called from another thread.
  void wait();
  int sessions_in_use() const;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace ppx::server
