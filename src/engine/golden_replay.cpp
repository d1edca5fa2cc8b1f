#include "engine/golden_replay.h"

#include <cmath>

#include "ppx/error.h"
#include "ppx/lm.h"
#include "ppx/lm_gen.h"
#include "ppx/mimi.h"
#include "ppx/safetensors.h"

namespace ppx {
namespace {

double rel_l2(const float* a, const float* ref, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(a[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

bool all_finite(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) return false;
  }
  return true;
}

void check_shape(const SafeTensors& f, const std::string& key, const std::vector<int64_t>& shape) {
  if (f.info(key).shape != shape) {
    throw Error("session file '" + f.path() + "': '" + key + "' has shape " + shape_str(f.info(key).shape) +
                ", expected " + shape_str(shape) + " (does the session match the model config?)");
  }
}

}  // namespace

ReplayReport replay_golden_session(LmStepper& stepper, const LmGenConfig& gen_in, const Mimi* mimi,
                                   const SafeTensors& f, bool teacher_forced, const VoiceEmbeddings* voice) {
  const LmConfig& c = stepper.config();
  const int half = c.n_q / 2, S = c.dep_q, K = c.dep_q + 1, V = c.text_card, card = c.card;
  const int64_t steps = f.info("step.user").shape.at(0);
  check_shape(f, "step.user", {steps, half});
  check_shape(f, "step.moshi", {steps, half});
  check_shape(f, "step.text_in", {steps, 1});
  check_shape(f, "step.text_logits", {steps, V});
  check_shape(f, "step.audio_logits", {steps, S, card});
  check_shape(f, "step.out", {steps, K});
  const auto user = f.to_i64("step.user"), moshi = f.to_i64("step.moshi"), text_in = f.to_i64("step.text_in");
  const auto out_ref = f.to_i64("step.out");
  const auto text_ref = f.to_f32("step.text_logits"), audio_ref = f.to_f32("step.audio_logits");
  const int64_t n_prompt = f.to_i64("session.n_prompt_steps").at(0);

  LmGenConfig gen = gen_in;
  gen.use_sampling = false;  // goldens are greedy
  LmGen lg(stepper, gen);

  ReplayReport r;
  r.steps = static_cast<int>(steps);
  int64_t start = 0;
  if (voice) {
    if (voice->dim != c.dim) throw Error("voice embeddings have width " + std::to_string(voice->dim) + ", the LM " + std::to_string(c.dim));
    for (int64_t i = 0; i < voice->n; ++i) lg.step_embedding(voice->embeddings.data() + i * voice->dim);
    lg.set_cache(voice->cache);
    start = voice->n + 1;
  }
  r.first_step = static_cast<int>(start);
  int64_t agree = 0, compared = 0;
  StepLogits logits;
  for (int64_t i = start; i < steps; ++i) {
    auto opt = [&](const std::vector<int64_t>& v, int64_t row, int n) -> const int64_t* {
      return v[row * n] < 0 ? nullptr : v.data() + row * n;
    };
    // Teacher forcing: the golden argmax of this step wherever the golden has logits.
    std::vector<int64_t> force(1 + S, -1);
    if (teacher_forced) {
      const float* tg = text_ref.data() + i * V;
      if (all_finite(tg, V)) force[0] = Sampler::argmax(tg, V);
      for (int s = 0; s < S; ++s) {
        const float* ag = audio_ref.data() + (i * S + s) * card;
        if (all_finite(ag, card)) force[1 + s] = Sampler::argmax(ag, card);
      }
    }
    std::optional<int64_t> text;
    if (text_in[i] >= 0) text = text_in[i];
    logits.text.clear();
    const auto out = lg.step(opt(user, i, half), opt(moshi, i, half), text, &logits, force.data());
    const float* tr = text_ref.data() + i * V;
    if (!logits.text.empty() && all_finite(tr, V)) {
      r.text_logits_max_rel_l2 = std::max(r.text_logits_max_rel_l2, rel_l2(logits.text.data(), tr, V));
      for (int s = 0; s < S; ++s) {
        const float* ar = audio_ref.data() + (i * S + s) * card;
        r.audio_logits_max_rel_l2 =
            std::max(r.audio_logits_max_rel_l2, rel_l2(logits.audio.data() + static_cast<size_t>(s) * card, ar, card));
      }
    }
    if (out_ref[i * K] >= 0) {
      for (int k = 0; k < K; ++k) agree += out && (*out)[k] == out_ref[i * K + k];
      compared += K;
    }
    if (out && i >= n_prompt) r.out_tokens.insert(r.out_tokens.end(), out->begin(), out->end());
  }
  r.out_token_agreement = compared ? static_cast<double>(agree) / compared : 0.0;

  if (mimi) {
    const std::vector<float> pcm_ref = f.to_f32("session.out_pcm");
    const int fs = mimi->frame_samples(), nq = mimi->num_codebooks();
    const size_t frames = r.out_tokens.size() / K;
    std::vector<float> pcm(frames * fs);
    MimiState st;
    std::vector<int32_t> codes(nq);
    for (size_t fr = 0; fr < frames; ++fr) {
      for (int q = 0; q < nq; ++q) codes[q] = static_cast<int32_t>(r.out_tokens[fr * K + 1 + q]);
      mimi->decode(st, codes.data(), pcm.data() + fr * fs);
    }
    if (pcm.size() != pcm_ref.size()) {
      throw Error("session file '" + f.path() + "': session.out_pcm holds " + std::to_string(pcm_ref.size()) +
                  " samples, the replay produced " + std::to_string(pcm.size()));
    }
    r.pcm_rel_l2 = rel_l2(pcm.data(), pcm_ref.data(), static_cast<int64_t>(pcm.size()));
  }
  return r;
}

}  // namespace ppx
