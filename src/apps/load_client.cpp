#include "apps/load_client.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/websocket.hpp>
#include <cstring>
#include <deque>

namespace ppx::load {

namespace {

namespace beast = boost::beast;
namespace websocket = beast::websocket;
namespace net = boost::asio;
using tcp = net::ip::tcp;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(net::io_context& ioc, const SessionOptions& o, tcp::resolver::results_type eps,
          std::shared_ptr<const EncodedStream> audio, SessionTrace& trace,
          std::function<void()> done)
      : opts_(o),
        eps_(std::move(eps)),
        audio_(std::move(audio)),
        tr_(trace),
        done_(std::move(done)),
        ws_(net::make_strand(ioc)),
        start_timer_(ws_.get_executor()),
        pace_timer_(ws_.get_executor()),
        deadline_(ws_.get_executor()) {
    const size_t n = audio_->frames.size();
    tr_.scheduled.assign(n, {});
    tr_.written.assign(n, {});
    tr_.answered.assign(n, {});
  }

  void start(Clock::time_point at) {
    start_timer_.expires_at(at);
    start_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (!ec) self->connect();
    });
  }

 private:
  enum class Phase { kConnecting, kStreaming, kDraining, kClosing, kDone };

  struct Out {
    const std::vector<uint8_t>* msg;
    int64_t frame;  // -1 for the header pages
  };

  void fail(const std::string& why) {
    if (tr_.failure.empty()) tr_.failure = why;
  }

  void hard_close() {
    beast::error_code ec;
    beast::get_lowest_layer(ws_).socket().shutdown(tcp::socket::shutdown_both, ec);
    beast::get_lowest_layer(ws_).close();
  }

  void finish() {
    if (phase_ == Phase::kDone) return;
    phase_ = Phase::kDone;
    start_timer_.cancel();
    pace_timer_.cancel();
    deadline_.cancel();
    hard_close();
    if (done_) done_();
  }

  void arm_deadline(Clock::time_point at) {
    deadline_.expires_at(at);
    deadline_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (!ec) self->on_deadline();
    });
  }

  void on_deadline() {
    switch (phase_) {
      case Phase::kConnecting:
        fail("no handshake within " + std::to_string(opts_.handshake_timeout_s) + " s");
        return hard_close();
      case Phase::kStreaming:
        fail("stalled: " + std::to_string(tr_.frames_written) + " of " +
             std::to_string(audio_->frames.size()) + " frames written in time");
        return hard_close();
      case Phase::kDraining:
        return begin_close();
      case Phase::kClosing:
        return hard_close();
      case Phase::kDone:
        return;
    }
  }

  void connect() {
    tr_.t_connect = Clock::now();
    arm_deadline(tr_.t_connect + seconds(opts_.handshake_timeout_s));
    beast::get_lowest_layer(ws_).async_connect(
        eps_, [self = shared_from_this()](beast::error_code ec, const tcp::endpoint&) {
          self->on_connect(ec);
        });
  }

  void on_connect(beast::error_code ec) {
    if (ec) {
      fail("connect: " + ec.message());
      return finish();
    }
    beast::get_lowest_layer(ws_).socket().set_option(tcp::no_delay(true), ec);
    websocket::stream_base::timeout t{};
    t.handshake_timeout = std::chrono::seconds(10);  // the upgrade, and our close
    t.idle_timeout = websocket::stream_base::none();
    t.keep_alive_pings = false;
    ws_.set_option(t);
    ws_.read_message_max(4u << 20);
    ws_.binary(true);
    ws_.async_handshake(opts_.host + ":" + std::to_string(opts_.port), opts_.target,
                        [self = shared_from_this()](beast::error_code e) { self->on_upgrade(e); });
  }

  void on_upgrade(beast::error_code ec) {
    if (ec) {
      fail("websocket upgrade: " + ec.message());
      return finish();
    }
    tr_.connected = true;
    read();
  }

  void read() {
    ws_.async_read(buf_, [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->on_read(ec, n);
    });
  }

  void on_read(beast::error_code ec, size_t n) {
    const auto now = Clock::now();
    if (ec) {
      if (phase_ != Phase::kClosing && tr_.server_error.empty())
        fail("connection closed early (" + ec.message() + ") after " +
             std::to_string(tr_.frames_written) + " frames written");
      return finish();
    }
    const auto* d = static_cast<const uint8_t*>(buf_.data().data());
    if (n >= 1) on_message(d[0], d + 1, n - 1, now);
    buf_.consume(buf_.size());
    if (phase_ == Phase::kDraining && tr_.frames_answered >= tr_.frames_written) begin_close();
    read();
  }

  void on_message(uint8_t kind, const uint8_t* p, size_t n, Clock::time_point now) {
    switch (kind) {
      case 0x00:
        if (!tr_.handshake) on_handshake(now);
        break;
      case 0x01: {
        ++tr_.pages_received;
        // Ogg page header: "OggS", version, flags, granule (8), serial (4), sequence (4), ...
        if (n < 27 || std::memcmp(p, "OggS", 4) != 0) {
          ++tr_.unmatched_pages;
          break;
        }
        const uint32_t seq = static_cast<uint32_t>(p[18]) | static_cast<uint32_t>(p[19]) << 8 |
                             static_cast<uint32_t>(p[20]) << 16 |
                             static_cast<uint32_t>(p[21]) << 24;
        if (seq < 2) {
          ++tr_.header_pages;
          ++tr_.unmatched_pages;
          break;
        }
        const uint64_t k = seq - 2;
        if (k >= tr_.answered.size() || tr_.answered[k] != Clock::time_point{}) {
          ++tr_.unmatched_pages;
          break;
        }
        tr_.answered[k] = now;
        ++tr_.frames_answered;
        break;
      }
      case 0x02:
        ++tr_.text_messages;
        tr_.text_bytes += static_cast<int64_t>(n);
        break;
      case 0x05:
        tr_.server_error.assign(reinterpret_cast<const char*>(p), n);
        fail("server error: " + tr_.server_error);
        break;
      case 0x06:
        ++tr_.pings;
        break;
      default:
        break;
    }
  }

  void on_handshake(Clock::time_point now) {
    tr_.handshake = true;
    tr_.t_handshake = now;
    phase_ = Phase::kStreaming;
    const size_t frames = audio_->frames.size();
    t0_ = now;
    // Generous: a stall is when writing falls behind by more than the drain time plus 5 s.
    arm_deadline(t0_ + std::chrono::milliseconds(80) * static_cast<int64_t>(frames) +
                 seconds(opts_.drain_s + 5));
    queue_.push_back({&audio_->head, -1});
    queue_.push_back({&audio_->tags, -1});
    write_next();
    if (frames == 0) return start_drain();
    pace(0);
  }

  void pace(size_t k) {
    const auto due = t0_ + std::chrono::milliseconds(80) * static_cast<int64_t>(k);
    tr_.scheduled[k] = due;
    pace_timer_.expires_at(due);
    pace_timer_.async_wait([self = shared_from_this(), k](beast::error_code ec) {
      if (ec || self->phase_ != Phase::kStreaming) return;
      self->queue_.push_back({&self->audio_->frames[k], static_cast<int64_t>(k)});
      self->write_next();
      if (k + 1 < self->audio_->frames.size()) self->pace(k + 1);
    });
  }

  void write_next() {
    if (writing_ || queue_.empty() || phase_ == Phase::kDone || phase_ == Phase::kClosing) return;
    writing_ = true;
    const Out o = queue_.front();
    queue_.pop_front();
    ws_.async_write(net::buffer(*o.msg),
                    [self = shared_from_this(), o](beast::error_code ec, size_t) {
                      self->on_write(ec, o.frame);
                    });
  }

  void on_write(beast::error_code ec, int64_t frame) {
    writing_ = false;
    if (ec) {
      if (phase_ != Phase::kDone && tr_.server_error.empty())
        fail("write failed (" + ec.message() + ") after " + std::to_string(tr_.frames_written) +
             " frames");
      return hard_close();
    }
    if (frame >= 0) {
      tr_.written[static_cast<size_t>(frame)] = Clock::now();
      if (tr_.frames_written == 0) tr_.t_first_frame = tr_.written[0];
      ++tr_.frames_written;
      if (static_cast<size_t>(tr_.frames_written) == audio_->frames.size()) return start_drain();
    }
    write_next();
  }

  void start_drain() {
    if (phase_ != Phase::kStreaming) return;
    phase_ = Phase::kDraining;
    arm_deadline(Clock::now() + seconds(opts_.drain_s));
    if (tr_.frames_answered >= tr_.frames_written) begin_close();
  }

  void begin_close() {
    if (phase_ == Phase::kClosing || phase_ == Phase::kDone) return;
    phase_ = Phase::kClosing;
    pace_timer_.cancel();
    arm_deadline(Clock::now() + std::chrono::seconds(12));
    ws_.async_close(websocket::close_code::normal, [self = shared_from_this()](beast::error_code) {
      // The pending read ends with `closed` and finishes the session.
    });
  }

  const SessionOptions opts_;
  tcp::resolver::results_type eps_;
  std::shared_ptr<const EncodedStream> audio_;
  SessionTrace& tr_;
  std::function<void()> done_;
  websocket::stream<beast::tcp_stream> ws_;
  net::steady_timer start_timer_, pace_timer_, deadline_;
  beast::flat_buffer buf_;
  std::deque<Out> queue_;
  bool writing_ = false;
  Phase phase_ = Phase::kConnecting;
  Clock::time_point t0_;
};

}  // namespace

