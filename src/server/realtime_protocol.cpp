#include "server/realtime_protocol.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "server/http_util.h"
#include "server/log.h"

namespace ppx::server {

namespace {

constexpr size_t kMaxEchoBytes = 128;  // client ids echoed back (event_id, item_id)
constexpr size_t kMaxModelBytes = 128;
constexpr int kMaxJsonDepth = 64;

using Json = realtime::Json;

// JSON nested deeper than kMaxJsonDepth (counted outside strings) is refused before parsing.
bool too_deep(const uint8_t* d, size_t n) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < n; ++i) {
    const uint8_t c = d[i];
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

bool valid_model(const std::string& m) {
  if (m.empty() || m.size() > kMaxModelBytes) return false;
  for (const char c : m)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || std::strchr("._:/-", c))) return false;
  return true;
}

const Json* member(const Json& j, const char* key) {
  if (!j.is_object()) return nullptr;
  const auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}

const Json* path(const Json& j, std::initializer_list<const char*> keys) {
  const Json* p = &j;
  for (const char* k : keys)
    if (!(p = member(*p, k))) return nullptr;
  return p;
}

}  // namespace

RealtimeUpgrade realtime_upgrade(std::string_view sec_websocket_protocol, std::string_view openai_beta) {
  constexpr std::string_view kKeyProtocol = "openai-insecure-api-key.";
  RealtimeUpgrade u;
  u.beta = openai_beta.find("realtime=v1") != std::string_view::npos;
  for (const std::string& p : websocket_protocols(sec_websocket_protocol)) {
    if (p == "realtime")
      u.subprotocol = p;
    else if (p.starts_with(kKeyProtocol))
      u.key = p.substr(kKeyProtocol.size());
    else if (p == "openai-beta.realtime-v1")
      u.beta = true;
  }
  return u;
}

RealtimeProtocol::RealtimeProtocol(SessionHub& hub, bool beta)
    : hub_(hub), beta_(beta), event_prefix_(realtime::random_id("event") + "_") {}

Json RealtimeProtocol::event(const char* type) {
  return Json{{"type", type}, {"event_id", event_prefix_ + std::to_string(next_event_++)}};
}

void RealtimeProtocol::emit(const Json& ev) {
  std::string s = ev.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (s.size() > kMaxServerEventBytes) {  // bounded by construction; never sent if not
    log::error("realtime: dropping an oversized server event",
               {{"session", core_->id()}, {"bytes", s.size()}, {"type", ev.value("type", "")}});
    return;
  }
  core_->send(s);
}

std::string RealtimeProtocol::prepare(const std::string& query) {
  const auto q = parse_query(query);
  std::string model = "personaplex";
  if (const auto it = q.find("model"); it != q.end()) {
    if (!valid_model(it->second))
      return "bad model (1 to 128 characters of letters, digits and ._:/-)";
    model = it->second;
  }
  std::lock_guard<std::mutex> lk(mu_);
  t_open_ = Clock::now();
  params_.gen = hub_.model.gen;
  params_.text_prompt = kDefaultTextPrompt;
  params_.seed = std::random_device{}() * 0x9E3779B97F4A7C15ULL + std::random_device{}();
  if (const auto v = resolve_voice(hub_.opts.voice_dir, kDefaultVoice)) {
    params_.voice_path = *v;
    view_.voice = kDefaultVoice;
  }
  view_.id = realtime::random_id("sess");
  view_.model = model;
  view_.instructions = params_.text_prompt;
  view_.temperature = params_.gen.temp;
  return "";
}

void RealtimeProtocol::on_open() { send_session("session.created"); }

void RealtimeProtocol::send_session(const char* type) {
  Json ev = event(type);
  {
    std::lock_guard<std::mutex> lk(mu_);
    ev["session"] = realtime::session_object(view_, beta_);
  }
  emit(ev);
}

void RealtimeProtocol::send_fatal(const char* code, const std::string& message) {
  Json ev = event("error");
  ev["error"] = Json{
      {"type", std::strcmp(code, "bad_request") == 0 ? "invalid_request_error" : "server_error"},
      {"code", code},
      {"message", realtime::clip_utf8(message, 4096)},
      {"param", nullptr},
      {"event_id", nullptr}};
  emit(ev);
}

