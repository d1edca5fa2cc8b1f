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

std::vector<uint8_t> message_of(uint8_t kind, const std::string& text) {
  return message(kind, text.data(), text.size());
}

std::vector<uint8_t> message(uint8_t kind, const void* data, size_t n) {
  std::vector<uint8_t> m(1 + n);
  m[0] = kind;
  if (n) std::memcpy(m.data() + 1, data, n);
  return m;
}

int SessionHub::acquire_slot(const std::shared_ptr<ChatSession>& s) {
  std::lock_guard<std::mutex> lk(mu);
  if (stopping || draining || !device_error.empty()) return -2;
  for (size_t i = 0; i < slot_used.size(); ++i) {
    if (!slot_used[i]) {
      slot_used[i] = true;
      ++in_use;
      ++workers;
      sessions.remove_if([](const std::weak_ptr<ChatSession>& w) { return w.expired(); });
      sessions.push_back(s);
      return static_cast<int>(i);
    }
  }
  return -1;
}

void SessionHub::start_worker(int slot, std::function<void()> body) {
  std::thread previous;
  {
    std::lock_guard<std::mutex> lk(mu);
    previous = std::move(slot_threads[static_cast<size_t>(slot)]);
  }
  // The previous worker released this slot as its last step: it is finishing now.
  if (previous.joinable()) previous.join();
  std::unique_lock<std::mutex> lk(mu);  // held so the new worker cannot release before it is stored
  try {
    slot_threads[static_cast<size_t>(slot)] = std::thread(std::move(body));
  } catch (...) {
    lk.unlock();
    release_slot(slot);
    throw;
  }
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

void SessionHub::kill_all(SessionEnd why, const std::string& message) {
  std::list<std::weak_ptr<ChatSession>> live;
  {
    std::lock_guard<std::mutex> lk(mu);
    live = sessions;
  }
  for (auto& w : live)
    if (auto s = w.lock()) s->kill(why, message);
}

std::string SessionHub::unavailable() {
  std::lock_guard<std::mutex> lk(mu);
  if (!device_error.empty()) return "device failed: " + device_error;
  if (draining || stopping) return "draining";
  return "";
}

void ChatSession::kill(SessionEnd why, const std::string& message) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (alive_) {
      alive_ = false;
      end_ = why;
      end_message_ = message;
    }
  }
  cv_.notify_all();
}

SessionEnd ChatSession::killed(std::string& detail) {
  std::lock_guard<std::mutex> lk(mu_);
  detail = end_message_;
  return end_;
}

void ChatSession::begin(const std::string& query) {
  try {
    ChatParams p;
    const std::string err = parse_chat_params(query, hub_->opts, hub_->model, p);
    if (!err.empty()) return reject(Rejection::kBadRequest, err);
    const int slot = hub_->acquire_slot(shared_from_this());
    if (slot == -1)
      return reject(
          Rejection::kBusy,
          "server busy: all " + std::to_string(hub_->opts.max_sessions) + " sessions in use");
    if (slot < 0) return reject(Rejection::kDraining, "server unavailable: " + hub_->unavailable());
    std::fprintf(stderr, "session (slot %d): started, voice '%s', %zu-byte text prompt\n", slot,
                 p.voice_path.c_str(), p.text_prompt.size());
    hub_->start_worker(
        slot, [self = shared_from_this(), slot, p = std::move(p)] { self->worker(slot, p); });
    hub_->metrics.session_started();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "session setup failed: %s\n", e.what());
    reject(Rejection::kInternalError, std::string("internal error: ") + e.what());
  }
}

void ChatSession::reject(Rejection why, const std::string& message) {
  hub_->metrics.rejected(why);
  kill(SessionEnd::kClientLeft);
  enqueue(message_of(kError, message));
  enqueue_close();
}

bool ChatSession::on_client_audio(const uint8_t* data, size_t n) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    const size_t cost = n + kMessageOverheadBytes;
    if (queued_bytes_ + cost > kMaxQueuedInputBytes) return false;
    in_.emplace_back(data, data + n);
    queued_bytes_ += cost;
  }
  cv_.notify_all();
  return true;
}

bool ChatSession::alive() {
  std::lock_guard<std::mutex> lk(mu_);
  return alive_;
}

void ChatSession::worker(int slot, const ChatParams& p) {
  const auto t0 = Clock::now();
  SessionEnd why = SessionEnd::kSessionError;
  std::string text;
  try {
    why = run(slot, p, text);
  } catch (const DeviceError& e) {
    why = SessionEnd::kDeviceError;
    text = std::string("device error: ") + e.what();
    if (hub_->on_device_error) hub_->on_device_error(e.what());
  } catch (const std::exception& e) {
    why = SessionEnd::kSessionError;
    text = std::string("session failed: ") + e.what();
  }
  try {
    if (why != SessionEnd::kClientLeft && why != SessionEnd::kClientLeftDuringPrompts)
      send_error(text);
    std::fprintf(stderr, "session (slot %d): ended after %.1f s, %lld frames: %s%s%s\n", slot,
                 std::chrono::duration<double>(Clock::now() - t0).count(),
                 static_cast<long long>(frames_), label(why), text.empty() ? "" : ": ",
                 text.c_str());
    hub_->metrics.session_ended(why);
    enqueue_close();
  } catch (const std::exception&) {
    // Out of memory while saying goodbye: the slot is released all the same.
  }
  hub_->release_slot(slot);
}

