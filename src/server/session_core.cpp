#include "server/session_core.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <optional>
#include <thread>
#include <utility>

#include <boost/asio/post.hpp>

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

int SessionHub::acquire_slot(const std::shared_ptr<SessionCore>& s, bool with_reservation) {
  std::lock_guard<std::mutex> lk(mu);
  if (with_reservation) --reserved;
  if (stopping || draining || !device_error.empty()) return -2;
  if (!with_reservation && in_use + reserved >= static_cast<int>(slot_used.size())) return -1;
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

bool SessionHub::reserve_slot() {
  std::lock_guard<std::mutex> lk(mu);
  if (in_use + reserved >= static_cast<int>(slot_used.size())) return false;
  ++reserved;
  return true;
}

void SessionHub::unreserve_slot() {
  std::lock_guard<std::mutex> lk(mu);
  --reserved;
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

SessionHub::SlotState SessionHub::slot_state() {
  std::lock_guard<std::mutex> lk(mu);
  return {in_use, reserved, unavailable_locked()};
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

uint64_t HeadWaiters::add(std::function<void()> close) {
  std::lock_guard<std::mutex> lk(mu_);
  const uint64_t id = next_++;
  waiters_.emplace(id, Waiter{std::chrono::steady_clock::now(), std::move(close)});
  return id;
}

void HeadWaiters::remove(uint64_t id) {
  std::lock_guard<std::mutex> lk(mu_);
  waiters_.erase(id);
}

bool HeadWaiters::close_oldest(std::chrono::steady_clock::duration min_age) {
  std::function<void()> close;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (waiters_.empty() || std::chrono::steady_clock::now() - waiters_.begin()->second.since < min_age) return false;
    close = std::move(waiters_.begin()->second.close);
    waiters_.erase(waiters_.begin());
  }
  close();
  return true;
}

std::string SessionHub::unavailable() {
  std::lock_guard<std::mutex> lk(mu);
  return unavailable_locked();
}

std::string SessionHub::unavailable_locked() const {
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
  if (is_live_) post_tick();
}

SessionEnd SessionCore::killed(std::string& detail) {
  std::lock_guard<std::mutex> lk(mu_);
  detail = end_message_;
  return end_;
}

void SessionCore::begin(const std::string& query) {
  try {
    const std::string err = protocol_->prepare(query);
    if (!err.empty()) {
      reservation_.release();
      return reject(Rejection::kBadRequest, err);
    }
    const bool reserved = static_cast<bool>(reservation_);
    reservation_.consumed();
    const int slot = hub_->acquire_slot(shared_from_this(), reserved);
    // Full or draining upgrades are refused with HTTP 503 before they happen (http_connection.cpp, which
    // reserves the slot); these two answer a drain begun since, or a session without a reservation.
    if (slot == -1)
      return reject(
          Rejection::kBusy,
          "server busy: all " + std::to_string(hub_->opts.max_sessions) + " sessions in use");
    if (slot < 0) return reject(Rejection::kDraining, "server unavailable: " + hub_->unavailable());
    hub_->start_worker(slot, [self = shared_from_this(), slot] { self->worker(slot); });
    hub_->metrics.session_started();
    protocol_->on_open();
  } catch (const std::exception& e) {
    reservation_.release();  // at once, not when the closed session is destroyed
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
  if (is_live_) post_tick();
  return true;
}

bool SessionCore::alive() {
  std::lock_guard<std::mutex> lk(mu_);
  return alive_;
}

// The live phase's state (the worker thread fills it, then only the strand touches it).
struct SessionCore::Live {
  int slot = 0;
  std::unique_ptr<CodecStream> codec;
  std::unique_ptr<LmStepper> stepper;
  std::unique_ptr<Conversation> conv;
  Clock::time_point t_start;        // the session's start (the duration limit)
  Clock::time_point t_conv;         // the handshake (pacing)
  Clock::time_point last_activity;  // the idle limit
  // The frames in flight (Conversation::step_async pipelines up to kMaxFramesInFlight): when each
  // started, oldest first.
  std::deque<Clock::time_point> t_frames;
  int64_t started = 0;  // frames handed to the conversation (pacing)
  // Why the session ends, once it must while frames are still in flight: it ends as the last one
  // comes back (their model state is the slot's until then).
  std::optional<std::pair<SessionEnd, std::string>> ending;
};

SessionCore::SessionCore(std::shared_ptr<SessionHub> hub, std::unique_ptr<Protocol> protocol)
    : hub_(std::move(hub)),
      protocol_(std::move(protocol)),
      strand_(boost::asio::make_strand(hub_->executor)),
      timer_(strand_) {
  protocol_->attach(this);
}

// live_ goes with the session: its destructors hand the slot's model state back (finish() already
// did unless the session never started).
SessionCore::~SessionCore() = default;

std::shared_ptr<const PreparedVoice> SessionCore::voice(const std::string& path, int sample_rate, int frame_samples) {
  try {
    return hub_->voices.get(path, sample_rate, frame_samples);
  } catch (const std::exception& x) {
    // Clients see the voice file by name: the server's directory stays out of what they are told.
    std::string what = x.what();
    const std::string name = std::filesystem::path(path).filename().string();
    for (size_t at = what.find(path); at != std::string::npos; at = what.find(path, at + name.size()))
      what.replace(at, path.size(), name);
    throw Error(what);
  }
}

SessionEnd SessionCore::failed(std::exception_ptr e, std::string& detail) {
  try {
    std::rethrow_exception(e);
  } catch (const DeviceError& d) {
    detail = std::string("device error: ") + d.what();
    if (hub_->on_device_error) hub_->on_device_error(d.what());
    return SessionEnd::kDeviceError;
  } catch (const std::exception& x) {
    detail = std::string("session failed: ") + x.what();
  } catch (...) {
    detail = "session failed: unknown error";
  }
  return SessionEnd::kSessionError;
}

void SessionCore::worker(int slot) {
  t0_ = Clock::now();
  SessionEnd why = SessionEnd::kSessionError;
  std::string text;
  try {
    log::info("session started", {{"session", id_}, {"slot", slot}, {"endpoint", protocol_->endpoint()}});
    // This thread runs the system prompts (and with --per-session-codec launches the codec's
    // graphs): the backend's device must be current here too, not only on the loading thread.
    hub_->model.backend->attach_thread();
    const std::optional<SessionEnd> ended = prepare(slot, text);
    if (!ended) {
      // The conversation runs: from here on it is events on the strand. The session holds
      // itself until it ends (its events hold it only weakly).
      self_ = shared_from_this();
      is_live_ = true;
      try {
        post_tick();
        return;
      } catch (...) {  // out of memory: the session ends here instead
        is_live_ = false;
        self_.reset();
        throw;
      }
    }
    why = *ended;
  } catch (...) {
    why = failed(std::current_exception(), text);
  }
  finish(slot, std::move(live_), why, text);
}

void SessionCore::finish(int slot, std::unique_ptr<Live> live, SessionEnd why, const std::string& text) {
  // The model state first (an LM slot closes through the scheduler's queue, ahead of any later
  // session's open of the slot).
  try {
    live.reset();
  } catch (...) {
  }
  try {
    protocol_->on_end(why, text);
    const double duration_s = std::chrono::duration<double>(Clock::now() - t0_).count();
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
                {"endpoint", protocol_->endpoint()},
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

std::optional<SessionEnd> SessionCore::prepare(int slot, std::string& detail) {
  const ServerModel& m = hub_->model;
  const ServerOptions& o = hub_->opts;
  Protocol& proto = *protocol_;
  const int sr = m.sample_rate, fs = m.frame_samples;
  auto L = std::make_unique<Live>();
  L->slot = slot;
  L->t_start = Clock::now();
  const auto max_duration = std::chrono::duration<double>(o.max_session_duration_s);
  auto over_duration = [&] {
    if (o.max_session_duration_s <= 0 || Clock::now() - L->t_start < max_duration) return false;
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
  if (!p.voice_path.empty()) set_prompt_voice(prompt, *voice(p.voice_path, sr, fs));
  const std::string wrapped = wrap_system_prompt(p.text_prompt);
  if (!wrapped.empty()) prompt.text_tokens = m.tokenizer->encode(wrapped);
  if (hub_->codec) {
    L->codec = hub_->codec->open(slot);  // through the codec scheduler's queue
  } else {
    std::lock_guard<std::mutex> lk(hub_->backend_mu);
    // --per-session-codec: the stream's work runs on the session's strand, never on the LM
    // scheduler's thread that completes the step before the decode.
    L->codec = std::make_unique<PostingCodecStream>(
        m.backend->codec_stream(slot), [strand = strand_](std::function<void()> task) {
          boost::asio::post(strand, std::move(task));
        });
  }
  // The LM slot goes through the scheduler's queue: no lock held meanwhile.
  L->stepper = hub_->scheduler->open(slot, p.gen, p.seed);
  if (!alive()) return ended_early();
  L->conv = std::make_unique<Conversation>(*L->codec, *L->stepper, p.gen);
  Conversation& conv = *L->conv;
  // Audio sent before the conversation starts is decoded (so a stream stays in sync and the
  // input queue stays bounded) and dropped (/api/chat) or kept up to a bound (/v1/realtime): the
  // model cannot hear it yet.
  const auto t_prompts = Clock::now();
  bool cached = false;
  const bool done = hub_->scheduler->run_system_prompts(*L->stepper, conv, prompt, [&](int64_t, int64_t) {
    if (over_duration()) {
      why = SessionEnd::kMaxDuration;
      return false;
    }
    if (!pump_input(why, detail)) return false;
    proto.drop_early_input();
    proto.on_prompt_tick(Clock::now());
    return true;
  }, &cached);
  // The model state goes with L on the way out (the slot's LM state closes through the queue).
  if (!done) return early(why);
  log::info("session prompts done",
            {{"session", id_},
             {"cached", cached},
             {"steps", system_prompt_steps(prompt, m.frame_samples, p.gen.audio_silence_frame_cnt)},
             {"ms", std::round(std::chrono::duration<double, std::milli>(Clock::now() - t_prompts).count() * 10) / 10}});
  if (!alive()) return ended_early();
  proto.drop_early_input();

  proto.on_ready();
  L->last_activity = Clock::now();
  L->t_conv = Clock::now();
  live_ = std::move(L);
  return std::nullopt;
}

void SessionCore::post_tick() {
  if (tick_posted_.exchange(true)) return;
  // A weak reference: a tick posted as the session ends (a kill from the closing connection) must
  // not keep it alive, nor, once the executor has stopped, the hub through it.
  boost::asio::post(strand_, [weak = weak_from_this()] {
    if (auto self = weak.lock()) self->tick();
  });
}

// Pacing: a session may run ahead of real time (since its handshake) by kBurstFrames at most, so
// a client that sends audio faster than real time gets no more compute than a real-time one; its
// surplus waits in the protocol's decoder (bounded: beyond it the input fails). With nothing to
// do the session sleeps until the next frame is due or 100 ms pass (for the idle and duration
// limits), unless input or a kill wakes it first.
void SessionCore::tick() {
  tick_posted_ = false;  // before anything is read: a later event posts again
  if (!live_) return;    // ended
  Live& L = *live_;
  if (L.ending) return;  // waits for its frames in flight
  if (static_cast<int>(L.t_frames.size()) >= Conversation::kMaxFramesInFlight) return;  // a completion ticks
  const ServerModel& m = hub_->model;
  const ServerOptions& o = hub_->opts;
  Protocol& proto = *protocol_;
  const int sr = m.sample_rate, fs = m.frame_samples;
  std::string detail;
  try {
    const auto now = Clock::now();
    if (o.max_session_duration_s > 0 &&
        now - L.t_start >= std::chrono::duration<double>(o.max_session_duration_s))
      return end_when_idle(SessionEnd::kMaxDuration,
                           "maximum session duration reached (" + fmt_seconds(o.max_session_duration_s) + ")");
    const size_t before = proto.available();
    SessionEnd why = SessionEnd::kClientLeft;
    if (!pump_input(why, detail)) return end_when_idle(why, detail);
    // Audio decoded, or paced audio still waiting, is activity.
    if (proto.available() > before || proto.available() >= static_cast<size_t>(fs)) L.last_activity = now;
    if (now - L.last_activity > std::chrono::duration<double>(o.idle_timeout_s))
      return end_when_idle(SessionEnd::kIdleTimeout, "idle timeout: no audio received for " + fmt_seconds(o.idle_timeout_s));
    const auto frame_dur = std::chrono::duration<double>(static_cast<double>(fs) / sr);
    auto due = [&] {
      return L.t_conv + std::chrono::duration_cast<Clock::duration>(
                            frame_dur * static_cast<double>(std::max<int64_t>(0, L.started - kBurstFrames)));
    };
    bool paced = proto.available() >= static_cast<size_t>(fs);
    // Frames start while they are due, up to the pipeline's depth: a session that has fallen
    // behind hands its next frame over while this one is still in the schedulers.
    while (paced && now >= due() && static_cast<int>(L.t_frames.size()) < Conversation::kMaxFramesInFlight) {
      const std::vector<float> pcm = proto.take(static_cast<size_t>(fs));
      // The completion is posted to this strand, so it runs after this tick; the entry goes first
      // and comes back out if the frame could not start.
      L.t_frames.push_back(Clock::now());
      try {
        L.conv->step_async(pcm.data(), [self = shared_from_this()](std::optional<FrameOut> f,
                                                                    std::exception_ptr e) mutable {
          // On a scheduler's thread: the rest runs on the session's strand, which takes the
          // reference along (the session is never destroyed on a scheduler's thread). The frame
          // holds the session until it is back: a session never ends with a frame in flight.
          Strand& strand = self->strand_;
          try {
            boost::asio::post(strand, [self = std::move(self), f = std::move(f), e]() mutable {
              self->frame_done(std::move(f), e);
            });
          } catch (...) {
            // Out of memory: the session cannot go on, and nothing here may wait.
            log::error("session frame lost: cannot hand it back (out of memory)", {});
          }
        });
      } catch (...) {
        L.t_frames.pop_back();
        throw;
      }
      ++L.started;
      paced = proto.available() >= static_cast<size_t>(fs);
    }
    if (static_cast<int>(L.t_frames.size()) >= Conversation::kMaxFramesInFlight) return;  // a completion ticks
    const auto wake =
        paced ? std::min(due(), now + std::chrono::milliseconds(100)) : now + std::chrono::milliseconds(100);
    timer_.expires_at(wake);
    timer_.async_wait([weak = weak_from_this()](const boost::system::error_code& ec) {
      if (ec) return;
      if (auto self = weak.lock()) self->tick();
    });
  } catch (...) {
    const SessionEnd why = failed(std::current_exception(), detail);
    if (live_) end_when_idle(why, detail);  // a frame that could not start is not in t_frames
  }
}

void SessionCore::end_when_idle(SessionEnd why, const std::string& detail) {
  if (!live_) return;
  Live& L = *live_;
  if (!L.t_frames.empty()) {
    if (!L.ending) L.ending.emplace(why, detail);  // the first reason stands
    try {
      timer_.cancel();
    } catch (...) {
    }
    return;
  }
  end_live(why, detail);
}

void SessionCore::frame_done(std::optional<FrameOut> f, std::exception_ptr error) {
  Live& L = *live_;
  const Clock::time_point t_frame = L.t_frames.front();
  L.t_frames.pop_front();
  std::string detail;
  if (L.ending) {
    // Ending: the frames still in flight come back (a later one fails with an earlier one's
    // error) and are dropped; the last one ends the session. An error still counts (a device
    // error ends every session).
    if (error) {
      std::string ignored;
      failed(error, ignored);
    }
    if (L.t_frames.empty()) {
      const auto ending = std::move(*L.ending);
      end_live(ending.first, ending.second);
    }
    return;
  }
  try {
    if (error) std::rethrow_exception(error);
    const ServerModel& m = hub_->model;
    const double frame_ms = std::chrono::duration<double, std::milli>(Clock::now() - t_frame).count();
    const double budget_ms = 1000.0 * m.frame_samples / m.sample_rate;
    hub_->metrics.frame(frame_ms, budget_ms);
    budget_misses_ += frame_ms > budget_ms;
    if (f) {
      protocol_->on_frame(f->pcm, f->text_token, text_piece(*m.tokenizer, f->text_token));
      ++frames_;
      if (!alive()) {
        const SessionEnd why = killed(detail);
        return end_when_idle(why, detail);
      }
    }
  } catch (...) {
    const SessionEnd why = failed(std::current_exception(), detail);
    return end_when_idle(why, detail);
  }
  tick();  // the next frame at once when it is due
}

void SessionCore::end_live(SessionEnd why, const std::string& detail) {
  if (!live_) return;
  const std::shared_ptr<SessionCore> keep = std::move(self_);  // released as this returns
  std::unique_ptr<Live> live = std::move(live_);  // live_ is null from here: later events return
  is_live_ = false;
  const int slot = live->slot;
  try {
    timer_.cancel();
  } catch (...) {
  }
  finish(slot, std::move(live), why, detail);
}

}  // namespace ppx::server
