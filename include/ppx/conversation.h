// One full-duplex conversation on the CPU reference path: the system prompts, then one 80 ms
// frame in -> one frame out (Mimi encode, LM step, Mimi decode), exactly as the upstream server
// and offline tool sequence them. Weights (Mimi, Lm) are shared; all state here is per session.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ppx/config.h"
#include "ppx/lm_gen.h"
#include "ppx/mimi.h"

namespace ppx {

// A precomputed voice prompt (.pt file contents): embeddings [n, dim] and the token cache [K, CT].
struct VoiceEmbeddings {
  int64_t n = 0, dim = 0;
  std::vector<float> embeddings;
  std::vector<int64_t> cache;
};

// Reads a PersonaPlex voice file (`embeddings` [n,1,1,dim], `cache` [1,K,CT]). Throws ppx::Error.
VoiceEmbeddings load_voice_embeddings(const std::string& path);

struct SystemPrompt {
  std::optional<VoiceEmbeddings> voice;  // a .pt voice, or
  std::vector<float> voice_audio;        // voice audio at the model rate (already normalised), or neither
  std::vector<int> text_tokens;          // tokenized "<system> ... <system>", may be empty
};

// Steps the system prompts would take (voice frames + silences + text tokens).
int64_t system_prompt_steps(const SystemPrompt& p, int frame_samples, int silence_frames);

struct FrameOut {
  std::vector<float> pcm;  // [frame_samples] agent audio (not clamped)
  int64_t text_token = 0;  // 0 = EPAD, 3 = PAD, else a SentencePiece id
  std::vector<int64_t> tokens;  // the whole frame [dep_q + 1]
};

class Conversation {
 public:
  // `mimi` and `lm` must outlive this object. seed: sampling seed.
  Conversation(const Mimi& mimi, const Lm& lm, const LmGenConfig& gen, uint64_t seed, int dep_steps = -1);

  // Runs the four prompt phases (voice, silence, text, silence) and resets Mimi. Throws
  // ppx::Error when they would not fit in the LM context. `on_step(done, total)` reports progress
  // and may return false to abandon (client gone).
  bool run_system_prompts(const SystemPrompt& p, const std::function<bool(int64_t, int64_t)>& on_step = {});
  // Wall time of each stage of the last step, in milliseconds.
  struct StageTimes {
    double encode = 0, lm = 0, decode = 0;
  };
  // One frame of user audio [frame_samples] -> the agent frame (always produced after prompts).
  std::optional<FrameOut> step(const float* pcm_in, StageTimes* times = nullptr);
  const LmGen& lm_gen() const { return gen_; }

 private:
  const Mimi& mimi_;
  const Lm& lm_;
  LmGenConfig cfg_;
  Sampler sampler_;
  CpuLmStepper stepper_;
  LmGen gen_;
  MimiState mimi_state_;
};

}  // namespace ppx
