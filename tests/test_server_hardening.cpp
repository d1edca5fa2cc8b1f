// Hostile clients, files and failures against the in-process server (tiny demo model): each test
// here reproduces a way the server could crash, be starved or grow without bound, and checks the
// contained outcome (limits and budgets: docs/PROTOCOL.md "Limits").
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <atomic>
#include <fstream>
#include <thread>

#include "faulty_backend.h"
#include "server/end_reason.h"
#include "server_test_util.h"

namespace {

using namespace ppx::server_test;
using Clock = std::chrono::steady_clock;

double process_cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

std::string long_prompt() {
  std::string words;
  while (words.size() + 12 < 4000) words += "listen+carefully+";
  return words;
}

// The server on a FaultyBackend that wraps the tiny model, to inject failures.
class FaultyServerTest : public ServerTest {
 protected:
  void start_faulty(int max_sessions, double idle_s) {
    faulty_model_ = ppx::app::server_model(*model_);
    faulty_model_.backend = &faulty_;
    start(max_sessions, idle_s, 2.0, "", "", {}, &faulty_model_);
  }
  FaultyBackend faulty_{*model_->backend};
  ppx::server::ServerModel faulty_model_;
};

// A voice file whose name is not UTF-8: /api/voices used to throw on an I/O thread (json
// type_error 316), which terminated the process.
TEST_F(ServerTest, VoiceNameThatIsNotUtf8IsSkipped) {
  const std::string bad = *voice_dir_ + "/caf\xe9.pt";
  { std::ofstream(bad) << "x"; }
  int status = 0;
  const auto voices = nlohmann::json::parse(http_get(port_, "/api/voices", &status));
  EXPECT_EQ(status, 200);
  EXPECT_EQ(voices, nlohmann::json::array({"voice.wav"}));
  fs::remove(bad);
  expect_healthy();
}

// An exception in an HTTP handler is a 500 for that request; the server keeps serving.
TEST_F(FaultyServerTest, HandlerExceptionIsA500) {
  start_faulty(1, 3.0);
  faulty_.device_throws = true;
  int status = 0;
  http_get(port_, "/health", &status);
  EXPECT_EQ(status, 500);
  faulty_.device_throws = false;
  EXPECT_EQ(nlohmann::json::parse(http_get(port_, "/health", &status))["status"], "ok");
  expect_healthy();
}

// An exception while a session is set up or runs: 0x05 + close for that client, slot freed.
TEST_F(FaultyServerTest, SessionExceptionIsAnErrorAndClose) {
  start_faulty(1, 3.0);
  faulty_.stepper_throws = true;
  Client c;
  ASSERT_TRUE(c.connect(port_, chat()));
  const Exchange ex = c.run({}, 0ms, nullptr, 10s);
  EXPECT_FALSE(ex.handshake);
  EXPECT_TRUE(ex.closed);
  ASSERT_EQ(ex.errors.size(), 1u);
  EXPECT_NE(ex.errors[0].find("injected failure"), std::string::npos) << ex.errors[0];
  faulty_.stepper_throws = false;
  expect_healthy();
}

// A DeviceError (sticky CUDA error) in one session: every client is told and closed, new
// sessions are refused, and wait() reports a non-zero exit code.
TEST_F(FaultyServerTest, DeviceErrorTellsEveryClientAndStopsNonZero) {
  start_faulty(2, 5.0);
  std::vector<float> speech = user_speech();
  speech.resize(40 * kFrame);
  Exchange other;
  std::atomic<bool> other_started{false};
  std::thread t([&] {
    Client c;
    if (!c.connect(port_, chat("&audio_seed=5"))) return;
    other = c.run(
        audio_messages(speech), 80ms,
        [&](const Exchange& e) {
          if (e.audio_msgs >= 3) other_started = true;
          return false;
        },
        30s);
  });
  while (!other_started) std::this_thread::sleep_for(10ms);
  Client c;
  ASSERT_TRUE(c.connect(port_, chat()));
  const Exchange ex = c.run(
      audio_messages(speech), 80ms,
      [&](const Exchange& e) {
        if (e.audio_msgs >= 4) faulty_.step_device_error = true;
        return false;
      },
      30s);
  t.join();
  // Each client is told, by its own failed step or by the shutdown the first failure starts.
  for (const Exchange* e : std::initializer_list<const Exchange*>{&ex, &other}) {
    EXPECT_TRUE(e->closed);
    ASSERT_EQ(e->errors.size(), 1u);
    EXPECT_TRUE(e->errors[0].find("GPU failed") != std::string::npos ||
                e->errors[0].find("device error") != std::string::npos)
        << e->errors[0];
  }
  EXPECT_EQ(server_->wait(), ppx::server::kExitDeviceError);
  EXPECT_EQ(faulty_.live_steppers.load(), 0);
  server_.reset();
}

// Bare 0x01 messages carry no audio: they are ignored and do not hold the slot past the idle
// timeout.
TEST_F(ServerTest, EmptyAudioMessagesDoNotKeepASessionAlive) {
  start(1, 1.0);
  std::vector<std::vector<uint8_t>> bare(480, msg(0x01));  // 12 s of them
  Client c;
  ASSERT_TRUE(c.connect(port_, chat()));
  const auto t0 = Clock::now();
  const Exchange ex = c.run(bare, 25ms, nullptr, 20s);
  EXPECT_LT(Clock::now() - t0, 8s);  // prompts + 1 s idle, also under sanitizers
  EXPECT_TRUE(ex.closed);
  ASSERT_EQ(ex.errors.size(), 1u);
  EXPECT_NE(ex.errors[0].find("idle"), std::string::npos) << ex.errors[0];
  EXPECT_GE(metric(http_get(port_, "/metrics"), "personaplex_ignored_messages_total"), 10.0);
  expect_healthy();
}

// Audio sent before the handshake (while a long text prompt runs) is decoded and dropped, not
// queued without bound and answered in a burst afterwards; a flood of bare messages then is
// ignored.
TEST_F(ServerTest, AudioBeforeTheHandshakeIsDropped) {
  start(1, 3.0, 0.05);
  std::vector<float> speech = user_speech();
  speech.resize(60 * kFrame);
  ppx::OggOpusWriter w(24000);
  std::vector<std::vector<uint8_t>> early{msg(0x01, w.head_page()), msg(0x01, w.tags_page())};
  for (size_t i = 0; i + kFrame <= speech.size(); i += kFrame)
    early.push_back(msg(0x01, w.encode_frame(speech.data() + i, kFrame)));
  for (int i = 0; i < 20000; ++i) early.push_back(msg(0x01));
  Client c;
  ASSERT_TRUE(c.connect(port_, "/api/chat?voice_prompt=voice.wav&text_prompt=" + long_prompt()));
  Exchange ex = c.run(
      early, 0ms, [](const Exchange& e) { return e.handshake; }, 60s, true);
  ASSERT_TRUE(ex.handshake);
  EXPECT_GT(ex.sent, 62u) << "the prompts ended before the early audio was sent";
  EXPECT_EQ(ex.audio_msgs, 0);
  // After the handshake: 5 more frames of the same stream give exactly 5 answers.
  std::vector<std::vector<uint8_t>> late;
  for (int i = 0; i < 5; ++i) late.push_back(msg(0x01, w.encode_frame(speech.data(), kFrame)));
  ex = c.run(
      late, 1ms, [](const Exchange& e) { return e.audio_msgs >= 7; }, 20s, true);
  EXPECT_TRUE(ex.errors.empty()) << ex.errors.front();
  const Exchange rest = c.run({}, 0ms, nullptr, 700ms);  // nothing more may come
  EXPECT_EQ(ex.audio_msgs + rest.audio_msgs, 2 + 5);     // OpusHead, OpusTags, one page per frame
  c.drop();
  expect_healthy();
}

// When the process runs out of file descriptors, accept() fails at once for as long as the
// pending connection waits: the server backs off instead of spinning a core, and serves again
// once descriptors are free.
TEST_F(ServerTest, AcceptBacksOffWhenOutOfDescriptors) {
  net::io_context ioc;
  std::vector<std::unique_ptr<tcp::socket>> clients;
  for (int i = 0; i < 4; ++i) {
    clients.push_back(std::make_unique<tcp::socket>(ioc));
    clients.back()->open(tcp::v4());
  }
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  int open_fds = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator("/proc/self/fd")) ++open_fds;
  rlimit low = saved;
  low.rlim_cur = static_cast<rlim_t>(open_fds);  // no descriptor to spare
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  for (auto& s : clients) {
    beast::error_code ec;
    s->connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port_), ec);
  }
  const double cpu0 = process_cpu_seconds();
  std::this_thread::sleep_for(1500ms);
  const double cpu = process_cpu_seconds() - cpu0;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
  EXPECT_LT(cpu, 0.3) << "the accept loop spun while out of descriptors";
  clients.clear();
  expect_healthy();
}

