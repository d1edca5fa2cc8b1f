// The /v1/realtime protocol (docs/PROTOCOL.md): the OpenAI Realtime API's JSON events over a
// WebSocket, as Pipecat's OpenAIRealtimeLLMService and the OpenAI SDKs speak it, GA event names by
// default and beta names when the upgrade carries `OpenAI-Beta: realtime=v1`.
//
// Client events are parsed on the connection's strand (each bounded by kMaxClientEventBytes):
// `input_audio_buffer.append` becomes raw PCM16 input for the session core, `session.update`
// changes the start parameters until the conversation starts, the turn-based events are
// acknowledged. The worker side turns PCM16 into samples and segments the agent's continuous
// output into responses (see on_frame()). Session state shared by both sides is under mu_.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "server/realtime_events.h"
#include "server/session_core.h"

namespace ppx::server {

inline constexpr size_t kMaxClientEventBytes = size_t{1} << 20;      // larger: error, skipped
inline constexpr size_t kMaxRealtimeMessageBytes = size_t{4} << 20;  // larger: connection closed
inline constexpr size_t kMaxServerEventBytes = size_t{256} << 10;
inline constexpr int kMaxInvalidEvents = 100;  // error events before the session is ended
// What a client may send, as a rate with a burst (RateBudget); more ends the session. Bytes: every
// event up to kMaxClientEventBytes (parsing costs the connection's network thread ~5 ms a MiB);
// real-time audio is 64 KiB/s of base64, and a client far ahead of real time meets
// kMaxBufferedInputSamples first. Events other than `input_audio_buffer.append`: Pipecat sends one
// per context message when a conversation starts, then a few a turn; each may cost a reply (a
// `session.update` answers with the whole session).
inline constexpr double kClientBytesPerSecond = 1 << 20;
inline constexpr double kClientBytesBurst = 16 << 20;
inline constexpr double kControlEventsPerSecond = 50;
inline constexpr double kControlEventsBurst = 1000;
// Without a session.update the conversation starts with the defaults after this long.
inline constexpr std::chrono::milliseconds kRealtimeStartWait{1000};
// Audio sent before the conversation starts: the most recent second is kept (the model hears it
// first, within its burst allowance), older audio is dropped.
inline constexpr size_t kKeptEarlySamples = 24000;
// Decoded input waiting for the model (a client far ahead of real time): 30 s at 24 kHz.
inline constexpr size_t kMaxBufferedInputSamples = 30 * 24000;
// Segmentation of the agent's output into responses: a frame is silent when its text token is
// a pad and its audio RMS is below kSilenceRms; a response closes after kSilentFramesToClose
// silent frames in a row, or after kMaxSegmentFrames frames.
// Erring low: a threshold too high would drop quiet speech between responses, one too low only
// makes responses end at kMaxSegmentFrames. (The tiny test model's output sits near 0.006.)
inline constexpr float kSilenceRms = 0.003f;    // about -50 dBFS
inline constexpr int kSilentFramesToClose = 6;  // 480 ms
inline constexpr int kMaxSegmentFrames = 50;    // 4 s

// A rate with a burst (a token bucket): take() succeeds while what was taken over any span of t
// seconds stays within burst + rate x t.
class RateBudget {
 public:
  RateBudget(double rate_per_s, double burst) : rate_(rate_per_s), burst_(burst), level_(burst) {}
  using Clock = std::chrono::steady_clock;
  bool take(double amount, Clock::time_point now) {
    if (last_ != Clock::time_point{})
      level_ = std::min(burst_, level_ + rate_ * std::chrono::duration<double>(now - last_).count());
    last_ = now;
    if (amount > level_) return false;
    level_ -= amount;
    return true;
  }

 private:
  double rate_, burst_, level_;
  Clock::time_point last_{};
};

// What a /v1/realtime upgrade asks for besides the request itself. Browsers cannot set headers on
// a WebSocket, so OpenAI's browser clients offer the subprotocols `realtime`,
// `openai-insecure-api-key.KEY` and `openai-beta.realtime-v1` instead of `Authorization` and
// `OpenAI-Beta: realtime=v1`; the server selects `realtime`, which a browser requires once it
// offered any.
struct RealtimeUpgrade {
  std::string subprotocol;  // to select ("" for none)
  std::string key;          // the API key offered as a subprotocol ("" for none)
  bool beta = false;        // the beta API (header or subprotocol)
};
RealtimeUpgrade realtime_upgrade(std::string_view sec_websocket_protocol, std::string_view openai_beta);

class RealtimeProtocol final : public Protocol {
 public:
  RealtimeProtocol(SessionHub& hub, bool beta);

  const char* endpoint() const override { return "/v1/realtime"; }
  bool text_frames() const override { return true; }
  size_t max_message_bytes() const override { return kMaxRealtimeMessageBytes; }
  std::string prepare(const std::string& query) override;
  void on_open() override;
  bool on_message(const uint8_t* data, size_t n) override;
  void send_fatal(const char* code, const std::string& message) override;

  bool ready(Clock::time_point now, SessionParams& p) override;
  bool decode(const std::vector<uint8_t>& chunk, SessionEnd& why, std::string& detail) override;
  size_t available() const override { return pcm_.size(); }
  std::vector<float> take(size_t n) override;
  void drop_early_input() override;
  void on_ready() override {}
  void on_frame(const std::vector<float>& pcm, int64_t text_token,
                const std::string& text) override;
  void on_end(SessionEnd why, const std::string& detail) override;

 private:
  using Json = realtime::Json;
  Json event(const char* type);  // {type, event_id}
  // event() of the open response's one audio part: its response and item ids, output and content
  // index 0 (the part's added / done and every delta).
  Json part_event(const char* type);
  void emit(const Json& ev);
  // Strand side. One error event; false once the invalid-event limit ends the session. An error
  // that is an answer (`counts` false: retrieve of an unknown item) is not counted.
  bool invalid(const std::string& code, const std::string& message, const char* param = nullptr,
               bool counts = true);
  bool flood(const std::string& why);  // strand side: ends the session (a client over its RateBudget); false
  void apply_session_update(const Json& session);  // under mu_
  void send_session(const char* type);
  // Worker side: response lifecycle.
  void open_response();
  void close_response(bool cancelled);

  SessionHub& hub_;
  const bool beta_;
  std::atomic<uint64_t> next_event_{0};
  std::string event_prefix_;
  std::string client_event_id_;  // strand only: event_id of the event being handled
  int invalid_events_ = 0;       // strand only
  RateBudget client_bytes_{kClientBytesPerSecond, kClientBytesBurst};        // strand only
  RateBudget control_events_{kControlEventsPerSecond, kControlEventsBurst};  // strand only
  std::atomic<bool> cancel_{false};

  std::mutex mu_;  // guards the session state below
  realtime::SessionView view_;
  SessionParams params_;
  Clock::time_point t_open_;
  bool updated_ = false, started_ = false;

  // Worker only.
  std::deque<float> pcm_;
  std::string conversation_id_;
  std::optional<std::string> voice_;  // as reported in response objects
  bool open_ = false;
  std::string response_id_, item_id_, transcript_;
  std::optional<std::string> previous_item_;
  int segment_frames_ = 0, silent_run_ = 0;
};

}  // namespace ppx::server
