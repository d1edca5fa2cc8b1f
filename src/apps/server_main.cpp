// personaplex-server: the real-time speech-to-speech WebSocket server (docs/PROTOCOL.md).
// Loads the model once, listens, prints "listening on http://HOST:PORT" when ready, and serves
// until SIGINT or SIGTERM.
#include <pthread.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <filesystem>

#include "apps/common.h"
#include "apps/model_loading.h"
#include "ppx/error.h"
#include "server/server.h"

namespace {

int serve(int argc, char** argv) {
  CLI::App app{"PersonaPlex real-time speech-to-speech server (WebSocket /api/chat)"};
  ppx::app::ModelFlags mf;
  mf.add_to(app);
  ppx::server::ServerOptions o;
  app.add_option("--host", o.host, "address to listen on")->capture_default_str();
  app.add_option("--port", o.port, "TCP port (0: pick a free one and print it)")
      ->capture_default_str();
  app.add_option("--voice-prompt-dir", o.voice_dir,
                 "directory of voice prompts, .pt or .wav (default: <hf-dir>/voices)");
  app.add_option("--max-sessions", o.max_sessions,
                 "concurrent conversations; more clients get a busy error")
      ->capture_default_str()
      ->check(CLI::Range(1, 256));
  app.add_option("--static", o.static_dir,
                 "serve the files of this directory at GET /<path> (optional)")
      ->check(CLI::ExistingDirectory);
  app.add_option("--idle-timeout", o.idle_timeout_s,
                 "drop a chat client that sends no audio for this many seconds")
      ->capture_default_str()
      ->check(CLI::Range(0.5, 3600.0));
  app.add_option("--io-threads", o.io_threads, "network threads")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app.add_option("--ssl", o.ssl_dir,
                 "serve HTTPS/WSS with DIR/cert.pem (chain) and DIR/key.pem; browsers need it for the "
                 "microphone except on localhost")
      ->check(CLI::ExistingDirectory);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (!o.voice_dir.empty() && !std::filesystem::is_directory(o.voice_dir))
    throw ppx::Error("--voice-prompt-dir '" + o.voice_dir + "' is not a directory");
  if (!o.ssl_dir.empty()) ppx::server::Server::check_tls(o.ssl_dir);
  mf.codec_slots = o.max_sessions;

  ppx::app::LoadedModel m = ppx::app::load_model(mf);
  if (!m.tokenizer) throw ppx::Error("a text tokenizer is needed: give --tokenizer or --hf-dir");
  if (o.voice_dir.empty()) o.voice_dir = m.voice_dir;
  const ppx::server::ServerModel sm = ppx::server::server_model(m);
  std::fprintf(stderr, "model: %s on %s\n", m.description.c_str(), m.backend->device().c_str());

  // Signals go to sigwait() below only: block them before any thread starts.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  ppx::server::Server server(o, sm);
  server.start();
  const char* scheme = server.tls() ? "https" : "http";
  const unsigned port = server.port();
  std::printf("listening on %s://%s:%u\n", scheme, o.host.c_str(), port);
  const bool any = o.host == "0.0.0.0" || o.host == "::";
  std::printf("open %s://%s:%u/ in a browser to talk to the model\n", scheme,
              any || o.host == "127.0.0.1" ? "localhost" : o.host.c_str(), port);
  std::fflush(stdout);
  int sig = 0;
  sigwait(&sigs, &sig);
  std::fprintf(stderr, "signal %d: stopping\n", sig);
  server.stop();
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return ppx::app::run_main(serve, argc, argv); }
