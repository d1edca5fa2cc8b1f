// Harness of the server tests: an in-process server on a free port of 127.0.0.1 with the embedded
// tiny demo model (ServerTest), a paced WebSocket client (Client), HTTP helpers and user speech.
// Readiness and slot release are observed through /health, never assumed after a sleep.
#pragma once

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
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "apps/model_loading.h"
#include "ppx/audio.h"
#include "ppx/ogg_opus.h"
#include "apps/server_model.h"
#include "server/server.h"
#include "test_util.h"

namespace ppx::server_test {

namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

constexpr int kFrame = 1920;

using Headers = std::vector<std::pair<std::string, std::string>>;

// The whole answer (status, headers, body) to a GET of `target` with `headers`.
inline http::response<http::string_body> http_request(uint16_t port, const std::string& target,
                                                      const Headers& headers = {}) {
  net::io_context ioc;
  tcp::socket s(ioc);
  s.connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
  http::request<http::empty_body> req{http::verb::get, target, 11};
  req.set(http::field::host, "127.0.0.1");
  for (const auto& [k, v] : headers) req.insert(k, v);  // a name given twice: two lines
  http::write(s, req);
  beast::flat_buffer b;
  http::response<http::string_body> res;
  http::read(s, b, res);
  return res;
}

inline std::string http_get(uint16_t port, const std::string& target, int* status = nullptr,
                            const Headers& headers = {}) {
  http::response<http::string_body> res = http_request(port, target, headers);
  if (status) *status = static_cast<int>(res.result_int());
  return res.body();
}

// The whole answer to a WebSocket upgrade request for `target` (status 101 when accepted; the
// connection is then dropped).
inline http::response<http::string_body> upgrade_response(uint16_t port, const std::string& target,
                                                          Headers headers = {}) {
  headers.insert(headers.end(), {{"Connection", "Upgrade"},
                                 {"Upgrade", "websocket"},
                                 {"Sec-WebSocket-Version", "13"},
                                 {"Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="}});
  return http_request(port, target, headers);
}

inline int upgrade_status(uint16_t port, const std::string& target, Headers headers = {}) {
  return static_cast<int>(upgrade_response(port, target, std::move(headers)).result_int());
}

// One series' value in a /metrics text (Prometheus exposition), -1 when it is absent.
inline double metric(const std::string& metrics, const std::string& series) {
  const size_t at = metrics.find("\n" + series + " ");
  return at == std::string::npos ? -1.0 : std::stod(metrics.substr(at + series.size() + 2));
}

// Polls /health until every slot is free (true) or `limit` passes (false).
inline bool wait_slots_free(uint16_t port, std::chrono::milliseconds limit = 10s) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    const auto h = nlohmann::json::parse(http_get(port, "/health"));
    if (h["sessions_in_use"] == 0 && h.value("sessions_starting", 0) == 0) return true;
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

inline std::vector<uint8_t> msg(uint8_t kind, const std::vector<uint8_t>& payload = {}) {
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
  std::vector<std::chrono::steady_clock::time_point> sent_at;   // when each message went out
  std::vector<std::chrono::steady_clock::time_point> audio_at;  // when each 0x01 arrived
};

// A WebSocket client driven on one thread: sends its messages (paced) once the handshake byte
// arrives, and reads everything until done(), a close, or the deadline.
class Client {
 public:
  bool connect(uint16_t port, const std::string& target, const Headers& headers = {}) {
    beast::error_code ec;
    beast::get_lowest_layer(ws_).socket().connect(
        tcp::endpoint(net::ip::make_address("127.0.0.1"), port), ec);
    if (ec) return false;
    ws_.read_message_max(64 << 20);
    ws_.binary(true);
    if (!headers.empty()) {
      ws_.set_option(websocket::stream_base::decorator([headers](websocket::request_type& r) {
        for (const auto& [k, v] : headers) r.set(k, v);
      }));
    }
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
    // Message k goes out at t0 + k * interval (t0: when sending starts), so pacing does not drift.
    std::chrono::steady_clock::time_point t0;
    std::function<void()> send_next = [&] {
      if (finished || ex.sent >= to_send.size()) return;
      if (ex.sent == 0) t0 = std::chrono::steady_clock::now();
      ws_.async_write(net::buffer(to_send[ex.sent]), [&](beast::error_code ec, size_t) {
        if (ec) return;
        ex.sent_at.push_back(std::chrono::steady_clock::now());
        ++ex.sent;
        pace.expires_at(t0 + interval * static_cast<int64_t>(ex.sent));
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
            ex.audio_at.push_back(std::chrono::steady_clock::now());
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
  // A WebSocket close frame (code 1000) written on the socket by hand; the socket stays open and
  // nothing more is read (a client that never completes the TCP teardown).
  void send_close_frame_only() {
    const uint8_t frame[] = {0x88, 0x82, 0x01, 0x02, 0x03, 0x04, 0x03 ^ 0x01, 0xE8 ^ 0x02};
    beast::error_code ec;
    net::write(beast::get_lowest_layer(ws_).socket(), net::buffer(frame), ec);
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
inline std::vector<float> user_speech() {
  const ppx::Audio a = ppx::read_audio(ppx::test::data("speech_16k.wav"));
  std::vector<float> x = ppx::resample(ppx::take_channel(a, 0), a.sample_rate, 24000);
  x.resize((x.size() + kFrame - 1) / kFrame * kFrame, 0.f);
  return x;
}

// The client's messages for `pcm`: header pages, then one 0x01 page per 80 ms frame.
inline std::vector<std::vector<uint8_t>> audio_messages(const std::vector<float>& pcm) {
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
             const std::string& static_dir = "", const std::string& ssl_dir = "",
             const std::function<void(ppx::server::ServerOptions&)>& tweak = {},
             const ppx::server::ServerModel* model = nullptr) {
    if (server_) server_->stop();
    server_.reset();
    ppx::server::ServerOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.voice_dir = *voice_dir_;
    o.max_sessions = max_sessions;
    o.idle_timeout_s = idle_s;
    o.ping_interval_s = ping_s;
    o.static_dir = static_dir;
    o.ssl_dir = ssl_dir;
    if (tweak) tweak(o);
    const ppx::server::ServerModel m = model ? *model : ppx::app::server_model(*model_);
    server_ = std::make_unique<ppx::server::Server>(o, m);
    server_->start();
    port_ = server_->port();
  }

  static std::string chat(const std::string& extra = "") {
    return "/api/"
           "chat?voice_prompt=voice.wav&text_prompt=You+are+a+tester%2E&text_seed=1&audio_seed=2" +
           extra;
  }

  // After any client: every slot comes back, and a new client still gets its handshake. An upgrade
  // a test's client sent just before it left can still reach the server after the slots were seen
  // free, and its session holds the slot for a moment (an ASan CI run saw this once): a refused
  // upgrade is retried while the slots come free again, for up to 5 s.
  void expect_healthy() {
    ASSERT_TRUE(wait_slots_free(port_)) << "a session slot was not released";
    std::unique_ptr<Client> c;
    for (const auto end = std::chrono::steady_clock::now() + 5s;;) {
      c = std::make_unique<Client>();
      if (c->connect(port_, chat())) break;
      ASSERT_LT(std::chrono::steady_clock::now(), end) << "a new client is still refused after 5 s";
      ASSERT_TRUE(wait_slots_free(port_)) << "a session slot was not released";
      std::this_thread::sleep_for(50ms);
    }
    const Exchange ex = c->run(
        {}, 0ms, [](const Exchange& e) { return e.handshake; }, 20s);
    EXPECT_TRUE(ex.handshake);
    c->drop();
    EXPECT_TRUE(wait_slots_free(port_));
  }

  static inline ppx::app::LoadedModel* model_ = nullptr;
  static inline std::string* voice_dir_ = nullptr;
  std::unique_ptr<ppx::server::Server> server_;
  uint16_t port_ = 0;
};

}  // namespace ppx::server_test
