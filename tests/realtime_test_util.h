// Test helpers for /v1/realtime as Pipecat drives it (test_realtime_pipecat.cpp): base64, user
// speech as PCM16, the validator of every server event against the field rules Pipecat's strict
// parser depends on, and a JSON WebSocket client on one thread.
#pragma once

#include <deque>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include "server_test_util.h"

namespace ppx::realtime_test {

using namespace ppx::server_test;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr int kRate = 24000;
constexpr int kChunk = 480;  // 20 ms, as Pipecat's transports deliver audio
constexpr size_t kMaxEventBytes = 256 * 1024;

// --- base64 -------------------------------------------------------------------------------------

inline std::string b64_encode(const uint8_t* p, size_t n) {
  static const char* k = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((n + 2) / 3 * 4);
  for (size_t i = 0; i < n; i += 3) {
    const uint32_t v = (uint32_t{p[i]} << 16) | (i + 1 < n ? uint32_t{p[i + 1]} << 8 : 0u) |
                       (i + 2 < n ? uint32_t{p[i + 2]} : 0u);
    out += k[(v >> 18) & 63];
    out += k[(v >> 12) & 63];
    out += i + 1 < n ? k[(v >> 6) & 63] : '=';
    out += i + 2 < n ? k[v & 63] : '=';
  }
  return out;
}

// Strict standard base64 (padding required); nullopt when it is not.
inline std::optional<std::vector<uint8_t>> b64_decode(const std::string& s) {
  if (s.size() % 4 != 0) return std::nullopt;
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  std::vector<uint8_t> out;
  out.reserve(s.size() / 4 * 3);
  for (size_t i = 0; i < s.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int j = 0; j < 4; ++j) {
      const char c = s[i + j];
      if (c == '=' && i + 4 == s.size() && j >= 2) {
        v[j] = 0;
        ++pad;
      } else {
        if (pad) return std::nullopt;
        v[j] = val(c);
        if (v[j] < 0) return std::nullopt;
      }
    }
    const uint32_t w =
        (uint32_t(v[0]) << 18) | (uint32_t(v[1]) << 12) | (uint32_t(v[2]) << 6) | uint32_t(v[3]);
    out.push_back(uint8_t(w >> 16));
    if (pad < 2) out.push_back(uint8_t(w >> 8));
    if (pad < 1) out.push_back(uint8_t(w));
  }
  return out;
}

// User speech as PCM16 LE at 24 kHz, repeated to `seconds`.
inline std::vector<uint8_t> speech_pcm16(double seconds) {
  const std::vector<float> x = user_speech();
  const size_t n = static_cast<size_t>(seconds * kRate);
  std::vector<uint8_t> out(2 * n);
  for (size_t i = 0; i < n; ++i) {
    const float f = std::clamp(x[i % x.size()], -1.f, 1.f);
    const auto s = static_cast<int16_t>(std::lround(f * 32767.f));
    out[2 * i] = static_cast<uint8_t>(s & 0xff);
    out[2 * i + 1] = static_cast<uint8_t>((s >> 8) & 0xff);
  }
  return out;
}

inline json append_event(const uint8_t* p, size_t n) {
  return {{"type", "input_audio_buffer.append"}, {"audio", b64_encode(p, n)}};
}

// --- the validator ------------------------------------------------------------------------------

// Server event types Pipecat's parsers know. GA: pipecat/services/openai/realtime/events.py;
// beta: the same file before 1.0 (and openai_realtime_beta/). Each dies on the other's names.
const std::set<std::string> kGaTypes = {"error",
                                        "session.created",
                                        "session.updated",
                                        "conversation.created",
                                        "input_audio_buffer.committed",
                                        "input_audio_buffer.cleared",
                                        "input_audio_buffer.speech_started",
                                        "input_audio_buffer.speech_stopped",
                                        "conversation.item.added",
                                        "conversation.item.done",
                                        "conversation.item.input_audio_transcription.delta",
                                        "conversation.item.input_audio_transcription.completed",
                                        "conversation.item.input_audio_transcription.failed",
                                        "conversation.item.truncated",
                                        "conversation.item.deleted",
                                        "conversation.item.retrieved",
                                        "response.created",
                                        "response.done",
                                        "response.output_item.added",
                                        "response.output_item.done",
                                        "response.content_part.added",
                                        "response.content_part.done",
                                        "response.output_text.delta",
                                        "response.output_text.done",
                                        "response.output_audio_transcript.delta",
                                        "response.output_audio_transcript.done",
                                        "response.output_audio.delta",
                                        "response.output_audio.done",
                                        "response.function_call_arguments.delta",
                                        "response.function_call_arguments.done",
                                        "rate_limits.updated"};
