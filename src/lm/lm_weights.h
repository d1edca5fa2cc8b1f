// fp32 weights of the LM, loaded by key from a WeightSource (see lm_state_dict_spec for keys).
#pragma once

#include <vector>

#include "ppx/lm.h"

namespace ppx {

struct Lm::Weights {
  struct Temporal {
    std::vector<float> in_proj;   // [3*dim, dim] rows: Q, K, V; head h = rows h*hd..h*hd+hd-1 in each
    std::vector<float> out_proj;  // [dim, dim]
    std::vector<float> norm1, norm2;  // [dim]
    std::vector<float> lin_in;    // [2*hidden, dim] rows: gate (SiLU) then up
    std::vector<float> lin_out;   // [dim, hidden]
  };
  struct Depformer {
    std::vector<float> norm1, norm2;  // [ddim], shared by all steps
    std::vector<float> in_proj;       // [dep_q * 3*ddim, ddim]
    std::vector<float> out_proj;      // [dep_q * ddim, ddim]
    std::vector<std::vector<float>> lin_in;   // per step [2*dhidden, ddim]
    std::vector<std::vector<float>> lin_out;  // per step [ddim, dhidden]
  };
  std::vector<std::vector<float>> emb;  // per audio stream [card+1, dim]
  std::vector<float> text_emb;          // [text_card+1, dim]
  std::vector<Temporal> layers;
  std::vector<float> out_norm;          // [dim]
  std::vector<float> text_linear;       // [text_card, dim]
  std::vector<std::vector<float>> depformer_in;   // per step [ddim, dim]
  std::vector<float> depformer_text_emb;          // [text_card+1, ddim]
  std::vector<std::vector<float>> depformer_emb;  // per step 1.. [card+1, ddim]
  std::vector<Depformer> dep_layers;
  std::vector<std::vector<float>> linears;        // per step [card, ddim]
};

// Loads `key` with `shape`, applying upstream's 8 -> dep_q depformer expansion when the source is
// a checkpoint file in the 8-step layout.
std::vector<float> load_lm_tensor(WeightSource& w, const std::string& key, const std::vector<int64_t>& shape);

}  // namespace ppx
