#include "server/realtime_events.h"

#include <array>
#include <random>

namespace ppx::server::realtime {

namespace {

constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

Json audio_format(bool beta) {
  if (beta) return "pcm16";
  return Json{{"type", "audio/pcm"}, {"rate", 24000}};
}

Json zero_usage() {
  const Json details{{"cached_tokens", 0}, {"text_tokens", 0}, {"audio_tokens", 0}};
  return Json{{"total_tokens", 0},
              {"input_tokens", 0},
              {"output_tokens", 0},
              {"input_token_details", details},
              {"output_token_details", details}};
}

Json voice_json(const std::optional<std::string>& v) { return v ? Json(*v) : Json(nullptr); }

}  // namespace

std::string base64_encode(const uint8_t* d, size_t n) {
  std::string out;
  out.reserve((n + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= n; i += 3) {
    const uint32_t v = (uint32_t{d[i]} << 16) | (uint32_t{d[i + 1]} << 8) | d[i + 2];
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += kB64[v & 63];
  }
  if (i < n) {
    const uint32_t v = (uint32_t{d[i]} << 16) | (i + 1 < n ? uint32_t{d[i + 1]} << 8 : 0u);
    out += kB64[v >> 18];
    out += kB64[(v >> 12) & 63];
    out += i + 1 < n ? kB64[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::optional<std::vector<uint8_t>> base64_decode(const std::string& s) {
  static const std::array<int8_t, 256> table = [] {
    std::array<int8_t, 256> t{};
    t.fill(-1);
    for (int i = 0; i < 64; ++i) t[static_cast<uint8_t>(kB64[i])] = static_cast<int8_t>(i);
    return t;
  }();
  if (s.size() % 4 != 0) return std::nullopt;
  std::vector<uint8_t> out;
  out.reserve(s.size() / 4 * 3);
  for (size_t i = 0; i < s.size(); i += 4) {
    const bool last = i + 4 == s.size();
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = s[i + static_cast<size_t>(k)];
      if (c == '=' && last && k >= 2) {
        ++pad;
        v[k] = 0;
        continue;
      }
      if (pad) return std::nullopt;  // data after '='
      v[k] = table[static_cast<uint8_t>(c)];
      if (v[k] < 0) return std::nullopt;
    }
    const uint32_t x = (static_cast<uint32_t>(v[0]) << 18) | (static_cast<uint32_t>(v[1]) << 12) |
                       (static_cast<uint32_t>(v[2]) << 6) | static_cast<uint32_t>(v[3]);
    out.push_back(static_cast<uint8_t>(x >> 16));
    if (pad < 2) out.push_back(static_cast<uint8_t>(x >> 8));
    if (pad < 1) out.push_back(static_cast<uint8_t>(x));
  }
  return out;
}

std::string random_id(const char* prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = std::string(prefix) + "_";
  for (int k = 0; k < 2; ++k) {
    const uint64_t v = rng();
    for (int i = 0; i < 12; ++i) id += kHex[(v >> (4 * i)) & 15];
  }
  return id;
}

std::string clip_utf8(const std::string& s, size_t max_bytes) {
  if (s.size() <= max_bytes) return s;
  size_t n = max_bytes;
  while (n > 0 && (static_cast<uint8_t>(s[n]) & 0xC0) == 0x80) --n;  // s[n] starts a sequence
  return s.substr(0, n);
}

Json session_object(const SessionView& s, bool beta) {
  if (beta) {
    return Json{{"id", s.id},
                {"object", "realtime.session"},
                {"model", s.model},
                {"modalities", Json::array({"audio", "text"})},
                {"instructions", s.instructions},
                {"voice", voice_json(s.voice)},
                {"input_audio_format", "pcm16"},
                {"output_audio_format", "pcm16"},
                {"input_audio_transcription", nullptr},
                {"turn_detection", nullptr},
                {"tools", Json::array()},
                {"tool_choice", "auto"},
                {"temperature", s.temperature},
                {"max_response_output_tokens", "inf"}};
  }
  return Json{
      {"type", "realtime"},
      {"object", "realtime.session"},
      {"id", s.id},
      {"model", s.model},
      {"output_modalities", Json::array({"audio"})},
      {"instructions", s.instructions},
      {"audio",
       {{"input",
         {{"format", audio_format(false)},
          {"transcription", nullptr},
          {"noise_reduction", nullptr},
          {"turn_detection", nullptr}}},
        {"output",
         {{"format", audio_format(false)}, {"voice", voice_json(s.voice)}, {"speed", 1.0}}}}},
      {"tools", Json::array()},
      {"tool_choice", "auto"},
      {"max_output_tokens", "inf"},
      {"tracing", nullptr},
      {"prompt", nullptr},
      {"include", nullptr}};
}

Json audio_part(const std::string& transcript, bool beta) {
  return Json{{"type", beta ? "audio" : "output_audio"}, {"transcript", transcript}};
}

Json assistant_item(const std::string& id, const char* status,
                    const std::optional<std::string>& transcript, bool beta) {
  Json content = Json::array();
  if (transcript) content.push_back(audio_part(*transcript, beta));
  return Json{{"id", id},         {"object", "realtime.item"}, {"type", "message"},
              {"status", status}, {"role", "assistant"},       {"content", std::move(content)}};
}

Json response_object(const std::string& id, const std::string& conversation_id, const char* status,
                     const Json& status_details, const Json& output, bool done,
                     const std::optional<std::string>& voice, bool beta) {
  Json r{{"id", id},         {"object", "realtime.response"},
         {"status", status}, {"status_details", status_details},
         {"output", output}, {"conversation_id", conversation_id}};
  if (beta) {
    r["modalities"] = Json::array({"audio", "text"});
    r["voice"] = voice_json(voice);
    r["output_audio_format"] = "pcm16";
    r["max_output_tokens"] = "inf";
  } else {
    r["output_modalities"] = Json::array({"audio"});
    r["max_output_tokens"] = "inf";
    r["audio"] = Json{{"output", {{"format", audio_format(false)}, {"voice", voice_json(voice)}}}};
  }
  r["usage"] = done ? zero_usage() : Json(nullptr);
  return r;
}

const EventNames& event_names(bool beta) {
  static const EventNames ga{"conversation.item.added", "response.output_audio.delta",
                             "response.output_audio.done", "response.output_audio_transcript.delta",
                             "response.output_audio_transcript.done"};
  static const EventNames b{"conversation.item.created", "response.audio.delta",
                            "response.audio.done", "response.audio_transcript.delta",
                            "response.audio_transcript.done"};
  return beta ? b : ga;
}

}  // namespace ppx::server::realtime
