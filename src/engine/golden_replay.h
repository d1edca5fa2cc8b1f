// Replays an upstream golden session (the `session_*.safetensors` reference vectors) through the
// LM and Mimi and measures agreement. Used by `personaplex-verify session` and the tests.
//
// Session file layout (upstream-generated): per step i, `step.user` / `step.moshi` [S, 8] and
// `step.text_in` [S, 1] hold the provided tokens (-1 = not provided), `step.text_logits` [S, V]
// and `step.audio_logits` [S, dep_q, card] the logits (NaN where a step produced none), `step.out`
// [S, K] the returned frame (-1 while none); `session.out_pcm` is the Mimi decoding of the frames
// returned after the `session.n_prompt_steps` system-prompt steps.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "ppx/config.h"
#include "ppx/conversation.h"

namespace ppx {

class LmStepper;
class Mimi;
class SafeTensors;


struct ReplayReport {
  int steps = 0;                       // steps replayed
  int first_step = 0;                  // first step compared (after a voice replay: its length)
  double text_logits_max_rel_l2 = 0;   // over compared steps with logits
  double audio_logits_max_rel_l2 = 0;  // over compared steps and depformer steps
  double out_token_agreement = 0;      // fraction of equal tokens in returned frames
  std::optional<double> pcm_rel_l2;    // when a Mimi is given
  std::vector<int64_t> out_tokens;     // frames returned after the prompts, [frames, K]
};

// `stepper` must choose tokens greedily (argmax). teacher_forced: every sampled token is the
// argmax of the golden logits of that step (so the token history cannot diverge); otherwise the
// model's own greedy choice. With `voice`, the voice-prompt steps are replaced by the embedding
// replay and comparison starts after them. `mimi` (optional) decodes the output frames.
ReplayReport replay_golden_session(LmStepper& stepper, const LmGenConfig& gen, const Mimi* mimi,
                                   const SafeTensors& session, bool teacher_forced,
                                   const VoiceEmbeddings* voice = nullptr);

}  // namespace ppx
