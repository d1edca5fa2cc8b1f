// One /api/chat conversation, independent of the transport (plain TCP or TLS): request parameter
// validation, the slot, and the worker thread that owns the Conversation (voice and text prompts,
// then one model step per 80 ms of client audio, Ogg Opus out).
//
// The transport side (server.cpp) runs on the connection's strand: it hands client audio to
// on_client_audio() and implements enqueue()/enqueue_close() by posting to that strand. The two
// sides share only the input queue and `alive_`, under mu_.
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
#include "server/session_hub.h"

namespace ppx::server {

inline constexpr uint8_t kHandshake = 0x00, kAudio = 0x01, kText = 0x02, kError = 0x05,
                         kPing = 0x06;
inline constexpr size_t kMaxMessageBytes = size_t{1} << 20;  // one client message
inline constexpr size_t kMaxTextPromptBytes = 4096;

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

class ChatSession : public std::enable_shared_from_this<ChatSession> {
 public:
  explicit ChatSession(std::shared_ptr<SessionHub> hub) : hub_(std::move(hub)) {}
  virtual ~ChatSession() = default;
  ChatSession(const ChatSession&) = delete;
  ChatSession& operator=(const ChatSession&) = delete;

  // Any thread: the client is gone or the session must end.
  void kill();

 protected:
  using Clock = std::chrono::steady_clock;

  // Transport hooks, callable from any thread.
  virtual void enqueue(std::vector<uint8_t> m) = 0;
  virtual void enqueue_close() = 0;

  // Strand side, once the WebSocket is accepted: validates the request, takes a slot and starts
  // the worker, or sends an error and closes.
  void begin(const std::string& query);
  // Strand side: a 0x01 payload. False when the client sends faster than it is served (the
  // session is then rejected and ends).
  bool on_client_audio(const uint8_t* data, size_t n);
  void reject(const std::string& why);

  std::shared_ptr<SessionHub> hub_;

 private:
  bool alive();
  void send_error(const std::string& why) { enqueue(message(kError, why.data(), why.size())); }
  void worker(int slot, ChatParams p);
  std::string run(int slot, const ChatParams& p);  // returns why the session ended

  int64_t frames_ = 0;  // worker only
  std::mutex mu_;       // guards the members below
  std::condition_variable cv_;
  bool alive_ = true;
  std::deque<std::vector<uint8_t>> in_;
  size_t queued_bytes_ = 0;
  Clock::time_point last_audio_ = Clock::now();
};

}  // namespace ppx::server