const std::set<std::string> kBetaTypes = {"error",
                                          "session.created",
                                          "session.updated",
                                          "conversation.created",
                                          "input_audio_buffer.committed",
                                          "input_audio_buffer.cleared",
                                          "input_audio_buffer.speech_started",
                                          "input_audio_buffer.speech_stopped",
                                          "conversation.item.created",
                                          "conversation.item.input_audio_transcription.delta",
                                          "conversation.item.input_audio_transcription.completed",
                                          "conversation.item.input_audio_transcription.failed",
                                          "conversation.item.truncated",
                                          "conversation.item.deleted",
                                          "conversation.item.retrieved",
                                          "response.created",
                                          "response.done",
                                          "response.output_item.added",
                                          "response.output_item.done",
                                          "response.content_part.added",
                                          "response.content_part.done",
                                          "response.text.delta",
                                          "response.text.done",
                                          "response.audio_transcript.delta",
                                          "response.audio_transcript.done",
                                          "response.audio.delta",
                                          "response.audio.done",
                                          "response.function_call_arguments.delta",
                                          "response.function_call_arguments.done",
                                          "rate_limits.updated"};

// Error codes Pipecat logs and survives; any other error event ends its receive loop.
const std::set<std::string> kPipecatToleratedErrors = {"response_cancel_not_active",
                                                       "conversation_already_has_active_response",
                                                       "item_retrieve_invalid_item_id"};

class EventValidator {
 public:
  explicit EventValidator(bool beta) : beta_(beta) {}

  // Names of the protocol's events in this dialect.
  std::string audio_delta() const {
    return beta_ ? "response.audio.delta" : "response.output_audio.delta";
  }
  std::string audio_done() const {
    return beta_ ? "response.audio.done" : "response.output_audio.done";
  }
  std::string transcript_delta() const {
    return beta_ ? "response.audio_transcript.delta" : "response.output_audio_transcript.delta";
  }
  std::string transcript_done() const {
    return beta_ ? "response.audio_transcript.done" : "response.output_audio_transcript.done";
  }
  std::string text_delta() const {
    return beta_ ? "response.text.delta" : "response.output_text.delta";
  }
  std::string text_done() const {
    return beta_ ? "response.text.done" : "response.output_text.done";
  }
  std::string item_added() const {
    return beta_ ? "conversation.item.created" : "conversation.item.added";
  }

