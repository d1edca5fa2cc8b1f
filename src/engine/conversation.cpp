#include "ppx/conversation.h"

#include <chrono>

#include "ppx/audio.h"
#include "ppx/error.h"
#include "ppx/lm.h"
#include "ppx/pt_reader.h"
#include "ppx/safetensors.h"

namespace ppx {

VoiceEmbeddings load_voice_embeddings(const std::string& path) {
  check_voice_file_size(path);
  const auto t = read_pt_tensors(path);
  auto get = [&](const char* name) -> const PtTensor& {
    auto it = t.find(name);
    if (it == t.end()) throw Error("voice file '" + path + "': no '" + name + "' tensor");
    return it->second;
  };
  const PtTensor& e = get("embeddings");
  const PtTensor& c = get("cache");
  if (e.shape.size() != 4 || e.shape[1] != 1 || e.shape[2] != 1 || e.f32.empty())
    throw Error("voice file '" + path + "': embeddings has shape " + shape_str(e.shape) +
                ", expected a float tensor [n, 1, 1, dim]");
  if (c.shape.size() != 3 || c.shape[0] != 1 || c.i64.empty())
    throw Error("voice file '" + path + "': cache has shape " + shape_str(c.shape) + ", expected an integer tensor [1, K, CT]");
  VoiceEmbeddings v;
  v.n = e.shape[0];
  v.dim = e.shape[3];
  v.embeddings = e.f32;
  v.cache = c.i64;
  return v;
}

void load_voice_prompt(SystemPrompt& p, const std::string& path, int sample_rate, int frame_samples) {
  if (path.size() > 3 && path.compare(path.size() - 3, 3, ".pt") == 0)
    p.voice = load_voice_embeddings(path);
  else
    p.voice_audio = prepare_voice_audio(path, sample_rate, frame_samples);
}

int64_t system_prompt_steps(const SystemPrompt& p, int frame_samples, int silence_frames) {
  int64_t voice = 0;
  if (p.voice) voice = p.voice->n + 1;
  else if (!p.voice_audio.empty()) voice = (static_cast<int64_t>(p.voice_audio.size()) + frame_samples - 1) / frame_samples;
  return voice + 2 * static_cast<int64_t>(silence_frames) + static_cast<int64_t>(p.text_tokens.size());
}

namespace {

// Runs `call` here, then hands its error (or nullptr) to `done`.
template <typename F>
void run_now(F&& call, const std::function<void(std::exception_ptr)>& done) {
  std::exception_ptr error;
  try {
    call();
  } catch (...) {
    error = std::current_exception();
  }
  done(error);
}

}  // namespace

void CodecStream::encode_async(const float* pcm, int32_t* codes, Done done) {
  run_now([&] { encode(pcm, codes); }, done);
}

void CodecStream::decode_async(const int32_t* codes, float* pcm, Done done) {
  run_now([&] { decode(codes, pcm); }, done);
}

// One frame of step_async(), from its input to its `done`.
struct Conversation::Frame {
  enum class Stage { kQueued, kEncoding, kEncoded, kStepping, kStepped, kDecoding, kDone };
  Stage stage = Stage::kQueued;
  std::vector<float> pcm_in;
  std::vector<int32_t> codes;
  std::vector<int64_t> user;
  StepResult result;
  std::vector<int32_t> agent;
  std::optional<FrameOut> out;  // set once stepped, when the step produced output
  std::exception_ptr error;
  // An earlier frame's error, set as it failed while this one was in flight: this frame fails with
  // it as soon as no stage of it runs (its model state followed the failed one's).
  std::exception_ptr poison;
  FrameDone done;
};

Conversation::Conversation(CodecStream& codec, LmStepper& stepper, const LmGenConfig& gen)
    : codec_(codec), stepper_(stepper), lm_cfg_(stepper.config()), cfg_(gen), gen_(stepper, gen) {}

Conversation::~Conversation() = default;

void Conversation::check_system_prompts(const SystemPrompt& p) const {
  const LmConfig& c = lm_cfg_;
  const int64_t total = system_prompt_steps(p, codec_.frame_samples(), cfg_.audio_silence_frame_cnt);
  if (total >= c.context) {
    // Advice for the larger of the two parts a client chooses.
    const int64_t text = static_cast<int64_t>(p.text_tokens.size());
    const int64_t voice = total - text - 2 * static_cast<int64_t>(cfg_.audio_silence_frame_cnt);
    throw Error("system prompts take " + std::to_string(total) + " steps (voice " + std::to_string(voice) + ", 2 x " +
                std::to_string(cfg_.audio_silence_frame_cnt) + " silence, " + std::to_string(text) +
                " text tokens) but the LM context holds " + std::to_string(c.context) +
                (voice > text ? "; use a shorter voice prompt" : "; shorten the text prompt"));
  }
  if (p.voice && p.voice->dim != c.dim)
    throw Error("voice embeddings have width " + std::to_string(p.voice->dim) + " but the LM has dim " + std::to_string(c.dim));
  if (p.voice && p.voice->cache.size() != static_cast<size_t>(gen_.cache().size()))
    throw Error("voice cache has " + std::to_string(p.voice->cache.size()) + " entries, the LM expects " +
                std::to_string(gen_.cache().size()));
  for (int tok : p.text_tokens) {
    if (tok < 0 || tok >= c.text_card) throw Error("text prompt token " + std::to_string(tok) + " is outside the LM vocabulary");
  }
}

void Conversation::restore_prompts(const LmGen::State& s) {
  codec_.reset();
  gen_.restore(s);
}

bool Conversation::run_system_prompts(const SystemPrompt& p, const std::function<bool(int64_t, int64_t)>& on_step) {
  check_system_prompts(p);
  const LmConfig& c = lm_cfg_;
  const int fs = codec_.frame_samples(), half = c.n_q / 2;
  const int64_t total = system_prompt_steps(p, fs, cfg_.audio_silence_frame_cnt);
  const std::vector<int64_t> sine(cfg_.sine_tokens.begin(), cfg_.sine_tokens.end());
  const std::vector<int64_t> silence(cfg_.silence_tokens.begin(), cfg_.silence_tokens.end());
  int64_t done = 0;
  auto tick = [&]() { return !on_step || on_step(++done, total); };

  codec_.reset();
  if (p.voice) {
    for (int64_t i = 0; i < p.voice->n; ++i) {
      gen_.step_embedding(p.voice->embeddings.data() + i * p.voice->dim);
      if (!tick()) return false;
    }
    gen_.set_cache(p.voice->cache);
    if (!tick()) return false;  // the replay also consumed step 0
  } else if (!p.voice_audio.empty()) {
    std::vector<float> frame(fs);
    std::vector<int32_t> codes(half);
    std::vector<int64_t> agent(half);
    for (size_t off = 0; off < p.voice_audio.size(); off += fs) {
      const size_t n = std::min<size_t>(fs, p.voice_audio.size() - off);
      std::fill(frame.begin(), frame.end(), 0.f);
      std::copy_n(p.voice_audio.begin() + off, n, frame.begin());
      codec_.encode(frame.data(), codes.data());
      for (int q = 0; q < half; ++q) agent[q] = codes[q];
      gen_.step(sine.data(), agent.data(), cfg_.zero_text_code);
      if (!tick()) return false;
    }
  }
  auto silence_phase = [&]() {
    for (int i = 0; i < cfg_.audio_silence_frame_cnt; ++i) {
      gen_.step(sine.data(), silence.data(), cfg_.zero_text_code);
      if (!tick()) return false;
    }
    return true;
  };
  if (!silence_phase()) return false;
  for (int tok : p.text_tokens) {
    gen_.step(sine.data(), silence.data(), tok);
    if (!tick()) return false;
  }
  if (!silence_phase()) return false;
  codec_.reset();
  return true;
}

std::optional<FrameOut> Conversation::step(const float* pcm_in, StageTimes* times) {
  using clock = std::chrono::steady_clock;
  auto ms = [](clock::time_point a, clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  const int half = lm_cfg_.n_q / 2;
  std::vector<int32_t> codes(half);
  const auto t0 = clock::now();
  codec_.encode(pcm_in, codes.data());
  const std::vector<int64_t> user(codes.begin(), codes.end());
  const auto t1 = clock::now();
  auto out = gen_.step(user.data(), nullptr, std::nullopt);
  const auto t2 = clock::now();
  if (times) {
    times->encode = ms(t0, t1);
    times->lm = ms(t1, t2);
    times->decode = 0;
  }
  if (!out) return std::nullopt;
  FrameOut f;
  f.tokens = *out;
  f.text_token = (*out)[0];
  std::vector<int32_t> agent(half);
  for (int q = 0; q < half; ++q) agent[q] = static_cast<int32_t>((*out)[1 + q]);
  f.pcm.resize(codec_.frame_samples());
  codec_.decode(agent.data(), f.pcm.data());
  if (times) times->decode = ms(t2, clock::now());
  return f;
}

int Conversation::frames_in_flight() const {
  std::lock_guard<std::mutex> lk(mu_);
  return static_cast<int>(frames_.size());
}

void Conversation::step_async(const float* pcm_in, FrameDone done) {
  auto f = std::make_unique<Frame>();
  f->pcm_in.assign(pcm_in, pcm_in + codec_.frame_samples());
  f->codes.assign(static_cast<size_t>(lm_cfg_.n_q / 2), 0);
  f->done = std::move(done);
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (static_cast<int>(frames_.size()) >= kMaxFramesInFlight)
      throw Error("Conversation: " + std::to_string(kMaxFramesInFlight) + " frames are already in flight");
    frames_.push_back(std::move(f));
  }
  pump();
}

// Starts every stage that can start: the oldest frame waiting for it, once the stage is free and
// (LM, decode) the frame's earlier stage is done; and claims the finished frames at the front for
// delivery. Everything is decided and marked in one pass under the lock and done outside it (a
// stage may complete at once, here, and call back into pump()), so two threads never start the
// same stage or deliver at once. A frame that was in flight behind a failed one fails as soon as
// no stage of it runs; frames before it, and frames given after the failure, go on.
//
// Lifetime: the owner may destroy this object once the last `done` has run. A frame that is
// marked here but not started yet cannot complete, so no `done` behind it can run: the starts are
// made newest frame first (encode, LM, decode), and nothing here touches `this` after the last
// one unless this thread holds frames to deliver (which likewise keeps every later `done` back).
void Conversation::pump() {
  using Stage = Frame::Stage;
  Frame* enc = nullptr;
  Frame* lm = nullptr;
  Frame* dec = nullptr;
  const StepRequest* req = nullptr;
  std::vector<std::unique_ptr<Frame>> ready;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& p : frames_) {
      Frame& f = *p;
      const bool running = f.stage == Stage::kEncoding || f.stage == Stage::kStepping || f.stage == Stage::kDecoding;
      if (f.stage == Stage::kDone) continue;
      if (f.poison) {
        if (!running) {
          f.error = f.poison;
          f.stage = Stage::kDone;
        }
        continue;
      }
      if (!encoding_ && f.stage == Stage::kQueued && !enc) {
        enc = &f;
        f.stage = Stage::kEncoding;
        encoding_ = true;
      }
      if (!stepping_ && f.stage == Stage::kEncoded && !lm) {
        // begin_step here, under the lock: the LM state is the previous frame's end_step's.
        try {
          f.user.assign(f.codes.begin(), f.codes.end());
          req = gen_.begin_step(f.user.data(), nullptr, std::nullopt);
          if (req) {
            lm = &f;
            f.stage = Stage::kStepping;
            stepping_ = true;
          } else {
            f.stage = Stage::kDone;  // no step to run: no output
          }
        } catch (...) {
          fail_locked(&f, std::current_exception());
          continue;
        }
      }
      if (!decoding_ && f.stage == Stage::kStepped && !dec) {
        if (f.out) {
          dec = &f;
          f.stage = Stage::kDecoding;
          decoding_ = true;
        } else {
          f.stage = Stage::kDone;  // before outputs start: nothing to decode
        }
      }
    }
    if (!delivering_) claim_locked(ready);
  }
  // A call that throws (a scheduler that has stopped) completes its stage with the error.
  if (enc) {
    try {
      codec_.encode_async(enc->pcm_in.data(), enc->codes.data(), [this, enc](std::exception_ptr e) { encoded(enc, e); });
    } catch (...) {
      encoded(enc, std::current_exception());
    }
  }
  if (lm) {
    try {
      stepper_.run_async(*req, lm->result, [this, lm](std::exception_ptr e) { stepped(lm, e); });
    } catch (...) {
      stepped(lm, std::current_exception());
    }
  }
  if (dec) {
    try {
      codec_.decode_async(dec->agent.data(), dec->out->pcm.data(), [this, dec](std::exception_ptr e) { decoded(dec, e); });
    } catch (...) {
      decoded(dec, std::current_exception());
    }
  }
  if (!ready.empty()) deliver(std::move(ready));
}

