#include "server/server.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/beast/websocket/ssl.hpp>
#include <deque>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <type_traits>

#include "ppx/error.h"
#include "server/chat_protocol.h"
#include "server/http_util.h"
#include "server/log.h"
#include "server/realtime_protocol.h"
#include "server/session_hub.h"
#include "server/web_assets.h"

namespace ppx::server {

namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
namespace net = boost::asio;
namespace ssl = net::ssl;
using tcp = net::ip::tcp;

namespace {

constexpr size_t kMaxQueuedOutput = 1024;  // messages the client has not taken
// A WebSocket's unsent bytes in the kernel (TCP_NOTSENT_LOWAT, where the platform has it): few,
// so that a client that stops reading stalls a write within seconds (the send buffer the kernel
// would grow to 4 MiB holds 17 minutes of /api/chat output), while the bytes in flight still grow
// with the congestion window (a far client's throughput is not capped, as a small SO_SNDBUF would).
constexpr int kWsUnsentBytes = 64 * 1024;
// A write that has not completed for this long (or --idle-timeout, if longer) means the client
// stopped reading: the session ends.
constexpr auto kMinStalledWrite = std::chrono::seconds(10);
// Request head limit: large enough that an oversized text_prompt (4096 bytes, up to 3x that
// percent-encoded) reaches the prompt check and its clear error message instead of failing the
// HTTP parse; small enough that no header value reaches Beast's own limit of a field (64 KiB),
// which throws instead of failing the read.
constexpr uint32_t kMaxRequestHead = 60 * 1024;
constexpr auto kHandshakeTimeout = std::chrono::seconds(10);
// A plain HTTP response: each piece written within this (a client that stops reading is dropped).
constexpr auto kResponseIdleTimeout = std::chrono::seconds(15);
constexpr uint64_t kMinResponseRate = 64 * 1024;  // bytes/s: a whole response's deadline
// After refusing a malformed or oversized request: what the client still sends is read and
// dropped for up to this long, or this many bytes, before the close.
constexpr auto kLingerTime = std::chrono::seconds(2);
constexpr size_t kLingerBytes = 1 << 20;
constexpr auto kCloseFlushLimit = std::chrono::seconds(2);  // stop(): time for the 0x05 + close
// Retry-After of a WebSocket upgrade refused with 503: all slots in use (one may free up any
// moment), or draining / device failed (the process is going away; a restart takes longer).
constexpr int kRetryAfterBusyS = 1;
constexpr int kRetryAfterDrainingS = 5;

// nlohmann::json::dump that never throws on invalid UTF-8 (replaced by U+FFFD).
std::string dump(const nlohmann::ordered_json& j) {
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

// /health's "capacity": the sessions this server holds and where that number came from, with the
// capacity model's two limits (null where not modelled: the CPU backend) and its inputs.
nlohmann::ordered_json capacity_json(const std::optional<Capacity>& c, const ServerOptions& o) {
  nlohmann::ordered_json j;
  j["max_sessions"] = o.max_sessions;
  j["source"] = o.max_sessions_source;
  j["memory_sessions"] = c ? nlohmann::ordered_json(c->memory_sessions) : nlohmann::ordered_json();
  j["bandwidth_sessions"] =
      c && c->bandwidth_sessions ? nlohmann::ordered_json(*c->bandwidth_sessions) : nlohmann::ordered_json();
  j["computed_sessions"] = c ? nlohmann::ordered_json(c->sessions) : nlohmann::ordered_json();
  j["bandwidth_gb_s"] = c && c->bandwidth > 0 ? nlohmann::ordered_json(c->bandwidth / 1e9) : nlohmann::ordered_json();
  j["free_bytes"] = c ? nlohmann::ordered_json(c->free_bytes) : nlohmann::ordered_json();
  j["bytes_per_session"] = c ? nlohmann::ordered_json(c->bytes_per_session) : nlohmann::ordered_json();
  j["weight_step_ms"] = c && c->bandwidth > 0 ? nlohmann::ordered_json(c->weight_step_ms) : nlohmann::ordered_json();
  j["session_step_ms"] = c && c->bandwidth > 0 ? nlohmann::ordered_json(c->session_step_ms) : nlohmann::ordered_json();
  return j;
}

// The prompt cache's figures, or nullptr when the server has none.
std::unique_ptr<PromptCache::Stats> cache_stats(SessionHub& hub) {
  PromptCache* pc = hub.scheduler ? hub.scheduler->prompt_cache() : nullptr;
  return pc ? std::make_unique<PromptCache::Stats>(pc->stats()) : nullptr;
}

// Constant-time comparison (of SHA-256 digests, so the length leaks nothing either).
bool same_secret(const std::string& a, const std::string& b) {
  unsigned char da[SHA256_DIGEST_LENGTH], db[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(a.data()), a.size(), da);
  SHA256(reinterpret_cast<const unsigned char*>(b.data()), b.size(), db);
  return CRYPTO_memcmp(da, db, sizeof da) == 0;
}

using PlainStream = beast::tcp_stream;
using TlsStream = beast::ssl_stream<beast::tcp_stream>;
template <class S>
constexpr bool kIsTls = std::is_same_v<S, TlsStream>;

// The WebSocket transport of a SessionCore over Stream, driven on the connection's strand: client
// messages go to the session's Protocol, outgoing messages are queued and written in order.
template <class Stream>
class WsSession final : public SessionCore {
 public:
  WsSession(std::shared_ptr<SessionHub> hub, std::unique_ptr<Protocol> protocol, Stream&& s,
            ConnectionSlot conn, SlotReservation reservation)
      : SessionCore(std::move(hub), std::move(protocol)),
        conn_(std::move(conn)),
        ws_(std::move(s)) {
    reservation_ = std::move(reservation);
    ++hub_->websockets;
  }
  ~WsSession() override { --hub_->websockets; }

  // `subprotocol`: the Sec-WebSocket-Protocol the server selects ("" for none).
  void start(const http::request<http::string_body>& req, const std::string& subprotocol) {
    if (!subprotocol.empty()) {
      ws_.set_option(websocket::stream_base::decorator([subprotocol](websocket::response_type& r) {
        r.set(http::field::sec_websocket_protocol, subprotocol);
      }));
    }
    websocket::stream_base::timeout t{};
    t.handshake_timeout = kHandshakeTimeout;
    t.idle_timeout = std::chrono::milliseconds(
        static_cast<int64_t>(std::max(2.0, hub_->opts.idle_timeout_s) * 1000));
    t.keep_alive_pings = true;
    ws_.set_option(t);
    ws_.read_message_max(protocol().max_message_bytes());
    ws_.binary(!protocol().text_frames());
    // A close frame ends the session at once: the read that saw it completes only after the TCP
    // teardown, which waits for the client's FIN (up to half the idle timeout), and the slot would
    // stay taken meanwhile.
    ws_.control_callback([this](websocket::frame_type kind, beast::string_view) {
      if (kind == websocket::frame_type::close) kill(SessionEnd::kClientLeft, "the client closed the WebSocket");
    });
    beast::error_code ec;
    beast::get_lowest_layer(ws_).socket().set_option(tcp::no_delay(true), ec);
#ifdef TCP_NOTSENT_LOWAT
    const int lowat = kWsUnsentBytes;
    setsockopt(beast::get_lowest_layer(ws_).socket().native_handle(), IPPROTO_TCP, TCP_NOTSENT_LOWAT, &lowat,
               sizeof lowat);
#endif
    stalled_write_ = std::max<std::chrono::steady_clock::duration>(
        kMinStalledWrite, std::chrono::milliseconds(static_cast<int64_t>(hub_->opts.idle_timeout_s * 1000)));
    const std::string target(req.target());
    const size_t qpos = target.find('?');
    const std::string query = qpos == std::string::npos ? "" : target.substr(qpos + 1);
    ws_.async_accept(req, [self = self_ptr(), query](beast::error_code e) {
      if (e) return;
      self->do_read();
      self->begin(query);
    });
  }

 private:
  struct Out {
    std::vector<uint8_t> data;
    bool close = false;
  };

  std::shared_ptr<WsSession> self_ptr() {
    return std::static_pointer_cast<WsSession>(shared_from_this());
  }

  void do_read() {
    ws_.async_read(rbuf_,
                   [self = self_ptr()](beast::error_code ec, size_t n) { self->on_read(ec, n); });
  }

  void on_read(beast::error_code ec, size_t n) {
    // Logged (the client is gone or broke the protocol: WebSocket 1002, 1007, 1009, ...).
    if (ec) return kill(SessionEnd::kClientLeft, "connection: " + ec.message());
    try {
      const auto* d = static_cast<const uint8_t*>(rbuf_.data().data());
      const bool more = protocol().on_message(d, n);
      rbuf_.consume(rbuf_.size());
      if (!more) return;  // killed: the worker says why and closes
    } catch (const std::exception& e) {
      return kill(SessionEnd::kSessionError, std::string("internal error: ") + e.what());
    }
    do_read();
  }

  void enqueue(std::vector<uint8_t> m) override {
    net::post(ws_.get_executor(), [self = self_ptr(), m = std::move(m)]() mutable {
      self->push_out(Out{std::move(m), false});
    });
  }
  void enqueue_close() override {
    net::post(ws_.get_executor(), [self = self_ptr()]() { self->push_out(Out{{}, true}); });
  }

  void push_out(Out o) {
    if (closing_) return;
    const bool stalled = writing_ && std::chrono::steady_clock::now() - write_started_ > stalled_write_;
    if (out_.size() >= kMaxQueuedOutput || stalled) {  // the client does not read: drop it
      kill(SessionEnd::kClientLeft,
           stalled ? "the client stopped reading (a write waited " +
                         std::to_string(std::chrono::duration_cast<std::chrono::seconds>(stalled_write_).count()) + " s)"
                   : "the client stopped reading (" + std::to_string(kMaxQueuedOutput) + " messages waiting)");
      closing_ = true;
      beast::error_code ec;
      beast::get_lowest_layer(ws_).socket().close(ec);
      return;
    }
    out_.push_back(std::move(o));
    pump();
  }

  void pump() {
    if (writing_ || out_.empty() || closing_) return;
    if (out_.front().close) {
      closing_ = true;
      ws_.async_close(websocket::close_code::normal, [self = self_ptr()](beast::error_code) {
        self->kill(SessionEnd::kClientLeft);
      });
      return;
    }
    writing_ = true;
    write_started_ = std::chrono::steady_clock::now();
    ws_.async_write(net::buffer(out_.front().data),
                    [self = self_ptr()](beast::error_code ec, size_t) {
                      self->writing_ = false;
                      if (ec) {
                        self->closing_ = true;
                        return self->kill(SessionEnd::kClientLeft, "connection: write failed: " + ec.message());
                      }
                      self->out_.pop_front();
                      self->pump();
                    });
  }

  ConnectionSlot conn_;
  websocket::stream<Stream> ws_;
  beast::flat_buffer rbuf_;
  std::deque<Out> out_;  // strand only, like the flags
  bool writing_ = false, closing_ = false;
  std::chrono::steady_clock::time_point write_started_;  // of the write in flight
  std::chrono::steady_clock::duration stalled_write_{};
};

// One plain HTTP request on a fresh connection (no keep-alive), or the upgrade to /api/chat or
// /v1/realtime.
// Over TLS the handshake comes first.
template <class Stream>
class HttpConnection : public std::enable_shared_from_this<HttpConnection<Stream>> {
 public:
  HttpConnection(std::shared_ptr<SessionHub> hub, Stream&& s)
      : hub_(std::move(hub)), conn_(hub_), stream_(std::move(s)) {}
  ~HttpConnection() { hub_->head_waiters.remove(waiter_); }

  void run() {
    beast::get_lowest_layer(stream_).expires_after(std::chrono::seconds(15));
    // Until its request head is read, a newer connection at the limit may close this one
    // (HeadWaiters). The callback runs on another thread: it touches the stream only on this
    // connection's strand, and only while the head is unread (after that the stream may belong to
    // a WebSocket session).
    waiter_ = hub_->head_waiters.add([weak = this->weak_from_this(), ex = stream_.get_executor()] {
      net::post(ex, [weak] {
        if (auto self = weak.lock(); self && !self->head_read_) {
          beast::error_code ec;
          beast::get_lowest_layer(self->stream_).socket().close(ec);
        }
      });
    });
    if constexpr (kIsTls<Stream>) {
      stream_.async_handshake(ssl::stream_base::server,
                              [self = this->shared_from_this()](beast::error_code ec) {
                                if (!ec) self->read();
                              });
    } else {
      read();
    }
  }

 private:
  void read() {
    parser_.emplace();
    parser_->header_limit(kMaxRequestHead);
    parser_->body_limit(16 * 1024);
    http::async_read(stream_, buf_, *parser_,
                     [self = this->shared_from_this()](beast::error_code ec, size_t) {
                       self->head_read_ = true;
                       self->hub_->head_waiters.remove(self->waiter_);
                       if (!ec) return self->on_request();
                       self->on_bad_request(ec);
                     });
  }

  // A request that could not be read: a status for one that was malformed or too large (the
  // client is still there to read it), nothing when the client left or timed out.
  void on_bad_request(beast::error_code ec) {
    if (ec.category() != http::make_error_code(http::error::bad_target).category() ||
        ec == http::error::end_of_stream || ec == http::error::partial_message)
      return;
    http::status st = http::status::bad_request;
    std::string why = "bad request: " + ec.message() + "\n";
    if (ec == http::error::header_limit) {
      st = http::status::request_header_fields_too_large;
      why = "request head larger than " + std::to_string(kMaxRequestHead / 1024) + " KiB\n";
    } else if (ec == http::error::body_limit) {
      st = http::status::payload_too_large;
      why = "request body too large\n";
    }
    http::request<http::string_body> req;  // HTTP/1.1, not HEAD: what the reply needs of it
    linger_ = true;
    malformed(req, st, why);
  }

  void on_request() {
    http::request<http::string_body> req = parser_->release();
    try {
      route(req);
    } catch (const std::exception& e) {
      log::error("http request failed",
                 {{"target", std::string(req.target().substr(0, 80))}, {"error", e.what()}});
      reply(req, http::status::internal_server_error, "text/plain", "internal server error\n");
    }
  }

  // The API key from `api_key=` in the query or an `Authorization: Bearer` header.
  // `protocol_key`: a key offered as the subprotocol openai-insecure-api-key.KEY ("" for none).
  bool authorized(const http::request<http::string_body>& req, const std::string& query,
                  const std::string& protocol_key = "") const {
    const std::string& key = hub_->opts.api_key;
    if (key.empty()) return true;
    if (!protocol_key.empty() && same_secret(protocol_key, key)) return true;
    const auto auth = req.find(http::field::authorization);
    if (auth != req.end()) {
      const std::string v(auth->value());
      // The scheme is case-insensitive and followed by one or more spaces (RFC 9110 11.1, 11.4).
      if (v.size() > 7 && beast::iequals(std::string_view(v).substr(0, 7), "Bearer ")) {
        const size_t at = v.find_first_not_of(' ', 7);
        if (at != std::string::npos && same_secret(v.substr(at), key)) return true;
      }
    }
    const auto q = parse_query(query);
    const auto it = q.find("api_key");
    return it != q.end() && same_secret(it->second, key);
  }

  bool origin_allowed(const http::request<http::string_body>& req) const {
    const auto& allowed = hub_->opts.allowed_origins;
    const auto it = req.find(http::field::origin);
    if (allowed.empty() || it == req.end()) return true;  // non-browser clients send no Origin
    return std::find(allowed.begin(), allowed.end(), std::string(it->value())) != allowed.end();
  }

  void route(const http::request<http::string_body>& req) {
    const std::string target(req.target());
    const size_t qpos = target.find('?');
    const std::string path = target.substr(0, qpos);
    const std::string query = qpos == std::string::npos ? "" : target.substr(qpos + 1);
    const bool api = path.rfind("/api/", 0) == 0;
    if (req.version() >= 11 && req.find(http::field::host) == req.end())  // RFC 9112 3.2
      return malformed(req, http::status::bad_request, "an HTTP/1.1 request needs a Host header\n");
    if (!websocket::is_upgrade(req) && beast::iequals(req[http::field::upgrade], "websocket"))
      return malformed(req, http::status::bad_request,
                       "a WebSocket upgrade needs an HTTP/1.1 GET with Connection: Upgrade\n");
    if (websocket::is_upgrade(req)) {
      if (path != "/api/chat" && path != "/v1/realtime")
        return reply(req, http::status::not_found, "text/plain", "not found\n");
      if (!valid_websocket_key(req[http::field::sec_websocket_key]))
        return malformed(req, http::status::bad_request, "Sec-WebSocket-Key must be 16 bytes in base64 (RFC 6455)\n");
      if (req[http::field::sec_websocket_version] != "13")
        return malformed(req, http::status::upgrade_required, "this server speaks WebSocket version 13\n",
                         {.ws_version = true});
      if (!origin_allowed(req)) {
        hub_->metrics.rejected(Rejection::kForbiddenOrigin);
        return reply(req, http::status::forbidden, "text/plain", "origin not allowed\n");
      }
      const RealtimeUpgrade rt = path == "/v1/realtime"
                                     ? realtime_upgrade(req[http::field::sec_websocket_protocol], req["OpenAI-Beta"])
                                     : RealtimeUpgrade{};
      if (!authorized(req, query, rt.key)) return unauthorized(req);
      // Refused before the upgrade (HTTP 503 + Retry-After) while draining or full, so that a
      // load balancer can try another server. The slot found free is reserved until the session
      // takes it (SlotReservation); only a drain begun in between is refused after the upgrade
      // (SessionCore::begin).
      if (const std::string why = hub_->unavailable(); !why.empty()) {
        hub_->metrics.rejected(Rejection::kDraining);
        return refuse(req, why.rfind("device", 0) == 0 ? "device_failed" : "draining",
                      "server unavailable: " + why, kRetryAfterDrainingS);
      }
      SlotReservation reservation(hub_);
      if (!reservation) {
        hub_->metrics.rejected(Rejection::kBusy);
        return refuse(req, "busy",
                      "server busy: all " + std::to_string(hub_->opts.max_sessions) +
                          " sessions in use",
                      kRetryAfterBusyS);
      }
      beast::get_lowest_layer(stream_).expires_never();  // the WebSocket has its own timeouts
      std::unique_ptr<Protocol> protocol;
      if (path == "/api/chat") {
        protocol = std::make_unique<ChatProtocol>(*hub_);
      } else {
        protocol = std::make_unique<RealtimeProtocol>(*hub_, rt.beta);
      }
      std::make_shared<WsSession<Stream>>(hub_, std::move(protocol), std::move(stream_),
                                          std::move(conn_), std::move(reservation))
          ->start(req, rt.subprotocol);
      return;
    }
    if (req.method() != http::verb::get && req.method() != http::verb::head)
      return reply(req, http::status::method_not_allowed, "text/plain", "method not allowed\n");
    const int in_use = hub_->sessions_in_use();
    if (path == "/health/live")  // the process serves HTTP
      return reply(req, http::status::ok, "application/json", "{\"status\":\"live\"}\n");
    if (path == "/health" || path == "/health/ready") {
      const std::string why = hub_->unavailable();
      // Ready: the model is loaded (it is before the server starts), not draining, a slot free.
      const int reserved = hub_->slots_reserved();
      const bool ready = why.empty() && in_use + reserved < hub_->opts.max_sessions;
      nlohmann::ordered_json j;
      j["status"] = why.empty() ? "ok" : why.rfind("device", 0) == 0 ? "device_failed" : "draining";
      if (!why.empty()) j["error"] = why;
      j["ready"] = ready;
      j["model"] = hub_->model.description;
      j["device"] = hub_->model.backend->device();
      if (hub_->model.device_index >= 0)
        j["device_index"] = hub_->model.device_index;
      else
        j["device_index"] = nullptr;
      j["speed_flags"] = hub_->model.speed_flags;
      j["sessions_in_use"] = in_use;
      j["sessions_starting"] = reserved;  // upgraded (or upgrading), slot reserved, not yet started
      j["max_sessions"] = hub_->opts.max_sessions;
      j["connections"] = hub_->connections.load();
      j["max_connections"] = hub_->opts.max_connections;
      j["capacity"] = capacity_json(hub_->model.capacity, hub_->opts);
      if (PromptCache* pc = hub_->scheduler->prompt_cache()) {
        const PromptCache::Stats st = pc->stats();
        j["prompt_cache"] = {{"capacity_bytes", st.capacity_bytes}, {"used_bytes", st.used_bytes},
                             {"entries", st.entries},           {"hits", st.hits},
                             {"misses", st.misses},             {"evictions", st.evictions}};
      } else {
        j["prompt_cache"] = nullptr;
      }
      const VoiceCache::Stats vs = hub_->voices.stats();
      j["voice_cache"] = {{"capacity_bytes", kVoiceCacheBytes}, {"used_bytes", vs.bytes}, {"entries", vs.entries},
                          {"hits", vs.hits},                    {"misses", vs.misses},    {"evictions", vs.evictions}};
      const bool ok = path == "/health" ? why.empty() : ready;
      return reply(req, ok ? http::status::ok : http::status::service_unavailable,
                   "application/json", dump(j));
    }
    if (path == "/metrics") {
      if (hub_->opts.metrics_auth && !authorized(req, query)) return unauthorized(req);
      return reply(
          req, http::status::ok, "text/plain; version=0.0.4",
          hub_->metrics.prometheus(in_use, hub_->opts.max_sessions, hub_->connections.load(), cache_stats(*hub_).get()));
    }
    if (api && !authorized(req, query)) return unauthorized(req);
    if (path == "/api/voices")
      return reply(req, http::status::ok, "application/json",
                   dump(nlohmann::ordered_json(list_voices(hub_->opts.voice_dir))));
    // --static files first (they may replace the built-in client), then the built-in client.
    if (const auto file = resolve_static(hub_->opts.static_dir, target)) {
      // Streamed from the file a buffer at a time (never read whole into memory).
      http::file_body::value_type body;
      beast::error_code ec;
      body.open(file->c_str(), beast::file_mode::scan, ec);
      if (!ec) {
        auto res = std::make_shared<http::response<http::file_body>>(http::status::ok, req.version());
        res->set(http::field::content_type, content_type(*file));
        res->body() = std::move(body);
        return send(req, std::move(res));
      }
    }
    if (const WebAsset* a = find_web_asset(path))
      return reply(req, http::status::ok, a->content_type, std::string(a->body));
    reply(req, http::status::not_found, "text/plain", "not found\n");
  }

  // A WebSocket upgrade refused with 503: {"error":{"code":CODE,"message":MESSAGE}}.
  void refuse(const http::request<http::string_body>& req, const char* code,
              const std::string& message, int retry_after_s) {
    nlohmann::ordered_json j;
    j["error"]["code"] = code;
    j["error"]["message"] = message;
    reply(req, http::status::service_unavailable, "application/json", dump(j), {.retry_after_s = retry_after_s});
  }

  void unauthorized(const http::request<http::string_body>& req) {
    hub_->metrics.rejected(Rejection::kUnauthorized);
    reply(req, http::status::unauthorized, "text/plain",
          "unauthorized: give the API key as api_key=... or Authorization: Bearer ...\n",
          {.bearer_challenge = true});
  }

  // Header fields a reply may add besides its type.
  struct ReplyFields {
    int retry_after_s = 0;          // Retry-After, when above 0
    bool bearer_challenge = false;  // WWW-Authenticate: Bearer
    bool ws_version = false;        // Sec-WebSocket-Version: 13 (RFC 6455 4.4)
  };

  // A request that breaks HTTP or RFC 6455: counted as a malformed_request rejection.
  void malformed(const http::request<http::string_body>& req, http::status st, std::string why,
                 ReplyFields fields = {}) {
    hub_->metrics.rejected(Rejection::kMalformedRequest);
    reply(req, st, "text/plain", std::move(why), fields);
  }

  void reply(const http::request<http::string_body>& req, http::status st, const std::string& type,
             std::string body, ReplyFields fields = {}) {
    auto res = std::make_shared<http::response<http::string_body>>(st, req.version());
    if (fields.ws_version) res->set(http::field::sec_websocket_version, "13");
    res->set(http::field::content_type, type);
    res->set(http::field::cache_control, "no-store");
    if (fields.retry_after_s > 0) res->set(http::field::retry_after, std::to_string(fields.retry_after_s));
    if (fields.bearer_challenge) res->set(http::field::www_authenticate, "Bearer");
    res->body() = std::move(body);
    send(req, std::move(res));
  }

  // Writes a response and closes; to a HEAD request, its head alone (with the body's length).
  template <class Body>
  void send(const http::request<http::string_body>& req, std::shared_ptr<http::response<Body>> res) {
    res->set(http::field::server, "personaplex-cpp");
    res->keep_alive(false);
    res->prepare_payload();
    auto sr = std::make_shared<http::response_serializer<Body>>(*res);
    // Besides each piece's idle limit, the whole response within 60 s or at kMinResponseRate, so
    // that a client reading a trickle cannot hold its connection indefinitely.
    const uint64_t size = res->payload_size().value_or(0);
    response_deadline_ = std::chrono::steady_clock::now() +
                         std::max<std::chrono::steady_clock::duration>(
                             std::chrono::seconds(60), std::chrono::seconds(size / kMinResponseRate));
    if (req.method() == http::verb::head) {
      beast::get_lowest_layer(stream_).expires_after(kResponseIdleTimeout);
      http::async_write_header(stream_, *sr,
                               [self = this->shared_from_this(), res, sr](beast::error_code, size_t) { self->finish(); });
    } else {
      write_some(std::move(res), std::move(sr));
    }
  }

  // The response a piece at a time, each within kResponseIdleTimeout: a large static file takes as
  // long as the client keeps reading, and a client that stops reading is dropped.
  template <class Body>
  void write_some(std::shared_ptr<http::response<Body>> res, std::shared_ptr<http::response_serializer<Body>> sr) {
    beast::get_lowest_layer(stream_).expires_at(
        std::min(std::chrono::steady_clock::now() + kResponseIdleTimeout, response_deadline_));
    http::async_write_some(stream_, *sr, [self = this->shared_from_this(), res, sr](beast::error_code ec, size_t) mutable {
      if (ec || sr->is_done()) return self->finish();
      self->write_some(std::move(res), std::move(sr));
    });
  }

  void finish() {
    if (linger_) {
      // After refusing a request that the client may still be sending (a head over the limit):
      // read and drop what comes for a while before closing, so that closing with unread data
      // (a TCP reset) does not destroy the answer before the client reads it.
      if constexpr (!kIsTls<Stream>) {
        beast::error_code ec;
        stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
      }
      beast::get_lowest_layer(stream_).expires_after(kLingerTime);
      return drain();
    }
    if constexpr (kIsTls<Stream>) {
      beast::get_lowest_layer(stream_).expires_after(std::chrono::seconds(5));
      stream_.async_shutdown([self = this->shared_from_this()](beast::error_code) {});
    } else {
      beast::error_code ec;
      stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    }
  }

  void drain() {
    stream_.async_read_some(net::buffer(drain_buf_), [self = this->shared_from_this()](beast::error_code ec, size_t n) {
      self->drained_ += n;
      if (!ec && self->drained_ < kLingerBytes) return self->drain();
      self->linger_ = false;
      if constexpr (kIsTls<Stream>) self->finish();  // then the TLS close
    });
  }

  std::shared_ptr<SessionHub> hub_;
  ConnectionSlot conn_;
  Stream stream_;
  beast::flat_buffer buf_;
  std::optional<http::request_parser<http::string_body>> parser_;
  uint64_t waiter_ = 0;  // in hub_->head_waiters until the request head is read
  bool head_read_ = false;  // strand only
  std::chrono::steady_clock::time_point response_deadline_{};
  bool linger_ = false;  // finish() drains the client's input first (on_bad_request)
  size_t drained_ = 0;
  std::array<char, 16384> drain_buf_{};
};

// Certificate chain and key from DIR/cert.pem and DIR/key.pem; TLS 1.2 or newer.
std::unique_ptr<ssl::context> load_tls(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string cert = (fs::path(dir) / "cert.pem").string();
  const std::string key = (fs::path(dir) / "key.pem").string();
  for (const auto& f : {cert, key})
    if (!fs::is_regular_file(f))
      throw Error("--ssl: " + f + " is missing (the directory needs cert.pem and key.pem)");
  auto ctx = std::make_unique<ssl::context>(ssl::context::tls_server);
  ctx->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                   ssl::context::no_sslv3 | ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1 |
                   ssl::context::single_dh_use);
  beast::error_code ec;
  ctx->use_certificate_chain_file(cert, ec);
  if (ec) throw Error("--ssl: cannot use certificate " + cert + ": " + ec.message());
  ctx->use_private_key_file(key, ssl::context::pem, ec);
  if (ec) throw Error("--ssl: cannot use private key " + key + ": " + ec.message());
  if (SSL_CTX_check_private_key(ctx->native_handle()) != 1)
    throw Error("--ssl: " + key + " does not match the certificate " + cert);
  return ctx;
}

}  // namespace

struct Server::Impl {
  std::shared_ptr<SessionHub> hub = std::make_shared<SessionHub>();
  net::io_context ioc;
  tcp::acceptor acceptor{ioc};
  net::steady_timer accept_timer{ioc};
  std::chrono::milliseconds accept_backoff{0};
  std::unique_ptr<ssl::context> tls;  // null: plain HTTP
  std::vector<std::thread> threads;
  std::thread shutdown_thread;  // drain_then_stop(), started by shutdown() or a device error
  std::mutex stop_mu;           // held for the whole of stop_now()
  int exit_code = kExitOk;      // under hub->mu

