// Generation state of one conversation (upstream LMGen): the delayed token cache, the `provided`
// flags, forced vs sampled tokens, when output frames start and which cache columns form them.
//
// Streams: 0 text, 1..n_q/2 agent audio codebooks, n_q/2+1..n_q user audio codebooks. The cache is
// a ring of max_delay + 3 columns; the token of real frame f for stream k lives in column
// (f + delay_k) mod CT. No model call happens at t = 0; outputs start at t = max_delay + 1.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <vector>

#include "ppx/config.h"
#include "ppx/lm.h"

namespace ppx {

// Upstream sample_token: greedy argmax (first index wins ties) when sampling is off or temp <= 0;
// otherwise softmax(logits / temp), keep the top_k most likely (0 = all), and draw by the
// exponential race argmax(p_j / e_j), e_j ~ Exp(1). Seeded, so a run is reproducible. The CPU
// stepper asks it only for streams that are not provided (a provided stream's token is the given
// one; its own pick is the argmax), so steps whose streams are all provided, such as the system
// prompts, draw nothing from the stream.
class Sampler : public TokenChooser {
 public:
  Sampler(const LmGenConfig& c, uint64_t seed);
  int text(const float* logits, int n) override;
  int audio(int step, const float* logits, int n) override;
  static int argmax(const float* logits, int n);

 private:
  int sample(const float* logits, int n, double temp, int top_k);
  bool use_sampling_;
  double temp_, temp_text_;
  int top_k_, top_k_text_;
  std::mt19937_64 rng_;
  std::vector<float> probs_;
  std::vector<int> idx_;
};

// Logits of one step, when asked for: text [text_card], audio [dep_q * card].
struct StepLogits {
  std::vector<float> text, audio;
};

// One model call of the generation loop, as the backend sees it.
struct StepRequest {
  const int64_t* input = nullptr;      // [K] cache column t-1 (model input), unless `embedding`
  const float* embedding = nullptr;    // [dim] a replayed voice-prompt embedding, or nullptr
  const int64_t* target = nullptr;     // [K] cache column t
  const uint8_t* provided = nullptr;   // [K] which entries of `target` are provided (forced)
  const int64_t* force = nullptr;      // [1 + dep_q] teacher forcing: use these as the sampled
                                       // tokens (-1 = sample), or nullptr
};

struct StepResult {
  int64_t text = 0;            // sampled text token
  // [dep_q] sampled audio tokens; -1 for skipped depformer steps, and for steps of provided
  // streams whose results the engine computes after run() returns (their tokens are not used).
  std::vector<int64_t> audio;
};

// Computes model calls: temporal transformer, text sampling, depformer. Holds the per-session
// model state (KV cache). Implemented by the CPU reference and by the CUDA engine.
class LmStepper {
 public:
  virtual ~LmStepper() = default;
  virtual const LmConfig& config() const = 0;
  virtual void reset() = 0;  // empty KV cache, position 0
  virtual void run(const StepRequest& req, StepResult& out, StepLogits* logits) = 0;
  // run() without waiting, where the stepper can (no logits): `done` runs once the step is
  // complete (on another thread, or here before returning) with its error or nullptr. `req`, its
  // arrays and `out` must stay alive until then; one step in flight at a time. By default the
  // step runs here.
  using Done = std::function<void(std::exception_ptr)>;
  virtual void run_async(const StepRequest& req, StepResult& out, Done done);
  // Device time (ms) of the work of an earlier run that was still running when that run returned
  // (the CUDA engine's deferred depformer steps of provided streams); 0 when there is none.
  virtual double deferred_ms() const { return 0; }
  // Depformer steps run per call (--dep-q-exit): streams 1 + steps .. dep_q are not computed, so
  // they must be provided (LmGen checks this at every step).
  virtual int depformer_steps() const { return config().dep_q; }
};

// The CPU reference stepper: ppx::Lm in fp32, tokens chosen by a TokenChooser.
class CpuLmStepper : public LmStepper {
 public:
  // `lm` and `chooser` must outlive this object. dep_steps < 0: all dep_q steps (upstream).
  CpuLmStepper(const Lm& lm, TokenChooser& chooser, int dep_steps = -1);
  const LmConfig& config() const override;
  void reset() override;
  void run(const StepRequest& req, StepResult& out, StepLogits* logits) override;
  int depformer_steps() const override { return dep_steps_; }
  // The KV cache and position (the prompt cache copies them).
  LmState& state() { return state_; }

