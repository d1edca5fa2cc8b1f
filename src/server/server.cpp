#include "server/server.h"

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <list>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "ppx/audio.h"
#include "ppx/conversation.h"
#include "ppx/error.h"
#include "ppx/ogg_opus.h"
#include "server/http_util.h"
#include "server/metrics.h"

namespace ppx::server {

namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
namespace net = boost::asio;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

constexpr uint8_t kHandshake = 0x00, kAudio = 0x01, kText = 0x02, kError = 0x05, kPing = 0x06;
constexpr size_t kMaxMessageBytes = size_t{1} << 20;      // one client message
constexpr size_t kMaxQueuedInputBytes = size_t{8} << 20;  // audio not yet consumed by the worker
constexpr size_t kMaxQueuedOutput = 1024;                 // messages the client has not taken
constexpr size_t kMaxTextPromptBytes = 4096;
const char* const kDefaultTextPrompt =
    "You are a wise and friendly teacher. Answer questions or provide advice in a clear and "
    "engaging way.";
const char* const kDefaultVoice = "NATF0.pt";

// A chat request's parameters, validated.
struct ChatParams {
  std::string voice_path;  // empty: no voice prompt
  std::string text_prompt;
  LmGenConfig gen;
  uint64_t seed = 0;
};

bool parse_double(const std::string& s, double lo, double hi, double& out) {
  try {
    size_t used = 0;
    const double v = std::stod(s, &used);
    if (used != s.size() || !std::isfinite(v) || v < lo || v > hi) return false;
    out = v;
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

bool parse_int(const std::string& s, long long lo, long long hi, long long& out) {
  try {
    size_t used = 0;
    const long long v = std::stoll(s, &used);
    if (used != s.size() || v < lo || v > hi) return false;
    out = v;
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

// Fills `p` from the query string; returns an error message, or "" when valid.
std::string parse_chat_params(const std::string& query, const ServerOptions& opts,
                              const ServerModel& model, ChatParams& p) {
  const auto q = parse_query(query);
  auto get = [&](const char* key) -> const std::string* {
    const auto it = q.find(key);
    return it == q.end() ? nullptr : &it->second;
  };
  p.gen = model.gen;
  p.text_prompt = kDefaultTextPrompt;
  if (const auto* t = get("text_prompt")) p.text_prompt = *t;
  if (p.text_prompt.size() > kMaxTextPromptBytes)
    return "text_prompt is too long (" + std::to_string(p.text_prompt.size()) + " bytes, at most " +
           std::to_string(kMaxTextPromptBytes) + ")";
  if (!is_valid_utf8(p.text_prompt)) return "text_prompt is not valid UTF-8";
  if (const auto* v = get("voice_prompt")) {
    if (!v->empty()) {
      const auto path = resolve_voice(opts.voice_dir, *v);
      if (!path) return "unknown voice_prompt (not a file listed by /api/voices)";
      p.voice_path = *path;
    }
  } else if (const auto path = resolve_voice(opts.voice_dir, kDefaultVoice)) {
    p.voice_path = *path;
  }
  struct D {
    const char* key;
    double* dst;
  };
  for (const D& d :
       {D{"text_temperature", &p.gen.temp_text}, D{"audio_temperature", &p.gen.temp}}) {
    if (const auto* s = get(d.key))
      if (!parse_double(*s, 0.0, 100.0, *d.dst))
        return std::string("bad ") + d.key + " (a number in [0, 100])";
  }
  struct K {
    const char* key;
    int* dst;
  };
  for (const K& k : {K{"text_topk", &p.gen.top_k_text}, K{"audio_topk", &p.gen.top_k}}) {
    if (const auto* s = get(k.key)) {
      long long v = 0;
      if (!parse_int(*s, 0, 1 << 20, v))
        return std::string("bad ") + k.key + " (an integer in [0, 1048576])";
      *k.dst = static_cast<int>(v);
    }
  }
  long long text_seed = -1, audio_seed = -1;
  for (auto [key, dst] :
       {std::pair{"text_seed", &text_seed}, std::pair{"audio_seed", &audio_seed}}) {
    if (const auto* s = get(key))
      if (!s->empty() && !parse_int(*s, -1, (1LL << 62), *dst)) return std::string("bad ") + key;
  }
  if (text_seed < 0 && audio_seed < 0)
    p.seed = std::random_device{}() * 0x9E3779B97F4A7C15ULL + std::random_device{}();
  else
    p.seed = static_cast<uint64_t>(std::max(audio_seed, 0LL)) * 1000003ULL +
             static_cast<uint64_t>(std::max(text_seed, 0LL));
  return "";
}

std::string fmt_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", s);
  return buf;
}

std::vector<uint8_t> message(uint8_t kind, const void* data = nullptr, size_t n = 0) {
  std::vector<uint8_t> m(1 + n);
  m[0] = kind;
  if (n) std::memcpy(m.data() + 1, data, n);
  return m;
}

}  // namespace

class ChatSession;

struct Server::Impl : std::enable_shared_from_this<Server::Impl> {
  ServerOptions opts;
  ServerModel model;
  net::io_context ioc;
  tcp::acceptor acceptor{ioc};
  std::vector<std::thread> threads;

  std::mutex mu;  // guards everything below
  std::condition_variable cv;
  std::vector<bool> slot_used;
  int in_use = 0;
  int workers = 0;
  bool stopping = false, stopped = false;
  std::list<std::weak_ptr<ChatSession>> sessions;
  std::mutex backend_mu;  // creating codec streams / steppers
  Metrics metrics;

  int acquire_slot() {
    std::lock_guard<std::mutex> lk(mu);
    if (stopping) return -1;
    for (size_t i = 0; i < slot_used.size(); ++i) {
      if (!slot_used[i]) {
        slot_used[i] = true;
        ++in_use;
        return static_cast<int>(i);
      }
    }
    return -1;
  }
  void release_slot(int slot) {
    std::lock_guard<std::mutex> lk(mu);
    slot_used[static_cast<size_t>(slot)] = false;
    --in_use;
    --workers;
    cv.notify_all();
  }
  void do_accept();
  void stop_all();
};

// One /api/chat connection: the WebSocket (driven on its strand by the I/O threads) and, once it
// holds a slot, its worker thread. The worker and the strand share only `in_`/`alive_` (under mu_)
// and the messages the worker posts to the strand.
class ChatSession : public std::enable_shared_from_this<ChatSession> {
 public:
  ChatSession(std::shared_ptr<Server::Impl> srv, tcp::socket&& s)
      : srv_(std::move(srv)), ws_(std::move(s)) {}

  void start(http::request<http::string_body> req) {
    websocket::stream_base::timeout t{};
    t.handshake_timeout = std::chrono::seconds(10);
    t.idle_timeout = std::chrono::milliseconds(
        static_cast<int64_t>(std::max(2.0, srv_->opts.idle_timeout_s) * 1000));
    t.keep_alive_pings = true;
    ws_.set_option(t);
    ws_.read_message_max(kMaxMessageBytes);
    ws_.binary(true);
    beast::error_code ec;
    beast::get_lowest_layer(ws_).socket().set_option(tcp::no_delay(true), ec);
    const std::string target(req.target());
    const size_t qpos = target.find('?');
    query_ = qpos == std::string::npos ? "" : target.substr(qpos + 1);
    ws_.async_accept(req, [self = shared_from_this()](beast::error_code e) { self->on_accept(e); });
  }

  // Any thread: the client is gone or the session must end.
  void kill() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      alive_ = false;
    }
    cv_.notify_all();
  }

 private:
  struct Out {
    std::vector<uint8_t> data;
    bool close = false;
  };

  void on_accept(beast::error_code ec) {
    if (ec) return;
    do_read();
    ChatParams p;
    const std::string err = parse_chat_params(query_, srv_->opts, srv_->model, p);
    if (!err.empty()) return reject(err);
    const int slot = srv_->acquire_slot();
    if (slot < 0)
      return reject("server busy: all " + std::to_string(srv_->opts.max_sessions) +
                    " sessions in use");
    srv_->metrics.session_started();
    std::fprintf(stderr, "session (slot %d): started, voice '%s', %zu-byte text prompt\n", slot,
                 p.voice_path.c_str(), p.text_prompt.size());
    {
      std::lock_guard<std::mutex> lk(srv_->mu);
      ++srv_->workers;
      srv_->sessions.remove_if([](const std::weak_ptr<ChatSession>& w) { return w.expired(); });
      srv_->sessions.push_back(weak_from_this());
    }
    std::thread([self = shared_from_this(), slot, p = std::move(p)]() mutable {
      self->worker(slot, std::move(p));
    }).detach();
  }

  void reject(const std::string& why) {
    srv_->metrics.rejected(why);
    enqueue(message(kError, why.data(), why.size()));
    enqueue_close();
  }

  // ---- strand side ----
  void do_read() {
    ws_.async_read(rbuf_, [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->on_read(ec, n);
    });
  }

  void on_read(beast::error_code ec, size_t n) {
    if (ec) return kill();
    const auto* d = static_cast<const uint8_t*>(rbuf_.data().data());
    if (n > 0 && d[0] == kAudio) {
      bool overflow = false;
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (queued_bytes_ + n > kMaxQueuedInputBytes) {
          overflow = true;
        } else {
          in_.emplace_back(d + 1, d + n);
          queued_bytes_ += n;
          last_audio_ = Clock::now();
        }
      }
      if (overflow) {
        kill();
        return reject("audio arrives faster than it can be processed");
      }
      cv_.notify_all();
    } else {
      ++ignored_;  // other kinds (and empty messages) are ignored, as upstream does
      srv_->metrics.ignored_message();
    }
    rbuf_.consume(rbuf_.size());
    do_read();
  }

