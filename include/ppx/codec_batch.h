// The codec (Mimi) of many sessions at once: per-session streaming state lives in slots sized at
// startup, and one encode() or decode() call runs one frame for each of n sessions. A backend that
// can batch its kernels launches each layer once for all of them (CUDA); one that cannot loops
// over per-slot CodecStreams (LoopCodecBatch). Either way a session's codes and audio are exactly
// those it would get from its own CodecStream: batching changes how the work is launched, not the
// arithmetic of any row.
//
// Who calls what: the codec scheduler (src/engine/codec_scheduler.h) owns the CodecBatch and is
// the only thread that calls into it; sessions reach it through the CodecStream it hands out.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "ppx/conversation.h"

namespace ppx {

class CodecBatch {
 public:
  virtual ~CodecBatch() = default;
  virtual int slots() const = 0;
  virtual int frame_samples() const = 0;
  virtual int num_codebooks() const = 0;
  virtual int codebook_size() const = 0;  // codes are in [0, codebook_size())
  // The stream of `slot` starts over (encoder and decoder): its next frame is a first frame.
  virtual void reset(int slot) = 0;
  // One frame for each of n distinct slots: pcm [n][frame_samples] -> codes [n][num_codebooks],
  // row i being slots[i]'s.
  virtual void encode(const int* slots, int n, const float* pcm, int32_t* codes) = 0;
  // codes [n][num_codebooks] -> pcm [n][frame_samples]. A code outside [0, codebook_size()) is a
  // ppx::Error (the codec scheduler checks each session's codes before batching them, so that one
  // session's bad codes fail that session alone).
  virtual void decode(const int* slots, int n, const int32_t* codes, float* pcm) = 0;
  // Called once by the thread that will make every other call, before any (CUDA: binds it to the
  // backend's device).
  virtual void attach_thread() {}
};

// A CodecBatch over one CodecStream per slot, made on first use by `make(slot)`: the fallback for
// a backend without batched kernels (the CPU reference). Calls are per slot, in row order.
class LoopCodecBatch : public CodecBatch {
 public:
  using MakeStream = std::function<std::unique_ptr<CodecStream>(int slot)>;
  LoopCodecBatch(int slots, int frame_samples, int num_codebooks, int codebook_size, MakeStream make,
                 std::function<void()> attach = {})
      : streams_(static_cast<size_t>(slots)), fs_(frame_samples), ncb_(num_codebooks), bins_(codebook_size),
        make_(std::move(make)), attach_(std::move(attach)) {}
  int slots() const override { return static_cast<int>(streams_.size()); }
  int frame_samples() const override { return fs_; }
  int num_codebooks() const override { return ncb_; }
  int codebook_size() const override { return bins_; }
  void reset(int slot) override { stream(slot).reset(); }
  void encode(const int* slots, int n, const float* pcm, int32_t* codes) override {
    for (int i = 0; i < n; ++i)
      stream(slots[i]).encode(pcm + static_cast<size_t>(i) * fs_, codes + static_cast<size_t>(i) * ncb_);
  }
  void decode(const int* slots, int n, const int32_t* codes, float* pcm) override {
    for (int i = 0; i < n; ++i)
      stream(slots[i]).decode(codes + static_cast<size_t>(i) * ncb_, pcm + static_cast<size_t>(i) * fs_);
  }
  void attach_thread() override {
    if (attach_) attach_();
  }

 private:
  CodecStream& stream(int slot);
  std::vector<std::unique_ptr<CodecStream>> streams_;
  int fs_, ncb_, bins_;
  MakeStream make_;
  std::function<void()> attach_;
};

}  // namespace ppx
