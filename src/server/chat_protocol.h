// The /api/chat protocol (docs/PROTOCOL.md): request parameters in the query string, Ogg Opus
// audio both ways in [kind][payload] binary messages (0x00 handshake, 0x01 audio, 0x02 text,
// 0x05 error, 0x06 ping), as upstream Moshi/PersonaPlex.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "server/session_core.h"

namespace ppx {
class OggOpusReader;
class OggOpusWriter;
}  // namespace ppx

namespace ppx::server {

inline constexpr uint8_t kHandshake = 0x00, kAudio = 0x01, kText = 0x02, kError = 0x05,
                         kPing = 0x06;
inline constexpr size_t kMaxMessageBytes = size_t{1} << 20;  // one client message

// Fills `p` from the query string (upstream names and defaults); returns an error message, or ""
// when valid.
std::string parse_chat_params(const std::string& query, const ServerOptions& opts,
                              const ServerModel& model, SessionParams& p);

// [kind][payload] as one WebSocket message.
std::vector<uint8_t> message(uint8_t kind, const void* data = nullptr, size_t n = 0);
std::vector<uint8_t> message_of(uint8_t kind, const std::string& text = "");

class ChatProtocol final : public Protocol {
 public:
  explicit ChatProtocol(SessionHub& hub);
  ~ChatProtocol() override;

  const char* endpoint() const override { return "/api/chat"; }
  bool text_frames() const override { return false; }
  size_t max_message_bytes() const override { return kMaxMessageBytes; }
  std::string prepare(const std::string& query) override;
  bool on_message(const uint8_t* data, size_t n) override;
  void send_fatal(const char* code, const std::string& message) override;

  bool ready(Clock::time_point now, SessionParams& p) override;
  bool decode(const std::vector<uint8_t>& chunk, SessionEnd& why, std::string& detail) override;
  size_t available() const override;
  std::vector<float> take(size_t n) override;
  void on_prompt_tick(Clock::time_point now) override;
  void on_ready() override;
  void on_frame(const std::vector<float>& pcm, int64_t text_token,
                const std::string& text) override;
  void on_end(SessionEnd why, const std::string& detail) override;

 private:
  SessionHub& hub_;
  SessionParams params_;  // set by prepare(), read by the worker after the slot is taken
  // Worker only.
  std::unique_ptr<OggOpusReader> reader_;
  std::unique_ptr<OggOpusWriter> writer_;
  Clock::time_point last_ping_;
};

}  // namespace ppx::server
