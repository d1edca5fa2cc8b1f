#include "server/server.h"

#include <algorithm>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/beast/websocket/ssl.hpp>
#include <deque>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>
#include <type_traits>

#include "ppx/error.h"
#include "server/chat_session.h"
#include "server/http_util.h"
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
// Request head limit: large enough that an oversized text_prompt reaches the prompt check (and
// its clear error message) instead of failing the HTTP parse.
constexpr uint32_t kMaxRequestHead = 256 * 1024;
constexpr auto kHandshakeTimeout = std::chrono::seconds(10);

using PlainStream = beast::tcp_stream;
using TlsStream = beast::ssl_stream<beast::tcp_stream>;
template <class S>
constexpr bool kIsTls = std::is_same_v<S, TlsStream>;

// The WebSocket side of a ChatSession over transport Stream, driven on the connection's strand.
template <class Stream>
class WsSession final : public ChatSession {
 public:
  WsSession(std::shared_ptr<SessionHub> hub, Stream&& s)
      : ChatSession(std::move(hub)), ws_(std::move(s)) {}

  void start(http::request<http::string_body> req) {
    websocket::stream_base::timeout t{};
    t.handshake_timeout = kHandshakeTimeout;
    t.idle_timeout = std::chrono::milliseconds(
        static_cast<int64_t>(std::max(2.0, hub_->opts.idle_timeout_s) * 1000));
    t.keep_alive_pings = true;
    ws_.set_option(t);
    ws_.read_message_max(kMaxMessageBytes);
    ws_.binary(true);
    beast::error_code ec;
    beast::get_lowest_layer(ws_).socket().set_option(tcp::no_delay(true), ec);
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
    ws_.async_read(rbuf_, [self = self_ptr()](beast::error_code ec, size_t n) {
      self->on_read(ec, n);
    });
  }

  void on_read(beast::error_code ec, size_t n) {
    if (ec) return kill();
    const auto* d = static_cast<const uint8_t*>(rbuf_.data().data());
    if (n > 0 && d[0] == kAudio) {
      if (!on_client_audio(d + 1, n - 1)) {
        kill();
        return reject("audio arrives faster than it can be processed");
      }
    } else {
      hub_->metrics.ignored_message();  // other kinds (and empty messages), as upstream
    }
    rbuf_.consume(rbuf_.size());
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
    if (out_.size() >= kMaxQueuedOutput) {  // the client does not read: drop it
      kill();
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
      ws_.async_close(websocket::close_code::normal,
                      [self = self_ptr()](beast::error_code) { self->kill(); });
      return;
    }
    writing_ = true;
    ws_.async_write(net::buffer(out_.front().data),
                    [self = self_ptr()](beast::error_code ec, size_t) {
                      self->writing_ = false;
                      if (ec) {
                        self->closing_ = true;
                        return self->kill();
                      }
                      self->out_.pop_front();
                      self->pump();
                    });
  }

  websocket::stream<Stream> ws_;
  beast::flat_buffer rbuf_;
  std::deque<Out> out_;  // strand only, like the flags
  bool writing_ = false, closing_ = false;
};

// One plain HTTP request on a fresh connection (no keep-alive), or the upgrade to /api/chat.
// Over TLS the handshake comes first.
template <class Stream>
class HttpConnection : public std::enable_shared_from_this<HttpConnection<Stream>> {
 public:
  HttpConnection(std::shared_ptr<SessionHub> hub, Stream&& s)
      : hub_(std::move(hub)), stream_(std::move(s)) {}