  // Checks one raw server message; returns the parsed event (null when it is not JSON).
  json check(const std::string& raw) {
    ++count_;
    const std::string at = "event #" + std::to_string(count_);
    if (raw.size() >= kMaxEventBytes)
      bad(at + ": " + std::to_string(raw.size()) + " bytes (limit 256 KiB)");
    json e = json::parse(raw, nullptr, false);
    if (e.is_discarded() || !e.is_object()) {
      bad(at + ": not a JSON object: " + raw.substr(0, 200));
      return nullptr;
    }
    const std::string type = str(e, "type", at);
    const std::string where = at + " (" + type + ")";
    if (!(beta_ ? kBetaTypes : kGaTypes).count(type))
      bad(where + ": not a " + std::string(beta_ ? "beta" : "GA") + " Realtime server event type");
    const std::string id = str(e, "event_id", where);
    if (id.empty()) bad(where + ": empty event_id");
    if (!ids_.insert(id).second) bad(where + ": event_id " + id + " repeated");
    types_.push_back(type);
    if (count_ == 1 && type != "session.created")
      bad(where + ": the first event must be session.created");

    if (type == "session.created" || type == "session.updated") {
      session(e, where);
    } else if (type == "error") {
      if (obj(e, "error", where)) {
        str(e["error"], "type", where + " error");
        str(e["error"], "message", where + " error");
        opt_str(e["error"], "code", where + " error");
        ++errors_;
        const json& c = e["error"]["code"];
        if (!(c.is_string() && kPipecatToleratedErrors.count(c.get<std::string>())))
          ++fatal_errors_;
      }
    } else if (type == "conversation.created") {
      if (obj(e, "conversation", where)) {
        str(e["conversation"], "id", where);
        if (e["conversation"].value("object", "") != "realtime.conversation")
          bad(where + ": conversation.object must be realtime.conversation");
      }
    } else if (type == "response.created") {
      response(e, where, false);
      if (open_) bad(where + ": a response opened while " + open_->id + " is open");
      open_ = Open{e["response"].value("id", ""), "", {type}, 0};
      if (e["response"].value("status", "") != "in_progress")
        bad(where + ": a new response's status must be in_progress");
    } else if (type == "response.done") {
      response(e, where, true);
      const std::string rid = e.contains("response") ? e["response"].value("id", "") : "";
      if (!open_) {
        bad(where + ": response.done without an open response");
      } else {
        if (rid != open_->id) bad(where + ": response.done for " + rid + ", open is " + open_->id);
        open_->steps.push_back(type);
        const std::string status = e["response"].value("status", "");
        if (status == "failed") bad(where + ": status failed (an error for Pipecat)");
        if (status == "in_progress") bad(where + ": response.done with status in_progress");
        for (const auto& it : e["response"]["output"])
          if (it.is_object() && it.value("id", "") != open_->item && !open_->item.empty())
            bad(where + ": output item " + it.value("id", "") + " is not the response's item " +
                open_->item);
        done_.push_back(*open_);
        closed_ids_.insert(open_->id);
        open_.reset();
      }
    } else if (type == item_added() || type == "conversation.item.done") {
      if (obj(e, "item", where)) item(e["item"], where);
      opt_str(e, "previous_item_id", where);
      if (e.contains("item") && e["item"].value("role", "") == "assistant") {
        if (!open_) {
          bad(where + ": an assistant item outside a response");
        } else if (type == item_added()) {
          if (!open_->item.empty())
            bad(where + ": a second assistant item in response " + open_->id);
          open_->item = e["item"].value("id", "");
          open_->steps.push_back(type);
          if (!beta_ && e["item"].value("status", "") != "in_progress")
            bad(where + ": a new assistant item's status must be in_progress");
        } else if (e["item"].value("id", "") != open_->item) {
          bad(where + ": conversation.item.done for another item");
        }
      }
    } else if (type == "response.output_item.added" || type == "response.output_item.done") {
      str(e, "response_id", where);
      integer(e, "output_index", where);
      if (obj(e, "item", where)) item(e["item"], where);
      in_response(e, where, e.contains("item") ? e["item"].value("id", "") : "");
    } else if (type == "response.content_part.added" || type == "response.content_part.done") {
      for (const char* k : {"response_id", "item_id"}) str(e, k, where);
      for (const char* k : {"output_index", "content_index"}) integer(e, k, where);
      if (obj(e, "part", where)) content(e["part"], where + " part");
      in_response(e, where, e.value("item_id", ""));
    } else if (type == audio_delta() || type == transcript_delta() || type == text_delta() ||
               type == audio_done() || type == transcript_done() || type == text_done()) {
      for (const char* k : {"response_id", "item_id"}) str(e, k, where);
      for (const char* k : {"output_index", "content_index"}) integer(e, k, where);
      if (type == audio_delta() || type == transcript_delta() || type == text_delta())
        str(e, "delta", where);
      if (type == transcript_done()) str(e, "transcript", where);
      if (type == text_done()) str(e, "text", where);
      in_response(e, where, e.value("item_id", ""));
      if (type == audio_delta() && e["delta"].is_string()) {
        const auto pcm = b64_decode(e["delta"].get<std::string>());
        if (!pcm) {
          bad(where + ": delta is not base64");
        } else {
          if (pcm->empty() || pcm->size() % 2)
            bad(where + ": " + std::to_string(pcm->size()) + " audio bytes (must be even, > 0)");
          audio_samples_ += pcm->size() / 2;
          ++audio_deltas_;
        }
        if (open_ && open_->audio_deltas++ == 0) open_->steps.push_back(type);
      }
      if (type == transcript_delta() && e["delta"].is_string()) {
        ++transcript_deltas_;
        transcript_ += e["delta"].get<std::string>();
      }
      if (type == audio_done() && open_) open_->steps.push_back(type);
    } else if (type == "input_audio_buffer.speech_started") {
      integer(e, "audio_start_ms", where);
      str(e, "item_id", where);
      if (open_)
        bad(where + ": speech_started while response " + open_->id + " is open (close it first)");
    } else if (type == "input_audio_buffer.speech_stopped") {
      integer(e, "audio_end_ms", where);
      str(e, "item_id", where);
    } else if (type == "input_audio_buffer.committed") {
      str(e, "item_id", where);
      opt_str(e, "previous_item_id", where);
    } else if (type == "conversation.item.truncated") {
      str(e, "item_id", where);
      integer(e, "content_index", where);
      integer(e, "audio_end_ms", where);
    } else if (type == "conversation.item.deleted") {
      str(e, "item_id", where);
    } else if (type == "conversation.item.retrieved") {
      if (obj(e, "item", where)) item(e["item"], where);
    } else if (type.rfind("conversation.item.input_audio_transcription.", 0) == 0) {
      str(e, "item_id", where);
      integer(e, "content_index", where);
      if (type.size() > 6 && type.substr(type.size() - 6) == ".delta") str(e, "delta", where);
      if (type.size() > 10 && type.substr(type.size() - 10) == ".completed")
        str(e, "transcript", where);
    } else if (type == "rate_limits.updated") {
      if (!e.contains("rate_limits") || !e["rate_limits"].is_array())
        bad(where + ": rate_limits is not a list");
    } else if (type.rfind("response.function_call_arguments.", 0) == 0) {
      for (const char* k : {"response_id", "item_id", "call_id"}) str(e, k, where);
    }
    return e;
  }