void start_session(net::io_context& ioc, const SessionOptions& opts,
                   const tcp::resolver::results_type& endpoints,
                   std::shared_ptr<const EncodedStream> audio, Clock::time_point start_at,
                   SessionTrace& trace, std::function<void()> done) {
  auto s =
      std::make_shared<Session>(ioc, opts, endpoints, std::move(audio), trace, std::move(done));
  s->start(start_at);
}

SessionSummary summarize(const SessionTrace& t, double budget_ms, int64_t tail_frames) {
  SessionSummary s;
  s.frames_sent = t.frames_written;
  if (t.handshake) s.handshake_ms = ms_between(t.t_connect, t.t_handshake);
  for (size_t k = 0; k < t.written.size(); ++k) {
    if (t.written[k] == Clock::time_point{}) continue;
    s.send_lag_ms.push_back(ms_between(t.scheduled[k], t.written[k]));
    if (t.answered[k] == Clock::time_point{}) {
      ++s.frames_missed;
      continue;
    }
    ++s.frames_received;
    const double ms = ms_between(t.written[k], t.answered[k]);
    s.latency_ms.push_back(ms);
    if (ms > budget_ms) ++s.frames_over_budget;
  }
  s.failure = t.failure;
  if (s.failure.empty() && !t.connected) s.failure = "no connection";
  if (s.failure.empty() && !t.handshake) s.failure = "no handshake";
  if (s.failure.empty() && s.frames_missed > tail_frames)
    s.failure = std::to_string(s.frames_missed) + " of " + std::to_string(s.frames_sent) +
                " frames unanswered";
  return s;
}

}  // namespace ppx::load