  void run() {
    beast::get_lowest_layer(stream_).expires_after(std::chrono::seconds(15));
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
                       if (!ec) self->on_request();
                     });
  }

  void on_request() {
    http::request<http::string_body> req = parser_->release();
    const std::string target(req.target());
    const std::string path = target.substr(0, target.find('?'));
    if (websocket::is_upgrade(req)) {
      if (path == "/api/chat") {
        beast::get_lowest_layer(stream_).expires_never();  // the WebSocket has its own timeouts
        std::make_shared<WsSession<Stream>>(hub_, std::move(stream_))->start(std::move(req));
        return;
      }
      return reply(req, http::status::not_found, "text/plain", "not found\n");
    }
    if (req.method() != http::verb::get)
      return reply(req, http::status::method_not_allowed, "text/plain", "method not allowed\n");
    const int in_use = hub_->sessions_in_use();
    if (path == "/health") {
      nlohmann::ordered_json j;
      j["status"] = "ok";
      j["model"] = hub_->model.description;
      j["device"] = hub_->model.backend->device();
      j["sessions_in_use"] = in_use;
      j["max_sessions"] = hub_->opts.max_sessions;
      return reply(req, http::status::ok, "application/json", j.dump() + "\n");
    }
    if (path == "/metrics")
      return reply(req, http::status::ok, "text/plain; version=0.0.4",
                   hub_->metrics.prometheus(in_use, hub_->opts.max_sessions));
    if (path == "/api/voices")
      return reply(req, http::status::ok, "application/json",
                   nlohmann::json(list_voices(hub_->opts.voice_dir)).dump() + "\n");
    // --static files first (they may replace the built-in client), then the built-in client.
    if (const auto file = resolve_static(hub_->opts.static_dir, target)) {
      std::ifstream f(*file, std::ios::binary);
      std::ostringstream ss;
      ss << f.rdbuf();
      if (f) return reply(req, http::status::ok, content_type(*file), ss.str());
    }
    if (const WebAsset* a = find_web_asset(path))
      return reply(req, http::status::ok, a->content_type, std::string(a->body));
    reply(req, http::status::not_found, "text/plain", "not found\n");
  }

  void reply(const http::request<http::string_body>& req, http::status st, const std::string& type,
             std::string body) {
    auto res = std::make_shared<http::response<http::string_body>>(st, req.version());
    res->set(http::field::server, "personaplex-cpp");
    res->set(http::field::content_type, type);
    res->set(http::field::cache_control, "no-store");
    res->keep_alive(false);
    res->body() = std::move(body);
    res->prepare_payload();
    http::async_write(stream_, *res,
                      [self = this->shared_from_this(), res](beast::error_code, size_t) {
                        self->finish();
                      });
  }

  void finish() {
    if constexpr (kIsTls<Stream>) {
      beast::get_lowest_layer(stream_).expires_after(std::chrono::seconds(5));
      stream_.async_shutdown([self = this->shared_from_this()](beast::error_code) {});
    } else {
      beast::error_code ec;
      stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    }
  }

  std::shared_ptr<SessionHub> hub_;
  Stream stream_;
  beast::flat_buffer buf_;
  std::optional<http::request_parser<http::string_body>> parser_;
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

struct Server::Impl : std::enable_shared_from_this<Server::Impl> {
  std::shared_ptr<SessionHub> hub = std::make_shared<SessionHub>();
  net::io_context ioc;
  tcp::acceptor acceptor{ioc};
  std::unique_ptr<ssl::context> tls;  // null: plain HTTP
  std::vector<std::thread> threads;

  void do_accept() {
    acceptor.async_accept(net::make_strand(ioc), [self = shared_from_this()](beast::error_code ec,
                                                                           tcp::socket s) {
      if (ec) {
        if (ec == net::error::operation_aborted || !self->acceptor.is_open()) return;
      } else if (self->tls) {
        std::make_shared<HttpConnection<TlsStream>>(self->hub,
                                                    TlsStream(std::move(s), *self->tls))
            ->run();
      } else {
        std::make_shared<HttpConnection<PlainStream>>(self->hub, PlainStream(std::move(s)))->run();
      }
      self->do_accept();
    });
  }
};

ServerModel server_model(const app::LoadedModel& m) {
  ServerModel sm;
  sm.backend = m.backend.get();
  sm.tokenizer = m.tokenizer.get();
  if (!m.cfg.lm_gen) throw Error("the model config has no generation settings (lm_gen)");
  sm.gen = *m.cfg.lm_gen;
  sm.sample_rate = m.cfg.mimi.sample_rate;
  sm.frame_samples = m.cfg.mimi.frame_samples();
  sm.description = m.description;
  return sm;
}

Server::Server(const ServerOptions& opts, const ServerModel& model)
    : impl_(std::make_shared<Impl>()) {
  if (opts.max_sessions < 1) throw Error("--max-sessions must be at least 1");
  if (!model.backend || !model.tokenizer)
    throw Error("server: a model backend and a text tokenizer are needed");
  SessionHub& hub = *impl_->hub;
  hub.opts = opts;
  hub.model = model;
  hub.slot_used.assign(static_cast<size_t>(opts.max_sessions), false);
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

void Server::start() {
  impl_->do_accept();
  for (int i = 0; i < std::max(1, impl_->hub->opts.io_threads); ++i)
    impl_->threads.emplace_back([this] { impl_->ioc.run(); });
}

void Server::stop() {
  SessionHub& hub = *impl_->hub;
  std::list<std::weak_ptr<ChatSession>> live;
  {
    std::lock_guard<std::mutex> lk(hub.mu);
    if (hub.stopped) return;
    hub.stopping = true;
    live = hub.sessions;
  }
  for (auto& w : live)
    if (auto s = w.lock()) s->kill();
  {
    // Workers notice within ~100 ms (or one model step); bounded in case a step is slow.
    std::unique_lock<std::mutex> lk(hub.mu);
    hub.cv.wait_for(lk, std::chrono::seconds(30), [&] { return hub.workers == 0; });
  }
  net::post(impl_->ioc, [impl = impl_] {
    beast::error_code ec;
    impl->acceptor.close(ec);
  });
  impl_->ioc.stop();
  for (auto& t : impl_->threads)
    if (t.joinable()) t.join();
  impl_->threads.clear();
  {
    std::lock_guard<std::mutex> lk(hub.mu);
    hub.stopped = true;
  }
  hub.cv.notify_all();
}

void Server::wait() {
  SessionHub& hub = *impl_->hub;
  std::unique_lock<std::mutex> lk(hub.mu);
  hub.cv.wait(lk, [&] { return hub.stopped; });
}

}  // namespace ppx::server