  // Responses whose events came as created -> assistant item -> audio deltas -> audio done -> done.
  int complete_lifecycles() const {
    const std::vector<std::string> want = {"response.created", item_added(), audio_delta(),
                                           audio_done(), "response.done"};
    int n = 0;
    for (const auto& r : done_) n += r.steps == want;
    return n;
  }
  std::string lifecycles() const {
    std::string s;
    for (const auto& r : done_) {
      s += "[";
      for (const auto& st : r.steps) s += st + " ";
      s += "] ";
    }
    return s;
  }

  const std::vector<std::string>& problems() const { return problems_; }
  std::string report() const {
    std::string s;
    for (size_t i = 0; i < problems_.size() && i < 20; ++i) s += "  " + problems_[i] + "\n";
    if (problems_.size() > 20) s += "  ... " + std::to_string(problems_.size() - 20) + " more\n";
    return s;
  }
  int count(const std::string& type) const {
    return static_cast<int>(std::count(types_.begin(), types_.end(), type));
  }
  size_t audio_samples() const { return audio_samples_; }
  int audio_deltas() const { return audio_deltas_; }
  int transcript_deltas() const { return transcript_deltas_; }
  const std::string& transcript() const { return transcript_; }
  int errors() const { return errors_; }
  int fatal_errors() const { return fatal_errors_; }
  bool response_open() const { return open_.has_value(); }
  // The assistant item now playing (what Pipecat truncates), or the last one.
  std::string current_item() const {
    if (open_ && !open_->item.empty()) return open_->item;
    return done_.empty() ? "" : done_.back().item;
  }

 private:
  struct Open {
    std::string id, item;
    std::vector<std::string> steps;
    int audio_deltas = 0;
  };

  void bad(const std::string& m) { problems_.push_back(m); }
  std::string str(const json& o, const char* k, const std::string& where) {
    if (!o.is_object() || !o.contains(k) || !o[k].is_string()) {
      bad(where + ": " + k + " missing or not a string");
      return "";
    }
    return o[k].get<std::string>();
  }
  void opt_str(const json& o, const char* k, const std::string& where) {
    if (o.is_object() && o.contains(k) && !o[k].is_null() && !o[k].is_string())
      bad(where + ": " + k + " is neither a string nor null");
  }
  void integer(const json& o, const char* k, const std::string& where) {
    if (!o.is_object() || !o.contains(k) || !o[k].is_number_integer())
      bad(where + ": " + k + " missing or not an integer");
  }
  bool obj(const json& o, const char* k, const std::string& where) {
    if (!o.contains(k) || !o[k].is_object()) {
      bad(where + ": " + k + " missing or not an object");
      return false;
    }
    return true;
  }
  void one_of(const json& o, const char* k, const std::set<std::string>& allowed,
              const std::string& where, bool nullable = true) {
    if (!o.is_object() || !o.contains(k) || (nullable && o[k].is_null())) return;
    if (!o[k].is_string() || !allowed.count(o[k].get<std::string>()))
      bad(where + ": " + k + " = " + o[k].dump() + " is not allowed");
  }