// Beyond --max-connections a connection is answered 503 (or closed) at once.
TEST_F(ServerTest, ConnectionsBeyondTheLimitAreRefused) {
  start(1, 3.0, 2.0, "", "", [](ppx::server::ServerOptions& o) { o.max_connections = 3; });
  net::io_context ioc;
  std::vector<std::unique_ptr<tcp::socket>> idle;
  for (int i = 0; i < 3; ++i) {
    idle.push_back(std::make_unique<tcp::socket>(ioc));
    idle.back()->connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port_));
  }
  const auto until = Clock::now() + 5s;
  while (server_->connections() < 3 && Clock::now() < until) std::this_thread::sleep_for(10ms);
  ASSERT_EQ(server_->connections(), 3);
  int status = 0;
  try {
    http_get(port_, "/health", &status);
  } catch (const std::exception&) {
    status = -1;  // closed before an answer: also a refusal
  }
  EXPECT_TRUE(status == 503 || status == -1) << status;
  idle.clear();
  while (server_->connections() > 0 && Clock::now() < until + 5s) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(nlohmann::json::parse(http_get(port_, "/health", &status))["status"], "ok");
  EXPECT_GE(metric(http_get(port_, "/metrics"),
                   "personaplex_rejected_total{reason=\"too_many_connections\"}"),
            1.0);
}

