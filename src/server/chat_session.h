// One /api/chat conversation, independent of the transport (plain TCP or TLS): request parameter
// validation, the slot, and the worker thread that owns the Conversation (voice and text prompts,
// then one model step per 80 ms of client audio, Ogg Opus out).
//
// The transport side (server.cpp) runs on the connection's strand: it hands client audio to
// on_client_audio() and implements enqueue()/enqueue_close() by posting to that strand. The two
// sides share only the input queue and the kill state (`alive_`, `end_`), under mu_.
//
// Input accounting: every queued 0x01 message costs its payload plus kMessageOverheadBytes
// against kMaxQueuedInputBytes, in every phase (the worker drains the queue during the system
// prompts too, decoding and discarding audio sent before the handshake); empty payloads are not
// queued and do not count as activity. The idle timer restarts only when audio decodes.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ppx/lm_gen.h"
#include "server/end_reason.h"
#include "server/session_hub.h"

namespace ppx {
class OggOpusReader;
}

namespace ppx::server {

inline constexpr uint8_t kHandshake = 0x00, kAudio = 0x01, kText = 0x02, kError = 0x05,
                         kPing = 0x06;
inline constexpr size_t kMaxMessageBytes = size_t{1} << 20;  // one client message
inline constexpr size_t kMaxTextPromptBytes = 4096;
// Input not yet taken by the worker, counted as payload bytes + kMessageOverheadBytes a message.
inline constexpr size_t kMaxQueuedInputBytes = size_t{4} << 20;
inline constexpr size_t kMessageOverheadBytes = 64;
// Frames a session may run ahead of real time (counted from its handshake): 2 s.
inline constexpr int64_t kBurstFrames = 25;

// A chat request's parameters, validated.
struct ChatParams {
  std::string voice_path;  // empty: no voice prompt
  std::string text_prompt;
  LmGenConfig gen;
  uint64_t seed = 0;
};

// Fills `p` from the query string (upstream names and defaults); returns an error message, or ""
// when valid.
std::string parse_chat_params(const std::string& query, const ServerOptions& opts,
                              const ServerModel& model, ChatParams& p);

// [kind][payload] as one WebSocket message.
std::vector<uint8_t> message(uint8_t kind, const void* data = nullptr, size_t n = 0);
std::vector<uint8_t> message_of(uint8_t kind, const std::string& text = "");

class ChatSession : public std::enable_shared_from_this<ChatSession> {
 public:
  explicit ChatSession(std::shared_ptr<SessionHub> hub) : hub_(std::move(hub)) {}
  virtual ~ChatSession() = default;
  ChatSession(const ChatSession&) = delete;
  ChatSession& operator=(const ChatSession&) = delete;

  // Any thread: the session must end; the first call's reason wins. For reasons other than
  // kClientLeft the worker sends 0x05 `message` before the close.
  void kill(SessionEnd why, const std::string& message = "");

 protected:
  using Clock = std::chrono::steady_clock;

  // Transport hooks, callable from any thread.
  virtual void enqueue(std::vector<uint8_t> m) = 0;
  virtual void enqueue_close() = 0;

  // Strand side, once the WebSocket is accepted: validates the request, takes a slot and starts
  // the worker, or sends an error and closes.
  void begin(const std::string& query);
  // Strand side: a non-empty 0x01 payload. False when it would exceed kMaxQueuedInputBytes (the
  // session is then killed with kInputOverflow).
  bool on_client_audio(const uint8_t* data, size_t n);
  // Strand side: refuses the connection before a session exists (0x05 + close).
  void reject(Rejection why, const std::string& message);

  std::shared_ptr<SessionHub> hub_;

 private:
  bool alive();
  void send_error(const std::string& why) { enqueue(message(kError, why.data(), why.size())); }
  void worker(int slot, const ChatParams& p);
  // Runs the session until it ends; returns why, with the 0x05 text in `detail`.
  SessionEnd run(int slot, const ChatParams& p, std::string& detail);
  // Moves queued client input into `reader`. False (with `why` and `detail` set) when the session
  // must end (killed, or the stream failed).
  bool pump_input(OggOpusReader& reader, SessionEnd& why, std::string& detail);
  // The kill reason once !alive_.
  SessionEnd killed(std::string& detail);

  int64_t frames_ = 0;  // worker only
  std::mutex mu_;       // guards the members below
  std::condition_variable cv_;
  bool alive_ = true;
  SessionEnd end_ = SessionEnd::kClientLeft;
  std::string end_message_;
  std::deque<std::vector<uint8_t>> in_;
  size_t queued_bytes_ = 0;
};

}  // namespace ppx::server
