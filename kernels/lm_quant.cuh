// Weight quantization for the w8a16 GEMV (lm_gemv.cuh with GemvArgs::w8 or wi8): bf16 [N, K] ->
// 8-bit [N, K] plus one fp32 scale per row (per output channel), as fp8 e4m3 or as int8.
//
// int8: scale[n] = max_k |w[n, k]| / 127 (1 for a row of zeros); q[n, k] = rint(w[n, k] /
// scale[n]) clamped to [-127, 127]: 255 uniform levels per row, an absolute error <= scale / 2 per
// weight (relative 1/254 at the row's largest entry, 1/25 at a fifth of it).
//
// fp8 e4m3:
// Scheme: scale[n] = max_k |w[n, k]| / 448 (448 is e4m3's largest finite value), or 1 for a row
// of zeros; q[n, k] = e4m3(w[n, k] / scale[n]), rounded to nearest (ties to even) and saturated
// to +-448 (never NaN for finite input). The division is IEEE fp32. Dequantized weights are
// float(q[n, k]) * scale[n]: the largest entry of each row maps to +-448, e4m3 keeps 3 mantissa
// bits (relative error <= 2^-4 per weight for |w| >= 2^-6 * scale, absolute <= 2^-10 * scale
// below). Inputs must be finite.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace ppx::kern {

// Quantizes w [N, K] (row-major, any K >= 1) into q [N, K] and scale [N] on stream s.
// Throws std::runtime_error on N < 0 or K < 1.
void quantize_fp8_rows(const __nv_bfloat16* w, int N, int K, __nv_fp8_e4m3* q, float* scale, cudaStream_t s);
void quantize_int8_rows(const __nv_bfloat16* w, int N, int K, int8_t* q, float* scale, cudaStream_t s);
// out[i] = q[i] as bf16 (exact: |q| <= 127 fits bf16's 8-bit significand) for i < n, on stream s:
// the int8 weights' values for kern::gemm_set_policy(3). Throws std::runtime_error on n < 0.
void int8_to_bf16(const int8_t* q, __nv_bfloat16* out, int64_t n, cudaStream_t s);

}  // namespace ppx::kern
