#include "server/chat_session.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>

#include "ppx/audio.h"
#include "ppx/conversation.h"
#include "ppx/error.h"
#include "ppx/ogg_opus.h"
#include "server/http_util.h"

namespace ppx::server {

namespace {

constexpr size_t kMaxQueuedInputBytes = size_t{8} << 20;  // audio not yet consumed by the worker
const char* const kDefaultTextPrompt =
    "You are a wise and friendly teacher. Answer questions or provide advice in a clear and "
    "engaging way.";
const char* const kDefaultVoice = "NATF0.pt";

bool parse_double(const std::string& s, double lo, double hi, double& out) {
  try {
    size_t used = 0;
    const double v = std::stod(s, &used);
    if (used != s.size() || !std::isfinite(v) || v < lo || v > hi) return false;
    out = v;
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

bool parse_int(const std::string& s, long long lo, long long hi, long long& out) {
  try {
    size_t used = 0;
    const long long v = std::stoll(s, &used);
    if (used != s.size() || v < lo || v > hi) return false;
    out = v;
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

std::string fmt_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", s);
  return buf;
}

}  // namespace

// Fills `p` from the query string; returns an error message, or "" when valid.
std::string parse_chat_params(const std::string& query, const ServerOptions& opts,
                              const ServerModel& model, ChatParams& p) {
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

std::vector<uint8_t> message(uint8_t kind, const void* data, size_t n) {
  std::vector<uint8_t> m(1 + n);
  m[0] = kind;
  if (n) std::memcpy(m.data() + 1, data, n);
  return m;
}

int SessionHub::acquire_slot() {
  std::lock_guard<std::mutex> lk(mu);
  if (stopping) return -1;
  for (size_t i = 0; i < slot_used.size(); ++i) {
    if (!slot_used[i]) {
      slot_used[i] = true;
      ++in_use;
      return static_cast<int>(i);
    }
  }
  return -1;
}

void SessionHub::release_slot(int slot) {
  std::lock_guard<std::mutex> lk(mu);
  slot_used[static_cast<size_t>(slot)] = false;
  --in_use;
  --workers;
  cv.notify_all();
}

int SessionHub::sessions_in_use() {
  std::lock_guard<std::mutex> lk(mu);
  return in_use;
}

void ChatSession::kill() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    alive_ = false;
  }
  cv_.notify_all();
}

void ChatSession::begin(const std::string& query) {
  ChatParams p;
  const std::string err = parse_chat_params(query, hub_->opts, hub_->model, p);
  if (!err.empty()) return reject(err);
  const int slot = hub_->acquire_slot();
  if (slot < 0)
    return reject("server busy: all " + std::to_string(hub_->opts.max_sessions) +
                  " sessions in use");
  hub_->metrics.session_started();
  std::fprintf(stderr, "session (slot %d): started, voice '%s', %zu-byte text prompt\n", slot,
               p.voice_path.c_str(), p.text_prompt.size());
  {
    std::lock_guard<std::mutex> lk(hub_->mu);
    ++hub_->workers;
    hub_->sessions.remove_if([](const std::weak_ptr<ChatSession>& w) { return w.expired(); });
    hub_->sessions.push_back(weak_from_this());
  }
  std::thread([self = shared_from_this(), slot, p = std::move(p)]() mutable {
    self->worker(slot, std::move(p));
  }).detach();
}

void ChatSession::reject(const std::string& why) {
  hub_->metrics.rejected(why);
  enqueue(message(kError, why.data(), why.size()));
  enqueue_close();
}

bool ChatSession::on_client_audio(const uint8_t* data, size_t n) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (queued_bytes_ + n > kMaxQueuedInputBytes) return false;
    in_.emplace_back(data, data + n);
    queued_bytes_ += n;
    last_audio_ = Clock::now();
  }
  cv_.notify_all();
  return true;
}

bool ChatSession::alive() {
  std::lock_guard<std::mutex> lk(mu_);
  return alive_;
}

void ChatSession::worker(int slot, ChatParams p) {
  const auto t0 = Clock::now();
  std::string why;
  try {
    why = run(slot, p);
  } catch (const std::exception& e) {
    why = std::string("session failed: ") + e.what();
    send_error(why);
  }
  std::fprintf(stderr, "session (slot %d): ended after %.1f s, %lld frames: %s\n", slot,
               std::chrono::duration<double>(Clock::now() - t0).count(),
               static_cast<long long>(frames_), why.c_str());
  hub_->metrics.session_ended(why);
  enqueue_close();
  hub_->release_slot(slot);
}

std::string ChatSession::run(int slot, const ChatParams& p) {
  const ServerModel& m = hub_->model;
  const int sr = m.sample_rate, fs = m.frame_samples;
  SystemPrompt prompt;
  if (!p.voice_path.empty()) {
    if (p.voice_path.size() > 3 && p.voice_path.compare(p.voice_path.size() - 3, 3, ".pt") == 0)
      prompt.voice = load_voice_embeddings(p.voice_path);
    else
      prompt.voice_audio = prepare_voice_audio(p.voice_path, sr, fs);
  }
  const std::string wrapped = wrap_system_prompt(p.text_prompt);
  if (!wrapped.empty()) prompt.text_tokens = m.tokenizer->encode(wrapped);
  std::unique_ptr<CodecStream> codec;
  std::unique_ptr<LmStepper> stepper;
  {
    std::lock_guard<std::mutex> lk(hub_->backend_mu);
    codec = m.backend->codec_stream(slot);
    stepper = m.backend->lm_stepper(p.gen, p.seed);
  }
  Conversation conv(*codec, *stepper, p.gen);
  const auto ping_every = std::chrono::duration<double>(hub_->opts.ping_interval_s);
  auto last_ping = Clock::now();
  const bool done = conv.run_system_prompts(prompt, [&](int64_t, int64_t) {
    if (!alive()) return false;
    if (Clock::now() - last_ping >= ping_every) {
      enqueue(message(kPing));
      last_ping = Clock::now();
    }
    return true;
  });
  if (!done || !alive()) return "client left during the system prompts";

  OggOpusWriter writer(sr);
  OggOpusReader reader(sr);
  enqueue(message(kHandshake));
  enqueue(message(kAudio, writer.head_page().data(), writer.head_page().size()));
  enqueue(message(kAudio, writer.tags_page().data(), writer.tags_page().size()));
  {
    std::lock_guard<std::mutex> lk(mu_);
    last_audio_ = Clock::now();
  }
  const auto idle = std::chrono::duration<double>(hub_->opts.idle_timeout_s);
  std::deque<std::vector<uint8_t>> batch;
  while (true) {
    Clock::time_point last;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait_for(lk, std::chrono::milliseconds(100), [&] { return !alive_ || !in_.empty(); });
      if (!alive_) return "client gone";
      batch.swap(in_);
      queued_bytes_ = 0;
      last = last_audio_;
    }
    if (batch.empty() && Clock::now() - last > idle) {
      const std::string why =
          "idle timeout: no audio received for " + fmt_seconds(hub_->opts.idle_timeout_s);
      send_error(why);
      return why;
    }
    for (const auto& b : batch) reader.push(b.data(), b.size());
    batch.clear();
    if (reader.failed()) {
      const std::string why = "bad audio stream: " + reader.error();
      send_error(why);
      return why;
    }
    while (reader.available() >= static_cast<size_t>(fs)) {
      const std::vector<float> pcm = reader.take(static_cast<size_t>(fs));
      const auto t_frame = Clock::now();
      const auto fr = conv.step(pcm.data());
      hub_->metrics.frame(std::chrono::duration<double, std::milli>(Clock::now() - t_frame).count(),
                          1000.0 * fs / sr);
      if (!fr) continue;
      const int64_t tok = fr->text_token;
      if (tok != 0 && tok != 3) {
        const std::string piece = m.tokenizer->id_to_piece(static_cast<int>(tok));
        std::string text;  // SentencePiece's word marker U+2581 becomes a space, as upstream
        for (size_t i = 0; i < piece.size();) {
          if (piece.compare(i, 3, "\xE2\x96\x81") == 0) {
            text += ' ';
            i += 3;
          } else {
            text += piece[i++];
          }
        }
        enqueue(message(kText, text.data(), text.size()));
      }
      const std::vector<uint8_t> page = writer.encode_frame(fr->pcm.data(), fs);
      enqueue(message(kAudio, page.data(), page.size()));
      ++frames_;
      if (!alive()) return "client gone";
    }
  }
}

}  // namespace ppx::server
