// One conversation, independent of the transport (plain TCP or TLS) and of the wire protocol
// (/api/chat, /v1/realtime): the slot, the Conversation (voice and text prompts, then one model
// step per 80 ms of client audio, paced to real time), the input queue and its byte budget, the
// idle/duration limits, the kill state and the end reason.
//
// Three pieces meet here:
//  - the transport (ws_session.cpp) runs on the connection's strand: it hands every client message to
//    protocol().on_message() and implements enqueue()/enqueue_close() by posting to that strand;
//  - the Protocol adapter turns client messages into PCM input and control (start parameters),
//    and each output frame (PCM + text piece) into outgoing messages. Its strand side (on_open,
//    on_message) runs on the connection's strand, its worker side (ready, decode, take, on_ready,
//    on_frame, on_end) in the session's worker context (below), one call at a time;
//  - the session core (SessionCore) drives the worker side in real time.
//
// The worker context has two phases. Until the conversation starts (start parameters, voice file,
// system prompts: blocking work of a few milliseconds to seconds) it is a thread of the session's
// own. From then on the session is a set of events on the server's session executor (a few
// threads shared by all sessions, SessionHub::executor), serialised by the session's strand:
// input arriving, a timer (pacing, idle and duration limits), a kill, and a frame completing. A
// frame runs without a waiting thread: Conversation::step_async hands it to the codec and LM
// schedulers, whose threads call back when each stage is done. So a live conversation holds no
// thread, and a frame's CPU work (audio decoding and encoding) runs on the executor.
//
// Input accounting: every queued input chunk (push_input) costs its payload plus
// kMessageOverheadBytes against kMaxQueuedInputBytes, in every phase (the worker drains the queue
// during the start wait and the system prompts too, decoding and discarding audio sent before the
// conversation starts); empty payloads are not queued and do not count as activity. The idle
// timer restarts only when audio decodes.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>

#include "ppx/conversation.h"
#include "ppx/lm_gen.h"
#include "server/end_reason.h"
#include "server/log.h"
#include "server/session_hub.h"

namespace ppx::server {

// Input not yet taken by the worker, counted as payload bytes + kMessageOverheadBytes a chunk.
inline constexpr size_t kMaxQueuedInputBytes = size_t{4} << 20;
inline constexpr size_t kMessageOverheadBytes = 64;
inline constexpr size_t kMaxTextPromptBytes = 4096;
// Frames a session may run ahead of real time (counted from its handshake): 2 s.
inline constexpr int64_t kBurstFrames = 25;

extern const char* const kDefaultTextPrompt;
extern const char* const kDefaultVoice;

// A session's start parameters, validated.
struct SessionParams {
  std::string voice_path;  // empty: no voice prompt
  std::string text_prompt;
  LmGenConfig gen;
  uint64_t seed = 0;
};

// Text tokens that carry no text: 0 (end of padding) and 3 (padding).
inline bool is_pad_token(int64_t token) { return token == 0 || token == 3; }
// The text of a decoded text token: SentencePiece's word marker U+2581 becomes a space (as
// upstream); "" for the pad tokens.
std::string text_piece(const TextTokenizer& tok, int64_t token);

class SessionCore;

// A wire protocol over one SessionCore (see the top of this file for which side runs where).
class Protocol {
 public:
  using Clock = std::chrono::steady_clock;
  virtual ~Protocol() = default;
  void attach(SessionCore* core) { core_ = core; }

  // The path it serves ("/api/chat", "/v1/realtime"), for the log.
  virtual const char* endpoint() const = 0;
  // Outgoing messages are WebSocket text frames (else binary).
  virtual bool text_frames() const = 0;
  // Largest client message the transport reads; a longer one ends the connection.
  virtual size_t max_message_bytes() const = 0;

  // Strand side. Validates the upgrade's query string: "" or the message of a bad request.
  virtual std::string prepare(const std::string& query) = 0;
  // The session holds its slot and its worker runs.
  virtual void on_open() {}
  // One client message; false: stop reading (the session was killed).
  virtual bool on_message(const uint8_t* data, size_t n) = 0;
  // Any thread: sends the message that refuses or ends the session (`code`: a label of
  // end_reason.h; the close follows).
  virtual void send_fatal(const char* code, const std::string& message) = 0;

  // Worker side. True once the start parameters are final (`p` is then filled); polled until then
  // while input is drained and discarded.
  virtual bool ready(Clock::time_point now, SessionParams& p) = 0;
  // One queued input chunk into PCM. False when the session must end (`why`, `detail` set).
  virtual bool decode(const std::vector<uint8_t>& chunk, SessionEnd& why, std::string& detail) = 0;
  virtual size_t available() const = 0;           // decoded samples not yet taken
  virtual std::vector<float> take(size_t n) = 0;  // up to n samples (24 kHz mono)
  // Before the conversation starts: drops the decoded input it does not keep for the first frames.
  virtual void drop_early_input() { take(available()); }
  virtual void on_prompt_tick(Clock::time_point) {}  // while the system prompts run
  virtual void on_ready() = 0;                       // the conversation starts
  // One output frame: `pcm` (frame_samples at 24 kHz), its text token (0, 3: pad) and that
  // token's text (text_piece()).
  virtual void on_frame(const std::vector<float>& pcm, int64_t text_token,
                        const std::string& text) = 0;
  // The session ended (the close follows): say why unless the client left.
  virtual void on_end(SessionEnd why, const std::string& detail) = 0;

