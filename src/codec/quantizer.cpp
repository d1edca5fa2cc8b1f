#include "codec/quantizer.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "backend/cpu_ops.h"
#include "ppx/weights.h"

namespace ppx {

SplitRvq::SplitRvq(const MimiConfig& c, WeightSource& w)
    : dim_(c.quantizer.dimension),
      bins_(c.quantizer.bins),
      in_dim_(c.quantizer.input_dimension),
      out_dim_(c.quantizer.output_dimension),
      n_(c.num_codebooks) {
  const int D = dim_, B = bins_;
  auto load_book = [&](const std::string& prefix, bool used) {
    const std::string k = prefix + "._codebook.";
    w.require(k + "_initialized", {1});
    if (!used) {
      w.require(k + "cluster_usage", {B});
      w.require(k + "embedding_sum", {B, D});
      return;
    }
    const std::vector<float> usage = w.load(k + "cluster_usage", {B});
    std::vector<float> sum = w.load(k + "embedding_sum", {B, D});
    Codebook cb;
    cb.e.resize(sum.size());
    cb.norm2.resize(B);
    for (int b = 0; b < B; ++b) {
      const float u = std::max(usage[b], 1e-5f);
      for (int d = 0; d < D; ++d) cb.e[static_cast<size_t>(b) * D + d] = sum[static_cast<size_t>(b) * D + d] / u;
      cb.norm2[b] = cpu::dot(&cb.e[static_cast<size_t>(b) * D], &cb.e[static_cast<size_t>(b) * D], D);
    }
    books_.push_back(std::move(cb));
  };
  in_first_ = w.load("quantizer.rvq_first.input_proj.weight", {D, in_dim_, 1});
  out_first_ = w.load("quantizer.rvq_first.output_proj.weight", {out_dim_, D, 1});
  load_book("quantizer.rvq_first.vq.layers.0", true);
  in_rest_ = w.load("quantizer.rvq_rest.input_proj.weight", {D, in_dim_, 1});
  out_rest_ = w.load("quantizer.rvq_rest.output_proj.weight", {out_dim_, D, 1});
  for (int q = 0; q < c.quantizer.n_q - 1; ++q) {
    load_book("quantizer.rvq_rest.vq.layers." + std::to_string(q), q < n_ - 1);
  }
}

// Same formula as torch.cdist's matrix path: d^2 = |x|^2 - 2 x.e + |e|^2, clamped, ties -> lowest.
int SplitRvq::argmin(const Codebook& cb, const float* x) const {
  const float xn = cpu::dot(x, x, dim_);
  int best = 0;
  float best_d = INFINITY;
  for (int b = 0; b < bins_; ++b) {
    const float d2 = std::max(xn - 2.f * cpu::dot(x, &cb.e[static_cast<size_t>(b) * dim_], dim_) + cb.norm2[b], 0.f);
    const float d = std::sqrt(d2);
    if (d < best_d) {
      best_d = d;
      best = b;
    }
  }
  return best;
}

void SplitRvq::encode(const float* x, int32_t* codes) const {
  std::vector<float> p(dim_), r(dim_);
  cpu::linear(x, 1, in_first_.data(), dim_, in_dim_, nullptr, p.data());
  codes[0] = argmin(books_[0], p.data());
  cpu::linear(x, 1, in_rest_.data(), dim_, in_dim_, nullptr, r.data());
  for (int q = 1; q < n_; ++q) {
    const int c = argmin(books_[q], r.data());
    codes[q] = c;
    const float* e = &books_[q].e[static_cast<size_t>(c) * dim_];
    for (int d = 0; d < dim_; ++d) r[d] -= e[d];
  }
}

void SplitRvq::decode(const int32_t* codes, float* y) const {
  std::vector<float> e0(books_[0].e.begin() + static_cast<size_t>(codes[0]) * dim_,
                        books_[0].e.begin() + static_cast<size_t>(codes[0] + 1) * dim_);
  std::vector<float> acc(dim_, 0.f), a(out_dim_), b(out_dim_);
  for (int q = 1; q < n_; ++q) {
    const float* e = &books_[q].e[static_cast<size_t>(codes[q]) * dim_];
    for (int d = 0; d < dim_; ++d) acc[d] += e[d];
  }
  cpu::linear(e0.data(), 1, out_first_.data(), out_dim_, dim_, nullptr, a.data());
  cpu::linear(acc.data(), 1, out_rest_.data(), out_dim_, dim_, nullptr, b.data());
  for (int o = 0; o < out_dim_; ++o) y[o] = a[o] + b[o];
}

}  // namespace ppx