// Under mu_: moves the finished frames at the front into `ready` and, if there were any, makes this
// thread the one that delivers.
void Conversation::claim_locked(std::vector<std::unique_ptr<Frame>>& ready) {
  while (!frames_.empty() && frames_.front()->stage == Frame::Stage::kDone) {
    ready.push_back(std::move(frames_.front()));
    frames_.pop_front();
  }
  if (!ready.empty()) delivering_ = true;
}

// Under mu_: f failed with e; the frames in flight behind it follow it.
void Conversation::fail_locked(Frame* f, std::exception_ptr e) {
  f->error = e;
  f->stage = Frame::Stage::kDone;
  bool behind = false;
  for (auto& p : frames_) {
    if (behind && !p->error && !p->poison) p->poison = e;
    behind = behind || p.get() == f;
  }
}

void Conversation::encoded(Frame* f, std::exception_ptr e) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    encoding_ = false;
    if (e) fail_locked(f, e);
    f->stage = e ? Frame::Stage::kDone : Frame::Stage::kEncoded;
  }
  pump();
}

void Conversation::stepped(Frame* f, std::exception_ptr e) {
  if (!e) {
    // The LM stage is still this frame's (stepping_): nothing else touches gen_ until it ends.
    try {
      const auto out = gen_.end_step(f->result);
      if (out) {
        const int half = lm_cfg_.n_q / 2;
        FrameOut o;
        o.tokens = *out;
        o.text_token = (*out)[0];
        f->agent.resize(static_cast<size_t>(half));
        for (int q = 0; q < half; ++q) f->agent[static_cast<size_t>(q)] = static_cast<int32_t>((*out)[1 + q]);
        o.pcm.assign(static_cast<size_t>(codec_.frame_samples()), 0.f);
        f->out = std::move(o);
      }
    } catch (...) {
      e = std::current_exception();
    }
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    stepping_ = false;
    if (e) fail_locked(f, e);
    f->stage = e ? Frame::Stage::kDone : Frame::Stage::kStepped;
  }
  pump();
}