bool ChatSession::pump_input(OggOpusReader& reader, SessionEnd& why, std::string& detail) {
  std::deque<std::vector<uint8_t>> batch;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!alive_) {
      why = end_;
      detail = end_message_;
      return false;
    }
    batch.swap(in_);
    queued_bytes_ = 0;
  }
  for (const auto& b : batch) reader.push(b.data(), b.size());
  if (reader.failed()) {
    why = SessionEnd::kBadAudio;
    detail = "bad audio stream: " + reader.error();
    return false;
  }
  return true;
}

SessionEnd ChatSession::run(int slot, const ChatParams& p, std::string& detail) {
  const ServerModel& m = hub_->model;
  const ServerOptions& o = hub_->opts;
  const int sr = m.sample_rate, fs = m.frame_samples;
  const auto t_start = Clock::now();
  const auto max_duration = std::chrono::duration<double>(o.max_session_duration_s);
  auto over_duration = [&] {
    if (o.max_session_duration_s <= 0 || Clock::now() - t_start < max_duration) return false;
    detail = "maximum session duration reached (" + fmt_seconds(o.max_session_duration_s) + ")";
    return true;
  };
  // Why the session ended before its handshake (a client leaving then is counted as such).
  auto ended_early = [&] {
    const SessionEnd k = killed(detail);
    return k == SessionEnd::kClientLeft ? SessionEnd::kClientLeftDuringPrompts : k;
  };
  // A client that left at once (connect/reset churn) costs no model state.
  if (!alive()) return ended_early();
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
    stepper = m.backend->lm_stepper(p.gen, p.seed, m.dep_steps);
  }
  if (!alive()) return ended_early();
  Conversation conv(*codec, *stepper, p.gen);
  OggOpusReader reader(sr);
  const auto ping_every = std::chrono::duration<double>(o.ping_interval_s);
  auto last_ping = Clock::now();
  SessionEnd why = SessionEnd::kClientLeftDuringPrompts;
  // Audio sent before the handshake is decoded (so the Ogg stream stays in sync and the input
  // queue stays bounded) and dropped: the model cannot hear it yet.
  const bool done = conv.run_system_prompts(prompt, [&](int64_t, int64_t) {
    if (over_duration()) {
      why = SessionEnd::kMaxDuration;
      return false;
    }
    if (!pump_input(reader, why, detail)) return false;
    reader.take(reader.available());
    if (Clock::now() - last_ping >= ping_every) {
      enqueue(message_of(kPing));
      last_ping = Clock::now();
    }
    return true;
  });
  if (!done) return why == SessionEnd::kClientLeft ? SessionEnd::kClientLeftDuringPrompts : why;
  if (!alive()) return ended_early();
  reader.take(reader.available());

  OggOpusWriter writer(sr);
  enqueue(message_of(kHandshake));
  enqueue(message(kAudio, writer.head_page().data(), writer.head_page().size()));
  enqueue(message(kAudio, writer.tags_page().data(), writer.tags_page().size()));
  auto last_activity = Clock::now();
  const auto idle = std::chrono::duration<double>(o.idle_timeout_s);
  // Pacing: a session may run ahead of real time (since its handshake) by kBurstFrames at most,
  // so a client that sends audio faster than real time gets no more compute than a real-time
  // one; its surplus waits in the reader (bounded: beyond it the stream fails).
  const auto t_conv = Clock::now();
  const auto frame_dur = std::chrono::duration<double>(static_cast<double>(fs) / sr);
  auto frame_due = [&](int64_t k) {
    return t_conv + std::chrono::duration_cast<Clock::duration>(
                        frame_dur * static_cast<double>(std::max<int64_t>(0, k - kBurstFrames)));
  };
  while (true) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      const bool paced = reader.available() >= static_cast<size_t>(fs);
      const auto until =
          paced ? std::min(frame_due(frames_), Clock::now() + std::chrono::milliseconds(100))
                : Clock::now() + std::chrono::milliseconds(100);
      cv_.wait_until(lk, until, [&] { return !alive_ || (!paced && !in_.empty()); });
    }
    if (over_duration()) return SessionEnd::kMaxDuration;
    const size_t before = reader.available();
    if (!pump_input(reader, why, detail)) return why;
    // Audio decoded, or paced audio still waiting, is activity.
    if (reader.available() > before || reader.available() >= static_cast<size_t>(fs))
      last_activity = Clock::now();
    if (Clock::now() - last_activity > idle) {
      detail = "idle timeout: no audio received for " + fmt_seconds(o.idle_timeout_s);
      return SessionEnd::kIdleTimeout;
    }
    while (reader.available() >= static_cast<size_t>(fs) && Clock::now() >= frame_due(frames_)) {
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
      if (!alive()) return killed(detail);
    }
  }
}

}  // namespace ppx::server
