// The WebSocket server end to end on 127.0.0.1 with the embedded tiny demo model: a real
// conversation over /api/chat (Ogg Opus both ways), the HTTP routes, and hostile clients. Each test
// starts its own in-process server on a free port; readiness and slot release are observed
// through /health, never assumed after a sleep.
#include <gtest/gtest.h>

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/beast/websocket/ssl.hpp>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "apps/model_loading.h"
#include "ppx/audio.h"
#include "ppx/ogg_opus.h"
#include "server/server.h"
#include "test_util.h"

namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

constexpr int kFrame = 1920;

std::string http_get(uint16_t port, const std::string& target, int* status = nullptr) {
  net::io_context ioc;
  tcp::socket s(ioc);
  s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
  http::request<http::empty_body> req{http::verb::get, target, 11};
  req.set(http::field::host, "127.0.0.1");
  http::write(s, req);
  beast::flat_buffer b;
  http::response<http::string_body> res;
  http::read(s, b, res);
  if (status) *status = static_cast<int>(res.result_int());
  return res.body();
}

// Polls /health until every slot is free (true) or `limit` passes (false).
bool wait_slots_free(uint16_t port, std::chrono::milliseconds limit = 10s) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (nlohmann::json::parse(http_get(port, "/health"))["sessions_in_use"] == 0) return true;
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

std::vector<uint8_t> msg(uint8_t kind, const std::vector<uint8_t>& payload = {}) {
  std::vector<uint8_t> m(1 + payload.size());
  m[0] = kind;
  if (!payload.empty()) std::memcpy(m.data() + 1, payload.data(), payload.size());
  return m;
}

struct Exchange {
  bool handshake = false, closed = false;
  int audio_msgs = 0, text_msgs = 0, pings = 0;
  std::vector<std::string> errors;
  std::vector<uint8_t> audio_bytes;  // every 0x01 payload, joined
  size_t sent = 0;
  std::string close_reason;
};

// A WebSocket client driven on one thread: sends its messages (paced) once the handshake byte
// arrives, and reads everything until done(), a close, or the deadline.
class Client {
 public:
  bool connect(uint16_t port, const std::string& target) {
    beast::error_code ec;
    beast::get_lowest_layer(ws_).socket().connect(
        tcp::endpoint(net::ip::make_address("127.0.0.1"), port), ec);
    if (ec) return false;
    ws_.read_message_max(64 << 20);
    ws_.binary(true);
    ws_.handshake("127.0.0.1:" + std::to_string(port), target, ec);
    return !ec;
  }

  Exchange run(std::vector<std::vector<uint8_t>> to_send, std::chrono::milliseconds interval,
               const std::function<bool(const Exchange&)>& done, std::chrono::milliseconds deadline,
               bool send_at_once = false) {
    Exchange ex;
    bool finished = false, started = false;
    net::steady_timer pace(ioc_), limit(ioc_);
    auto finish = [&] {
      if (finished) return;
      finished = true;
      pace.cancel();
      limit.cancel();
      beast::error_code ec;
      beast::get_lowest_layer(ws_).socket().cancel(ec);
    };
    std::function<void()> send_next = [&] {
      if (finished || ex.sent >= to_send.size()) return;
      ws_.async_write(net::buffer(to_send[ex.sent]), [&](beast::error_code ec, size_t) {
        if (ec) return;
        ++ex.sent;
        pace.expires_after(interval);
        pace.async_wait([&](beast::error_code e) {
          if (!e) send_next();
        });
      });
    };
    std::function<void()> read_next = [&] {
      ws_.async_read(buf_, [&](beast::error_code ec, size_t n) {
        if (ec) {
          if (!finished) {
            ex.closed = true;
            ex.close_reason = ec.message();
          }
          return finish();
        }
        const auto* d = static_cast<const uint8_t*>(buf_.data().data());
        if (n >= 1) {
          if (d[0] == 0x00) ex.handshake = true;
          if (d[0] == 0x01) {
            ++ex.audio_msgs;
            ex.audio_bytes.insert(ex.audio_bytes.end(), d + 1, d + n);
          }
          if (d[0] == 0x02) ++ex.text_msgs;
          if (d[0] == 0x05) ex.errors.emplace_back(reinterpret_cast<const char*>(d + 1), n - 1);
          if (d[0] == 0x06) ++ex.pings;
        }
        buf_.consume(buf_.size());
        if (ex.handshake && !started) {
          started = true;
          send_next();
        }
        if (done && done(ex)) return finish();
        read_next();
      });
    };
    limit.expires_after(deadline);
    limit.async_wait([&](beast::error_code e) {
      if (!e) finish();
    });
    if (send_at_once) {
      started = true;
      send_next();
    }
    read_next();
    ioc_.restart();
    ioc_.run();
    return ex;
  }