  void do_accept() {
    acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket s) {
      if (ec) {
        if (ec == net::error::operation_aborted || !acceptor.is_open()) return;
        // Out of file descriptors (EMFILE/ENFILE), memory or buffers: the pending connection
        // stays queued and would fail again at once. Back off instead of spinning.
        accept_backoff = std::clamp(accept_backoff * 2, std::chrono::milliseconds(10),
                                    std::chrono::milliseconds(1000));
        if (accept_backoff >= std::chrono::milliseconds(1000) || accept_backoff.count() == 10)
          log::warn("accept failed, retrying",
                    {{"error", ec.message()}, {"retry_ms", static_cast<int64_t>(accept_backoff.count())}});
        accept_timer.expires_after(accept_backoff);
        accept_timer.async_wait([this](beast::error_code e) {
          if (!e) do_accept();
        });
        return;
      }
      accept_backoff = std::chrono::milliseconds(0);
      try {
        on_socket(std::move(s));
      } catch (const std::exception& e) {
        log::error("connection setup failed", {{"error", e.what()}});
      }
      do_accept();
    });
  }

  void on_socket(tcp::socket s) {
    // At the limit, the oldest connection still without a request head makes way (HeadWaiters);
    // counted as a refusal too.
    const bool full = hub->connections.load() >= hub->opts.max_connections;
    if (full) hub->metrics.rejected(Rejection::kTooManyConnections);
    if (full && !hub->head_waiters.close_oldest(std::chrono::seconds(1))) {
      beast::error_code ec;
      if (!tls) {  // best effort: the socket's send buffer takes this at once
        static constexpr char k503[] =
            "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: text/plain\r\n"
            "Content-Length: 21\r\nConnection: close\r\n\r\ntoo many connections\n";
        s.non_blocking(true, ec);
        s.write_some(net::buffer(k503, sizeof k503 - 1), ec);
        s.shutdown(tcp::socket::shutdown_both, ec);
      }
      s.close(ec);
      return;
    }
    if (tls) {
      std::make_shared<HttpConnection<TlsStream>>(hub, TlsStream(std::move(s), *tls))->run();
    } else {
      std::make_shared<HttpConnection<PlainStream>>(hub, PlainStream(std::move(s)))->run();
    }
  }

  void run_io() {
    for (;;) {
      try {
        ioc.run();
        return;
      } catch (const std::exception& e) {
        log::error("I/O thread: uncaught exception (serving on)", {{"error", e.what()}});
      } catch (...) {
        log::error("I/O thread: uncaught exception (serving on)");
      }
    }
  }

  // Starts drain_then_stop() on its own thread unless a shutdown already began.
  void begin_shutdown(double drain_s, SessionEnd why, const std::string& message) {
    {
      std::lock_guard<std::mutex> lk(hub->mu);
      if (hub->stopping || shutdown_thread.joinable()) return;
      hub->draining = true;
      hub->cv.notify_all();
      shutdown_thread =
          std::thread([this, drain_s, why, message] { drain_then_stop(drain_s, why, message); });
    }
  }

  void join_shutdown_thread() {
    std::thread t;
    {
      std::lock_guard<std::mutex> lk(hub->mu);
      t = std::move(shutdown_thread);
    }
    if (t.joinable() && t.get_id() != std::this_thread::get_id())
      t.join();
    else if (t.joinable())
      t.detach();
  }

  void drain_then_stop(double drain_s, SessionEnd why, const std::string& message) {
    {
      std::unique_lock<std::mutex> lk(hub->mu);
      const int live = hub->in_use;
      if (live > 0) log::info("draining", {{"sessions", live}, {"drain_timeout_s", drain_s}});
      hub->cv.wait_for(lk, std::chrono::duration<double>(drain_s),
                       [&] { return hub->in_use == 0 || hub->stopping; });
    }
    stop_now(why, message);
  }

  // Ends every session with `why` (0x05 `message` + close), waits for the session workers, lets
  // the closes go out, then stops the I/O threads. Idempotent; concurrent callers wait for it.
  void stop_now(SessionEnd why, const std::string& message) {
    std::lock_guard<std::mutex> stop_lk(stop_mu);
    {
      std::lock_guard<std::mutex> lk(hub->mu);
      if (hub->stopped) return;
      hub->stopping = true;
    }
    hub->cv.notify_all();
    hub->kill_all(why, message);
    {
      // However long a model step takes: no worker may outlive the model.
      std::unique_lock<std::mutex> lk(hub->mu);
      while (!hub->cv.wait_for(lk, std::chrono::seconds(5), [&] { return hub->workers == 0; }))
        log::warn("stopping: waiting for session workers", {{"workers", hub->workers}});
    }
    std::vector<std::thread> workers;
    {
      std::lock_guard<std::mutex> lk(hub->mu);
      workers.swap(hub->slot_threads);
      hub->slot_threads.resize(workers.size());
    }
    for (auto& t : workers)
      if (t.joinable()) t.join();
    // Every session has ended, so the executor runs out of work (their timers are cancelled).
    hub->executor_guard.reset();
    for (auto& t : hub->executor_threads)
      if (t.joinable() && t.get_id() != std::this_thread::get_id()) t.join();
    hub->executor_threads.clear();
    net::post(ioc, [this] {
      beast::error_code ec;
      acceptor.close(ec);
      accept_timer.cancel();
    });
    const auto until = std::chrono::steady_clock::now() + kCloseFlushLimit;
    while (hub->websockets.load() > 0 && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ioc.stop();
    for (auto& t : threads)
      if (t.joinable() && t.get_id() != std::this_thread::get_id()) t.join();
    threads.clear();
    {
      std::lock_guard<std::mutex> lk(hub->mu);
      hub->stopped = true;
    }
    hub->cv.notify_all();
  }
};

