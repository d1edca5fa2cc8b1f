#include "ppx/lm_gen.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "ppx/error.h"

namespace ppx {

Sampler::Sampler(const LmGenConfig& c, uint64_t seed)
    : use_sampling_(c.use_sampling),
      temp_(c.temp),
      temp_text_(c.temp_text),
      top_k_(c.top_k),
      top_k_text_(c.top_k_text),
      rng_(seed) {}

int Sampler::argmax(const float* logits, int n) {
  int best = 0;
  for (int i = 1; i < n; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return best;
}

int Sampler::text(const float* logits, int n) { return sample(logits, n, temp_text_, top_k_text_); }
int Sampler::audio(int, const float* logits, int n) { return sample(logits, n, temp_, top_k_); }

int Sampler::sample(const float* logits, int n, double temp, int top_k) {
  // Greedy at temperature 0, also where the temperature is 0 as a float (as the CUDA sampler) or
  // so small that logits / t overflow: the limit of sampling as t -> 0 (NaN probabilities else).
  const float t = static_cast<float>(temp);
  if (!use_sampling_ || !(t > 0.f)) return argmax(logits, n);
  probs_.resize(n);
  float mx = -INFINITY;
  for (int i = 0; i < n; ++i) mx = std::max(mx, logits[i] / t);
  if (!std::isfinite(mx)) return argmax(logits, n);
  float sum = 0.f;
  for (int i = 0; i < n; ++i) sum += (probs_[i] = std::exp(logits[i] / t - mx));
  for (int i = 0; i < n; ++i) probs_[i] /= sum;
  idx_.resize(n);
  std::iota(idx_.begin(), idx_.end(), 0);
  int m = n;
  if (top_k > 0 && top_k < n) {
    m = top_k;
    std::partial_sort(idx_.begin(), idx_.begin() + m, idx_.end(), [&](int a, int b) {
      return probs_[a] > probs_[b] || (probs_[a] == probs_[b] && a < b);
    });
  }
  // Exponential race: argmax p / e with e ~ Exp(1) is a draw from the categorical p.
  std::exponential_distribution<double> exp1(1.0);
  int best = idx_[0];
  double best_score = -1.0;
  for (int j = 0; j < m; ++j) {
    const double score = probs_[idx_[j]] / exp1(rng_);
    if (score > best_score) {
      best_score = score;
      best = idx_[j];
    }
  }
  return best;
}

CpuLmStepper::CpuLmStepper(const Lm& lm, TokenChooser& chooser, int dep_steps)
    : lm_(lm), chooser_(chooser), dep_steps_(dep_steps < 0 ? lm.config().dep_q : std::min(dep_steps, lm.config().dep_q)) {
  lm_.init_state(state_);
}

const LmConfig& CpuLmStepper::config() const { return lm_.config(); }

void CpuLmStepper::reset() { lm_.init_state(state_); }

namespace {
// Uses `force[i]` when given and >= 0; else, for a provided stream, the argmax (its token is the
// provided one whatever is picked here, so no random draw is spent on it); else asks the chooser.
class ForcingChooser : public TokenChooser {
 public:
  ForcingChooser(TokenChooser& inner, const int64_t* force, const uint8_t* provided)
      : inner_(inner), force_(force), provided_(provided) {}
  int text(const float* l, int n) override {
    if (force_ && force_[0] >= 0) return static_cast<int>(force_[0]);
    return provided_ && provided_[0] ? Sampler::argmax(l, n) : inner_.text(l, n);
  }
  int audio(int s, const float* l, int n) override {
    if (force_ && force_[1 + s] >= 0) return static_cast<int>(force_[1 + s]);
    return provided_ && provided_[1 + s] ? Sampler::argmax(l, n) : inner_.audio(s, l, n);
  }

 private:
  TokenChooser& inner_;
  const int64_t* force_;
  const uint8_t* provided_;
};
}  // namespace

void CpuLmStepper::run(const StepRequest& req, StepResult& out, StepLogits* logits) {
  const LmConfig& c = lm_.config();
  const int S = c.dep_q;
  std::vector<float> x(c.dim), h(c.dim), text_logits(c.text_card);
  if (req.embedding) {
    std::copy_n(req.embedding, c.dim, x.begin());
  } else {
    lm_.embed(req.input, x.data());
  }
  lm_.temporal(state_, x.data(), h.data(), text_logits.data());
  ForcingChooser chooser(chooser_, req.force, req.provided);
  out.text = chooser.text(text_logits.data(), c.text_card);
  const int64_t next_text = req.provided[0] ? req.target[0] : out.text;
  out.audio.assign(S, -1);
  if (logits) {
    logits->text = text_logits;
    logits->audio.assign(static_cast<size_t>(S) * c.card, NAN);
  }
  lm_.depformer(h.data(), next_text, req.target + 1, req.provided + 1, chooser, dep_steps_, out.audio.data(),
                logits ? logits->audio.data() : nullptr);
}

LmGen::LmGen(LmStepper& stepper, const LmGenConfig& gen) : stepper_(stepper), gen_(gen) {
  const LmConfig& c = stepper.config();
  K_ = c.n_q + 1;
  half_ = c.n_q / 2;
  dep_q_ = c.dep_q;
  delays_ = c.delays;
  max_delay_ = c.max_delay();
  ct_ = max_delay_ + 3;
  initial_.assign(K_, c.card);
  initial_[0] = c.text_card;
  cache_.assign(static_cast<size_t>(K_) * ct_, -2);
  provided_.assign(static_cast<size_t>(K_) * ct_, 0);
  stepper_.reset();
}

void LmGen::reset() {
  pending_.reset();
  offset_ = 0;
  std::fill(provided_.begin(), provided_.end(), 0);
  stepper_.reset();
}

void LmGen::restore(const State& s) {
  if (s.cache.size() != cache_.size() || s.provided.size() != provided_.size() || s.offset < 0)
    throw Error("generation state of another shape (" + std::to_string(s.cache.size()) + " cache entries, expected " +
                std::to_string(cache_.size()) + ")");
  pending_.reset();
  cache_ = s.cache;
  provided_ = s.provided;
  offset_ = s.offset;
}

void LmGen::set_cache(const std::vector<int64_t>& cache) {
  if (cache.size() != cache_.size()) {
    throw Error("token cache has " + std::to_string(cache.size()) + " entries, expected " +
                std::to_string(K_) + " x " + std::to_string(ct_));
  }
  cache_ = cache;
}

std::optional<LmGen::Prepared> LmGen::prepare(const int64_t* user, const int64_t* agent,
                                              std::optional<int64_t> text) {
  auto write = [&](int k, int64_t tok) {
    const int col = static_cast<int>((offset_ + delays_[k]) % ct_);
    at(k, col) = tok;
    prov(k, col) = 1;
  };
  if (user) for (int i = 0; i < half_; ++i) write(half_ + 1 + i, user[i]);
  if (agent) for (int i = 0; i < half_; ++i) write(1 + i, agent[i]);
  if (text) write(0, *text);
  for (int k = 0; k < K_; ++k) {
    if (offset_ <= delays_[k]) {
      at(k, static_cast<int>(offset_ % ct_)) = initial_[k];
      prov(k, static_cast<int>(offset_ % ct_)) = 1;
    }
  }
  if (offset_ == 0) {
    for (int k = 0; k < K_; ++k) at(k, 0) = initial_[k];
    offset_ = 1;
    return std::nullopt;
  }
  return Prepared{static_cast<int>((offset_ - 1) % ct_), static_cast<int>(offset_ % ct_)};
}

const StepRequest& LmGen::request(const Prepared& p, const float* embedding, const int64_t* force) {
  req_in_.resize(K_);
  req_tgt_.resize(K_);
  req_pv_.resize(K_);
  for (int k = 0; k < K_; ++k) {
    req_in_[k] = at(k, p.in_col);
    req_tgt_[k] = at(k, p.tgt_col);
    req_pv_[k] = prov(k, p.tgt_col);
  }
  // --dep-q-exit: the depformer steps that are not run must be of provided streams (in
  // conversation the user's codebooks always are), or their tokens would silently be missing.
  for (int s = stepper_.depformer_steps(); s < dep_q_; ++s) {
    if (!req_pv_[1 + s]) {
      throw Error("--dep-q-exit " + std::to_string(stepper_.depformer_steps()) +
                  ": codebook stream " + std::to_string(1 + s) +
                  " is not provided at this step, and its depformer step is skipped (give the "
                  "user's audio every step, or run all " + std::to_string(dep_q_) + " steps)");
    }
  }
  req_ = StepRequest{};
  req_.input = req_in_.data();
  req_.embedding = embedding;
  req_.target = req_tgt_.data();
  req_.provided = req_pv_.data();
  req_.force = force;
  return req_;
}

std::optional<std::vector<int64_t>> LmGen::complete(const Prepared& p, const StepResult& r) {
  for (int k = 0; k < K_; ++k) prov(k, p.in_col) = 0;
  if (!prov(0, p.tgt_col)) at(0, p.tgt_col) = r.text;
  for (int s = 0; s < dep_q_; ++s) {
    if (!prov(1 + s, p.tgt_col)) at(1 + s, p.tgt_col) = r.audio[s];
  }
  if (offset_ <= max_delay_) {
    ++offset_;
    return std::nullopt;
  }
  std::vector<int64_t> out(dep_q_ + 1);
  for (int k = 0; k <= dep_q_; ++k) out[k] = at(k, static_cast<int>((offset_ - max_delay_ + delays_[k]) % ct_));
  ++offset_;
  return out;
}

std::optional<std::vector<int64_t>> LmGen::step(const int64_t* user, const int64_t* agent,
                                                std::optional<int64_t> text, StepLogits* logits,
                                                const int64_t* force) {
  const auto p = prepare(user, agent, text);
  if (!p) return std::nullopt;
  const StepRequest& req = request(*p, nullptr, force);
  StepResult r;
  stepper_.run(req, r, logits);
  return complete(*p, r);
}

const StepRequest* LmGen::begin_step(const int64_t* user, const int64_t* agent, std::optional<int64_t> text) {
  if (pending_) throw Error("LmGen: a step is already in flight");
  const auto p = prepare(user, agent, text);
  if (!p) return nullptr;
  const StepRequest& req = request(*p, nullptr, nullptr);
  pending_ = p;
  return &req;
}

std::optional<std::vector<int64_t>> LmGen::end_step(const StepResult& r) {
  if (!pending_) throw Error("LmGen: no step in flight");
  const Prepared p = *pending_;
  pending_.reset();
  return complete(p, r);
}

void LmGen::step_embedding(const float* embedding) {
  std::vector<int64_t> dummy(half_, stepper_.config().card);
  std::optional<Prepared> p;
  while (!(p = prepare(dummy.data(), dummy.data(), gen_.zero_text_code))) {
  }
  const StepRequest& req = request(*p, embedding, nullptr);
  StepResult r;
  stepper_.run(req, r, nullptr);
  complete(*p, r);
}

void LmStepper::run_async(const StepRequest& req, StepResult& out, Done done) {
  std::exception_ptr error;
  try {
    run(req, out, nullptr);
  } catch (...) {
    error = std::current_exception();
  }
  done(error);
}

}  // namespace ppx