  void drop() {  // vanish: close the TCP connection without a WebSocket close
    beast::error_code ec;
    beast::get_lowest_layer(ws_).socket().close(ec);
  }
  void reset() {  // vanish abruptly: the peer sees a TCP reset (RST), not a FIN
    beast::error_code ec;
    beast::get_lowest_layer(ws_).socket().set_option(net::socket_base::linger(true, 0), ec);
    beast::get_lowest_layer(ws_).socket().close(ec);
  }

 private:
  net::io_context ioc_;
  websocket::stream<beast::tcp_stream> ws_{ioc_};
  beast::flat_buffer buf_;
};

// User speech at 24 kHz, padded to whole frames.
std::vector<float> user_speech() {
  const ppx::Audio a = ppx::read_audio(ppx::test::data("speech_16k.wav"));
  std::vector<float> x = ppx::resample(ppx::take_channel(a, 0), a.sample_rate, 24000);
  x.resize((x.size() + kFrame - 1) / kFrame * kFrame, 0.f);
  return x;
}

// The client's messages for `pcm`: header pages, then one 0x01 page per 80 ms frame.
std::vector<std::vector<uint8_t>> audio_messages(const std::vector<float>& pcm) {
  ppx::OggOpusWriter w(24000);
  std::vector<std::vector<uint8_t>> out{msg(0x01, w.head_page()), msg(0x01, w.tags_page())};
  for (size_t i = 0; i + kFrame <= pcm.size(); i += kFrame)
    out.push_back(msg(0x01, w.encode_frame(pcm.data() + i, kFrame)));
  return out;
}

class ServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // PPX_TEST_DEVICE=cuda runs the same tests on the CUDA backend (on a GPU machine).
    ppx::app::ModelFlags flags;
    if (const char* d = std::getenv("PPX_TEST_DEVICE")) flags.device = d;
    model_ = new ppx::app::LoadedModel(ppx::app::load_model(flags));
    voice_dir_ = new std::string(ppx::test::scratch("server_voices_" + std::to_string(::getpid())));
    fs::create_directories(*voice_dir_);
    std::vector<float> voice = user_speech();
    voice.resize(24000);
    ppx::write_wav_pcm16(*voice_dir_ + "/voice.wav", 24000, voice);
    std::error_code ec;
    fs::create_symlink("/etc/passwd", *voice_dir_ + "/escape.wav", ec);
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    fs::remove_all(*voice_dir_, ec);
    delete voice_dir_;
    delete model_;
  }

  void SetUp() override { start(1, 3.0); }
  void TearDown() override {
    if (server_) server_->stop();
  }

  void start(int max_sessions, double idle_s, double ping_s = 2.0,
             const std::string& static_dir = "", const std::string& ssl_dir = "") {
    if (server_) server_->stop();
    ppx::server::ServerOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.voice_dir = *voice_dir_;
    o.max_sessions = max_sessions;
    o.idle_timeout_s = idle_s;
    o.ping_interval_s = ping_s;
    o.static_dir = static_dir;
    o.ssl_dir = ssl_dir;
    const ppx::server::ServerModel m = ppx::server::server_model(*model_);
    server_ = std::make_unique<ppx::server::Server>(o, m);
    server_->start();
    port_ = server_->port();
  }

  static std::string chat(const std::string& extra = "") {
    return "/api/"
           "chat?voice_prompt=voice.wav&text_prompt=You+are+a+tester%2E&text_seed=1&audio_seed=2" +
           extra;
  }

  // After any client: every slot comes back, and a new client still gets its handshake.
  void expect_healthy() {
    ASSERT_TRUE(wait_slots_free(port_)) << "a session slot was not released";
    Client c;
    ASSERT_TRUE(c.connect(port_, chat()));
    const Exchange ex = c.run(
        {}, 0ms, [](const Exchange& e) { return e.handshake; }, 20s);
    EXPECT_TRUE(ex.handshake);
    c.drop();
    EXPECT_TRUE(wait_slots_free(port_));
  }

  static ppx::app::LoadedModel* model_;
  static std::string* voice_dir_;
  std::unique_ptr<ppx::server::Server> server_;
  uint16_t port_ = 0;
};