  void content(const json& c, const std::string& where) {
    if (!c.is_object()) return bad(where + ": content part is not an object");
    if (!c.contains("type") || !c["type"].is_string())
      return bad(where + ": content part without type");
    one_of(c, "type",
           {"text", "audio", "input_text", "input_audio", "input_image", "output_text",
            "output_audio"},
           where, false);
    for (const char* k : {"text", "audio", "transcript"}) opt_str(c, k, where + " content");
  }
  void item(const json& it, const std::string& where) {
    const std::string w = where + " item";
    if (!it.is_object()) return bad(w + " is not an object");
    str(it, "id", w);
    if (!it.contains("type")) bad(w + ": type missing");
    one_of(it, "type", {"message", "function_call", "function_call_output"}, w, false);
    one_of(it, "status", {"completed", "in_progress", "incomplete"}, w);
    one_of(it, "role", {"user", "assistant", "system"}, w);
    if (it.contains("object") && !it["object"].is_null() && it["object"] != "realtime.item")
      bad(w + ": object must be realtime.item");
    if (it.contains("content") && !it["content"].is_null()) {
      if (!it["content"].is_array()) return bad(w + ": content is not a list");
      for (const auto& c : it["content"]) content(c, w);
    }
  }
  void usage(const json& u, const std::string& where) {
    if (!u.is_object()) return bad(where + ": usage missing or not an object");
    for (const char* k : {"total_tokens", "input_tokens", "output_tokens"})
      integer(u, k, where + " usage");
    for (const char* k : {"input_token_details", "output_token_details"})
      if (!u.contains(k) || !u[k].is_object())
        bad(where + ": usage." + k + " missing or not an object");
  }
  void response(const json& e, const std::string& where, bool done) {
    if (!obj(e, "response", where)) return;
    const json& r = e["response"];
    str(r, "id", where + " response");
    if (r.value("object", "") != "realtime.response")
      bad(where + ": response.object must be realtime.response");
    if (!r.contains("status")) bad(where + ": response.status missing");
    one_of(r, "status", {"completed", "in_progress", "incomplete", "cancelled", "failed"}, where,
           false);
    if (!r.contains("status_details")) bad(where + ": response.status_details key missing");
    if (!r.contains("output") || !r["output"].is_array()) {
      bad(where + ": response.output missing or not a list");
    } else {
      for (const auto& it : r["output"]) item(it, where + " output");
    }
    const char* mod = beta_ ? "modalities" : "output_modalities";
    if (r.contains(mod) && !r[mod].is_null()) modalities(r[mod], where);
    if (done) usage(r.contains("usage") ? r["usage"] : json(), where);
  }
  void modalities(const json& m, const std::string& where) {
    if (!m.is_array()) return bad(where + ": modalities is not a list");
    for (const auto& x : m)
      if (!x.is_string() || (x != "text" && x != "audio")) bad(where + ": modality " + x.dump());
  }
  void format(const json& f, const std::string& where) {
    if (f.is_null()) return;
    if (!f.is_object()) return bad(where + ": format is not an object");
    one_of(f, "type", {"audio/pcm", "audio/pcmu", "audio/pcma"}, where, false);
    if (f.value("type", "") == "audio/pcm" && (!f.contains("rate") || f["rate"] != kRate))
      bad(where + ": audio/pcm rate must be 24000");
  }
  void session(const json& e, const std::string& where) {
    if (!obj(e, "session", where)) return;
    const json& s = e["session"];
    if (!beta_ && s.value("type", "") != "realtime")
      bad(where + ": session.type must be \"realtime\"");
    if (s.contains("object") && !s["object"].is_null() && s["object"] != "realtime.session")
      bad(where + ": session.object must be realtime.session");
    opt_str(s, "id", where + " session");
    opt_str(s, "model", where + " session");
    opt_str(s, "instructions", where + " session");
    if (s.contains("tool_choice") && !s["tool_choice"].is_null()) {
      if (!s["tool_choice"].is_string())
        bad(where + ": tool_choice must be a string");
      else
        one_of(s, "tool_choice", {"auto", "none", "required"}, where);
    }
    if (s.contains("tools") && !s["tools"].is_null() && !s["tools"].is_array())
      bad(where + ": tools is not a list");
    if (s.contains("max_output_tokens") && !s["max_output_tokens"].is_null() &&
        !s["max_output_tokens"].is_number_integer() && s["max_output_tokens"] != "inf")
      bad(where + ": max_output_tokens must be an integer or \"inf\"");
    if (s.contains("expires_at") && !s["expires_at"].is_null() &&
        !s["expires_at"].is_number_integer())
      bad(where + ": expires_at must be an integer");
    if (beta_) {
      if (s.contains("modalities") && !s["modalities"].is_null())
        modalities(s["modalities"], where);
      for (const char* k : {"input_audio_format", "output_audio_format"})
        if (s.contains(k) && !s[k].is_null() && s[k] != "pcm16")
          bad(where + ": " + k + " must be pcm16");
      opt_str(s, "voice", where);
      return;
    }
    if (s.contains("output_modalities") && !s["output_modalities"].is_null())
      modalities(s["output_modalities"], where);
    if (s.contains("audio") && !s["audio"].is_null()) {
      const json& a = s["audio"];
      if (!a.is_object()) return bad(where + ": audio is not an object");
      if (a.contains("input") && a["input"].is_object()) {
        const json& in = a["input"];
        if (in.contains("format")) format(in["format"], where + " audio.input");
        if (in.contains("turn_detection") && !in["turn_detection"].is_null() &&
            !in["turn_detection"].is_boolean()) {
          if (!in["turn_detection"].is_object())
            bad(where + ": turn_detection must be an object, a bool or null");
          else
            one_of(in["turn_detection"], "type", {"server_vad", "semantic_vad"},
                   where + " turn_detection");
        }
        if (in.contains("transcription") && !in["transcription"].is_null()) {
          if (!in["transcription"].is_object())
            bad(where + ": transcription must be an object or null");
          else
            opt_str(in["transcription"], "model", where + " transcription");
        }
        if (in.contains("noise_reduction") && !in["noise_reduction"].is_null()) {
          if (!in["noise_reduction"].is_object())
            bad(where + ": noise_reduction must be an object or null");
          else
            one_of(in["noise_reduction"], "type", {"near_field", "far_field"}, where);
        }
      }
      if (a.contains("output") && a["output"].is_object()) {
        const json& out = a["output"];
        if (out.contains("format")) format(out["format"], where + " audio.output");
        opt_str(out, "voice", where + " audio.output");
        if (out.contains("speed") && !out["speed"].is_null() && !out["speed"].is_number())
          bad(where + ": audio.output.speed must be a number");
      }
    }
  }
  // Every response-scoped event belongs to the open response and its assistant item.
  void in_response(const json& e, const std::string& where, const std::string& item_id) {
    const std::string rid = e.value("response_id", "");
    if (!open_) {
      bad(where +
          (closed_ids_.count(rid) ? ": after its response.done" : ": outside any response"));
      return;
    }
    if (rid != open_->id)
      bad(where + ": response_id " + rid + ", the open response is " + open_->id);
    if (open_->item.empty())
      bad(where + ": before the response's assistant item was added");
    else if (item_id != open_->item)
      bad(where + ": item_id " + item_id + ", the response's item is " + open_->item);
  }

