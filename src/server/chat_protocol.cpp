#include "server/chat_protocol.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>

#include "ppx/audio.h"
#include "ppx/conversation.h"
#include "ppx/error.h"
#include "ppx/ogg_opus.h"
#include "server/http_util.h"

namespace ppx::server {

namespace {

// The whole of `s` as one decimal number (no white space, sign "+", hex or trailing text), within
// [lo, hi] and finite.
bool parse_double(const std::string& s, double lo, double hi, double& out) {
  double v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v, std::chars_format::general);
  if (ec != std::errc() || end != s.data() + s.size() || !std::isfinite(v) || v < lo || v > hi) return false;
  out = v;
  return true;
}

bool parse_int(const std::string& s, long long lo, long long hi, long long& out) {
  long long v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size() || v < lo || v > hi) return false;
  out = v;
  return true;
}

}  // namespace

// Fills `p` from the query string; returns an error message, or "" when valid.
std::string parse_chat_params(const std::string& query, const ServerOptions& opts,
                              const ServerModel& model, SessionParams& p) {
  const auto q = parse_query(query);
  auto get = [&](const char* key) -> const std::string* {
    const auto it = q.find(key);
    return it == q.end() ? nullptr : &it->second;
  };
  p.gen = model.gen;
  p.text_prompt = kDefaultTextPrompt;
  if (const auto* t = get("text_prompt")) p.text_prompt = *t;
  if (p.text_prompt.size() > kMaxTextPromptBytes)
    return "text_prompt is too long (" + std::to_string(p.text_prompt.size()) + " bytes, at most " +
           std::to_string(kMaxTextPromptBytes) + ")";
  if (!is_valid_utf8(p.text_prompt)) return "text_prompt is not valid UTF-8";
  if (const auto* v = get("voice_prompt")) {
    if (!v->empty()) {
      const auto path = resolve_voice(opts.voice_dir, *v);
      if (!path) return "unknown voice_prompt (not a file listed by /api/voices)";
      p.voice_path = *path;
    }
  } else if (const auto path = resolve_voice(opts.voice_dir, kDefaultVoice)) {
    p.voice_path = *path;
  }
  struct D {
    const char* key;
    double* dst;
  };
  for (const D& d :
       {D{"text_temperature", &p.gen.temp_text}, D{"audio_temperature", &p.gen.temp}}) {
    if (const auto* s = get(d.key))
      if (!parse_double(*s, 0.0, 100.0, *d.dst))
        return std::string("bad ") + d.key + " (a number in [0, 100])";
  }
  struct K {
    const char* key;
    int* dst;
  };
  for (const K& k : {K{"text_topk", &p.gen.top_k_text}, K{"audio_topk", &p.gen.top_k}}) {
    if (const auto* s = get(k.key)) {
      long long v = 0;
      if (!parse_int(*s, 0, 1 << 20, v))
        return std::string("bad ") + k.key + " (an integer in [0, 1048576])";
      *k.dst = static_cast<int>(v);
    }
  }
  long long text_seed = -1, audio_seed = -1;
  for (auto [key, dst] :
       {std::pair{"text_seed", &text_seed}, std::pair{"audio_seed", &audio_seed}}) {
    if (const auto* s = get(key))
      if (!s->empty() && !parse_int(*s, -1, (1LL << 62), *dst)) return std::string("bad ") + key;
  }
  if (text_seed < 0 && audio_seed < 0)
    p.seed = std::random_device{}() * 0x9E3779B97F4A7C15ULL + std::random_device{}();
  else
    p.seed = static_cast<uint64_t>(std::max(audio_seed, 0LL)) * 1000003ULL +
             static_cast<uint64_t>(std::max(text_seed, 0LL));
  return "";
}

std::vector<uint8_t> message_of(uint8_t kind, const std::string& text) {
  return message(kind, text.data(), text.size());
}

std::vector<uint8_t> message(uint8_t kind, const void* data, size_t n) {
  std::vector<uint8_t> m(1 + n);
  m[0] = kind;
  if (n) std::memcpy(m.data() + 1, data, n);
  return m;
}

ChatProtocol::ChatProtocol(SessionHub& hub) : hub_(hub) {}
ChatProtocol::~ChatProtocol() = default;

std::string ChatProtocol::prepare(const std::string& query) {
  return parse_chat_params(query, hub_.opts, hub_.model, params_);
}

bool ChatProtocol::on_message(const uint8_t* d, size_t n) {
  if (n > 1 && d[0] == kAudio) {
    if (!core_->push_input(d + 1, n - 1)) {
      // Stop reading; the worker says why and closes.
      core_->kill(SessionEnd::kInputOverflow,
                  "audio arrives faster than it can be processed (more than " +
                      std::to_string(kMaxQueuedInputBytes >> 20) + " MiB queued)");
      return false;
    }
  } else {
    hub_.metrics.ignored_message();  // other kinds and empty payloads, as upstream
  }
  return true;
}

void ChatProtocol::send_fatal(const char*, const std::string& text) {
  core_->send(message_of(kError, text));
}

bool ChatProtocol::ready(Clock::time_point now, SessionParams& p) {
  p = params_;
  reader_ = std::make_unique<OggOpusReader>(hub_.model.sample_rate);
  last_ping_ = now;
  return true;
}

bool ChatProtocol::decode(const std::vector<uint8_t>& chunk, SessionEnd& why, std::string& detail) {
  reader_->push(chunk.data(), chunk.size());
  if (reader_->overflowed()) {  // as /v1/realtime says it
    why = SessionEnd::kInputOverflow;
    detail = "audio arrives faster than real time (more than " +
             std::to_string(OggOpusReader::kDefaultMaxBufferedSamples / static_cast<size_t>(hub_.model.sample_rate)) + " s waiting)";
    return false;
  }
  if (reader_->failed()) {
    why = SessionEnd::kBadAudio;
    detail = "bad audio stream: " + reader_->error();
    return false;
  }
  return true;
}

size_t ChatProtocol::available() const { return reader_->available(); }

std::vector<float> ChatProtocol::take(size_t n) { return reader_->take(n); }

void ChatProtocol::on_prompt_tick(Clock::time_point now) {
  if (now - last_ping_ >= std::chrono::duration<double>(hub_.opts.ping_interval_s)) {
    core_->send(message_of(kPing));
    last_ping_ = now;
  }
}

void ChatProtocol::on_ready() {
  writer_ = std::make_unique<OggOpusWriter>(hub_.model.sample_rate);
  core_->send(message_of(kHandshake));
  core_->send(message(kAudio, writer_->head_page().data(), writer_->head_page().size()));
  core_->send(message(kAudio, writer_->tags_page().data(), writer_->tags_page().size()));
}

void ChatProtocol::on_frame(const std::vector<float>& pcm, int64_t text_token,
                            const std::string& text) {
  if (!is_pad_token(text_token)) core_->send(message(kText, text.data(), text.size()));
  const std::vector<uint8_t> page = writer_->encode_frame(pcm.data(), static_cast<int>(pcm.size()));
  core_->send(message(kAudio, page.data(), page.size()));
}

void ChatProtocol::on_end(SessionEnd why, const std::string& detail) {
  if (why != SessionEnd::kClientLeft && why != SessionEnd::kClientLeftDuringPrompts)
    core_->send(message_of(kError, detail));
}

}  // namespace ppx::server
