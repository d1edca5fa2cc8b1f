#include "server/server.h"

#include <openssl/ssl.h>
#include <sys/resource.h>

#include <algorithm>
#include <cctype>
#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "ppx/error.h"
#include "server/connection.h"
#include "server/log.h"
#include "server/session_hub.h"

namespace ppx::server {

namespace beast = boost::beast;
namespace net = boost::asio;
namespace ssl = net::ssl;
using tcp = net::ip::tcp;

namespace {

constexpr auto kCloseFlushLimit = std::chrono::seconds(2);  // stop(): time for the 0x05 + close

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
  // Never a passphrase prompt on the terminal (a server would hang at startup): an encrypted key
  // fails here with its own message.
  ctx->set_password_callback([](std::size_t, ssl::context::password_purpose) { return std::string(); }, ec);
  ctx->use_private_key_file(key, ssl::context::pem, ec);
  if (ec) {
    std::ifstream in(key);
    const std::string pem((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (pem.find("ENCRYPTED") != std::string::npos)
      throw Error("--ssl: the private key " + key +
                  " is encrypted; the server needs it without a passphrase (openssl pkey -in " + key + " -out " +
                  key + ".plain && mv " + key + ".plain " + key + " asks for it once)");
    throw Error("--ssl: cannot use private key " + key + ": " + ec.message());
  }
  if (SSL_CTX_check_private_key(ctx->native_handle()) != 1)
    throw Error("--ssl: " + key + " does not match the certificate " + cert);
  return ctx;
}

// --host (an address, or a name such as localhost: its first address) and --port as an endpoint.
// A name that resolves to IPv4 and IPv6 addresses (localhost: ::1 first on Debian) binds its IPv4
// one, which every client can reach (personaplex-load's default is 127.0.0.1). An empty host or a
// numeric shorthand ("0") is refused, never widened to every interface.
tcp::endpoint listen_endpoint(const std::string& host, uint16_t port) {
  boost::system::error_code ec;
  const net::ip::address a = net::ip::make_address(host, ec);
  if (!ec) return {a, port};
  const bool name = std::any_of(host.begin(), host.end(), [](unsigned char c) { return std::isalpha(c); });
  if (!name) throw Error("--host '" + host + "' is not an IP address (or a host name)");
  net::io_context ioc;
  tcp::resolver r(ioc);
  const auto found = r.resolve(host, std::to_string(port), ec);
  if (ec || found.empty())
    throw Error("--host '" + host + "' is neither an IP address nor a name that resolves" +
                (ec ? ": " + ec.message() : std::string()));
  for (const auto& e : found)
    if (e.endpoint().address().is_v4()) return e.endpoint();
  return found.begin()->endpoint();
}

// Opens, binds and listens on `acceptor`; throws naming the address.
void listen_on(tcp::acceptor& acceptor, const std::string& host, uint16_t port) {
  const tcp::endpoint ep = listen_endpoint(host, port);
  try {
    acceptor.open(ep.protocol());
    acceptor.set_option(net::socket_base::reuse_address(true));
    acceptor.bind(ep);
    acceptor.listen(net::socket_base::max_listen_connections);
  } catch (const boost::system::system_error& e) {
    throw Error("cannot listen on " + host + ":" + std::to_string(port) + ": " + e.code().message());
  }
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
    serve_connection(hub, std::move(s), tls.get());
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
  listen_on(impl_->acceptor, opts.host, opts.port);
}

Server::~Server() { stop(); }

uint16_t Server::port() const { return impl_->acceptor.local_endpoint().port(); }

void Server::check_tls(const std::string& ssl_dir) { load_tls(ssl_dir); }

void Server::check_listen(const std::string& host, uint16_t port) {
  net::io_context ioc;
  tcp::acceptor probe(ioc);
  listen_on(probe, host, port);  // closed again as it goes out of scope
}

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