  bool beta_;
  int count_ = 0, errors_ = 0, fatal_errors_ = 0, audio_deltas_ = 0, transcript_deltas_ = 0;
  size_t audio_samples_ = 0;
  std::string transcript_;
  std::set<std::string> ids_, closed_ids_;
  std::vector<std::string> types_, problems_;
  std::optional<Open> open_;
  std::vector<Open> done_;
};

// --- a JSON WebSocket client on one thread ------------------------------------------------------

// Sends queued text messages, reads every server message, ticks every 20 ms from the upgrade; a
// run ends with the connection closed: by the server, by stop() (a WebSocket close, or a bare TCP
// close with stop(true)), or at the deadline.
class RtClient {
 public:
  // The HTTP status of the upgrade: 101 when connected.
  int connect(uint16_t port, const std::string& target, const Headers& headers = {}) {
    beast::error_code ec;
    beast::get_lowest_layer(ws_).socket().connect(
        tcp::endpoint(net::ip::make_address("127.0.0.1"), port), ec);
    if (ec) return 0;
    ws_.read_message_max(64 << 20);
    ws_.text(true);
    ws_.set_option(websocket::stream_base::decorator([headers](websocket::request_type& r) {
      for (const auto& [k, v] : headers) r.set(k, v);
    }));
    websocket::response_type res;
    ws_.handshake(res, "127.0.0.1:" + std::to_string(port), target, ec);
    opened_ = Clock::now();
    return static_cast<int>(res.result_int());
  }

