#pragma once
// One client connection of the server: its HTTP request (http_connection.cpp) and, after an upgrade
// to /api/chat or /v1/realtime, its WebSocket session (ws_session.cpp). server.cpp accepts the
// connections and hands each to serve_connection().

#include <memory>
#include <string>
#include <type_traits>
#include <utility>  // before Asio: its awaitable.hpp uses std::exchange without it

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>

#include "server/session_core.h"
#include "server/session_hub.h"

namespace ppx::server {

using PlainStream = boost::beast::tcp_stream;
using TlsStream = boost::beast::ssl_stream<boost::beast::tcp_stream>;
template <class S>
constexpr bool kIsTls = std::is_same_v<S, TlsStream>;
using HttpRequest = boost::beast::http::request<boost::beast::http::string_body>;

// Serves one accepted connection (its ConnectionSlot counted from here): over TLS (`tls` not null)
// the handshake first, then one HTTP request (no keep-alive) or the upgrade to a WebSocket session.
void serve_connection(std::shared_ptr<SessionHub> hub, boost::asio::ip::tcp::socket socket,
                      boost::asio::ssl::context* tls);

// Accepts the upgrade `req` on `stream` (`subprotocol`: the Sec-WebSocket-Protocol the server
// selects, "" for none) and runs a session of `protocol` on it; the session keeps the connection's
// count and the slot reserved by the busy check.
template <class Stream>
void start_ws_session(std::shared_ptr<SessionHub> hub, std::unique_ptr<Protocol> protocol, Stream&& stream,
                      ConnectionSlot conn, SlotReservation reservation, const HttpRequest& req,
                      const std::string& subprotocol);
extern template void start_ws_session<PlainStream>(std::shared_ptr<SessionHub>, std::unique_ptr<Protocol>,
                                                   PlainStream&&, ConnectionSlot, SlotReservation,
                                                   const HttpRequest&, const std::string&);
extern template void start_ws_session<TlsStream>(std::shared_ptr<SessionHub>, std::unique_ptr<Protocol>,
                                                 TlsStream&&, ConnectionSlot, SlotReservation, const HttpRequest&,
                                                 const std::string&);

}  // namespace ppx::server
