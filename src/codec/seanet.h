// SEANet encoder and decoder of Mimi (causal, streaming, no norm, ELU, identity skips).
// Keys follow upstream: `encoder.model.N.*`, `decoder.model.N.*`.
#pragma once

#include <memory>
#include <vector>

#include "codec/conv.h"
#include "ppx/config.h"

namespace ppx {

// One layer of the sequential model; its streaming state lives in SeanetState at the same index.
struct SeanetLayer {
  enum class Kind { kConv, kConvTr, kElu, kResBlock };
  explicit SeanetLayer(Kind k) : kind(k) {}
  Kind kind;
  std::unique_ptr<StreamConv1d> conv;   // kConv; kResBlock: the kernel-3 conv (block.1)
  std::unique_ptr<StreamConv1d> conv2;  // kResBlock: the kernel-1 conv (block.3)
  std::unique_ptr<StreamConvTr1d> convtr;
  int channels = 0;  // kElu / kResBlock: width
};

struct SeanetState {
  std::vector<Conv1dState> conv;   // per layer (kConv, kResBlock first conv)
  std::vector<Conv1dState> conv2;  // per layer (kResBlock second conv)
  std::vector<ConvTr1dState> convtr;
  void reset(size_t n_layers);
};

class Seanet {
 public:
  // `decoder` selects the mirror network. `prefix` is "encoder.model." or "decoder.model.".
  Seanet(const SeanetConfig& c, WeightSource& w, bool decoder);
  // Encoder: x [1, T] -> y [dimension, T / hop]. Decoder: x [dimension, T] -> y [1, T * hop].
  void forward(SeanetState& st, const std::vector<float>& x, int T, std::vector<float>& y, int* T_out) const;
  size_t n_layers() const { return layers_.size(); }

 private:
  std::vector<SeanetLayer> layers_;
};

}  // namespace ppx