bool RealtimeProtocol::invalid(const std::string& code, const std::string& message,
                               const char* param, bool counts) {
  Json ev = event("error");
  ev["error"] =
      Json{{"type", "invalid_request_error"},
           {"code", code},
           {"message", message},
           {"param", param ? Json(param) : Json(nullptr)},
           {"event_id", client_event_id_.empty() ? Json(nullptr) : Json(client_event_id_)}};
  emit(ev);
  if (!counts) return true;
  hub_.metrics.ignored_message();
  if (++invalid_events_ >= kMaxInvalidEvents) {
    core_->kill(SessionEnd::kSessionError,
                "too many invalid client events (" + std::to_string(kMaxInvalidEvents) + ")");
    return false;
  }
  return true;
}

bool RealtimeProtocol::on_message(const uint8_t* d, size_t n) {
  client_event_id_.clear();
  const Clock::time_point now = Clock::now();
  if (!client_bytes_.take(static_cast<double>(n), now))  // every event read, parsed or not
    return flood("client events arrive faster than " + std::to_string(static_cast<int>(kClientBytesPerSecond) >> 20) +
                 " MiB a second (after a burst of " + std::to_string(static_cast<int>(kClientBytesBurst) >> 20) +
                 " MiB)");
  if (n > kMaxClientEventBytes)
    return invalid("event_too_large", "client event of " + std::to_string(n) + " bytes; at most " +
                                          std::to_string(kMaxClientEventBytes) + " bytes");
  if (too_deep(d, n)) return invalid("invalid_json", "client event nested too deeply");
  const Json j = Json::parse(d, d + n, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return invalid("invalid_json", "client event is not a JSON object (or not valid UTF-8)");
  if (const Json* id = member(j, "event_id"); id && id->is_string())
    client_event_id_ = realtime::clip_utf8(id->get<std::string>(), kMaxEchoBytes);
  const Json* type_j = member(j, "type");
  if (!type_j || !type_j->is_string())
    return invalid("missing_required_parameter", "client event without a string 'type'", "type");
  const std::string type = type_j->get<std::string>();
  if (type != "input_audio_buffer.append" && !control_events_.take(1, now))
    return flood("events other than input_audio_buffer.append arrive faster than " +
                 std::to_string(static_cast<int>(kControlEventsPerSecond)) + " a second (after a burst of " +
                 std::to_string(static_cast<int>(kControlEventsBurst)) + ")");

  if (type == "input_audio_buffer.append") {
    const Json* a = member(j, "audio");
    if (!a || !a->is_string())
      return invalid("missing_required_parameter", "append without a string 'audio'", "audio");
    const auto pcm = realtime::base64_decode(a->get_ref<const std::string&>());
    if (!pcm) return invalid("invalid_base64", "'audio' is not valid base64", "audio");
    if (pcm->size() % 2 != 0)
      return invalid(
          "invalid_audio_length",
          "'audio' must be 16-bit PCM: an even number of bytes, got " + std::to_string(pcm->size()),
          "audio");
    if (pcm->empty()) return true;
    if (!core_->push_input(pcm->data(), pcm->size())) {
      core_->kill(SessionEnd::kInputOverflow,
                  "audio arrives faster than it can be processed (more than " +
                      std::to_string(kMaxQueuedInputBytes >> 20) + " MiB queued)");
      return false;
    }
    return true;
  }
  if (type == "session.update") {
    if (const Json* s = member(j, "session"); s && s->is_object()) {
      std::lock_guard<std::mutex> lk(mu_);
      apply_session_update(*s);
    }
    send_session("session.updated");
    return true;
  }
  if (type == "input_audio_buffer.commit") {
    Json ev = event("input_audio_buffer.committed");
    ev["previous_item_id"] = nullptr;
    ev["item_id"] = realtime::random_id("item");
    emit(ev);
    return true;
  }
  if (type == "input_audio_buffer.clear") {
    emit(event("input_audio_buffer.cleared"));
    return true;
  }
  if (type == "conversation.item.truncate" || type == "conversation.item.delete" ||
      type == "conversation.item.retrieve") {
    const Json* id = member(j, "item_id");
    if (!id || !id->is_string())
      return invalid("missing_required_parameter", type + " without a string 'item_id'", "item_id");
    const std::string item = realtime::clip_utf8(id->get<std::string>(), kMaxEchoBytes);
    if (type == "conversation.item.retrieve")  // items are not stored (Pipecat: not fatal)
      return invalid("item_retrieve_invalid_item_id", "items are not stored on this server",
                     "item_id", false);
    Json ev = event(type == "conversation.item.truncate" ? "conversation.item.truncated"
                                                         : "conversation.item.deleted");
    ev["item_id"] = item;
    if (type == "conversation.item.truncate") {
      const Json* ci = member(j, "content_index");
      const Json* ms = member(j, "audio_end_ms");
      ev["content_index"] = ci && ci->is_number_integer() ? *ci : Json(0);  // echoed as sent
      ev["audio_end_ms"] = ms && ms->is_number_integer() ? *ms : Json(0);
    }
    emit(ev);
    return true;
  }
  if (type == "conversation.item.create") {
    const Json* item = member(j, "item");
    if (!item || !item->is_object())
      return invalid("missing_required_parameter", "conversation.item.create without 'item'",
                     "item");
    return true;  // accepted and ignored: the model has no text input mid-conversation
  }
  if (type == "response.cancel") {
    cancel_ = true;  // the open response (if any) ends as "cancelled"
    return true;
  }
  if (type == "response.create" || type == "output_audio_buffer.clear") return true;
  return invalid("unknown_event_type",
                 "unknown client event type '" + realtime::clip_utf8(type, kMaxEchoBytes) + "'",
                 "type");
}

bool RealtimeProtocol::flood(const std::string& why) {
  core_->kill(SessionEnd::kSessionError, why);
  return false;
}

void RealtimeProtocol::apply_session_update(const Json& s) {
  if (started_) return;  // the prompts have run: the session stays as it is
  if (const Json* ins = member(s, "instructions"); ins && ins->is_string()) {
    params_.text_prompt = realtime::clip_utf8(ins->get<std::string>(), kMaxTextPromptBytes);
    view_.instructions = params_.text_prompt;
  }
  const Json* voice = path(s, {"audio", "output", "voice"});
  if (!voice) voice = member(s, "voice");  // beta shape
  if (voice && voice->is_string()) {
    const std::string v = voice->get<std::string>();
    for (const std::string& name : {v, v + ".pt", v + ".wav"}) {
      if (const auto p = resolve_voice(hub_.opts.voice_dir, name)) {
        params_.voice_path = *p;
        view_.voice = name;
        break;
      }
    }
  }
  if (const Json* t = member(s, "temperature"); t && t->is_number()) {
    const double x = t->get<double>();
    if (std::isfinite(x) && x >= 0 && x <= 2) {
      params_.gen.temp = x;
      view_.temperature = x;
    }
  }
  updated_ = true;
}

bool RealtimeProtocol::ready(Clock::time_point now, SessionParams& p) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!updated_ && now - t_open_ < kRealtimeStartWait) return false;
  started_ = true;
  p = params_;
  voice_ = view_.voice;
  conversation_id_ = realtime::random_id("conv");
  return true;
}

