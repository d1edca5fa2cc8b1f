// One block per weight row: a block max of |w|, then each thread converts its strided share.
#include "lm_quant.cuh"

#include <algorithm>
#include <stdexcept>

#include "common.cuh"

namespace ppx::kern {
namespace {

constexpr int kThreads = 256;
constexpr float kFp8Max = 448.f;

// This block's row of w [N, K]: its dequantization scale max|row| / qmax (1 for a row of zeros),
// stored to scale[blockIdx.x] and returned to every thread.
__device__ float row_scale(const __nv_bfloat16* w, int K, float qmax, float* scale) {
  __shared__ float red[32];
  const int64_t row = static_cast<int64_t>(blockIdx.x) * K;
  float m = 0.f;
  for (int k = threadIdx.x; k < K; k += kThreads) m = fmaxf(m, fabsf(__bfloat162float(w[row + k])));
  m = block_max(m, red);
  const float sc = m > 0.f ? __fdiv_rn(m, qmax) : 1.f;
  if (threadIdx.x == 0) scale[blockIdx.x] = sc;
  return sc;
}

__global__ void __launch_bounds__(kThreads) quantize_rows_kernel(const __nv_bfloat16* w, int K, __nv_fp8_e4m3* q,
                                                                 float* scale) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * K;
  const float sc = row_scale(w, K, kFp8Max, scale);
  __nv_fp8_storage_t* out = reinterpret_cast<__nv_fp8_storage_t*>(q) + row;
  for (int k = threadIdx.x; k < K; k += kThreads) {
    out[k] = __nv_cvt_float_to_fp8(__fdiv_rn(__bfloat162float(w[row + k]), sc), __NV_SATFINITE, __NV_E4M3);
  }
}

__global__ void __launch_bounds__(kThreads) quantize_int8_kernel(const __nv_bfloat16* w, int K, int8_t* q,
                                                                 float* scale) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * K;
  const float sc = row_scale(w, K, 127.f, scale);
  for (int k = threadIdx.x; k < K; k += kThreads) {
    const float v = rintf(__fdiv_rn(__bfloat162float(w[row + k]), sc));
    q[row + k] = static_cast<int8_t>(fminf(fmaxf(v, -127.f), 127.f));
  }
}

__global__ void int8_to_bf16_kernel(const int8_t* q, __nv_bfloat16* out, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16(static_cast<float>(q[i]));
}

}  // namespace

void int8_to_bf16(const int8_t* q, __nv_bfloat16* out, int64_t n, cudaStream_t s) {
  if (n < 0) throw std::runtime_error("int8_to_bf16: need n >= 0");
  if (n == 0) return;
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 65535);
  int8_to_bf16_kernel<<<static_cast<unsigned>(blocks), 256, 0, s>>>(q, out, n);
}

void quantize_int8_rows(const __nv_bfloat16* w, int N, int K, int8_t* q, float* scale, cudaStream_t s) {
  if (N < 0 || K < 1) throw std::runtime_error("quantize_int8_rows: need N >= 0 and K >= 1");
  if (N == 0) return;
  quantize_int8_kernel<<<N, kThreads, 0, s>>>(w, K, q, scale);
}

void quantize_fp8_rows(const __nv_bfloat16* w, int N, int K, __nv_fp8_e4m3* q, float* scale, cudaStream_t s) {
  if (N < 0 || K < 1) throw std::runtime_error("quantize_fp8_rows: need N >= 0 and K >= 1");
  if (N == 0) return;
  quantize_rows_kernel<<<N, kThreads, 0, s>>>(w, K, q, scale);
}

}  // namespace ppx::kern
