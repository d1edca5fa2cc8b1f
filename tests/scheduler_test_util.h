// Scripted sessions for the frame scheduler's tests (CPU and CUDA): a session's sampling, seed
// and user audio tokens, and a player that runs one on any LmStepper.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "ppx/config.h"
#include "ppx/lm_gen.h"

namespace ppx::test {

// One session's script: its sampling, seed, user audio tokens and length.
struct Script {
  LmGenConfig gen;
  uint64_t seed = 0;
  // A system prompt first: prompt_steps steps with every stream given (prompt_user and
  // prompt_agent [prompt_steps, n_q / 2], prompt_text [prompt_steps]), what the scheduler prefills.
  int prompt_steps = 0;
  std::vector<int64_t> prompt_user, prompt_agent, prompt_text;
  int steps = 0;
  std::vector<int64_t> user;  // [steps, n_q / 2]
};

inline Script make_script(const ModelConfig& cfg, int index, bool sampling) {
  Script s;
  s.gen = *cfg.lm_gen;
  s.gen.use_sampling = sampling;
  s.seed = 1000 + static_cast<uint64_t>(index);
  s.steps = 8 + (index * 7) % 9;  // 8 .. 16 steps (the tiny model outputs from its third step)
  const int half = cfg.lm->n_q / 2;
  std::mt19937 rng(static_cast<uint32_t>(index) * 7919u + 13u);
  std::uniform_int_distribution<int> tok(0, cfg.lm->card - 1);
  s.user.resize(static_cast<size_t>(s.steps) * half);
  for (auto& t : s.user) t = tok(rng);
  // Every fourth session has no prompt; the others 1 .. 14 steps, across prefill chunk edges.
  s.prompt_steps = index % 4 == 0 ? 0 : 1 + (index * 5) % 14;
  std::uniform_int_distribution<int> text(0, cfg.lm->text_card - 1);
  s.prompt_user.resize(static_cast<size_t>(s.prompt_steps) * half);
  s.prompt_agent.resize(s.prompt_user.size());
  s.prompt_text.resize(static_cast<size_t>(s.prompt_steps));
  for (auto& t : s.prompt_user) t = tok(rng);
  for (auto& t : s.prompt_agent) t = tok(rng);
  for (auto& t : s.prompt_text) t = text(rng);
  return s;
}

// The script's system prompt on `gen` (its outputs are not read, as in conversation).
inline void play_prompt(LmGen& gen, const Script& s, int half) {
  for (int i = 0; i < s.prompt_steps; ++i)
    gen.step(s.prompt_user.data() + static_cast<size_t>(i) * half, s.prompt_agent.data() + static_cast<size_t>(i) * half,
             s.prompt_text[static_cast<size_t>(i)]);
}

// Runs a script on `gen` (its prompt, then its steps) and returns every token the session
// produced after the prompt, in order.
inline std::vector<int64_t> play_on(LmGen& gen, const Script& s, int half) {
  play_prompt(gen, s, half);
  std::vector<int64_t> out;
  for (int i = 0; i < s.steps; ++i) {
    const auto frame = gen.step(s.user.data() + static_cast<size_t>(i) * half, nullptr, std::nullopt);
    if (frame) out.insert(out.end(), frame->begin(), frame->end());
  }
  return out;
}

// The same on a fresh LmGen over `stepper`.
inline std::vector<int64_t> play(LmStepper& stepper, const Script& s, int half) {
  LmGen gen(stepper, s.gen);
  return play_on(gen, s, half);
}

}  // namespace ppx::test