bool RealtimeProtocol::decode(const std::vector<uint8_t>& chunk, SessionEnd& why,
                              std::string& detail) {
  if (pcm_.size() + chunk.size() / 2 > kMaxBufferedInputSamples) {
    why = SessionEnd::kInputOverflow;
    detail = "audio arrives faster than real time (more than " +
             std::to_string(kMaxBufferedInputSamples / 24000) + " s waiting)";
    return false;
  }
  for (size_t i = 0; i + 1 < chunk.size(); i += 2) {
    const auto v = static_cast<int16_t>(static_cast<uint16_t>(chunk[i] | (chunk[i + 1] << 8)));
    pcm_.push_back(static_cast<float>(v) / 32768.0f);
  }
  return true;
}

std::vector<float> RealtimeProtocol::take(size_t n) {
  n = std::min(n, pcm_.size());
  std::vector<float> out(pcm_.begin(), pcm_.begin() + static_cast<std::ptrdiff_t>(n));
  pcm_.erase(pcm_.begin(), pcm_.begin() + static_cast<std::ptrdiff_t>(n));
  return out;
}

void RealtimeProtocol::drop_early_input() {
  if (pcm_.size() > kKeptEarlySamples)
    pcm_.erase(pcm_.begin(), pcm_.end() - static_cast<std::ptrdiff_t>(kKeptEarlySamples));
}

