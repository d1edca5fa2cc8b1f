// Mimi neural audio codec, CPU fp32, streaming: one frame of `frame_samples()` PCM samples
// (1920 at 24 kHz) <-> `num_codebooks()` codes (8). Weights are shared and immutable; all streaming
// state of one audio stream lives in a MimiState, so many sessions can share one Mimi.
#pragma once

#include <cstdint>
#include <memory>

#include "ppx/config.h"

namespace ppx {

class WeightSource;
struct MimiStateImpl;

// Streaming state of one stream (conv contexts, transposed-conv tails, the two KV rings).
class MimiState {
 public:
  MimiState();
  ~MimiState();
  MimiState(MimiState&&) noexcept;
  MimiState& operator=(MimiState&&) noexcept;
  void reset();          // both directions
  void reset_encoder();
  void reset_decoder();
  MimiStateImpl& impl() { return *impl_; }

 private:
  std::unique_ptr<MimiStateImpl> impl_;
};

class Mimi {
 public:
  // Loads every tensor of the upstream state dict (keys of `mimi_keys.json` for the real model);
  // codebooks beyond num_codebooks are checked for shape but not kept.
  Mimi(const MimiConfig& c, WeightSource& w);
  ~Mimi();

  const MimiConfig& config() const { return c_; }
  int frame_samples() const { return c_.frame_samples(); }
  int num_codebooks() const { return c_.num_codebooks; }

  // pcm: [frame_samples] -> codes: [num_codebooks], each in [0, bins).
  void encode(MimiState& st, const float* pcm, int32_t* codes) const;
  // codes: [num_codebooks] -> pcm: [frame_samples] (not clamped). Throws ppx::Error on a code
  // outside [0, bins).
  void decode(MimiState& st, const int32_t* codes, float* pcm) const;

 private:
  struct Parts;
  MimiConfig c_;
  std::unique_ptr<Parts> p_;
};

}  // namespace ppx