int default_session_threads() {
  const int cpus = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(cpus / 4, 2, 8);
}

int default_max_connections(int max_sessions) {
  rlimit rl{};
  long fds = 1024;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
    fds = static_cast<long>(rl.rlim_cur);
  const long want = 4L * max_sessions + 64;
  return static_cast<int>(std::max(8L, std::min(want, fds - 32)));
}

Server::Server(const ServerOptions& opts, const ServerModel& model)
    : impl_(std::make_shared<Impl>()) {
  if (opts.max_sessions < 1) throw Error("--max-sessions must be at least 1");
  if (opts.max_connections < 0) throw Error("--max-connections must not be negative");
  if (opts.session_threads < 0) throw Error("--session-threads must not be negative");
  if (!model.backend || !model.tokenizer)
    throw Error("server: a model backend and a text tokenizer are needed");
  SessionHub& hub = *impl_->hub;
  hub.opts = opts;
  if (hub.opts.max_connections == 0)
    hub.opts.max_connections = default_max_connections(opts.max_sessions);
  if (hub.opts.session_threads == 0) hub.opts.session_threads = default_session_threads();
  hub.model = model;
  hub.slot_used.assign(static_cast<size_t>(opts.max_sessions), false);
  hub.slot_threads.resize(static_cast<size_t>(opts.max_sessions));
  // The LM state of every slot is made now (on CUDA: KV caches and captured graphs), so that a
  // session joining later allocates nothing on the device and stalls no one.
  hub.scheduler = std::make_unique<LmScheduler>(
      model.backend->lm_batch(opts.max_sessions, model.dep_steps),
      [metrics = &hub.metrics](const LmScheduler::StepInfo& i) { metrics->batch_step(i.batch, i.ms, i.waiting); },
      0, opts.prompt_cache_bytes);
  if (opts.codec_batch)
    hub.codec = std::make_unique<CodecScheduler>(
        model.backend->codec_batch(opts.max_sessions),
        [metrics = &hub.metrics](const CodecScheduler::PassInfo& i) { metrics->codec_pass(i.encodes, i.decodes, i.ms); });
  Impl* impl = impl_.get();
  hub.on_device_error = [impl](const std::string& what) {
    {
      std::lock_guard<std::mutex> lk(impl->hub->mu);
      if (!impl->hub->device_error.empty()) return;
      impl->hub->device_error = what;
      impl->exit_code = kExitDeviceError;
    }
    log::error("device error: ending every session and exiting", {{"error", what}});
    impl->begin_shutdown(0.0, SessionEnd::kDeviceError,
                         "server error: the GPU failed; the server restarts, reconnect shortly");
  };
  if (!opts.ssl_dir.empty()) impl_->tls = load_tls(opts.ssl_dir);
  const std::string where = opts.host + ":" + std::to_string(opts.port);
  try {
    const tcp::endpoint ep(net::ip::make_address(opts.host), opts.port);
    impl_->acceptor.open(ep.protocol());
    impl_->acceptor.set_option(net::socket_base::reuse_address(true));
    impl_->acceptor.bind(ep);
    impl_->acceptor.listen(net::socket_base::max_listen_connections);
  } catch (const boost::system::system_error& e) {
    throw Error("cannot listen on " + where + ": " + e.code().message());
  }
}