// Sends `bytes` on a fresh connection; everything the server answers until it closes.
std::string raw_exchange(uint16_t port, const std::string& bytes) {
  net::io_context ioc;
  tcp::socket s(ioc);
  s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
  const timeval limit{20, 0};  // a server that never answers fails the test instead of hanging it
  setsockopt(s.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  net::write(s, net::buffer(bytes));
  std::string out;
  char buf[4096];
  beast::error_code ec;
  for (;;) {
    const size_t n = s.read_some(net::buffer(buf), ec);
    if (ec) break;
    out.append(buf, n);
  }
  return out;
}

// A close frame frees the slot at once, also when the client does not close TCP after it (the
// read that sees the close completes only after the teardown: half the idle timeout, 5 s here).
TEST_F(ServerTest, CloseFrameFreesTheSlotAtOnce) {
  start(1, 10.0);
  Client c;
  ASSERT_TRUE(c.connect(port_, chat()));
  c.run({}, 0ms, [](const Exchange& e) { return e.handshake; }, 10s);
  c.send_close_frame_only();
  EXPECT_TRUE(wait_slots_free(port_, 4s));  // the teardown path took 5 s
  c.drop();
}

// Audio far ahead of real time: past 30 s of decoded backlog the session ends as an overflow
// (was: "bad audio stream", as if the audio were broken).
TEST_F(ServerTest, AudioFarAheadOfRealTimeIsAnOverflow) {
  std::vector<float> pcm(static_cast<size_t>(36 * 24000));
  for (size_t i = 0; i < pcm.size(); ++i) pcm[i] = 0.1f * std::sin(0.05f * static_cast<float>(i));
  Client c;
  ASSERT_TRUE(c.connect(port_, chat()));
  const Exchange ex = c.run(audio_messages(pcm), 0ms, [](const Exchange& e) { return !e.errors.empty(); }, 60s);
  ASSERT_FALSE(ex.errors.empty());
  EXPECT_NE(ex.errors.front().find("faster than real time"), std::string::npos) << ex.errors.front();
  c.drop();
  EXPECT_TRUE(wait_slots_free(port_));
  EXPECT_EQ(metric(http_get(port_, "/metrics"), "personaplex_sessions_ended_total{reason=\"input_overflow\"}"), 1.0);
}

// A malformed or oversized request head is answered with its status (not a silent close), and
// the server serves on.
TEST_F(ServerTest, MalformedRequestsGetAStatus) {
  auto status_line = [&](const std::string& req) {
    const std::string r = raw_exchange(port_, req);
    return r.substr(0, r.find("\r\n"));
  };
  EXPECT_EQ(status_line("GET /health HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n"), "HTTP/1.1 400 Bad Request");
  EXPECT_EQ(status_line("GET /health HTTP/3.0\r\nHost: x\r\n\r\n"), "HTTP/1.1 400 Bad Request");
  EXPECT_EQ(status_line("GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n"),
            "HTTP/1.1 400 Bad Request");
  // One header value past the head limit (60 KiB; Beast's own limit of a value is 64 KiB).
  EXPECT_EQ(status_line("GET /health HTTP/1.1\r\nHost: x\r\nCookie: " + std::string(61 * 1024, 'a') + "\r\n\r\n"),
            "HTTP/1.1 431 Request Header Fields Too Large");
  // Far past it: the answer still arrives (the server reads and drops the rest before closing,
  // so that closing with unread input does not reset the connection under the answer).
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(status_line("GET /health HTTP/1.1\r\nHost: x\r\nCookie: " + std::string(300 * 1024, 'a') + "\r\n\r\n"),
              "HTTP/1.1 431 Request Header Fields Too Large");
  // HEAD: the head of the GET's answer, no body.
  const std::string head = raw_exchange(port_, "HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(head.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << head;
  EXPECT_NE(head.find("Content-Length: "), std::string::npos) << head;
  EXPECT_EQ(head.find("\r\n\r\n"), head.size() - 4) << head;
  // WebSocket upgrades: over HTTP/1.0, and with a key that is not 16 bytes of base64.
  const std::string upgrade =
      "Host: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n";
  EXPECT_EQ(status_line("GET " + chat() + " HTTP/1.0\r\n" + upgrade + "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"),
            "HTTP/1.0 400 Bad Request");
  for (const char* key : {"short", "", "dGhlIHNhbXBsZSBub25jZR==", "dGhlIHNhbXBsZSBub25jZQ=x"})
    EXPECT_EQ(status_line("GET " + chat() + " HTTP/1.1\r\n" + upgrade + "Sec-WebSocket-Key: " + key + "\r\n\r\n"),
              "HTTP/1.1 400 Bad Request")
        << key;
  const std::string v8 = raw_exchange(port_, "GET " + chat() +
                                                 " HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
                                                 "Sec-WebSocket-Version: 8\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n");
  EXPECT_EQ(v8.rfind("HTTP/1.1 426 Upgrade Required\r\n", 0), 0u) << v8;
  EXPECT_NE(v8.find("Sec-WebSocket-Version: 13\r\n"), std::string::npos) << v8;
  // HTTP/1.1 without Host (RFC 9112 3.2); HTTP/1.0 needs none.
  const std::string no_host = raw_exchange(port_, "GET /health HTTP/1.1\r\n\r\n");
  EXPECT_EQ(no_host.rfind("HTTP/1.1 400 Bad Request\r\n", 0), 0u) << no_host;
  EXPECT_NE(no_host.find("Host header"), std::string::npos) << no_host;
  EXPECT_EQ(status_line("GET /health HTTP/1.0\r\n\r\n"), "HTTP/1.0 200 OK");
  // Every refusal above counted: 3 + 6 + 1 + 4 + 1 + 1 (the HEAD and the HTTP/1.0 GET succeed).
  EXPECT_EQ(metric(http_get(port_, "/metrics"), "personaplex_rejected_total{reason=\"malformed_request\"}"), 16.0);
  expect_healthy();
}

// At --max-connections, a connection that has trickled its request head for over a second makes
// way for a new one: slow clients cannot keep /health out.
TEST_F(ServerTest, SlowRequestHeadsMakeWayAtTheLimit) {
  start(1, 3.0, 2.0, "", "", [](ppx::server::ServerOptions& o) { o.max_connections = 3; });
  net::io_context ioc;
  std::vector<std::unique_ptr<tcp::socket>> slow;
  for (int i = 0; i < 3; ++i) {
    slow.push_back(std::make_unique<tcp::socket>(ioc));
    slow.back()->connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port_));
    net::write(*slow.back(), net::buffer(std::string("GET /health HTTP/1.1\r\nHo")));
  }
  const auto until = Clock::now() + 5s;
  while (server_->connections() < 3 && Clock::now() < until) std::this_thread::sleep_for(10ms);
  ASSERT_EQ(server_->connections(), 3);
  std::this_thread::sleep_for(1200ms);
  int status = 0;
  EXPECT_EQ(nlohmann::json::parse(http_get(port_, "/health", &status))["status"], "ok");
  EXPECT_EQ(status, 200);
  // Exactly one slow connection was closed (the oldest): it reads the end of the stream.
  std::this_thread::sleep_for(200ms);
  int closed = 0;
  for (auto& s : slow) {
    s->non_blocking(true);
    char c = 0;
    beast::error_code ec;
    s->read_some(net::buffer(&c, 1), ec);
    closed += ec == net::error::eof || ec == net::error::connection_reset;
  }
  EXPECT_EQ(closed, 1);
}

