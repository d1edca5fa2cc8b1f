// Why a chat session ended, or why a connection was refused before it got one: fixed sets, so
// that /metrics has one label value per reason however the human-readable message varies.
#pragma once

#include <array>
#include <cstddef>

namespace ppx::server {

enum class SessionEnd {
  kClientLeft,               // the client closed, vanished or stopped reading
  kClientLeftDuringPrompts,  // ... before the handshake
  kIdleTimeout,              // no decoded audio for --idle-timeout
  kBadAudio,                 // the Ogg Opus stream is unusable or over its work budgets
  kInputOverflow,            // audio arrives faster than it is processed
  kMaxDuration,              // --max-session-duration reached
  kShutdown,                 // the server is shutting down (after the drain)
  kDeviceError,              // the compute device failed; the server exits
  kSessionError,             // anything else (bad voice file, prompt too long, internal error)
};
inline constexpr size_t kSessionEndCount = 9;

enum class Rejection {
  kBadRequest,          // invalid /api/chat parameters
  kBusy,                // every --max-sessions slot in use
  kDraining,            // shutting down: no new sessions
  kUnauthorized,        // missing or wrong --api-key
  kForbiddenOrigin,     // Origin not in --allowed-origin
  kTooManyConnections,  // --max-connections reached
  kInternalError,       // an exception while setting the session up
  kMalformedRequest,    // an HTTP request that breaks HTTP or RFC 6455 (answered 400, 413, 426 or 431)
};
inline constexpr size_t kRejectionCount = 8;

// Prometheus label values, indexed by the enums above.
inline constexpr std::array<const char*, kSessionEndCount> kSessionEndLabels = {
    "client_left",     "client_left_during_prompts",
    "idle_timeout",    "bad_audio_stream",
    "input_overflow",  "max_duration",
    "server_shutdown", "device_error",
    "session_error"};
inline constexpr std::array<const char*, kRejectionCount> kRejectionLabels = {
    "bad_request",          "busy",          "draining", "unauthorized", "forbidden_origin",
    "too_many_connections", "internal_error", "malformed_request"};

inline const char* label(SessionEnd e) { return kSessionEndLabels[static_cast<size_t>(e)]; }
inline const char* label(Rejection r) { return kRejectionLabels[static_cast<size_t>(r)]; }

}  // namespace ppx::server