  // Any thread.
  void enqueue(std::vector<uint8_t> m) {
    net::post(ws_.get_executor(), [self = shared_from_this(), m = std::move(m)]() mutable {
      self->push_out(Out{std::move(m), false});
    });
  }
  void enqueue_close() {
    net::post(ws_.get_executor(), [self = shared_from_this()]() { self->push_out(Out{{}, true}); });
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
                      [self = shared_from_this()](beast::error_code) { self->kill(); });
      return;
    }
    writing_ = true;
    ws_.async_write(net::buffer(out_.front().data),
                    [self = shared_from_this()](beast::error_code ec, size_t) {
                      self->writing_ = false;
                      if (ec) {
                        self->closing_ = true;
                        return self->kill();
                      }
                      self->out_.pop_front();
                      self->pump();
                    });
  }

  // ---- worker side ----
  bool alive() {
    std::lock_guard<std::mutex> lk(mu_);
    return alive_;
  }

  void send_error(const std::string& why) { enqueue(message(kError, why.data(), why.size())); }

  void worker(int slot, ChatParams p) {
    const auto t0 = Clock::now();
    std::string why;
    try {
      why = run(slot, p);
    } catch (const std::exception& e) {
      why = std::string("session failed: ") + e.what();
      send_error(why);
    }
    std::fprintf(stderr, "session (slot %d): ended after %.1f s, %lld frames: %s\n", slot,
                 std::chrono::duration<double>(Clock::now() - t0).count(),
                 static_cast<long long>(frames_), why.c_str());
    srv_->metrics.session_ended(why);
    enqueue_close();
    srv_->release_slot(slot);
  }

  // Returns why the session ended.
  std::string run(int slot, const ChatParams& p) {
    const ServerModel& m = srv_->model;
    const int sr = m.sample_rate, fs = m.frame_samples;
    SystemPrompt prompt;
    if (!p.voice_path.empty()) {
      if (p.voice_path.size() > 3 && p.voice_path.compare(p.voice_path.size() - 3, 3, ".pt") == 0)
        prompt.voice = load_voice_embeddings(p.voice_path);
      else
        prompt.voice_audio = prepare_voice_audio(p.voice_path, sr, fs);
    }
    const std::string wrapped = wrap_system_prompt(p.text_prompt);
    if (!wrapped.empty()) prompt.text_tokens = m.tokenizer->encode(wrapped);
    std::unique_ptr<CodecStream> codec;
    std::unique_ptr<LmStepper> stepper;
    {
      std::lock_guard<std::mutex> lk(srv_->backend_mu);
      codec = m.backend->codec_stream(slot);
      stepper = m.backend->lm_stepper(p.gen, p.seed);
    }
    Conversation conv(*codec, *stepper, p.gen);
    const auto ping_every = std::chrono::duration<double>(srv_->opts.ping_interval_s);
    auto last_ping = Clock::now();
    const bool done = conv.run_system_prompts(prompt, [&](int64_t, int64_t) {
      if (!alive()) return false;
      if (Clock::now() - last_ping >= ping_every) {
        enqueue(message(kPing));
        last_ping = Clock::now();
      }
      return true;
    });
    if (!done || !alive()) return "client left during the system prompts";

    OggOpusWriter writer(sr);
    OggOpusReader reader(sr);
    enqueue(message(kHandshake));
    enqueue(message(kAudio, writer.head_page().data(), writer.head_page().size()));
    enqueue(message(kAudio, writer.tags_page().data(), writer.tags_page().size()));
    {
      std::lock_guard<std::mutex> lk(mu_);
      last_audio_ = Clock::now();
    }
    const auto idle = std::chrono::duration<double>(srv_->opts.idle_timeout_s);
    std::deque<std::vector<uint8_t>> batch;
    while (true) {
      Clock::time_point last;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait_for(lk, std::chrono::milliseconds(100), [&] { return !alive_ || !in_.empty(); });
        if (!alive_) return "client gone";
        batch.swap(in_);
        queued_bytes_ = 0;
        last = last_audio_;
      }
      if (batch.empty() && Clock::now() - last > idle) {
        const std::string why =
            "idle timeout: no audio received for " + fmt_seconds(srv_->opts.idle_timeout_s);
        send_error(why);
        return why;
      }
      for (const auto& b : batch) reader.push(b.data(), b.size());
      batch.clear();
      if (reader.failed()) {
        const std::string why = "bad audio stream: " + reader.error();
        send_error(why);
        return why;
      }
      while (reader.available() >= static_cast<size_t>(fs)) {
        const std::vector<float> pcm = reader.take(static_cast<size_t>(fs));
        const auto t_frame = Clock::now();
        const auto fr = conv.step(pcm.data());
        srv_->metrics.frame(std::chrono::duration<double, std::milli>(Clock::now() - t_frame).count(),
                            1000.0 * fs / sr);
        if (!fr) continue;
        const int64_t tok = fr->text_token;
        if (tok != 0 && tok != 3) {
          std::string piece = m.tokenizer->id_to_piece(static_cast<int>(tok));
          for (size_t pos; (pos = piece.find("\xE2\x96\x81")) != std::string::npos;)
            piece.replace(pos, 3, " ");
          enqueue(message(kText, piece.data(), piece.size()));
        }
        const std::vector<uint8_t> page = writer.encode_frame(fr->pcm.data(), fs);
        enqueue(message(kAudio, page.data(), page.size()));
        ++frames_;
        if (!alive()) return "client gone";
      }
    }
  }

  std::shared_ptr<Server::Impl> srv_;
  websocket::stream<beast::tcp_stream> ws_;
  std::string query_;
  beast::flat_buffer rbuf_;
  // strand only
  std::deque<Out> out_;
  bool writing_ = false, closing_ = false;
  uint64_t ignored_ = 0;
  int64_t frames_ = 0;  // worker only
  // shared with the worker, under mu_
  std::mutex mu_;
  std::condition_variable cv_;
  bool alive_ = true;
  std::deque<std::vector<uint8_t>> in_;
  size_t queued_bytes_ = 0;
  Clock::time_point last_audio_ = Clock::now();
};