TEST_F(ServerTest, ApiKeyGuardsTheApiButNotHealth) {
  start(1, 3.0, 2.0, "", "", [](ppx::server::ServerOptions& o) { o.api_key = "s3cret key"; });
  int status = 0;
  EXPECT_EQ(nlohmann::json::parse(http_get(port_, "/health", &status))["status"], "ok");
  http_get(port_, "/metrics", &status);
  EXPECT_EQ(status, 200);
  http_get(port_, "/api/voices", &status);
  EXPECT_EQ(status, 401);
  http_get(port_, "/api/voices?api_key=s3cret+key", &status);
  EXPECT_EQ(status, 200);
  http_get(port_, "/api/voices", &status, {{"Authorization", "Bearer s3cret key"}});
  EXPECT_EQ(status, 200);
  http_get(port_, "/api/voices", &status, {{"Authorization", "bEARER   s3cret key"}});  // RFC 9110 11.1, 11.4
  EXPECT_EQ(status, 200);
  for (const auto& [target, headers] :
       std::vector<std::pair<std::string, Headers>>{{chat(), {}},
                                                    {chat("&api_key=wrong"), {}},
                                                    {chat(), {{"Authorization", "Bearer s3cret"}}},
                                                    {chat("&api_key="), {}}}) {
    EXPECT_EQ(upgrade_status(port_, target, headers), 401) << target;
  }
  for (const auto& [target, headers] : std::vector<std::pair<std::string, Headers>>{
           {chat("&api_key=s3cret%20key"), {}},
           {chat(), {{"Authorization", "Bearer s3cret key"}}}}) {
    Client c;
    ASSERT_TRUE(c.connect(port_, target, headers)) << target;
    EXPECT_TRUE(c.run(
                     {}, 0ms, [](const Exchange& e) { return e.handshake; }, 20s)
                    .handshake);
    c.drop();
    ASSERT_TRUE(wait_slots_free(port_));
  }
  start(1, 3.0, 2.0, "", "", [](ppx::server::ServerOptions& o) {
    o.api_key = "k";
    o.metrics_auth = true;
  });
  http_get(port_, "/metrics", &status);
  EXPECT_EQ(status, 401);
  http_get(port_, "/metrics?api_key=k", &status);
  EXPECT_EQ(status, 200);
}

