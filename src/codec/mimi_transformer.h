// Mimi's streaming transformer (encoder_transformer / decoder_transformer): pre-norm layers with
// LayerNorm (eps 1e-5), RoPE attention over a ring KV cache, exact-GELU MLP and LayerScale.
#pragma once

#include <string>
#include <vector>

#include "backend/cpu_attention.h"
#include "ppx/config.h"

namespace ppx {

class WeightSource;

struct MimiTransformerState {
  std::vector<cpu::RingKv> kv;  // per layer
  int64_t offset = 0;           // tokens processed (RoPE position of the next token)
};

class MimiTransformer {
 public:
  // prefix: "encoder_transformer.transformer." or "decoder_transformer.transformer."
  MimiTransformer(const MimiTransformerConfig& c, WeightSource& w, const std::string& prefix);
  void init_state(MimiTransformerState& st) const;
  // x: [D, T] channel-major (conv layout), updated in place.
  void forward(MimiTransformerState& st, std::vector<float>& x, int T) const;

 private:
  struct Layer {
    std::vector<float> in_proj, out_proj, norm1_w, norm1_b, norm2_w, norm2_b, linear1, linear2, ls1, ls2;
  };
  MimiTransformerConfig c_;
  std::vector<Layer> layers_;
};

}  // namespace ppx