ppx::app::LoadedModel* ServerTest::model_ = nullptr;
std::string* ServerTest::voice_dir_ = nullptr;

TEST_F(ServerTest, HealthAndVoices) {
  int status = 0;
  const auto h = nlohmann::json::parse(http_get(port_, "/health", &status));
  EXPECT_EQ(status, 200);
  EXPECT_EQ(h["status"], "ok");
  const char* dev = std::getenv("PPX_TEST_DEVICE");
  EXPECT_EQ(h["device"].get<std::string>().rfind(dev ? dev : "cpu", 0), 0u) << h["device"];
  EXPECT_EQ(h["sessions_in_use"], 0);
  EXPECT_EQ(h["max_sessions"], 1);
  // The symlink pointing outside the directory is not listed.
  EXPECT_EQ(nlohmann::json::parse(http_get(port_, "/api/voices")),
            nlohmann::json::array({"voice.wav"}));
  http_get(port_, "/../../etc/passwd", &status);
  EXPECT_EQ(status, 404);
}

TEST_F(ServerTest, StaticFilesStayInsideTheirDirectory) {
  const std::string root = *voice_dir_ + "/www";
  fs::create_directories(root + "/assets");
  ppx::test::write_bytes(root + "/index.html", {'<', 'p', '>'});
  ppx::test::write_bytes(root + "/assets/app.js", {'1', ';'});
  std::error_code ec;
  fs::create_symlink("/etc/passwd", root + "/leak.txt", ec);
  start(1, 3.0, 2.0, root);
  int status = 0;
  EXPECT_EQ(http_get(port_, "/", &status), "<p>");
  EXPECT_EQ(status, 200);
  EXPECT_EQ(http_get(port_, "/assets/app.js", &status), "1;");
  EXPECT_EQ(status, 200);
  for (const char* bad : {"/../voice.wav", "/assets/../../voice.wav", "/%2E%2E/voice.wav",
                          "/leak.txt", "/nope.js", "/assets/"}) {
    http_get(port_, bad, &status);
    EXPECT_EQ(status, 404) << bad;
  }
  fs::remove_all(root, ec);
}