TEST_F(ServerTest, AllowedOriginIsCheckedOnUpgrades) {
  start(1, 3.0, 2.0, "", "",
        [](ppx::server::ServerOptions& o) { o.allowed_origins = {"https://good.example"}; });
  EXPECT_EQ(upgrade_status(port_, chat(), {{"Origin", "https://evil.example"}}), 403);
  for (const Headers& h : {Headers{{"Origin", "https://good.example"}}, Headers{}}) {
    Client c;
    ASSERT_TRUE(c.connect(port_, chat(), h));
    EXPECT_TRUE(c.run(
                     {}, 0ms, [](const Exchange& e) { return e.handshake; }, 20s)
                    .handshake);
    c.drop();
    ASSERT_TRUE(wait_slots_free(port_));
  }
}

// shutdown(): new sessions get 503, the live conversation goes on for the drain timeout, then
// gets 0x05 + close; wait() returns 0.
TEST_F(ServerTest, ShutdownDrainsThenEndsSessionsWithAnError) {
  start(2, 5.0, 2.0, "", "", [](ppx::server::ServerOptions& o) { o.drain_timeout_s = 1.5; });
  std::vector<float> speech = user_speech();
  speech.resize(60 * kFrame);
  Client c;
  ASSERT_TRUE(c.connect(port_, chat()));
  std::atomic<bool> asked{false};
  Clock::time_point t_shutdown;
  int audio_at_shutdown = 0;
  const Exchange ex = c.run(
      audio_messages(speech), 80ms,
      [&](const Exchange& e) {
        if (e.audio_msgs >= 5 && !asked.exchange(true)) {
          t_shutdown = Clock::now();
          audio_at_shutdown = e.audio_msgs;
          std::thread([this] { server_->shutdown(); }).detach();
        }
        return false;
      },
      30s);
  const auto ended = Clock::now() - t_shutdown;
  EXPECT_TRUE(ex.closed);
  ASSERT_EQ(ex.errors.size(), 1u);
  EXPECT_NE(ex.errors[0].find("shutting down"), std::string::npos) << ex.errors[0];
  EXPECT_GE(ended, 1400ms);
  EXPECT_LT(ended, 5s);
  EXPECT_GE(ex.audio_msgs - audio_at_shutdown, 5);  // ~18 at real time; fewer under sanitizers
  EXPECT_EQ(server_->wait(), ppx::server::kExitOk);
  server_.reset();
}

