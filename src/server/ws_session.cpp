// The WebSocket side of a connection (connection.h): a SessionCore whose transport is a Beast
// WebSocket stream.
#include "server/connection.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/beast/websocket/ssl.hpp>
#include <chrono>
#include <deque>
#include <vector>


namespace ppx::server {

namespace beast = boost::beast;
namespace http = beast::http;
namespace websocket = beast::websocket;
namespace net = boost::asio;
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
constexpr auto kHandshakeTimeout = std::chrono::seconds(10);

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
  void start(const HttpRequest& req, const std::string& subprotocol) {
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


}  // namespace

template <class Stream>
void start_ws_session(std::shared_ptr<SessionHub> hub, std::unique_ptr<Protocol> protocol, Stream&& stream,
                      ConnectionSlot conn, SlotReservation reservation, const HttpRequest& req,
                      const std::string& subprotocol) {
  std::make_shared<WsSession<Stream>>(std::move(hub), std::move(protocol), std::move(stream), std::move(conn),
                                      std::move(reservation))
      ->start(req, subprotocol);
}

template void start_ws_session<PlainStream>(std::shared_ptr<SessionHub>, std::unique_ptr<Protocol>, PlainStream&&,
                                            ConnectionSlot, SlotReservation, const HttpRequest&, const std::string&);
template void start_ws_session<TlsStream>(std::shared_ptr<SessionHub>, std::unique_ptr<Protocol>, TlsStream&&,
                                          ConnectionSlot, SlotReservation, const HttpRequest&, const std::string&);

}  // namespace ppx::server