void RealtimeProtocol::open_response() {
  response_id_ = realtime::random_id("resp");
  item_id_ = realtime::random_id("item");
  transcript_.clear();
  segment_frames_ = silent_run_ = 0;
  open_ = true;
  const auto& names = realtime::event_names(beta_);
  Json ev = event("response.created");
  ev["response"] = realtime::response_object(response_id_, conversation_id_, "in_progress", nullptr,
                                             Json::array(), false, voice_, beta_);
  emit(ev);
  const Json item = realtime::assistant_item(item_id_, "in_progress", std::nullopt, beta_);
  ev = event(names.item_added);
  ev["previous_item_id"] = previous_item_ ? Json(*previous_item_) : Json(nullptr);
  ev["item"] = item;
  emit(ev);
  ev = event("response.output_item.added");
  ev["response_id"] = response_id_;
  ev["output_index"] = 0;
  ev["item"] = item;
  emit(ev);
  ev = part_event("response.content_part.added");
  ev["part"] = realtime::audio_part("", beta_);
  emit(ev);
}

RealtimeProtocol::Json RealtimeProtocol::part_event(const char* type) {
  Json ev = event(type);
  ev["response_id"] = response_id_;
  ev["item_id"] = item_id_;
  ev["output_index"] = 0;
  ev["content_index"] = 0;
  return ev;
}

void RealtimeProtocol::close_response(bool cancelled) {
  const auto& names = realtime::event_names(beta_);
  emit(part_event(names.audio_done));
  Json ev = part_event(names.transcript_done);
  ev["transcript"] = transcript_;
  emit(ev);
  ev = part_event("response.content_part.done");
  ev["part"] = realtime::audio_part(transcript_, beta_);
  emit(ev);
  const Json item = realtime::assistant_item(item_id_, cancelled ? "incomplete" : "completed",
                                             transcript_, beta_);
  ev = event("response.output_item.done");
  ev["response_id"] = response_id_;
  ev["output_index"] = 0;
  ev["item"] = item;
  emit(ev);
  if (!beta_) {  // the beta protocol has no conversation.item.done
    ev = event("conversation.item.done");
    ev["previous_item_id"] = previous_item_ ? Json(*previous_item_) : Json(nullptr);
    ev["item"] = item;
    emit(ev);
  }
  ev = event("response.done");
  ev["response"] = realtime::response_object(
      response_id_, conversation_id_, cancelled ? "cancelled" : "completed",
      cancelled ? Json{{"type", "cancelled"}, {"reason", "client_cancelled"}} : Json(nullptr),
      Json::array({item}), true, voice_, beta_);
  emit(ev);
  previous_item_ = item_id_;
  open_ = false;
}

void RealtimeProtocol::on_frame(const std::vector<float>& pcm, int64_t text_token,
                                const std::string& text) {
  double energy = 0;
  for (const float x : pcm) energy += static_cast<double>(x) * x;
  const double rms = pcm.empty() ? 0.0 : std::sqrt(energy / static_cast<double>(pcm.size()));
  const bool silent = is_pad_token(text_token) && rms < kSilenceRms;
  if (cancel_.exchange(false) && open_) close_response(true);
  if (!open_) {
    if (silent) return;  // between responses silence is not sent: the client plays silence
    open_response();
  }
  std::vector<uint8_t> bytes(pcm.size() * 2);
  for (size_t i = 0; i < pcm.size(); ++i) {
    const float c = std::clamp(pcm[i], -1.0f, 1.0f);
    const auto v = static_cast<int16_t>(std::lrint(c * 32767.0f));
    bytes[2 * i] = static_cast<uint8_t>(static_cast<uint16_t>(v) & 0xFF);
    bytes[2 * i + 1] = static_cast<uint8_t>(static_cast<uint16_t>(v) >> 8);
  }
  const auto& names = realtime::event_names(beta_);
  Json ev = part_event(names.audio_delta);
  ev["delta"] = realtime::base64_encode(bytes.data(), bytes.size());
  emit(ev);
  if (!text.empty()) {
    ev = part_event(names.transcript_delta);
    ev["delta"] = text;
    emit(ev);
    transcript_ += text;
  }
  ++segment_frames_;
  silent_run_ = silent ? silent_run_ + 1 : 0;
  if (silent_run_ >= kSilentFramesToClose || segment_frames_ >= kMaxSegmentFrames)
    close_response(false);
}

void RealtimeProtocol::on_end(SessionEnd why, const std::string& detail) {
  if (open_) close_response(false);
  if (why != SessionEnd::kClientLeft && why != SessionEnd::kClientLeftDuringPrompts)
    send_fatal(label(why), detail);
}

}  // namespace ppx::server