TEST_F(ServerTest, NewSessionsAreRefusedWhileDraining) {
  start(2, 5.0, 2.0, "", "", [](ppx::server::ServerOptions& o) { o.drain_timeout_s = 30; });
  Client live;
  ASSERT_TRUE(live.connect(port_, chat()));
  ASSERT_TRUE(live.run(
                      {}, 0ms, [](const Exchange& e) { return e.handshake; }, 20s)
                  .handshake);
  server_->shutdown();
  // Both endpoints refuse before the upgrade: 503, Retry-After: 5, a JSON reason.
  for (const std::string& target : {chat(), std::string("/v1/realtime")}) {
    const auto res = upgrade_response(port_, target);
    EXPECT_EQ(res.result_int(), 503u) << target;
    EXPECT_EQ(res[http::field::retry_after], "5") << target;
    EXPECT_EQ(nlohmann::json::parse(res.body())["error"]["code"], "draining") << res.body();
  }
  int status = 0;
  EXPECT_EQ(nlohmann::json::parse(http_get(port_, "/health", &status))["status"], "draining");
  EXPECT_EQ(status, 503);
  // Not ready (a slot is free, but draining), still live.
  const auto ready = nlohmann::json::parse(http_get(port_, "/health/ready", &status));
  EXPECT_EQ(status, 503);
  EXPECT_EQ(ready["status"], "draining");
  EXPECT_EQ(ready["ready"], false);
  EXPECT_EQ(ready["sessions_in_use"], 1);
  http_get(port_, "/health/live", &status);
  EXPECT_EQ(status, 200);
  EXPECT_EQ(metric(http_get(port_, "/metrics"), "personaplex_rejected_total{reason=\"draining\"}"),
            2.0);
  live.drop();  // the last session leaves: the drain ends early
  EXPECT_EQ(server_->wait(), ppx::server::kExitOk);
  server_.reset();
}

TEST_F(ServerTest, MaxSessionDurationEndsTheConversation) {
  start(1, 5.0, 2.0, "", "", [](ppx::server::ServerOptions& o) { o.max_session_duration_s = 1.0; });
  std::vector<float> speech = user_speech();
  speech.resize(60 * kFrame);
  Client c;
  ASSERT_TRUE(c.connect(port_, chat()));
  const auto t0 = Clock::now();
  const Exchange ex = c.run(audio_messages(speech), 80ms, nullptr, 20s);
  EXPECT_LT(Clock::now() - t0, 4s);
  EXPECT_TRUE(ex.closed);
  ASSERT_EQ(ex.errors.size(), 1u);
  EXPECT_NE(ex.errors[0].find("maximum session duration"), std::string::npos) << ex.errors[0];
  ASSERT_TRUE(wait_slots_free(port_));
  EXPECT_EQ(metric(http_get(port_, "/metrics"),
                   "personaplex_sessions_ended_total{reason=\"max_duration\"}"),
            1.0);
}