 protected:
  SessionCore* core_ = nullptr;
};

class SessionCore : public std::enable_shared_from_this<SessionCore> {
 public:
  SessionCore(std::shared_ptr<SessionHub> hub, std::unique_ptr<Protocol> protocol);
  virtual ~SessionCore();
  SessionCore(const SessionCore&) = delete;
  SessionCore& operator=(const SessionCore&) = delete;

  // Any thread: the session must end; the first call's reason wins. For reasons other than
  // kClientLeft the worker has the protocol say why before the close.
  void kill(SessionEnd why, const std::string& message = "");
  // Any thread: one outgoing message (dropped once the connection closes).
  void send(std::vector<uint8_t> m) { enqueue(std::move(m)); }
  void send(const std::string& s) { enqueue(std::vector<uint8_t>(s.begin(), s.end())); }
  // Strand side: a non-empty input chunk for Protocol::decode. False when it would exceed
  // kMaxQueuedInputBytes (the caller then kills the session with kInputOverflow).
  bool push_input(const uint8_t* data, size_t n);
  bool alive();

  SessionHub& hub() { return *hub_; }
  Protocol& protocol() { return *protocol_; }
  // Unique in the process and unlikely to repeat across servers; names the session in the log.
  const std::string& id() const { return id_; }

 protected:
  using Clock = std::chrono::steady_clock;

  // Transport hooks, callable from any thread.
  virtual void enqueue(std::vector<uint8_t> m) = 0;
  virtual void enqueue_close() = 0;

  // Strand side, once the WebSocket is accepted: validates the request, takes a slot and starts
  // the worker, or refuses (fatal message + close).
  void begin(const std::string& query);
  void reject(Rejection why, const std::string& message);

  std::shared_ptr<SessionHub> hub_;
  // The slot promised by the upgrade's busy check (http_connection.cpp), taken or given back by begin().
  SlotReservation reservation_;

 private:
  using Strand = boost::asio::strand<boost::asio::io_context::executor_type>;
  struct Live;  // the conversation's state once it runs (session_core.cpp)

  // The session's own thread: the prompt phase, then the hand-over to the executor (or the end).
  void worker(int slot);
  // The prompt phase: start parameters, voice, system prompts, then on_ready(). Returns nullopt
  // with live_ set when the conversation starts, or why it ended (text in `detail`).
  std::optional<SessionEnd> prepare(int slot, std::string& detail);
  // Every session's end, on whichever side it happens: the protocol's goodbye, the log line,
  // the metrics, the close; then the model state goes and the slot is released.
  void finish(int slot, std::unique_ptr<Live> live, SessionEnd why, const std::string& detail);
  // Maps an exception of the session (a DeviceError ends the server) to its end.
  SessionEnd failed(std::exception_ptr e, std::string& detail);
  // The prepared voice of `path` (VoiceCache::get); its errors name the file without its directory.
  std::shared_ptr<const PreparedVoice> voice(const std::string& path, int sample_rate, int frame_samples);
  // Live phase, on strand_.
  void post_tick();  // any thread: have tick() run soon (coalesced)
  void tick();       // input, limits, the next frame or the next wake-up
  void frame_done(std::optional<FrameOut> f, std::exception_ptr error);
  void end_live(SessionEnd why, const std::string& detail);
  // end_live once no frame is in flight: at once, or as the last one comes back.
  void end_when_idle(SessionEnd why, const std::string& detail);
  // Moves queued client input into the protocol's decoder. False (with `why` and `detail` set)
  // when the session must end (killed, or the input failed).
  bool pump_input(SessionEnd& why, std::string& detail);
  // The kill reason once !alive_.
  SessionEnd killed(std::string& detail);

  std::unique_ptr<Protocol> protocol_;
  const std::string id_ = log::new_session_id();
  Clock::time_point t0_;       // worker: when the session took its slot
  int64_t frames_ = 0;         // worker only
  int64_t budget_misses_ = 0;  // worker only: frames whose step took longer than the frame
  Strand strand_;              // the live phase's events
  boost::asio::steady_timer timer_;  // strand_ only
  std::unique_ptr<Live> live_;       // set by the worker thread, then strand_ only
  std::shared_ptr<SessionCore> self_;  // while live_ is set: the session's hold on itself
  std::atomic<bool> is_live_{false};      // live_ handed to the strand: events post ticks
  std::atomic<bool> tick_posted_{false};  // a tick is queued on the strand
  std::mutex mu_;       // guards the members below
  std::condition_variable cv_;
  bool alive_ = true;
  SessionEnd end_ = SessionEnd::kClientLeft;
  std::string end_message_;
  std::deque<std::vector<uint8_t>> in_;
  size_t queued_bytes_ = 0;
};

}  // namespace ppx::server
