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

Conversation::Conversation(CodecStream& codec, LmStepper& stepper, const LmGenConfig& gen)
    : codec_(codec), stepper_(stepper), lm_cfg_(stepper.config()), cfg_(gen), gen_(stepper, gen) {}

void Conversation::check_system_prompts(const SystemPrompt& p) const {
  const LmConfig& c = lm_cfg_;
  const int64_t total = system_prompt_steps(p, codec_.frame_samples(), cfg_.audio_silence_frame_cnt);
  if (total >= c.context) {
    throw Error("system prompts take " + std::to_string(total) + " steps (voice, 2 x " +
                std::to_string(cfg_.audio_silence_frame_cnt) + " silence, " + std::to_string(p.text_tokens.size()) +
                " text tokens) but the LM context holds " + std::to_string(c.context) + "; shorten the text prompt");
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

void Conversation::step_async(const float* pcm_in, FrameDone done) {
  if (async_.done) throw Error("Conversation: a frame is already in flight");
  const int half = lm_cfg_.n_q / 2;
  async_.done = std::move(done);
  async_.pcm_in.assign(pcm_in, pcm_in + codec_.frame_samples());
  async_.codes.assign(static_cast<size_t>(half), 0);
  codec_.encode_async(async_.pcm_in.data(), async_.codes.data(), [this](std::exception_ptr e) {
    if (e) return end_async(std::nullopt, e);
    after_encode();
  });
}

void Conversation::after_encode() {
  try {
    async_.user.assign(async_.codes.begin(), async_.codes.end());
    const StepRequest* req = gen_.begin_step(async_.user.data(), nullptr, std::nullopt);
    if (!req) return end_async(std::nullopt, nullptr);
    stepper_.run_async(*req, async_.result, [this](std::exception_ptr e) {
      if (e) return end_async(std::nullopt, e);
      after_lm();
    });
  } catch (...) {
    end_async(std::nullopt, std::current_exception());
  }
}

void Conversation::after_lm() {
  try {
    const auto out = gen_.end_step(async_.result);
    if (!out) return end_async(std::nullopt, nullptr);
    const int half = lm_cfg_.n_q / 2;
    FrameOut& f = async_.frame;
    f.tokens = *out;
    f.text_token = (*out)[0];
    async_.agent.resize(static_cast<size_t>(half));
    for (int q = 0; q < half; ++q) async_.agent[static_cast<size_t>(q)] = static_cast<int32_t>((*out)[1 + q]);
    f.pcm.assign(static_cast<size_t>(codec_.frame_samples()), 0.f);
    codec_.decode_async(async_.agent.data(), f.pcm.data(), [this](std::exception_ptr e) {
      if (e) return end_async(std::nullopt, e);
      end_async(std::move(async_.frame), nullptr);
    });
  } catch (...) {
    end_async(std::nullopt, std::current_exception());
  }
}

void Conversation::end_async(std::optional<FrameOut> f, std::exception_ptr error) {
  FrameDone done = std::move(async_.done);  // `this` may be gone once it has run
  async_.done = nullptr;
  if (done) done(std::move(f), error);
}

}  // namespace ppx