// One plain HTTP request on a fresh connection (no keep-alive), or the upgrade to /api/chat.
class HttpConnection : public std::enable_shared_from_this<HttpConnection> {
 public:
  HttpConnection(std::shared_ptr<Server::Impl> srv, tcp::socket&& s)
      : srv_(std::move(srv)), stream_(std::move(s)) {}

  void run() {
    parser_.emplace();
    parser_->header_limit(16 * 1024);
    parser_->body_limit(16 * 1024);
    stream_.expires_after(std::chrono::seconds(15));
    http::async_read(
        stream_, buf_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

 private:
  void on_read(beast::error_code ec) {
    if (ec) return;
    http::request<http::string_body> req = parser_->release();
    const std::string target(req.target());
    const std::string path = target.substr(0, target.find('?'));
    if (websocket::is_upgrade(req)) {
      if (path == "/api/chat") {
        stream_.expires_never();
        std::make_shared<ChatSession>(srv_, stream_.release_socket())->start(std::move(req));
        return;
      }
      return reply(req, http::status::not_found, "text/plain", "not found\n");
    }
    if (req.method() != http::verb::get)
      return reply(req, http::status::method_not_allowed, "text/plain", "method not allowed\n");
    if (path == "/health") {
      nlohmann::ordered_json j;
      int in_use = 0;
      {
        std::lock_guard<std::mutex> lk(srv_->mu);
        in_use = srv_->in_use;
      }
      j["status"] = "ok";
      j["model"] = srv_->model.description;
      j["device"] = srv_->model.backend->device();
      j["sessions_in_use"] = in_use;
      j["max_sessions"] = srv_->opts.max_sessions;
      return reply(req, http::status::ok, "application/json", j.dump() + "\n");
    }
    if (path == "/metrics") {
      int in_use = 0;
      {
        std::lock_guard<std::mutex> lk(srv_->mu);
        in_use = srv_->in_use;
      }
      return reply(req, http::status::ok, "text/plain; version=0.0.4",
                   srv_->metrics.prometheus(in_use, srv_->opts.max_sessions));
    }
    if (path == "/api/voices") {
      return reply(req, http::status::ok, "application/json",
                   nlohmann::json(list_voices(srv_->opts.voice_dir)).dump() + "\n");
    }
    if (const auto file = resolve_static(srv_->opts.static_dir, target)) {
      std::ifstream f(*file, std::ios::binary);
      std::ostringstream ss;
      ss << f.rdbuf();
      if (f) return reply(req, http::status::ok, content_type(*file), ss.str());
    }
    reply(req, http::status::not_found, "text/plain", "not found\n");
  }

  void reply(const http::request<http::string_body>& req, http::status st, const std::string& type,
             std::string body) {
    auto res = std::make_shared<http::response<http::string_body>>(st, req.version());
    res->set(http::field::server, "personaplex-cpp");
    res->set(http::field::content_type, type);
    res->keep_alive(false);
    res->body() = std::move(body);
    res->prepare_payload();
    http::async_write(stream_, *res, [self = shared_from_this(), res](beast::error_code, size_t) {
      beast::error_code e;
      self->stream_.socket().shutdown(tcp::socket::shutdown_send, e);
    });
  }

  std::shared_ptr<Server::Impl> srv_;
  beast::tcp_stream stream_;
  beast::flat_buffer buf_;
  std::optional<http::request_parser<http::string_body>> parser_;
};

void Server::Impl::do_accept() {
  acceptor.async_accept(net::make_strand(ioc),
                        [self = shared_from_this()](beast::error_code ec, tcp::socket s) {
                          if (ec) {
                            if (ec == net::error::operation_aborted || !self->acceptor.is_open())
                              return;
                          } else {
                            std::make_shared<HttpConnection>(self, std::move(s))->run();
                          }
                          self->do_accept();
                        });
}

void Server::Impl::stop_all() {
  std::list<std::weak_ptr<ChatSession>> ss;
  {
    std::lock_guard<std::mutex> lk(mu);
    stopping = true;
    ss = sessions;
  }
  for (auto& w : ss)
    if (auto s = w.lock()) s->kill();
}

Server::Server(const ServerOptions& opts, const ServerModel& model)
    : impl_(std::make_shared<Impl>()) {
  if (opts.max_sessions < 1) throw Error("--max-sessions must be at least 1");
  if (!model.backend || !model.tokenizer)
    throw Error("server: a model backend and a text tokenizer are needed");
  impl_->opts = opts;
  impl_->model = model;
  impl_->slot_used.assign(static_cast<size_t>(opts.max_sessions), false);
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

int Server::sessions_in_use() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->in_use;
}

void Server::start() {
  impl_->do_accept();
  for (int i = 0; i < std::max(1, impl_->opts.io_threads); ++i)
    impl_->threads.emplace_back([this] { impl_->ioc.run(); });
}

void Server::stop() {
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    if (impl_->stopped) return;
  }
  impl_->stop_all();
  {
    // Workers notice within ~100 ms (or one model step); bounded in case a step is slow.
    std::unique_lock<std::mutex> lk(impl_->mu);
    impl_->cv.wait_for(lk, std::chrono::seconds(30), [&] { return impl_->workers == 0; });
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
    std::lock_guard<std::mutex> lk(impl_->mu);
    impl_->stopped = true;
  }
  impl_->cv.notify_all();
}

void Server::wait() {
  std::unique_lock<std::mutex> lk(impl_->mu);
  impl_->cv.wait(lk, [&] { return impl_->stopped; });
}

}  // namespace ppx::server