Server::~Server() { stop(); }

uint16_t Server::port() const { return impl_->acceptor.local_endpoint().port(); }

void Server::check_tls(const std::string& ssl_dir) { load_tls(ssl_dir); }

bool Server::tls() const { return impl_->tls != nullptr; }

int Server::sessions_in_use() const { return impl_->hub->sessions_in_use(); }

int Server::connections() const { return impl_->hub->connections.load(); }

void Server::start() {
  SessionHub& hub = *impl_->hub;
  hub.executor_guard.emplace(hub.executor.get_executor());
  for (int i = 0; i < hub.opts.session_threads; ++i) {
    hub.executor_threads.emplace_back([h = &hub] {
      try {
        // Frames of --per-session-codec run their codec here: the device must be current.
        h->model.backend->attach_thread();
      } catch (const std::exception& e) {
        log::error("session executor: cannot use the device", {{"error", e.what()}});
      }
      for (;;) {
        try {
          h->executor.run();
          return;
        } catch (const std::exception& e) {
          log::error("session executor: uncaught exception (serving on)", {{"error", e.what()}});
        } catch (...) {
          log::error("session executor: uncaught exception (serving on)");
        }
      }
    });
  }
  impl_->do_accept();
  for (int i = 0; i < std::max(1, impl_->hub->opts.io_threads); ++i)
    impl_->threads.emplace_back([impl = impl_.get()] { impl->run_io(); });
}

void Server::shutdown() {
  impl_->begin_shutdown(impl_->hub->opts.drain_timeout_s, SessionEnd::kShutdown,
                        "server shutting down");
}

void Server::stop() {
  impl_->stop_now(SessionEnd::kShutdown, "server shutting down");
  impl_->join_shutdown_thread();
}

int Server::wait() {
  SessionHub& hub = *impl_->hub;
  {
    std::unique_lock<std::mutex> lk(hub.mu);
    hub.cv.wait(lk, [&] { return hub.stopped; });
  }
  impl_->join_shutdown_thread();
  std::lock_guard<std::mutex> lk(hub.mu);
  return impl_->exit_code;
}

}  // namespace ppx::server
