// The JSON of the /v1/realtime protocol (docs/PROTOCOL.md): base64, ids, and the session, response
// and item objects in their GA and beta shapes, as the OpenAI SDKs and Pipecat's pydantic models
// (pipecat/services/openai/realtime/events.py) parse them. No network, no threads.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace ppx::server::realtime {

using Json = nlohmann::ordered_json;

// Standard base64 (RFC 4648, with padding).
std::string base64_encode(const uint8_t* data, size_t n);
// Strict decoding: length a multiple of 4, alphabet only, '=' only as final padding. nullopt when
// malformed.
std::optional<std::vector<uint8_t>> base64_decode(const std::string& s);

// "<prefix>_" + 24 random hex digits.
std::string random_id(const char* prefix);

// `s` cut to at most `max_bytes` without splitting a UTF-8 sequence (s must be valid UTF-8).
std::string clip_utf8(const std::string& s, size_t max_bytes);

// What session.created / session.updated report: the session as it really is.
struct SessionView {
  std::string id, model, instructions;
  std::optional<std::string> voice;  // the voice file in use, as /api/voices lists it
  double temperature = 0.8;          // audio sampling temperature (beta shape only)
};
Json session_object(const SessionView& s, bool beta);

// An assistant message item: `status` "in_progress", "completed" or "incomplete"; `transcript`
// nullopt gives an empty content list (the item as first announced).
Json assistant_item(const std::string& id, const char* status,
                    const std::optional<std::string>& transcript, bool beta);
// The audio content part of an assistant item.
Json audio_part(const std::string& transcript, bool beta);
// A response object: `status` "in_progress", "completed" or "cancelled"; `output` its items;
// usage null while in progress, all-zero when done.
Json response_object(const std::string& id, const std::string& conversation_id, const char* status,
                     const Json& status_details, const Json& output, bool done,
                     const std::optional<std::string>& voice, bool beta);

// The event names that differ between GA and beta.
struct EventNames {
  const char* item_added;  // conversation.item.added | conversation.item.created
  const char* audio_delta;
  const char* audio_done;
  const char* transcript_delta;
  const char* transcript_done;
};
const EventNames& event_names(bool beta);

}  // namespace ppx::server::realtime