TEST_F(ServerTest, ConversationOverWebSocket) {
  const std::vector<float> speech = user_speech();
  const int frames = static_cast<int>(speech.size() / kFrame);
  ASSERT_GT(frames, 50);
  Client c;
  ASSERT_TRUE(c.connect(port_, chat()));
  // 4x real time: one 80 ms frame every 20 ms. Done when every frame's answer is back.
  const Exchange ex = c.run(
      audio_messages(speech), 20ms, [&](const Exchange& e) { return e.audio_msgs >= frames + 2; },
      60s);
  EXPECT_TRUE(ex.handshake);
  EXPECT_TRUE(ex.errors.empty()) << ex.errors.front();
  EXPECT_GE(ex.text_msgs, 1);
  EXPECT_EQ(ex.audio_msgs, frames + 2);  // OpusHead + OpusTags + one page per frame
  ppx::OggOpusReader reader(24000);
  reader.push(ex.audio_bytes.data(), ex.audio_bytes.size());
  EXPECT_FALSE(reader.failed()) << reader.error();
  EXPECT_EQ(reader.errors(), 0u);
  ASSERT_TRUE(reader.head().has_value());
  EXPECT_NEAR(static_cast<double>(reader.available()), static_cast<double>(speech.size()), kFrame);
  std::vector<float> out;
  reader.read(out);
  double energy = 0;
  for (float v : out) energy += static_cast<double>(v) * v;
  EXPECT_GT(energy, 0.0);
  c.drop();
  expect_healthy();
  // /metrics (Prometheus text) counts the frames, the session and its end.
  int status = 0;
  const std::string metrics = http_get(port_, "/metrics", &status);
  EXPECT_EQ(status, 200);
  const auto value = [&](const std::string& name) {
    const size_t at = metrics.find("\n" + name + " ");
    return at == std::string::npos ? -1.0 : std::stod(metrics.substr(at + name.size() + 2));
  };
  EXPECT_GE(value("personaplex_frames_total"), frames);
  EXPECT_GE(value("personaplex_sessions_started_total"), 1.0);  // expect_healthy() opens one too
  EXPECT_EQ(value("personaplex_sessions_in_use"), 0.0);
  EXPECT_EQ(value("personaplex_frame_seconds_count"), value("personaplex_frames_total"));
  EXPECT_NE(metrics.find("personaplex_sessions_ended_total{reason="), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("personaplex_frame_seconds_bucket{le=\"+Inf\"}"), std::string::npos);
}

TEST_F(ServerTest, RandomBytesAsAudioGetAnErrorAndClose) {
  std::mt19937 rng(5);
  std::vector<std::vector<uint8_t>> junk;
  for (int i = 0; i < 300; ++i) {
    std::vector<uint8_t> p(4096);
    for (auto& b : p) b = static_cast<uint8_t>(rng());
    junk.push_back(msg(0x01, p));
  }
  Client c;
  ASSERT_TRUE(c.connect(port_, chat()));
  const Exchange ex = c.run(junk, 0ms, nullptr, 30s);
  EXPECT_TRUE(ex.handshake);
  EXPECT_TRUE(ex.closed);
  ASSERT_EQ(ex.errors.size(), 1u) << ex.close_reason << " sent " << ex.sent;
  EXPECT_NE(ex.errors[0].find("bad audio stream"), std::string::npos) << ex.errors[0];
  expect_healthy();
}

TEST_F(ServerTest, UnknownMessageKindsAreIgnored) {
  std::vector<float> speech = user_speech();
  speech.resize(5 * kFrame);
  auto audio = audio_messages(speech);
  std::vector<std::vector<uint8_t>> to_send{
      msg(0x02, {'h', 'i'}), msg(0x03, {0}), msg(0x07), msg(0xFF, {1, 2}), {}};
  to_send.insert(to_send.end(), audio.begin(), audio.end());
  Client c;
  ASSERT_TRUE(c.connect(port_, chat()));
  const Exchange ex = c.run(
      to_send, 1ms, [](const Exchange& e) { return e.audio_msgs >= 7; }, 30s);
  EXPECT_TRUE(ex.errors.empty());
  EXPECT_FALSE(ex.closed) << ex.close_reason;
  EXPECT_EQ(ex.audio_msgs, 7);
  c.drop();
  expect_healthy();
}

TEST_F(ServerTest, BadVoicePromptsAreRefused) {
  for (const std::string v : {"..%2F..%2Fetc%2Fpasswd", "%2Fetc%2Fpasswd", "../../etc/passwd",
                              "nope.pt", "escape.wav", "voice.wav%00.pt"}) {
    Client c;
    ASSERT_TRUE(c.connect(port_, "/api/chat?voice_prompt=" + v));
    const Exchange ex = c.run({}, 0ms, nullptr, 10s);
    EXPECT_FALSE(ex.handshake) << v;
    EXPECT_TRUE(ex.closed) << v;
    ASSERT_EQ(ex.errors.size(), 1u) << v;
    EXPECT_NE(ex.errors[0].find("voice_prompt"), std::string::npos) << ex.errors[0];
  }
  expect_healthy();
}

