#include "codec/conv.h"

#include <algorithm>

#include "ppx/error.h"
#include "ppx/weights.h"

namespace ppx {

StreamConv1d::StreamConv1d(WeightSource& w, const std::string& key, int in, int out, int kernel, int stride,
                           bool bias, PadMode pad)
    : in_(in), out_(out), kernel_(kernel), stride_(stride), pad_(pad) {
  w_ = w.load(key + ".weight", {out, in, kernel});
  if (bias) b_ = w.load(key + ".bias", {out});
  if (kernel < stride) throw Error("conv '" + key + "': kernel smaller than stride");
}

void StreamConv1d::forward(Conv1dState& st, const float* x, int T, std::vector<float>& y) const {
  const int P = kernel_ - stride_;
  const int L = P + T;
  const int n_out = T / stride_;
  if (st.first) {
    st.prev.assign(static_cast<size_t>(in_) * P, 0.f);
    if (pad_ == PadMode::kReplicate && T > 0) {
      for (int i = 0; i < in_; ++i) std::fill_n(st.prev.begin() + i * P, P, x[static_cast<size_t>(i) * T]);
    }
    st.first = false;
  }
  // xp = concat(prev, x) per channel: [in, L].
  std::vector<float> xp(static_cast<size_t>(in_) * L);
  for (int i = 0; i < in_; ++i) {
    std::copy_n(st.prev.begin() + static_cast<size_t>(i) * P, P, xp.begin() + static_cast<size_t>(i) * L);
    std::copy_n(x + static_cast<size_t>(i) * T, T, xp.begin() + static_cast<size_t>(i) * L + P);
  }
  y.assign(static_cast<size_t>(out_) * n_out, 0.f);
  for (int o = 0; o < out_; ++o) {
    float* yo = y.data() + static_cast<size_t>(o) * n_out;
    for (int i = 0; i < in_; ++i) {
      const float* xi = xp.data() + static_cast<size_t>(i) * L;
      const float* wk = w_.data() + (static_cast<size_t>(o) * in_ + i) * kernel_;
      for (int j = 0; j < kernel_; ++j) {
        const float wv = wk[j];
        if (stride_ == 1) {
          const float* src = xi + j;
#pragma omp simd
          for (int n = 0; n < n_out; ++n) yo[n] += wv * src[n];
        } else {
          for (int n = 0; n < n_out; ++n) yo[n] += wv * xi[n * stride_ + j];
        }
      }
    }
    if (!b_.empty()) {
      for (int n = 0; n < n_out; ++n) yo[n] += b_[o];
    }
  }
  // Keep the last P samples of xp.
  for (int i = 0; i < in_; ++i) {
    std::copy_n(xp.begin() + static_cast<size_t>(i) * L + n_out * stride_, P,
                st.prev.begin() + static_cast<size_t>(i) * P);
  }
}

StreamConvTr1d::StreamConvTr1d(WeightSource& w, const std::string& key, int in, int out, int kernel, int stride,
                               int groups, bool bias)
    : in_(in), out_(out), kernel_(kernel), stride_(stride), groups_(groups) {
  if (groups != 1 && !(groups == in && in == out)) throw Error("convtr '" + key + "': only groups 1 or depthwise");
  w_ = w.load(key + ".weight", {in, out / groups, kernel});
  if (bias) b_ = w.load(key + ".bias", {out});
  if (kernel < stride) throw Error("convtr '" + key + "': kernel smaller than stride");
}

void StreamConvTr1d::forward(ConvTr1dState& st, const float* x, int T, std::vector<float>& y) const {
  const int S = stride_, K = kernel_, tail = K - S;
  const int full_len = S * (T - 1) + K;
  std::vector<float> full(static_cast<size_t>(out_) * full_len, 0.f);
  for (int o = 0; o < out_; ++o) {
    float* fo = full.data() + static_cast<size_t>(o) * full_len;
    if (groups_ == 1) {
      for (int i = 0; i < in_; ++i) {
        const float* xi = x + static_cast<size_t>(i) * T;
        const float* wk = w_.data() + (static_cast<size_t>(i) * out_ + o) * K;
        for (int j = 0; j < K; ++j) {
          const float wv = wk[j];
          for (int n = 0; n < T; ++n) fo[n * S + j] += wv * xi[n];
        }
      }
    } else {
      const float* xi = x + static_cast<size_t>(o) * T;
      const float* wk = w_.data() + static_cast<size_t>(o) * K;
      for (int j = 0; j < K; ++j) {
        for (int n = 0; n < T; ++n) fo[n * S + j] += wk[j] * xi[n];
      }
    }
  }
  if (!st.tail.empty()) {
    for (int o = 0; o < out_; ++o) {
      for (int j = 0; j < tail; ++j) full[static_cast<size_t>(o) * full_len + j] += st.tail[static_cast<size_t>(o) * tail + j];
    }
  }
  const int n_emit = S * T;
  y.resize(static_cast<size_t>(out_) * n_emit);
  st.tail.resize(static_cast<size_t>(out_) * tail);
  for (int o = 0; o < out_; ++o) {
    const float b = b_.empty() ? 0.f : b_[o];
    const float* fo = full.data() + static_cast<size_t>(o) * full_len;
    for (int n = 0; n < n_emit; ++n) y[static_cast<size_t>(o) * n_emit + n] = fo[n] + b;
    std::copy_n(fo + n_emit, tail, st.tail.begin() + static_cast<size_t>(o) * tail);
  }
}

}  // namespace ppx