// End reasons and rejections are labelled from fixed sets: messages that differ (here by a byte
// count) do not make new series.
TEST_F(ServerTest, MetricLabelsAreAFixedSet) {
  for (int n : {5000, 5001, 6000}) {
    Client c;
    ASSERT_TRUE(
        c.connect(port_, "/api/chat?text_prompt=" + std::string(static_cast<size_t>(n), 'a')));
    c.run({}, 0ms, nullptr, 10s);
  }
  const std::string m = http_get(port_, "/metrics");
  size_t series = 0;
  for (size_t at = 0; (at = m.find("\npersonaplex_rejected_total{", at)) != std::string::npos; ++at)
    ++series;
  EXPECT_EQ(series, ppx::server::kRejectionCount) << m;
  EXPECT_EQ(metric(m, "personaplex_rejected_total{reason=\"bad_request\"}"), 3.0) << m;
  EXPECT_EQ(m.find("5000"), std::string::npos);
}

// A rejection after the upgrade (here a bad request; a drain begun during the upgrade takes the
// same path) reaches the client as 0x05 before the close even when the client is sending.
TEST_F(ServerTest, RejectionArrivesBeforeTheCloseWhileTheClientSends) {
  std::vector<std::vector<uint8_t>> burst(64, msg(0x01, std::vector<uint8_t>(16384, 7)));
  for (int i = 0; i < 10; ++i) {
    Client b;
    ASSERT_TRUE(b.connect(port_, "/api/chat?text_prompt=" + std::string(5000, 'a')));
    const Exchange ex = b.run(burst, 0ms, nullptr, 10s, true);
    EXPECT_TRUE(ex.closed);
    ASSERT_EQ(ex.errors.size(), 1u) << "try " << i << ": " << ex.close_reason;
    EXPECT_NE(ex.errors[0].find("text_prompt"), std::string::npos) << ex.errors[0];
  }
  expect_healthy();
}

// stop() while sessions are starting: no worker (and so no model state) outlives it.
TEST_F(FaultyServerTest, StopWhileSessionsStartLeavesNoWorker) {
  for (int round = 0; round < 6; ++round) {
    start_faulty(2, 3.0);
    std::vector<std::unique_ptr<Client>> clients;
    for (int i = 0; i < 2; ++i) {
      clients.push_back(std::make_unique<Client>());
      clients.back()->connect(port_, chat());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(round * 7));
    server_->stop();
    EXPECT_EQ(faulty_.live_steppers.load(), 0) << "round " << round;
    server_.reset();
  }
}

}  // namespace

namespace {

using namespace ppx::server_test;

// A flood that ends the session (too much queued input, or a failed stream) gets exactly one
// 0x05, before the close: the error and the close come from one place, in order.
TEST_F(ServerTest, FloodGetsItsErrorBeforeTheClose) {
  std::mt19937 rng(3);
  std::vector<uint8_t> junk((1 << 20) - 16);  // under the 1 MiB message limit
  for (auto& b : junk) b = static_cast<uint8_t>(rng());
  const std::vector<std::vector<uint8_t>> flood(8, msg(0x01, junk));
  for (int i = 0; i < 8; ++i) {
    Client c;
    ASSERT_TRUE(c.connect(port_, "/api/chat?voice_prompt=&text_prompt="));
    const Exchange ex = c.run(flood, 0ms, nullptr, 15s);
    EXPECT_TRUE(ex.handshake);
    EXPECT_TRUE(ex.closed);
    ASSERT_EQ(ex.errors.size(), 1u) << "try " << i << ": " << ex.close_reason;
    ASSERT_TRUE(wait_slots_free(port_));
  }
}

}  // namespace

namespace {

using namespace ppx::server_test;

// --dep-q-exit 8 in the server: the conversation runs (the user's codebooks are always
// provided), and /health reports the flag.
TEST_F(ServerTest, DepQExitEightConverses) {
  ppx::server::ServerModel m = ppx::app::server_model(*model_);
  m.dep_steps = 8;
  m.speed_flags = "--dep-q-exit 8";
  start(1, 3.0, 2.0, "", "", {}, &m);
  EXPECT_EQ(nlohmann::json::parse(http_get(port_, "/health"))["speed_flags"], "--dep-q-exit 8");
  std::vector<float> speech = user_speech();
  speech.resize(10 * kFrame);
  Client c;
  ASSERT_TRUE(c.connect(port_, chat()));
  const Exchange ex = c.run(
      audio_messages(speech), 20ms, [](const Exchange& e) { return e.audio_msgs >= 12; }, 30s);
  EXPECT_TRUE(ex.errors.empty()) << ex.errors.front();
  EXPECT_EQ(ex.audio_msgs, 12);
  c.drop();
  expect_healthy();
}

}  // namespace
