// Split residual vector quantizer of Mimi: one semantic codebook (rvq_first) and num_codebooks-1
// acoustic codebooks (rvq_rest), both projecting the same latent. Codebooks are precomputed at load
// as embedding_sum / max(cluster_usage, 1e-5).
#pragma once

#include <cstdint>
#include <vector>

#include "ppx/config.h"

namespace ppx {

class WeightSource;

class SplitRvq {
 public:
  SplitRvq(const MimiConfig& c, WeightSource& w);
  // x: [input_dimension] latent -> codes [num_codebooks].
  void encode(const float* x, int32_t* codes) const;
  // codes [num_codebooks] -> [output_dimension] latent. Codes must be in [0, bins).
  void decode(const int32_t* codes, float* y) const;

 private:
  struct Codebook {
    std::vector<float> e;     // [bins, dim]
    std::vector<float> norm2; // [bins] squared norms
  };
  int argmin(const Codebook& cb, const float* x) const;
  int dim_, bins_, in_dim_, out_dim_, n_;
  std::vector<float> in_first_, out_first_, in_rest_, out_rest_;
  std::vector<Codebook> books_;  // [0] semantic, [1..] acoustic
};

}  // namespace ppx
