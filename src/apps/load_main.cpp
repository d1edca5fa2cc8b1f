// personaplex-load: a load generator for personaplex-server. Opens N WebSocket sessions to
// /api/chat, streams Ogg Opus in real time in each (one 80 ms page per 80 ms, as the web client
// does) and reports the per-frame added latency (input page written -> its output page read; see
// load_client.h for the frame matching), frames over budget, handshake times and failed sessions,
// as a table and as JSON. Exit status: 0 when every session passed, 1 when any failed, 2 on bad
// flags or inputs.
//
// Threads: `--io-threads` run one io_context; each session lives on its own strand. The audio is
// encoded before the first connection (K distinct synthetic voices, or the --input file), so
// the client's per-frame work is one write, one read and one timer per session.
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <exception>
#include <mutex>
#include <thread>

#include "apps/cli_checks.h"
#include "apps/common.h"
#include "apps/load_client.h"
#include "apps/load_signal.h"
#include "ppx/error.h"

namespace {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using json = nlohmann::ordered_json;
using ppx::load::Clock;

struct Options {
  std::string host = "127.0.0.1";
  uint16_t port = 8998;
  int sessions = 1;
  double duration_s = 30;
  double ramp_ms = 0;
  std::string api_key, voice, text_prompt, input, json_path;
  uint64_t seed = 1;
  int signals = 8;
  int io_threads = 2;
  double handshake_timeout_s = 120, drain_s = 5, budget_ms = 160;
  int tail_frames = 2;
  bool quiet = false;
  double churn = 0;  // connect/handshake/one frame/close cycles per second beside the sessions
  std::string churn_text_prompt;  // --churn-text-prompt (default: the sessions' prompt)
  bool churn_unique = false;      // --churn-unique-prompts: each churn session's prompt differs
};

std::string url_encode(const std::string& s) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 15]);
    }
  }
  return out;
}

// The server's /health answer (model, device, speed flags), or why it could not be read.
json server_health(const Options& o) {
  try {
    net::io_context ioc;
    tcp::resolver r(ioc);
    beast::tcp_stream s(ioc);
    s.expires_after(std::chrono::seconds(5));
    s.connect(r.resolve(o.host, std::to_string(o.port)));
    http::request<http::empty_body> req{http::verb::get, "/health", 11};
    req.set(http::field::host, o.host);
    http::write(s, req);
    beast::flat_buffer b;
    http::response<http::string_body> res;
    http::read(s, b, res);
    json j = json::parse(res.body(), nullptr, false);
    if (j.is_discarded()) return {{"status_code", res.result_int()}, {"body", res.body()}};
    return j;
  } catch (const std::exception& e) {
    return {{"error", e.what()}};
  }
}

// The encoded streams: one per distinct voice (the sessions take them in turn).
std::vector<std::shared_ptr<const ppx::load::EncodedStream>> prepare_audio(const Options& o,
                                                                           int64_t frames) {
  const int k = o.input.empty() ? std::max(1, std::min(o.signals, o.sessions)) : 1;
  std::vector<std::shared_ptr<const ppx::load::EncodedStream>> out(static_cast<size_t>(k));
  if (!o.input.empty()) {
    out[0] = ppx::load::encode_file(o.input, frames);
    return out;
  }
  std::vector<std::thread> pool;
  const int workers = std::max(1u, std::min<unsigned>(std::thread::hardware_concurrency(), k));
  std::atomic<int> next{0};
  std::mutex mu;
  std::exception_ptr failed;  // the first worker's failure, rethrown here (a thread must not throw)
  for (int w = 0; w < workers; ++w) {
    pool.emplace_back([&] {
      try {
        for (int i = next++; i < k; i = next++)
          out[static_cast<size_t>(i)] = ppx::load::encode_speech_like(o.seed + static_cast<uint64_t>(i), frames);
      } catch (...) {
        std::lock_guard<std::mutex> lk(mu);
        if (!failed) failed = std::current_exception();
        next = k;  // the other workers stop too
      }
    });
  }
  for (auto& t : pool) t.join();
  if (failed) {
    try {
      std::rethrow_exception(failed);
    } catch (const std::bad_alloc&) {
      // Each signal keeps its pages: ~0.35 KB a frame with the vectors' overhead.
      const double gb = static_cast<double>(frames) * 350.0 * k / 1e9;
      char msg[256];
      std::snprintf(msg, sizeof msg,
                    "out of memory keeping the encoded audio: %d signals of %lld frames each (~%.1f GB of "
                    "pages); use a shorter --duration or fewer --signals",
                    k, static_cast<long long>(frames), gb);
      throw ppx::Error(msg);
    }
  }
  return out;
}

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

