// One personaplex-load session: a WebSocket client of /api/chat that streams pre-encoded Ogg Opus
// pages in real time and timestamps what comes back.
//
// Timeline of a session (all on the session's strand of the shared io_context):
//   connect (TCP + WebSocket upgrade) -> wait for 0x00 (the server has run the system prompts)
//   -> send OpusHead, OpusTags, then frame k's page at t0 + k * 80 ms (t0: when 0x00 arrived),
//   as the web client does -> once every frame is written, wait up to `drain_s` for the answers
//   -> WebSocket close.
//
// Frame matching: after the handshake the server answers every complete 1920-sample input frame
// with exactly one audio page (0x01), in order, and nothing else audio-wise except its OpusHead
// (seq 0) and OpusTags (seq 1) pages. The system prompts have already run the LM past its
// acoustic delay (voice, 2 x 6 silence frames, text) before 0x00, so there is no warm-up frame:
// the page with Ogg sequence number s answers input frame k = s - 2. Each input page holds one
// 80 ms Opus packet, which decodes to exactly 1920 samples, so input frame k is complete on the
// server when page k has arrived. Added latency of frame k = (output page k read by the client)
// - (input page k's last byte handed to the socket, i.e. its write completed).
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "apps/load_signal.h"

namespace ppx::load {

using Clock = std::chrono::steady_clock;

struct SessionOptions {
  std::string host;  // for the Host header
  uint16_t port = 0;
  std::string target;                // "/api/chat?..."
  double handshake_timeout_s = 120;  // connect to 0x00
  double drain_s = 5;                // after the last frame is written, wait this long for answers
};

// What one session saw. Times are steady_clock; "unset" time points are Clock::time_point{}.
struct SessionTrace {
  int id = 0;
  bool connected = false;  // WebSocket upgrade accepted
  bool handshake = false;  // 0x00 received
  Clock::time_point t_connect, t_handshake, t_first_frame;
  std::vector<Clock::time_point> scheduled;  // frame k's due time (t0 + k * 80 ms)
  std::vector<Clock::time_point> written;    // frame k's write completed
  std::vector<Clock::time_point> answered;   // output page for frame k read
  int64_t frames_written = 0, frames_answered = 0, pages_received = 0, header_pages = 0,
          unmatched_pages = 0;
  int64_t text_messages = 0, text_bytes = 0, pings = 0;
  std::string server_error;  // the 0x05 payload, if any
  std::string failure;       // why the session failed while running; empty if it did not
};

// Starts one session at `start_at` on `ioc`; `trace` must outlive the io_context's run. `done` is
// called once, on an I/O thread, when the session has ended (whatever the reason).
void start_session(boost::asio::io_context& ioc, const SessionOptions& opts,
                   const boost::asio::ip::tcp::resolver::results_type& endpoints,
                   std::shared_ptr<const EncodedStream> audio, Clock::time_point start_at,
                   SessionTrace& trace, std::function<void()> done);

// The verdict on one session, from its trace.
struct SessionSummary {
  int64_t frames_sent = 0, frames_received = 0, frames_missed = 0, frames_over_budget = 0;
  double handshake_ms = -1;         // connect to 0x00; -1 when no handshake
  std::vector<double> latency_ms;   // added latency of each answered frame, in frame order
  std::vector<double> send_lag_ms;  // write completion - due time, per frame written
  std::string failure;              // empty: the session passed
};

// `tail_frames`: answers that may be missing at the end (still in flight when the drain ended)
// before the session counts as failed. A session fails on: no connection or upgrade refused, no
// handshake, a 0x05 error, an early close, a stall, or more than tail_frames unanswered frames.
SessionSummary summarize(const SessionTrace& t, double budget_ms, int64_t tail_frames);

}  // namespace ppx::load
