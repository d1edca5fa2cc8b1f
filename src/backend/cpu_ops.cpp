#include "backend/cpu_ops.h"

#include <cmath>

namespace ppx::cpu {

float dot(const float* a, const float* b, int64_t n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

void linear(const float* x, int64_t T, const float* w, int64_t out, int64_t in, const float* bias, float* y) {
  for (int64_t t = 0; t < T; ++t) {
    const float* xt = x + t * in;
    float* yt = y + t * out;
    for (int64_t o = 0; o < out; ++o) yt[o] = dot(w + o * in, xt, in) + (bias ? bias[o] : 0.f);
  }
}

void layer_norm(const float* x, int64_t T, int64_t D, const float* weight, const float* bias, float eps, float* y) {
  for (int64_t t = 0; t < T; ++t) {
    const float* xt = x + t * D;
    float* yt = y + t * D;
    double mean = 0.0;
    for (int64_t i = 0; i < D; ++i) mean += xt[i];
    mean /= static_cast<double>(D);
    double var = 0.0;
    for (int64_t i = 0; i < D; ++i) {
      const double d = xt[i] - mean;
      var += d * d;
    }
    var /= static_cast<double>(D);
    const float inv = static_cast<float>(1.0 / std::sqrt(var + eps));
    const float m = static_cast<float>(mean);
    for (int64_t i = 0; i < D; ++i) yt[i] = (xt[i] - m) * inv * weight[i] + bias[i];
  }
}

void gelu_inplace(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = 0.5f * x[i] * (1.f + std::erf(x[i] * static_cast<float>(M_SQRT1_2)));
}

void elu(const float* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.f ? x[i] : std::expm1(x[i]);
}

void rope_inplace(float* x, int64_t D, float pos, float max_period) {
  // The exponent constant is formed in double and rounded once to fp32, as upstream does.
  const float c = static_cast<float>(-std::log(static_cast<double>(max_period)) * 2.0 / static_cast<double>(D));
  for (int64_t i = 0; i < D / 2; ++i) {
    const float omega = std::exp(static_cast<float>(i) * c);
    const float theta = pos * omega;
    const float cs = std::cos(theta), sn = std::sin(theta);
    const float a = x[2 * i], b = x[2 * i + 1];
    x[2 * i] = a * cs - b * sn;
    x[2 * i + 1] = a * sn + b * cs;
  }
}

}  // namespace ppx::cpu
