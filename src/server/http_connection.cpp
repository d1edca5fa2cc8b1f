// The HTTP side of a connection (connection.h): one request (health, metrics, voices, the web
// client, static files) or the upgrade to a WebSocket session, with the checks before it.
#include "server/connection.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <algorithm>
#include <array>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>
#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>

#include "server/chat_protocol.h"
#include "server/http_util.h"
#include "server/log.h"
#include "server/realtime_protocol.h"
#include "server/web_assets.h"

namespace ppx::server {

namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
namespace net = boost::asio;
namespace ssl = net::ssl;
using tcp = net::ip::tcp;

namespace {

// Request head limit: large enough that an oversized text_prompt (4096 bytes, up to 3x that
// percent-encoded) reaches the prompt check and its clear error message instead of failing the
// HTTP parse; small enough that no header value reaches Beast's own limit of a field (64 KiB),
// which throws instead of failing the read.
constexpr uint32_t kMaxRequestHead = 60 * 1024;
// A plain HTTP response: each piece written within this (a client that stops reading is dropped).
constexpr auto kResponseIdleTimeout = std::chrono::seconds(15);
constexpr uint64_t kMinResponseRate = 64 * 1024;  // bytes/s: a whole response's deadline
// After refusing a malformed or oversized request: what the client still sends is read and
// dropped for up to this long, or this many bytes, before the close.
constexpr auto kLingerTime = std::chrono::seconds(2);
constexpr size_t kLingerBytes = 1 << 20;
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

// Every value of a header that may come in several lines (a list, RFC 9110 5.3), joined by ", ".
std::string all_values(const HttpRequest& req, std::string_view name) {
  std::string v;
  for (auto [it, end] = req.equal_range(name); it != end; ++it) {
    if (!v.empty()) v += ", ";
    v += it->value();
  }
  return v;
}

// One plain HTTP request on a fresh connection (no keep-alive), or the upgrade to /api/chat or
// /v1/realtime. Over TLS the handshake comes first.
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
                                     ? realtime_upgrade(all_values(req, "Sec-WebSocket-Protocol"),
                                                        all_values(req, "OpenAI-Beta"))
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
      start_ws_session(hub_, std::move(protocol), std::move(stream_), std::move(conn_), std::move(reservation),
                       req, rt.subprotocol);
      return;
    }
    if (req.method() != http::verb::get && req.method() != http::verb::head)
      return reply(req, http::status::method_not_allowed, "text/plain", "method not allowed\n");
    if (path == "/health/live")  // the process serves HTTP
      return reply(req, http::status::ok, "application/json", "{\"status\":\"live\"}\n");
    if (path == "/health" || path == "/health/ready") {
      const SessionHub::SlotState slots = hub_->slot_state();
      const std::string& why = slots.unavailable;
      const int in_use = slots.in_use, reserved = slots.reserved;
      // Ready: the model is loaded (it is before the server starts), not draining, a slot free.
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
          hub_->metrics.prometheus(hub_->sessions_in_use(), hub_->opts.max_sessions, hub_->connections.load(), cache_stats(*hub_).get()));
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


}  // namespace

void serve_connection(std::shared_ptr<SessionHub> hub, tcp::socket socket, ssl::context* tls) {
  if (tls) {
    std::make_shared<HttpConnection<TlsStream>>(std::move(hub), TlsStream(std::move(socket), *tls))->run();
  } else {
    std::make_shared<HttpConnection<PlainStream>>(std::move(hub), PlainStream(std::move(socket)))->run();
  }
}

}  // namespace ppx::server
