// The PersonaPlex language model on the CPU in fp32: temporal transformer (one token per frame,
// ring KV cache of `context` slots, RoPE, RMSNorm, SiLU gating), text head, and the depformer
// that emits dep_q audio tokens per frame with per-step weights. Checkpoint tensors of any float
// dtype (bf16/fp16/fp32, per tensor) are upcast to fp32 at load; nothing is rounded inside.
//
// Weights (Lm) are immutable and shared; per-session state lives in LmState.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ppx/config.h"
#include "ppx/ring_kv.h"

namespace ppx {

class WeightSource;

// Every tensor of the upstream LM state dict for `c` (dep_q-step layout), in upstream order.
std::vector<std::pair<std::string, std::vector<int64_t>>> lm_state_dict_spec(const LmConfig& c);

// Chooses each sampled token. Called with fp32 logits; returns an index into them.
class TokenChooser {
 public:
  virtual ~TokenChooser() = default;
  virtual int text(const float* logits, int n) = 0;
  // `step` is the depformer step (0..dep_q-1).
  virtual int audio(int step, const float* logits, int n) = 0;
};

struct LmState {
  std::vector<cpu::RingKv> kv;  // per temporal layer
  int64_t pos = 0;              // tokens processed by the temporal transformer
};

class Lm {
 public:
  // Loads the state dict. From a safetensors file, also accepts the 8-step (Kyutai Moshi)
  // depformer layout and expands it to dep_q steps as upstream does.
  Lm(const LmConfig& c, WeightSource& w);
  ~Lm();

  const LmConfig& config() const { return c_; }
  void init_state(LmState& st) const;

  // Sum of the stream embeddings of one cache column `tokens` [n_q + 1] (text first); x: [dim].
  // Token -1 embeds to zeros; other negative tokens are clamped to 0, as upstream.
  void embed(const int64_t* tokens, float* x) const;
  // One temporal step: x [dim] -> h = out_norm(transformer(x)) [dim], text_logits [text_card].
  void temporal(LmState& st, const float* x, float* h, float* text_logits) const;
  // The depformer for one frame. text_token: the merged text token. forced/provided: [dep_q].
  // Step s samples a_s with `chooser`; the next step's input is provided[s] ? forced[s] : a_s.
  // sampled: [dep_q] out. logits: [dep_q * card] out, or nullptr. Runs the first `steps` steps
  // (dep_q for the upstream behaviour); the rest of `sampled` is set to -1.
  void depformer(const float* h, int64_t text_token, const int64_t* forced, const uint8_t* provided,
                 TokenChooser& chooser, int steps, int64_t* sampled, float* logits) const;

 private:
  struct Weights;
  LmConfig c_;
  std::unique_ptr<Weights> w_;
};

}  // namespace ppx