TEST_F(ServerTest, BadTextPromptsAreRefused) {
  for (const std::string& t : {std::string("%FF%FE"), std::string(5000, 'a'),
                               std::string(100 * 1024, 'b')}) {
    Client c;
    ASSERT_TRUE(c.connect(port_, "/api/chat?voice_prompt=voice.wav&text_prompt=" + t));
    const Exchange ex = c.run({}, 0ms, nullptr, 10s);
    EXPECT_FALSE(ex.handshake);
    EXPECT_TRUE(ex.closed);
    ASSERT_EQ(ex.errors.size(), 1u);
    EXPECT_NE(ex.errors[0].find("text_prompt"), std::string::npos) << ex.errors[0];
  }
  expect_healthy();
}

TEST_F(ServerTest, OversizedMessageClosesTheConnection) {
  Client c;
  ASSERT_TRUE(c.connect(port_, chat()));
  const Exchange ex = c.run({msg(0x01, std::vector<uint8_t>(100 << 20, 0x55))}, 0ms, nullptr, 20s);
  EXPECT_TRUE(ex.handshake);
  EXPECT_TRUE(ex.closed);
  expect_healthy();
}

TEST_F(ServerTest, RapidConnectDisconnect) {
  for (int i = 0; i < 50; ++i) {
    Client c;
    ASSERT_TRUE(c.connect(port_, chat()));
    // Usually during the system prompts, or while the previous one still holds the slot.
    if (i % 2) c.reset(); else c.drop();
  }
  expect_healthy();
}

// A page cut short in the middle of the stream costs its audio, not the session: the reader
// resynchronizes on the next page and the frames after it are answered.
TEST_F(ServerTest, TruncatedPageMidStream) {
  std::vector<float> speech = user_speech();
  speech.resize(16 * kFrame);
  auto audio = audio_messages(speech);  // head, tags, 16 frames
  audio[2 + 5].resize(audio[2 + 5].size() / 2);
  Client c;
  ASSERT_TRUE(c.connect(port_, chat()));
  const Exchange ex = c.run(
      audio, 1ms, [](const Exchange& e) { return e.audio_msgs >= 2 + 14; }, 30s);
  EXPECT_TRUE(ex.errors.empty()) << ex.errors.front();
  EXPECT_FALSE(ex.closed) << ex.close_reason;
  EXPECT_GE(ex.audio_msgs, 2 + 14);
  c.reset();
  expect_healthy();
}

// A bare /api/chat (as Kyutai's command-line client connects) gets upstream's defaults; the
// default voice is not in this voice directory, so the session runs without a voice prompt.
TEST_F(ServerTest, MissingParametersGetDefaults) {
  std::vector<float> speech = user_speech();
  speech.resize(3 * kFrame);
  Client c;
  ASSERT_TRUE(c.connect(port_, "/api/chat"));
  const Exchange ex = c.run(
      audio_messages(speech), 1ms, [](const Exchange& e) { return e.audio_msgs >= 5; }, 60s);
  EXPECT_TRUE(ex.handshake);
  EXPECT_TRUE(ex.errors.empty());
  EXPECT_EQ(ex.audio_msgs, 5);
  c.drop();
  expect_healthy();
}