 private:
  const Lm& lm_;
  TokenChooser& chooser_;
  int dep_steps_;
  LmState state_;
};

class LmGen {
 public:
  // `stepper` must outlive this object.
  LmGen(LmStepper& stepper, const LmGenConfig& gen);

  // One step. user/agent: [n_q/2] tokens or nullptr (not provided); text: provided text token.
  // Returns the completed frame [dep_q + 1] (text, agent, user) once outputs have started, else
  // nullopt. `logits` (optional) receives this step's logits when a model call happened. `force`
  // ([1 + dep_q], -1 = sample) overrides the sampled tokens (teacher forcing).
  std::optional<std::vector<int64_t>> step(const int64_t* user, const int64_t* agent, std::optional<int64_t> text,
                                           StepLogits* logits = nullptr, const int64_t* force = nullptr);
  // step() in two halves around the model call, for a caller that runs the call itself (without
  // waiting: LmStepper::run_async). begin_step() takes step()'s inputs and returns the model call
  // to make, or nullptr when this step makes none (its output is nullopt and end_step() is not
  // called); the request points into this object and stays valid until end_step(), which takes
  // the call's result and returns what step() returns. Nothing else may run on this object in
  // between. Throws as step() does (the --dep-q-exit guard in begin_step()).
  const StepRequest* begin_step(const int64_t* user, const int64_t* agent, std::optional<int64_t> text);
  std::optional<std::vector<int64_t>> end_step(const StepResult& r);
  // Voice-prompt replay: as step() with dummy provided tokens (initial audio, text = zero_text_code)
  // but feeding `embedding` [dim] to the temporal transformer instead of the cache column.
  void step_embedding(const float* embedding);
  // Overwrites the token cache ([n_q + 1, CT] row-major), as after a .pt voice replay.
  void set_cache(const std::vector<int64_t>& cache);
  // Everything a step leaves in this object (not in the stepper): the prompt cache keeps it.
  struct State {
    std::vector<int64_t> cache;
    std::vector<uint8_t> provided;
    int64_t offset = 0;
  };
  State state() const { return State{cache_, provided_, offset_}; }
  // Back to a state() of a generation over the same LM config; the stepper's state is the
  // caller's (it loads the matching prefix). Throws ppx::Error on a state of another shape.
  void restore(const State& s);
  const std::vector<int64_t>& cache() const { return cache_; }
  int64_t offset() const { return offset_; }
  int cache_columns() const { return ct_; }
  // Back to t = 0 with an empty KV cache and no provided flags (the token cache is kept, as
  // upstream: every column is rewritten before it is read).
  void reset();

 private:
  struct Prepared {
    int in_col, tgt_col;
  };
  std::optional<Prepared> prepare(const int64_t* user, const int64_t* agent, std::optional<int64_t> text);
  // The model call of a prepared step (into req_ and its arrays), with the --dep-q-exit guard.
  const StepRequest& request(const Prepared& p, const float* embedding, const int64_t* force);
  // The call's result into the cache; the completed frame once outputs have started.
  std::optional<std::vector<int64_t>> complete(const Prepared& p, const StepResult& r);
  int64_t& at(int k, int col) { return cache_[static_cast<size_t>(k) * ct_ + col]; }
  uint8_t& prov(int k, int col) { return provided_[static_cast<size_t>(k) * ct_ + col]; }

  LmStepper& stepper_;
  LmGenConfig gen_;
  int K_, ct_, max_delay_, half_, dep_q_;
  std::vector<int> delays_;
  std::vector<int64_t> initial_;
  std::vector<int64_t> cache_;
  std::vector<uint8_t> provided_;  // [n_q + 1, CT] flags
  int64_t offset_ = 0;
  // The model call being made: its arrays [K] and, between begin_step() and end_step(), its step.
  std::vector<int64_t> req_in_, req_tgt_;
  std::vector<uint8_t> req_pv_;
  StepRequest req_;
  std::optional<Prepared> pending_;
};

}  // namespace ppx