std::string fmt_ms(const json& stats, const char* key) {
  if (!stats.contains(key)) return "-";
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", stats[key].get<double>());
  return b;
}

int body(int argc, char** argv) {
  Options o;
  CLI::App app{
      "personaplex-load: N real-time Ogg Opus conversations against personaplex-server, "
      "with per-frame added latency"};
  app.add_option("--host", o.host, "server address")->capture_default_str();
  app.add_option("--port", o.port, "server port")->capture_default_str();
  app.add_option("-n,--sessions", o.sessions, "concurrent sessions")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  app.add_option("--duration", o.duration_s, "seconds of audio streamed per session")
      ->capture_default_str()
      ->check(ppx::app::finite() & CLI::Range(0.08, 86400.0));
  app.add_option("--ramp-ms", o.ramp_ms, "session i connects i * this many ms after the first")
      ->capture_default_str()
      ->check(ppx::app::finite() & CLI::Range(0.0, 600000.0));
  app.add_option("--api-key", o.api_key, "the server's --api-key (sent as api_key=)")
      ->envname("PERSONAPLEX_API_KEY");
  app.add_option("--voice", o.voice,
                 "voice_prompt parameter (a name from /api/voices; \"\" for none; "
                 "default: the server's default)");
  app.add_option("--text-prompt", o.text_prompt,
                 "text_prompt parameter (\"\" for none; default: the server's default)");
  app.add_option("--input", o.input,
                 "audio file streamed by every session (WAV, FLAC, Ogg; first channel, looped to "
                 "--duration); default: a synthetic speech-like signal per session")
      ->check(CLI::ExistingFile);
  app.add_option("--seed", o.seed, "seed of the synthetic signals (session i: seed + i % signals)")
      ->capture_default_str();
  app.add_option("--signals", o.signals, "distinct synthetic signals, encoded before the start")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  app.add_option("--io-threads", o.io_threads, "client I/O threads")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app.add_option("--handshake-timeout", o.handshake_timeout_s,
                 "seconds from connect to the 0x00 handshake before a session fails")
      ->capture_default_str()
      ->check(ppx::app::finite() & CLI::Range(0.1, 3600.0));
  app.add_option("--drain", o.drain_s, "seconds to wait for answers after the last frame is sent")
      ->capture_default_str()
      ->check(ppx::app::finite() & CLI::Range(0.0, 600.0));
  app.add_option("--tail-frames", o.tail_frames,
                 "answers that may still be missing at the end without failing the session")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000000));
  app.add_option("--budget-ms", o.budget_ms, "a frame is over budget above this added latency")
      ->capture_default_str()
      ->check(ppx::app::finite() & CLI::Range(1.0, 1e6));
  app.add_option("--json", o.json_path, "write the results as JSON here");
  app.add_option("--churn", o.churn,
                 "beside the sessions, this many short sessions per second (connect, handshake, one "
                 "frame, close), from when the last session has connected until the sessions end; "
                 "reported apart (their handshake times and failures)")
      ->check(ppx::app::finite() & CLI::Range(0.0, 1000.0));
  app.add_option("--churn-text-prompt", o.churn_text_prompt,
                 "the churn sessions' text_prompt (default: the sessions' --text-prompt)");
  app.add_flag("--churn-unique-prompts", o.churn_unique,
               "end each churn session's text prompt with its own number, so that no two share a "
               "prompt (the server's prompt cache cannot serve them: their prompts start uncached; "
               "with no prompt given, \"Conversation (N)\")");
  app.add_flag("--quiet", o.quiet, "no per-session table (failed sessions are still listed)");
  ppx::app::check_numbers(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return ppx::app::parse_failed(app, e);
  }
  const bool voice_given = app.count("--voice") > 0, prompt_given = app.count("--text-prompt") > 0;
  const int64_t frames = std::llround(o.duration_s * 1000.0 / ppx::load::kFrameMs);
  if (!o.json_path.empty()) {  // fail before the run, not after it
    std::ofstream probe(o.json_path, std::ios::app);
    if (!probe) throw ppx::Error("--json '" + o.json_path + "': cannot write there");
  }

  if ((app.count("--churn-text-prompt") > 0 || o.churn_unique) && o.churn <= 0)
    throw ppx::Error("--churn-text-prompt and --churn-unique-prompts need --churn");
  // The upgrade target; `text`: the text prompt (nullptr: none given, the server's default).
  auto make_target = [&](const std::string* text) {
    std::string t = "/api/chat?";
    std::string sep;
    auto param = [&](const char* k, const std::string& v) {
      t += sep + k + "=" + url_encode(v);
      sep = "&";
    };
    if (text) param("text_prompt", *text);
    if (voice_given) param("voice_prompt", o.voice);
    if (!o.api_key.empty()) param("api_key", o.api_key);
    if (sep.empty()) t.pop_back();  // no '?' without parameters
    return t;
  };
  const std::string target = make_target(prompt_given ? &o.text_prompt : nullptr);
  const bool churn_prompt_given = app.count("--churn-text-prompt") > 0;
  // Churn session c's target.
  auto churn_target = [&](int c) {
    const std::string* base = churn_prompt_given ? &o.churn_text_prompt : prompt_given ? &o.text_prompt : nullptr;
    if (!o.churn_unique) return make_target(base);
    // With no prompt given, a short one of its own number.
    const std::string text = (base ? *base + " " : std::string("Conversation ")) + "(" + std::to_string(c) + ")";
    return make_target(&text);
  };

  const auto t_prep = Clock::now();
  // Every signal is generated and encoded before the first session (about 1 s of CPU per minute
  // of audio): a long --duration says so rather than appearing to hang.
  const bool long_prep = o.duration_s >= 600;
  if (long_prep)
    std::fprintf(stderr, "personaplex-load: encoding the audio first (%.0f s per signal)...\n", o.duration_s);
  const auto audio = prepare_audio(o, frames);
  const double prep_s = std::chrono::duration<double>(Clock::now() - t_prep).count();
  if (long_prep) std::fprintf(stderr, "personaplex-load: audio encoded in %.1f s\n", prep_s);
  const json health = server_health(o);

  net::io_context ioc;
  tcp::resolver resolver(ioc);
  beast::error_code ec;
  const auto endpoints = resolver.resolve(o.host, std::to_string(o.port), ec);
  if (ec) throw ppx::Error("--host '" + o.host + "': " + ec.message());
  ppx::load::SessionOptions so;
  so.host = o.host;
  so.port = o.port;
  so.target = target;
  so.handshake_timeout_s = o.handshake_timeout_s;
  so.drain_s = o.drain_s;
  // A long text prompt makes a long target: the banner shows its start and its size.
  std::string shown = o.api_key.empty() ? target : "/api/chat?... (api_key given)";
  if (shown.size() > 120) shown = shown.substr(0, 100) + "... (" + std::to_string(target.size()) + " bytes)";
  std::printf("personaplex-load: %d session(s) x %.1f s (%lld frames) to ws://%s:%u%s\n",
              o.sessions, o.duration_s, static_cast<long long>(frames), o.host.c_str(), o.port, shown.c_str());
  std::fflush(stdout);

  std::vector<ppx::load::SessionTrace> traces(static_cast<size_t>(o.sessions));
  std::atomic<int> live{o.sessions};
  const double cpu0 = cpu_seconds();
  const auto t_start = Clock::now() + std::chrono::milliseconds(20);
  for (int i = 0; i < o.sessions; ++i) {
    traces[static_cast<size_t>(i)].id = i;
    const auto at = t_start + std::chrono::duration_cast<Clock::duration>(
                                  std::chrono::duration<double, std::milli>(o.ramp_ms * i));
    ppx::load::start_session(ioc, so, endpoints, audio[static_cast<size_t>(i) % audio.size()], at,
                             traces[static_cast<size_t>(i)], [&live] { --live; });
  }
  // Churn: short sessions (one frame, then close) at o.churn per second while every session streams.
  const int churn_n = static_cast<int>(std::floor(o.churn * o.duration_s));
  std::vector<ppx::load::SessionTrace> churn(static_cast<size_t>(churn_n));
  if (churn_n > 0) {
    auto one = std::make_shared<ppx::load::EncodedStream>();
    one->head = audio[0]->head;
    one->tags = audio[0]->tags;
    one->frames.assign(audio[0]->frames.begin(), audio[0]->frames.begin() + std::min<size_t>(1, audio[0]->frames.size()));
    ppx::load::SessionOptions cso = so;
    cso.drain_s = 2;
    const auto t_churn = t_start + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double, std::milli>(o.ramp_ms * o.sessions));
    for (int c = 0; c < churn_n; ++c) {
      churn[static_cast<size_t>(c)].id = o.sessions + c;
      cso.target = churn_target(c);
      const auto at = t_churn + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(c / o.churn));
      ppx::load::start_session(ioc, cso, endpoints, one, at, churn[static_cast<size_t>(c)], [] {});
    }
  }
  std::vector<std::thread> threads;
  for (int t = 1; t < o.io_threads; ++t) threads.emplace_back([&ioc] { ioc.run(); });
  ioc.run();
  for (auto& t : threads) t.join();
  const double wall_s = std::chrono::duration<double>(Clock::now() - t_start).count();
  const double cpu_s = cpu_seconds() - cpu0;

  // Per session, then overall.
  json sessions = json::array();
  std::vector<double> all_latency, all_lag, handshakes;
  int64_t sent = 0, received = 0, missed = 0, over = 0, text = 0;
  int failed = 0;
  std::printf("\n%7s %9s %6s %6s %8s %8s %8s %8s %7s  %s\n", "session", "hs_ms", "sent", "recv",
              "p50_ms", "p99_ms", "p99.9", "max_ms", ">budget", "status");
  for (const auto& t : traces) {
    const ppx::load::SessionSummary s = ppx::load::summarize(t, o.budget_ms, o.tail_frames);
    const json lat = ppx::app::latency_stats(s.latency_ms);
    json j;
    j["id"] = t.id;
    j["ok"] = s.failure.empty();
    if (!s.failure.empty()) j["failure"] = s.failure;
    j["handshake_ms"] = s.handshake_ms >= 0 ? json(s.handshake_ms) : json(nullptr);
    j["frames_sent"] = s.frames_sent;
    j["frames_received"] = s.frames_received;
    j["frames_missed"] = s.frames_missed;
    j["frames_over_budget"] = s.frames_over_budget;
    j["added_latency_ms"] = lat;
    j["text_messages"] = t.text_messages;
    j["pings"] = t.pings;
    sessions.push_back(j);
    all_latency.insert(all_latency.end(), s.latency_ms.begin(), s.latency_ms.end());
    all_lag.insert(all_lag.end(), s.send_lag_ms.begin(), s.send_lag_ms.end());
    if (s.handshake_ms >= 0) handshakes.push_back(s.handshake_ms);
    sent += s.frames_sent;
    received += s.frames_received;
    missed += s.frames_missed;
    over += s.frames_over_budget;
    text += t.text_messages;
    if (!s.failure.empty()) ++failed;
    if (!o.quiet || !s.failure.empty()) {
      char hs[32] = "-";
      if (s.handshake_ms >= 0) std::snprintf(hs, sizeof hs, "%.1f", s.handshake_ms);
      std::printf("%7d %9s %6lld %6lld %8s %8s %8s %8s %7lld  %s\n", t.id, hs,
                  static_cast<long long>(s.frames_sent), static_cast<long long>(s.frames_received),
                  fmt_ms(lat, "p50").c_str(), fmt_ms(lat, "p99").c_str(),
                  fmt_ms(lat, "p99_9").c_str(), fmt_ms(lat, "max").c_str(),
                  static_cast<long long>(s.frames_over_budget),
                  s.failure.empty() ? "ok" : ("FAILED: " + s.failure).c_str());
    }
  }
  const json lat = ppx::app::latency_stats(all_latency);
  const json hs = ppx::app::latency_stats(handshakes);
  const json lag = ppx::app::latency_stats(all_lag);
  std::printf("%7s %9s %6lld %6lld %8s %8s %8s %8s %7lld  %d of %d failed\n", "all",
              fmt_ms(hs, "p50").c_str(), static_cast<long long>(sent),
              static_cast<long long>(received), fmt_ms(lat, "p50").c_str(),
              fmt_ms(lat, "p99").c_str(), fmt_ms(lat, "p99_9").c_str(), fmt_ms(lat, "max").c_str(),
              static_cast<long long>(over), failed, o.sessions);
  std::printf(
      "handshake ms p50 %s max %s; frames missed %lld; client: send lag p99 %s ms, "
      "max %s ms, %.1f CPU s in %.1f s\n",
      fmt_ms(hs, "p50").c_str(), fmt_ms(hs, "max").c_str(), static_cast<long long>(missed),
      fmt_ms(lag, "p99").c_str(), fmt_ms(lag, "max").c_str(), cpu_s, wall_s);
  // The churn cycles, apart from the sessions.
  std::vector<double> churn_hs;
  int churn_failed = 0;
  std::string churn_first_failure;
  for (const auto& t : churn) {
    const ppx::load::SessionSummary s = ppx::load::summarize(t, o.budget_ms, o.tail_frames);
    if (s.handshake_ms >= 0) churn_hs.push_back(s.handshake_ms);
    if (!s.failure.empty()) {
      if (churn_failed++ == 0) churn_first_failure = s.failure;
    }
  }
  const json churn_hs_stats = ppx::app::latency_stats(churn_hs);
  if (churn_n > 0)
    std::printf("churn: %d cycles (%.1f per second), %d failed%s; handshake ms p50 %s p99 %s max %s\n", churn_n,
                o.churn, churn_failed, churn_failed ? (" (first: " + churn_first_failure + ")").c_str() : "",
                fmt_ms(churn_hs_stats, "p50").c_str(), fmt_ms(churn_hs_stats, "p99").c_str(),
                fmt_ms(churn_hs_stats, "max").c_str());
  if (lag.contains("p99") && lag["p99"].get<double>() > 20)
    std::printf(
        "warning: frames were written late (send lag p99 > 20 ms): this client was short "
        "of CPU or the server stopped reading; latencies count from the actual write\n");

  if (!o.json_path.empty()) {
    json out;
    out["tool"] = "personaplex-load";
    out["machine"] = ppx::app::machine_info();
    out["command"] = ppx::app::command_line(argc, argv);
    json p;
    p["host"] = o.host;
    p["port"] = o.port;
    p["sessions"] = o.sessions;
    p["duration_s"] = o.duration_s;
    p["frames_per_session"] = frames;
    p["frame_ms"] = ppx::load::kFrameMs;
    p["ramp_ms"] = o.ramp_ms;
    p["voice_prompt"] = voice_given ? json(o.voice) : json(nullptr);
    p["text_prompt"] = prompt_given ? json(o.text_prompt) : json(nullptr);
    p["api_key"] = !o.api_key.empty();
    p["input"] = o.input.empty() ? json("synthetic") : json(o.input);
    p["signals"] = audio.size();
    p["seed"] = o.seed;
    p["budget_ms"] = o.budget_ms;
    p["tail_frames"] = o.tail_frames;
    p["drain_s"] = o.drain_s;
    p["handshake_timeout_s"] = o.handshake_timeout_s;
    p["io_threads"] = o.io_threads;
    p["churn_per_s"] = o.churn;
    p["churn_text_prompt"] = churn_prompt_given ? json(o.churn_text_prompt) : json(nullptr);
    p["churn_unique_prompts"] = o.churn_unique;
    out["parameters"] = p;
    out["server"] = health;
    json r;
    r["sessions"] = o.sessions;
    r["failed_sessions"] = failed;
    r["frames_sent"] = sent;
    r["frames_received"] = received;
    r["frames_missed"] = missed;
    r["frames_over_budget"] = over;
    r["added_latency_ms"] = lat;
    r["handshake_ms"] = hs;
    r["text_messages"] = text;
    r["client"] = {
        {"send_lag_ms", lag}, {"cpu_s", cpu_s}, {"wall_s", wall_s}, {"audio_prep_s", prep_s}};
    if (churn_n > 0) {
      json c;
      c["cycles"] = churn_n;
      c["failed"] = churn_failed;
      if (churn_failed) c["first_failure"] = churn_first_failure;
      c["handshake_ms"] = churn_hs_stats;
      r["churn"] = c;
    }
    out["results"] = r;
    out["sessions"] = sessions;
    std::ofstream f(o.json_path, std::ios::trunc);
    f << out.dump(2) << "\n";
    if (!f) throw ppx::Error("--json '" + o.json_path + "': cannot write");
  }
  return failed == 0 && churn_failed == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) { return ppx::app::run_main(body, argc, argv); }