// A long text prompt keeps the system prompts running for seconds; pings flow meanwhile, and a
// client that leaves during them frees its slot long before they would have finished.
TEST_F(ServerTest, ClientVanishesDuringSystemPrompts) {
  start(1, 3.0, 0.05);
  std::string words;
  while (words.size() + 12 < 4000) words += "listen+carefully+";
  Client c;
  ASSERT_TRUE(c.connect(port_, "/api/chat?voice_prompt=voice.wav&text_prompt=" + words));
  const auto t0 = std::chrono::steady_clock::now();
  const Exchange ex = c.run(
      {}, 0ms, [](const Exchange& e) { return e.pings >= 2 || e.handshake; }, 30s);
  EXPECT_GE(ex.pings, 2);
  ASSERT_FALSE(ex.handshake) << "the prompts finished too soon for this test";
  c.reset();  // a TCP reset in the middle of the system prompts
  EXPECT_TRUE(wait_slots_free(port_, 5s));
  // The uninterrupted prompts take at least as long as the full run below; the dropped one ended
  // sooner.
  const auto dropped = std::chrono::steady_clock::now() - t0;
  Client full;
  ASSERT_TRUE(full.connect(port_, "/api/chat?voice_prompt=voice.wav&text_prompt=" + words));
  const auto t1 = std::chrono::steady_clock::now();
  const Exchange ex2 = full.run(
      {}, 0ms, [](const Exchange& e) { return e.handshake; }, 60s);
  EXPECT_TRUE(ex2.handshake);
  const auto complete = std::chrono::steady_clock::now() - t1;
  EXPECT_LT(dropped, complete);
  full.drop();
  expect_healthy();
}

TEST_F(ServerTest, EmptyTextPromptAndNoVoice) {
  std::vector<float> speech = user_speech();
  speech.resize(3 * kFrame);
  Client c;
  ASSERT_TRUE(c.connect(port_, "/api/chat?voice_prompt=&text_prompt="));
  const Exchange ex = c.run(
      audio_messages(speech), 1ms, [](const Exchange& e) { return e.audio_msgs >= 5; }, 30s);
  EXPECT_TRUE(ex.handshake);
  EXPECT_TRUE(ex.errors.empty());
  EXPECT_EQ(ex.audio_msgs, 5);
  c.drop();
  expect_healthy();
}

TEST_F(ServerTest, ClientVanishesMidStream) {
  Client c;
  ASSERT_TRUE(c.connect(port_, chat()));
  const Exchange ex = c.run(
      audio_messages(user_speech()), 20ms, [](const Exchange& e) { return e.audio_msgs >= 6; },
      30s);
  EXPECT_GE(ex.audio_msgs, 6);
  c.reset();
  expect_healthy();
}

TEST_F(ServerTest, SecondClientGetsBusyError) {
  Client a;
  ASSERT_TRUE(a.connect(port_, chat()));
  ASSERT_TRUE(a.run(
                   {}, 0ms, [](const Exchange& e) { return e.handshake; }, 20s)
                  .handshake);
  Client b;
  ASSERT_TRUE(b.connect(port_, chat()));
  const Exchange ex = b.run({}, 0ms, nullptr, 10s);
  EXPECT_FALSE(ex.handshake);
  EXPECT_TRUE(ex.closed);
  ASSERT_EQ(ex.errors.size(), 1u);
  EXPECT_NE(ex.errors[0].find("busy"), std::string::npos) << ex.errors[0];
  a.drop();
  expect_healthy();
}

TEST_F(ServerTest, SilentClientIsDroppedAfterIdleTimeout) {
  start(1, 1.0);
  Client c;
  ASSERT_TRUE(c.connect(port_, chat()));
  const auto t0 = std::chrono::steady_clock::now();
  const Exchange ex = c.run({}, 0ms, nullptr, 15s);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  EXPECT_TRUE(ex.handshake);
  EXPECT_TRUE(ex.closed);
  ASSERT_EQ(ex.errors.size(), 1u);
  EXPECT_NE(ex.errors[0].find("idle"), std::string::npos) << ex.errors[0];
  expect_healthy();
}

TEST_F(ServerTest, TwoSessionsAtOnce) {
  start(2, 3.0);
  std::vector<float> speech = user_speech();
  speech.resize(10 * kFrame);
  Exchange ea, eb;
  std::thread ta([&] {
    Client c;
    if (c.connect(port_, chat()))
      ea = c.run(
          audio_messages(speech), 20ms, [](const Exchange& e) { return e.audio_msgs >= 12; }, 30s);
    c.drop();
  });
  Client c;
  EXPECT_TRUE(c.connect(port_, chat("&audio_seed=9")));
  eb = c.run(
      audio_messages(speech), 20ms, [](const Exchange& e) { return e.audio_msgs >= 12; }, 30s);
  c.drop();
  ta.join();
  EXPECT_EQ(ea.audio_msgs, 12);
  EXPECT_EQ(eb.audio_msgs, 12);
  EXPECT_TRUE(ea.errors.empty());
  EXPECT_TRUE(eb.errors.empty());
  expect_healthy();
}