  void send(const json& j) { send_raw(j.dump()); }
  void send_raw(std::string s) {
    if (closing_ || ended_) return;
    out_.push_back(std::move(s));
    if (out_.size() == 1) write_next();
  }
  void stop(bool drop = false) {
    stop_requested_ = true;
    drop_ = drop;
  }

  void run(const std::function<void(const std::string&)>& on_event,
           const std::function<void(int)>& on_tick, std::chrono::milliseconds deadline) {
    net::steady_timer tick(ioc_);
    limit_ = std::make_unique<net::steady_timer>(ioc_);
    tick_ = &tick;
    int k = 0;
    std::function<void()> schedule = [&] {
      tick.expires_at(opened_ + std::chrono::milliseconds(20) * k);
      tick.async_wait([&](beast::error_code e) {
        if (e || closing_ || ended_) return;
        if (on_tick) on_tick(k);
        ++k;
        if (stop_requested_) return begin_close();
        schedule();
      });
    };
    std::function<void()> read_next = [&] {
      ws_.async_read(buf_, [&](beast::error_code ec, size_t) {
        if (ec) {
          if (!closing_) {  // (with our close pending, the read ends as operation_aborted)
            server_closed_ = true;
            close_error_ = ec;
            close_reason_ = ws_.reason();
          }
          ended_ = true;
          tick.cancel();
          if (!closing_ || drop_) limit_->cancel();  // else the close handshake's guard stays
          return;
        }
        const std::string msg = beast::buffers_to_string(buf_.data());
        buf_.consume(buf_.size());
        if (!closing_) {
          on_event(msg);
          if (stop_requested_) begin_close();
        }
        read_next();
      });
    };
    limit_->expires_after(deadline);
    limit_->async_wait([&](beast::error_code e) {
      if (!e) begin_close();
    });
    if (on_tick) schedule();
    read_next();
    ioc_.run();
    tick_ = nullptr;
  }

  bool server_closed() const { return server_closed_; }  // the server ended the connection
  bool clean_close() const { return clean_close_; }      // our close was answered with a close
  beast::error_code close_error() const { return close_error_; }
  websocket::close_reason close_reason() const { return close_reason_; }

 private:
  void begin_close() {
    if (closing_ || ended_) return;
    closing_ = true;
    if (tick_) tick_->cancel();
    // Whatever happens, the connection is gone 5 s from now.
    limit_->expires_after(5s);
    limit_->async_wait([this](beast::error_code e) {
      if (e) return;
      beast::error_code ec;
      beast::get_lowest_layer(ws_).socket().close(ec);
    });
    if (drop_) {
      beast::error_code ec;
      beast::get_lowest_layer(ws_).socket().close(ec);
      return;
    }
    if (out_.empty()) close_now();
  }
  // The close handshake: its result is the close operation's (a pending read is aborted).
  void close_now() {
    ws_.async_close(websocket::close_code::normal, [this](beast::error_code ec) {
      clean_close_ = !ec;
      if (ec) close_error_ = ec;
      limit_->cancel();
    });
  }
  void write_next() {
    ws_.async_write(net::buffer(out_.front()), [this](beast::error_code ec, size_t) {
      if (ec) {
        out_.clear();
        return;
      }
      out_.pop_front();
      if (!out_.empty()) return write_next();
      if (closing_ && !drop_) close_now();
    });
  }

  net::io_context ioc_;
  websocket::stream<beast::tcp_stream> ws_{ioc_};
  beast::flat_buffer buf_;
  std::deque<std::string> out_;
  std::unique_ptr<net::steady_timer> limit_;
  net::steady_timer* tick_ = nullptr;
  bool stop_requested_ = false, drop_ = false, closing_ = false, ended_ = false;
  bool server_closed_ = false, clean_close_ = false;
  beast::error_code close_error_;
  websocket::close_reason close_reason_;
  Clock::time_point opened_;
};

}  // namespace ppx::realtime_test
