// Streaming causal convolutions of the Mimi codec (weights shared, state per session).
//
// StreamConv1d keeps the last P = K - S input samples of each channel; the first chunk after a
// reset is left-padded with zeros (PadMode::kConstant) or with copies of its first sample
// (PadMode::kReplicate). StreamConvTr1d emits S*T samples per T inputs and carries the K - S
// overlap tail (without bias) to the next chunk. Chunk lengths must be multiples of the stride.
#pragma once

#include <string>
#include <vector>

namespace ppx {

class WeightSource;

enum class PadMode { kConstant, kReplicate };

struct Conv1dState {
  std::vector<float> prev;  // [C_in, P]
  bool first = true;
};

class StreamConv1d {
 public:
  // Loads `<key>.weight` [out, in/groups, K] and, if `bias`, `<key>.bias` [out].
  StreamConv1d(WeightSource& w, const std::string& key, int in, int out, int kernel, int stride, bool bias,
               PadMode pad);
  // x: [in, T] -> y: [out, T/stride]. T must be a multiple of the stride.
  void forward(Conv1dState& st, const float* x, int T, std::vector<float>& y) const;
  int in() const { return in_; }
  int out() const { return out_; }
  int stride() const { return stride_; }

 private:
  int in_, out_, kernel_, stride_;
  PadMode pad_;
  std::vector<float> w_, b_;
};

struct ConvTr1dState {
  std::vector<float> tail;  // [out, K - S], bias excluded; empty before the first chunk
};

class StreamConvTr1d {
 public:
  // Loads `<key>.weight` [in, out/groups, K] and, if `bias`, `<key>.bias` [out]. groups is 1 or in
  // (depthwise, in == out).
  StreamConvTr1d(WeightSource& w, const std::string& key, int in, int out, int kernel, int stride, int groups,
                 bool bias);
  // x: [in, T] -> y: [out, T*stride].
  void forward(ConvTr1dState& st, const float* x, int T, std::vector<float>& y) const;
  int out() const { return out_; }

 private:
  int in_, out_, kernel_, stride_, groups_;
  std::vector<float> w_, b_;
};

}  // namespace ppx
