// CPU fp32 reference ops. Row-major; `Linear` weights are [out, in]; activations of the
// transformers are [T, D] (token-major), of convolutions [C, T] (channel-major).
// These are the numerics every other backend is checked against: plain fp32 with fp32
// accumulation, written so the compiler can vectorise the inner loops.
#pragma once

#include <cstdint>

namespace ppx::cpu {

// Dot product of two fp32 vectors of length n.
float dot(const float* a, const float* b, int64_t n);

// y[t, o] = sum_i x[t, i] * w[o, i] (+ bias[o] if bias != nullptr).
// x: [T, in], w: [out, in], y: [T, out]. y must not alias x.
void linear(const float* x, int64_t T, const float* w, int64_t out, int64_t in, const float* bias, float* y);

// LayerNorm over the last dim with affine weight/bias, eps as given. x, y: [T, D] (may alias).
void layer_norm(const float* x, int64_t T, int64_t D, const float* weight, const float* bias, float eps, float* y);

// Exact GELU 0.5*x*(1+erf(x/sqrt(2))), in place.
void gelu_inplace(float* x, int64_t n);
// ELU with alpha 1, out-of-place (y may alias x).
void elu(const float* x, int64_t n, float* y);

// Interleaved rotary embedding on one head vector: pairs (2i, 2i+1), omega_i =
// exp(i * (-ln(max_period) * 2 / D)), angle = pos * omega_i, all in fp32. x: [D], in place.
void rope_inplace(float* x, int64_t D, float pos, float max_period);

}  // namespace ppx::cpu
