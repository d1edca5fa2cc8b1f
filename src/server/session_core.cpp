#include "server/session_core.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <thread>

#include "ppx/audio.h"
#include "ppx/conversation.h"
#include "ppx/error.h"
#include "server/log.h"

namespace ppx::server {

const char* const kDefaultTextPrompt =
    "You are a wise and friendly teacher. Answer questions or provide advice in a clear and "
    "engaging way.";
const char* const kDefaultVoice = "NATF0.pt";

namespace {

std::string fmt_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", s);
  return buf;
}

}  // namespace

std::string text_piece(const TextTokenizer& tok, int64_t token) {
  if (is_pad_token(token)) return "";
  const std::string piece = tok.id_to_piece(static_cast<int>(token));
  std::string text;
  for (size_t i = 0; i < piece.size();) {
    if (piece.compare(i, 3, "\xE2\x96\x81") == 0) {
      text += ' ';
      i += 3;
    } else {
      text += piece[i++];
    }
  }
  return text;
}

int SessionHub::acquire_slot(const std::shared_ptr<SessionCore>& s) {
  std::lock_guard<std::mutex> lk(mu);
  if (stopping || draining || !device_error.empty()) return -2;
  for (size_t i = 0; i < slot_used.size(); ++i) {
    if (!slot_used[i]) {
      slot_used[i] = true;
      ++in_use;
      ++workers;
      sessions.remove_if([](const std::weak_ptr<SessionCore>& w) { return w.expired(); });
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
  std::list<std::weak_ptr<SessionCore>> live;
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

void SessionCore::kill(SessionEnd why, const std::string& message) {
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

SessionEnd SessionCore::killed(std::string& detail) {
  std::lock_guard<std::mutex> lk(mu_);
  detail = end_message_;
  return end_;
}

void SessionCore::begin(const std::string& query) {
  try {
    const std::string err = protocol_->prepare(query);
    if (!err.empty()) return reject(Rejection::kBadRequest, err);
    const int slot = hub_->acquire_slot(shared_from_this());
    // Full or draining upgrades are refused with HTTP 503 before they happen (server.cpp); these
    // two answer the race of a slot taken (or a drain begun) since that check.
    if (slot == -1)
      return reject(
          Rejection::kBusy,
          "server busy: all " + std::to_string(hub_->opts.max_sessions) + " sessions in use");
    if (slot < 0) return reject(Rejection::kDraining, "server unavailable: " + hub_->unavailable());
    hub_->start_worker(slot, [self = shared_from_this(), slot] { self->worker(slot); });
    hub_->metrics.session_started();
    protocol_->on_open();
  } catch (const std::exception& e) {
    log::error("session setup failed", {{"session", id_}, {"endpoint", protocol_->endpoint()}, {"error", e.what()}});
    reject(Rejection::kInternalError, std::string("internal error: ") + e.what());
  }
}

void SessionCore::reject(Rejection why, const std::string& message) {
  hub_->metrics.rejected(why);
  kill(SessionEnd::kClientLeft);
  protocol_->send_fatal(label(why), message);
  enqueue_close();
}

bool SessionCore::push_input(const uint8_t* data, size_t n) {
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

bool SessionCore::alive() {
  std::lock_guard<std::mutex> lk(mu_);
  return alive_;
}

void SessionCore::worker(int slot) {
  const auto t0 = Clock::now();
  SessionEnd why = SessionEnd::kSessionError;
  std::string text;
  const char* endpoint = protocol_->endpoint();
  try {
    log::info("session started", {{"session", id_}, {"slot", slot}, {"endpoint", endpoint}});
    // This thread steps the codec (and on CUDA launches its graphs): the backend's device must be
    // current here too, not only on the thread that loaded the model.
    hub_->model.backend->attach_thread();
    why = run(slot, text);
  } catch (const DeviceError& e) {
    why = SessionEnd::kDeviceError;
    text = std::string("device error: ") + e.what();
    if (hub_->on_device_error) hub_->on_device_error(e.what());
  } catch (const std::exception& e) {
    why = SessionEnd::kSessionError;
    text = std::string("session failed: ") + e.what();
  }
  try {
    protocol_->on_end(why, text);
    const double duration_s = std::chrono::duration<double>(Clock::now() - t0).count();
    // Leaving, timeouts, limits and shutdown are routine; a refused audio stream or a failed
    // session (a bad voice file, an internal error) is worth a look; a failed device ends the server.
    log::Level level = log::Level::kInfo;
    if (why == SessionEnd::kDeviceError)
      level = log::Level::kError;
    else if (why == SessionEnd::kBadAudio || why == SessionEnd::kInputOverflow || why == SessionEnd::kSessionError)
      level = log::Level::kWarn;
    log::write(level, "session ended",
               {{"session", id_},
                {"slot", slot},
                {"endpoint", endpoint},
                {"duration_s", std::round(duration_s * 1000.0) / 1000.0},
                {"frames", frames_},
                {"end_reason", label(why)},
                {"budget_misses", budget_misses_},
                {"detail", text.empty() ? nlohmann::json() : nlohmann::json(text)}});
    hub_->metrics.session_ended(why);
    enqueue_close();
  } catch (const std::exception&) {
    // Out of memory while saying goodbye: the slot is released all the same.
  }
  hub_->release_slot(slot);
}

bool SessionCore::pump_input(SessionEnd& why, std::string& detail) {
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
  for (const auto& b : batch)
    if (!protocol_->decode(b, why, detail)) return false;
  return true;
}

SessionEnd SessionCore::run(int slot, std::string& detail) {
  const ServerModel& m = hub_->model;
  const ServerOptions& o = hub_->opts;
  Protocol& proto = *protocol_;
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
  auto early = [](SessionEnd w) {
    return w == SessionEnd::kClientLeft ? SessionEnd::kClientLeftDuringPrompts : w;
  };
  SessionEnd why = SessionEnd::kClientLeftDuringPrompts;
  // The start parameters (at once for /api/chat); input sent meanwhile is decoded, and what the
  // protocol does not keep is dropped.
  SessionParams p;
  while (!proto.ready(Clock::now(), p)) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait_for(lk, std::chrono::milliseconds(10), [&] { return !alive_; });
    }
    if (over_duration()) return SessionEnd::kMaxDuration;
    if (!pump_input(why, detail)) return early(why);
    proto.drop_early_input();
  }
  log::info("session prompts",
            {{"session", id_}, {"voice", p.voice_path}, {"text_prompt_bytes", p.text_prompt.size()}});
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
  if (hub_->codec) {
    codec = hub_->codec->open(slot);  // through the codec scheduler's queue
  } else {
    std::lock_guard<std::mutex> lk(hub_->backend_mu);
    codec = m.backend->codec_stream(slot);
  }
  // The LM slot goes through the scheduler's queue: no lock held meanwhile.
  stepper = hub_->scheduler->open(slot, p.gen, p.seed);
  if (!alive()) return ended_early();
  Conversation conv(*codec, *stepper, p.gen);
  // Audio sent before the conversation starts is decoded (so a stream stays in sync and the
  // input queue stays bounded) and dropped (/api/chat) or kept up to a bound (/v1/realtime): the
  // model cannot hear it yet.
  const auto t_prompts = Clock::now();
  bool cached = false;
  const bool done = hub_->scheduler->run_system_prompts(*stepper, conv, prompt, [&](int64_t, int64_t) {
    if (over_duration()) {
      why = SessionEnd::kMaxDuration;
      return false;
    }
    if (!pump_input(why, detail)) return false;
    proto.drop_early_input();
    proto.on_prompt_tick(Clock::now());
    return true;
  }, &cached);
  if (!done) return early(why);
  log::info("session prompts done",
            {{"session", id_},
             {"cached", cached},
             {"steps", system_prompt_steps(prompt, m.frame_samples, p.gen.audio_silence_frame_cnt)},
             {"ms", std::round(std::chrono::duration<double, std::milli>(Clock::now() - t_prompts).count() * 10) / 10}});
  if (!alive()) return ended_early();
  proto.drop_early_input();

  proto.on_ready();
  auto last_activity = Clock::now();
  const auto idle = std::chrono::duration<double>(o.idle_timeout_s);
  // Pacing: a session may run ahead of real time (since its handshake) by kBurstFrames at most,
  // so a client that sends audio faster than real time gets no more compute than a real-time
  // one; its surplus waits in the protocol's decoder (bounded: beyond it the input fails).
  const auto t_conv = Clock::now();
  const auto frame_dur = std::chrono::duration<double>(static_cast<double>(fs) / sr);
  auto frame_due = [&](int64_t k) {
    return t_conv + std::chrono::duration_cast<Clock::duration>(
                        frame_dur * static_cast<double>(std::max<int64_t>(0, k - kBurstFrames)));
  };
  while (true) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      const bool paced = proto.available() >= static_cast<size_t>(fs);
      const auto until =
          paced ? std::min(frame_due(frames_), Clock::now() + std::chrono::milliseconds(100))
                : Clock::now() + std::chrono::milliseconds(100);
      cv_.wait_until(lk, until, [&] { return !alive_ || (!paced && !in_.empty()); });
    }
    if (over_duration()) return SessionEnd::kMaxDuration;
    const size_t before = proto.available();
    if (!pump_input(why, detail)) return why;
    // Audio decoded, or paced audio still waiting, is activity.
    if (proto.available() > before || proto.available() >= static_cast<size_t>(fs))
      last_activity = Clock::now();
    if (Clock::now() - last_activity > idle) {
      detail = "idle timeout: no audio received for " + fmt_seconds(o.idle_timeout_s);
      return SessionEnd::kIdleTimeout;
    }
    while (proto.available() >= static_cast<size_t>(fs) && Clock::now() >= frame_due(frames_)) {
      const std::vector<float> pcm = proto.take(static_cast<size_t>(fs));
      const auto t_frame = Clock::now();
      const auto fr = conv.step(pcm.data());
      const double frame_ms = std::chrono::duration<double, std::milli>(Clock::now() - t_frame).count();
      hub_->metrics.frame(frame_ms, 1000.0 * fs / sr);
      budget_misses_ += frame_ms > 1000.0 * fs / sr;
      if (!fr) continue;
      proto.on_frame(fr->pcm, fr->text_token, text_piece(*m.tokenizer, fr->text_token));
      ++frames_;
      if (!alive()) return killed(detail);
    }
  }
}

}  // namespace ppx::server
