// personaplex-server: the real-time speech-to-speech WebSocket server (docs/PROTOCOL.md).
// Loads the model once, listens, prints "listening on http://HOST:PORT" when ready, and serves
// until SIGINT or SIGTERM.
#include <pthread.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "apps/cli_checks.h"
#include "apps/common.h"
#include "apps/model_loading.h"
#include "ppx/capacity.h"
#include "ppx/error.h"
#include "server/log.h"
#include "apps/server_model.h"
#include "server/server.h"

namespace {

// Many connections need many descriptors: raise the soft limit to the hard one.
void raise_fd_limit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

// After the flags are parsed and the log is set up: checks, loads the model, serves until a signal.
// The capacity line of the startup log: both limits (where modelled) and the sessions used.
void log_capacity(const std::optional<ppx::Capacity>& cap, const ppx::server::ServerOptions& o) {
  std::string msg = "capacity: ";
  if (cap) {
    msg += "memory allows " + std::to_string(cap->memory_sessions) + ", bandwidth allows " +
           (cap->bandwidth_sessions ? std::to_string(*cap->bandwidth_sessions) : std::string("any")) + ", ";
  } else {
    msg += "not modelled on this device, ";
  }
  msg += "using " + std::to_string(o.max_sessions) +
         (o.max_sessions_source == "given" ? " (--max-sessions)" : "") + "; prompt cache " +
         std::to_string(o.prompt_cache_bytes >> 20) + " MiB";
  if (!cap) {
    ppx::server::log::info(msg, {{"max_sessions", o.max_sessions},
                                 {"source", o.max_sessions_source},
                                 {"prompt_cache_bytes", o.prompt_cache_bytes}});
    return;
  }
  ppx::server::log::info(
      msg, {{"max_sessions", o.max_sessions},
            {"source", o.max_sessions_source},
            {"memory_sessions", cap->memory_sessions},
            {"bandwidth_sessions",
             cap->bandwidth_sessions ? nlohmann::json(*cap->bandwidth_sessions) : nlohmann::json()},
            {"bandwidth_gb_s", cap->bandwidth / 1e9},
            {"free_gb", cap->free_bytes / 1e9},
            {"gb_per_session", cap->bytes_per_session / 1e9},
            {"prompt_cache_bytes", o.prompt_cache_bytes}});
}

int serve_with(ppx::app::ModelFlags& mf, ppx::server::ServerOptions& o, bool api_key_given,
               bool max_sessions_given) {
  if (!o.voice_dir.empty() && !std::filesystem::is_directory(o.voice_dir))
    throw ppx::Error("--voice-prompt-dir '" + o.voice_dir + "' is not a directory");
  if (!o.ssl_dir.empty()) ppx::server::Server::check_tls(o.ssl_dir);
  ppx::server::Server::check_listen(o.host, o.port);  // before the model loads (minutes)
  // An empty key is refused, whether given as the flag or set in the environment (an empty
  // variable would otherwise serve everyone without a word).
  const char* env_key = std::getenv("PERSONAPLEX_API_KEY");
  if ((api_key_given || (env_key && !*env_key)) && o.api_key.empty())
    throw ppx::Error("--api-key (or PERSONAPLEX_API_KEY) is empty");
  if (o.metrics_auth && o.api_key.empty()) throw ppx::Error("--metrics-auth needs --api-key");
  raise_fd_limit();
  // Without --max-sessions the CUDA backend sizes its codec by the capacity it computes (0).
  mf.codec_slots = max_sessions_given ? o.max_sessions : 0;
  mf.note = [](const std::string& s) { ppx::server::log::info(s); };

  ppx::app::LoadedModel m = ppx::app::load_model(mf);
  if (!m.tokenizer) throw ppx::Error("a text tokenizer is needed: give --tokenizer or --hf-dir");
  if (o.voice_dir.empty()) o.voice_dir = m.voice_dir;
  // --max-sessions wins (the batch then refuses a count whose KV caches do not fit); without it the
  // device's capacity, or 1 where it is not modelled (the CPU).
  const std::optional<ppx::Capacity> cap = m.backend->capacity();
  // The prompt cache: as given, or auto (the capacity model's choice on CUDA; 1 GiB on the CPU).
  if (mf.prompt_cache_bytes != ppx::kPromptCacheAuto)
    o.prompt_cache_bytes = mf.prompt_cache_bytes;
  else
    o.prompt_cache_bytes = cap ? static_cast<size_t>(cap->prompt_cache_bytes) : size_t{1} << 30;
  if (max_sessions_given) {
    o.max_sessions_source = "given";
  } else if (cap) {
    o.max_sessions = cap->sessions;
    o.max_sessions_source = "computed";
  } else {
    o.max_sessions_source = "default";
  }
  const ppx::server::ServerModel sm = ppx::app::server_model(m);
  ppx::server::log::info("model loaded",
                         {{"model", m.description},
                          {"device", m.backend->device()},
                          {"device_index", m.device_index < 0 ? nlohmann::json() : nlohmann::json(m.device_index)},
                          {"speed_flags", m.speed_flags}});
  log_capacity(cap, o);

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
  // An IPv6 address goes in brackets in a URL (RFC 3986).
  const std::string url_host = o.host.find(':') != std::string::npos ? "[" + o.host + "]" : o.host;
  std::printf("listening on %s://%s:%u\n", scheme, url_host.c_str(), port);
  const bool any = o.host == "0.0.0.0" || o.host == "::";
  std::printf("open %s://%s:%u/ in a browser to talk to the model\n", scheme,
              any || o.host == "127.0.0.1" || o.host == "::1" ? "localhost" : url_host.c_str(), port);
  std::fflush(stdout);
  ppx::server::log::info("listening", {{"url", std::string(scheme) + "://" + url_host + ":" + std::to_string(port)},
                                      {"host", o.host},
                                      {"port", port}});
  // The first signal drains (new sessions refused, live ones go on for --drain-timeout), the
  // second exits at once. The signal thread never touches the server after serve() returns.
  static std::mutex server_mu;
  static ppx::server::Server* live = &server;
  std::thread([sigs] {
    for (int count = 0;; ++count) {
      int sig = 0;
      if (sigwait(&sigs, &sig) != 0) continue;
      if (count > 0) {
        ppx::server::log::warn("second signal: exiting now", {{"signal", sig}});
        std::_Exit(128 + sig);
      }
      ppx::server::log::info("signal: draining, then stopping (again to exit now)", {{"signal", sig}});
      std::lock_guard<std::mutex> lk(server_mu);
      if (live) live->shutdown();
    }
  }).detach();
  const int code = server.wait();
  {
    std::lock_guard<std::mutex> lk(server_mu);
    live = nullptr;
  }
  if (code == 0)
    ppx::server::log::info("server stopped cleanly", {{"exit_code", code}});
  else
    ppx::server::log::error("server stopped: device error", {{"exit_code", code}});
  return code;
}

int serve(int argc, char** argv) {
  CLI::App app{
      "PersonaPlex real-time speech-to-speech server (WebSocket /api/chat and /v1/realtime)"};
  ppx::app::ModelFlags mf;
  mf.add_to(app);
  ppx::server::ServerOptions o;
  app.add_option("--host", o.host, "address to listen on")->capture_default_str();
  app.add_option("--port", o.port, "TCP port (0: pick a free one and print it)")
      ->capture_default_str();
  app.add_option("--voice-prompt-dir", o.voice_dir,
                 "directory of voice prompts, .pt or .wav (default: <hf-dir>/voices)");
  app.add_option("--max-sessions", o.max_sessions,
                 "concurrent conversations; more clients get a busy error (default: on CUDA the "
                 "lower of what free device memory and memory bandwidth allow, logged at startup "
                 "and in /health; on the CPU 1)")
      ->check(CLI::Range(1, ppx::kMaxSessionsLimit));
  app.add_option("--static", o.static_dir,
                 "serve the files of this directory at GET /<path> (optional)")
      ->check(CLI::ExistingDirectory);
  app.add_option(
         "--idle-timeout", o.idle_timeout_s,
         "drop a client (/api/chat, /v1/realtime) that sends no audio for this many seconds")
      ->capture_default_str()
      ->check(ppx::app::finite() & CLI::Range(0.5, 3600.0));
  app.add_option("--io-threads", o.io_threads, "network threads")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app.add_option("--session-threads", o.session_threads,
                 "threads that run the live conversations' audio coding and pacing, shared by "
                 "all sessions (default: a quarter of the CPU threads, 2 to 8)")
      ->check(CLI::Range(1, 256));
  app.add_option("--max-connections", o.max_connections,
                 "open client connections (HTTP and WebSocket); beyond it a 503 or an immediate "
                 "close (default: 4 per session slot + 64, within the file-descriptor limit)")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--api-key", o.api_key,
                 "require this key on /api/* and /v1/realtime (query api_key=KEY or Authorization: "
                 "Bearer KEY); "
                 "/health stays open")
      ->envname("PERSONAPLEX_API_KEY");
  app.add_flag("--metrics-auth", o.metrics_auth, "/metrics requires the API key too");
  app.add_option("--allowed-origin", o.allowed_origins,
                 "accept WebSocket upgrades only from these Origin values (repeatable; requests "
                 "without an Origin header, i.e. non-browser clients, are accepted)");
  app.add_option("--drain-timeout", o.drain_timeout_s,
                 "on SIGINT/SIGTERM: refuse new sessions, let live ones go on this many seconds, "
                 "then end them (a second signal exits at once)")
      ->capture_default_str()
      ->check(ppx::app::finite() & CLI::Range(0.0, 86400.0));
  app.add_option("--max-session-duration", o.max_session_duration_s,
                 "end a conversation after this many seconds (0: unlimited)")
      ->capture_default_str()
      ->check(ppx::app::finite() & CLI::Range(0.0, 31.0 * 86400.0));
  app.add_option(
         "--ssl", o.ssl_dir,
         "serve HTTPS/WSS with DIR/cert.pem (chain) and DIR/key.pem; browsers need it for the "
         "microphone except on localhost")
      ->check(CLI::ExistingDirectory);
  bool per_session_codec = false;
  app.add_flag("--per-session-codec", per_session_codec,
               "each session runs its own codec stream on its worker thread instead of the batched "
               "codec scheduler (for comparison; the default batches every session's frames)");
  std::string prompt_cache_mb = "auto";
  app.add_option("--prompt-cache-mb", prompt_cache_mb,
                 "memory (MiB; device memory on CUDA, counted against --max-sessions' computed "
                 "capacity) that keeps the LM state a voice and text prompt leave, so that later "
                 "sessions with the same prompts start without replaying them; 0: off; auto: on "
                 "CUDA a tenth of the free memory after the model loads, at most 4096; on the CPU 1024")
      ->capture_default_str()
      ->check([](const std::string& v) -> std::string {
        if (v == "auto") return "";
        try {
          size_t used = 0;
          const long n = std::stol(v, &used);
          if (used == v.size() && n >= 0 && n <= (1L << 20)) return "";
        } catch (const std::exception&) {
        }
        return "must be auto or a whole number of MiB from 0 to 1048576";
      });
  std::string log_level = "info";
  bool log_json = false;
  app.add_option("--log-level", log_level, "log messages of this level and above on stderr")
      ->capture_default_str()
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));
  app.add_flag("--log-json", log_json,
               "log one JSON object per line (time, level, msg and the event's fields)");
  ppx::app::check_numbers(app);
  try {
    app.parse(argc, argv);
    o.codec_batch = !per_session_codec;
    mf.prompt_cache_bytes =
        prompt_cache_mb == "auto" ? ppx::kPromptCacheAuto : static_cast<size_t>(std::stol(prompt_cache_mb)) << 20;
  } catch (const CLI::ParseError& e) {
    return ppx::app::parse_failed(app, e);
  }
  ppx::server::log::Level level = ppx::server::log::Level::kInfo;
  ppx::server::log::parse_level(log_level, level);
  ppx::server::log::init(level, log_json);
  // From here on a fatal error is a log line too (a JSON one with --log-json), not plain text.
  try {
    return serve_with(mf, o, app.count("--api-key") > 0, app.count("--max-sessions") > 0);
  } catch (const std::exception& e) {
    // With --log-level off the reason still reaches stderr: an exit 2 is never silent.
    if (level == ppx::server::log::Level::kOff)
      std::fprintf(stderr, "error: %s\n", e.what());
    else
      ppx::server::log::error(std::string("error: ") + e.what());
    return 2;
  }
}

}  // namespace

int main(int argc, char** argv) { return ppx::app::run_main(serve, argc, argv); }