// With --ssl: HTTPS for the routes and the web client, WSS for /api/chat, checked against the
// test certificate (tests/data/tls, CN localhost); a plain-HTTP request gets nothing.
TEST_F(ServerTest, TlsServesHttpsAndWss) {
  namespace ssl = net::ssl;
  start(1, 3.0, 2.0, "", ppx::test::data("tls"));
  net::io_context ioc;
  ssl::context ctx(ssl::context::tls_client);
  ctx.load_verify_file(ppx::test::data("tls/cert.pem"));
  ctx.set_verify_mode(ssl::verify_peer);
  ctx.set_verify_callback(ssl::host_name_verification("localhost"));
  const tcp::endpoint ep(net::ip::make_address("127.0.0.1"), port_);
  auto https_get = [&](const std::string& target, int& status) {
    beast::ssl_stream<beast::tcp_stream> s(ioc, ctx);
    beast::get_lowest_layer(s).connect(ep);
    beast::get_lowest_layer(s).expires_after(10s);
    SSL_set_tlsext_host_name(s.native_handle(), "localhost");
    s.handshake(ssl::stream_base::client);
    http::request<http::empty_body> req{http::verb::get, target, 11};
    req.set(http::field::host, "localhost");
    http::write(s, req);
    beast::flat_buffer b;
    http::response<http::string_body> res;
    http::read(s, b, res);
    status = static_cast<int>(res.result_int());
    return res.body();
  };
  int status = 0;
  EXPECT_EQ(nlohmann::json::parse(https_get("/health", status))["status"], "ok");
  EXPECT_EQ(status, 200);
  EXPECT_NE(https_get("/", status).find("<title>PersonaPlex</title>"), std::string::npos);
  EXPECT_EQ(status, 200);

  websocket::stream<beast::ssl_stream<beast::tcp_stream>> ws(ioc, ctx);
  beast::get_lowest_layer(ws).connect(ep);
  beast::get_lowest_layer(ws).expires_after(30s);
  SSL_set_tlsext_host_name(ws.next_layer().native_handle(), "localhost");
  ws.next_layer().handshake(ssl::stream_base::client);
  ws.binary(true);
  ws.handshake("localhost", chat());
  std::vector<float> speech = user_speech();
  speech.resize(3 * kFrame);
  int audio = 0;
  bool handshake = false;
  for (beast::flat_buffer b; audio < 5; b.clear()) {
    ws.read(b);
    const auto* d = static_cast<const uint8_t*>(b.data().data());
    if (b.size() >= 1 && d[0] == 0x00) {
      handshake = true;
      for (const auto& m : audio_messages(speech)) ws.write(net::buffer(m));
    }
    if (b.size() >= 1 && d[0] == 0x01) ++audio;
    ASSERT_FALSE(b.size() >= 1 && d[0] == 0x05) << "server error";
  }
  EXPECT_TRUE(handshake);
  EXPECT_EQ(audio, 5);  // OpusHead, OpusTags and one page per frame
  ws.close(websocket::close_code::normal);
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (server_->sessions_in_use() != 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(20ms);
  EXPECT_EQ(server_->sessions_in_use(), 0);

  // Plain HTTP on the TLS port: the TLS handshake fails and the connection is closed unanswered.
  tcp::socket plain(ioc);
  plain.connect(ep);
  const std::string get = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  net::write(plain, net::buffer(get));
  beast::error_code ec;
  std::string reply;
  net::read(plain, net::dynamic_buffer(reply), ec);
  EXPECT_EQ(reply.find("HTTP/1.1 200"), std::string::npos);
}

}  // namespace