void Conversation::decoded(Frame* f, std::exception_ptr e) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    decoding_ = false;
    if (e) fail_locked(f, e);
    f->stage = Frame::Stage::kDone;
  }
  pump();
}

// Runs the `done`s of `ready` (claimed by this thread, in order), then of any frames that finished
// meanwhile. While frames are in flight this thread stays the deliverer through a `done` (no later
// frame's `done` can overtake it, and those frames keep this object alive); before the last `done`
// with none in flight it lets go, since the owner may destroy this object in that `done`. A `done`
// that throws is ignored (it must not stop the others).
void Conversation::deliver(std::vector<std::unique_ptr<Frame>> ready) {
  auto run = [](Frame& f) {
    FrameDone done = std::move(f.done);
    std::optional<FrameOut> out;
    if (!f.error) out = std::move(f.out);
    try {
      if (done) done(std::move(out), f.error);
    } catch (...) {
    }
  };
  for (;;) {
    for (size_t i = 0; i + 1 < ready.size(); ++i) run(*ready[i]);
    bool idle = false;
    {
      std::lock_guard<std::mutex> lk(mu_);
      idle = frames_.empty();
      if (idle) delivering_ = false;
    }
    run(*ready.back());
    if (idle) return;  // `this` may be gone
    ready.clear();
    {
      std::lock_guard<std::mutex> lk(mu_);
      delivering_ = false;
      claim_locked(ready);
    }
    if (ready.empty()) return;
  }
}

}  // namespace ppx
