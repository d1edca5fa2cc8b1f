// The GEMV kernel family of lm_gemv.cuh, templated on the weight type WT (__nv_bfloat16 or
// __nv_fp8_e4m3) so that both weight formats share one kernel, one set of prologues and
// epilogues. Internal to the GEMV: included by lm_gemv.cu (bf16 instantiations, the public
// entry points) and lm_gemv8.cu (fp8 instantiations), which compile in parallel.
//
// One warp computes R output rows for all B batch columns: each lane streams 16-byte chunks of
// the weight rows (8 bf16 or 16 fp8 values) and the staged activations from shared memory; the
// loop is unrolled so several 16-byte loads per lane are in flight, which is what a memory-bound
// GEMV needs. The activation prologue is recomputed by every block (a few KB from L2) so that no
// separate norm or gate kernel is launched.
//
// fp8 weights: each 16-byte chunk is used as two 8-value halves, converted with the e4m3x2 ->
// half2 intrinsic (one instruction on sm_89+, software below) and widened to fp32; the row's
// scale multiplies the fp32 dot product once, after the warp reduction and before the epilogue.
#pragma once

#include <cuda_fp8.h>

#include <stdexcept>
#include <type_traits>

#include "common.cuh"
#include "lm_gemv.cuh"

namespace ppx::kern::gemv_impl {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxSmemBytes = 100 * 1024;
constexpr int kPre = 4;  // 16-byte weight chunks per row and lane requested before the prologue

// One warp per row unit when that many blocks are resident at once (one wave, as before);
// otherwise the blocks that are resident at once (occupancy x SMs), each warp taking the same
// number of units (gemv_set_grid_policy(1), a measurement hook: always one warp per unit). In lm_gemv.cu.
int grid_blocks(int units, int resident_blocks);

namespace {  // a private copy of the kernels in each including file

// The weight formats: values per 16-byte chunk and the [N, K] base pointer in GemvArgs.
template <typename WT>
struct Weights;
template <>
struct Weights<__nv_bfloat16> {
  static constexpr int kPerChunk = 8;
  static __device__ __forceinline__ const void* base(const GemvArgs& a) { return a.w; }
};
template <>
struct Weights<__nv_fp8_e4m3> {
  static constexpr int kPerChunk = 16;
  static __device__ __forceinline__ const void* base(const GemvArgs& a) { return a.w8; }
};
template <>
struct Weights<int8_t> {
  static constexpr int kPerChunk = 16;
  static __device__ __forceinline__ const void* base(const GemvArgs& a) { return a.wi8; }
};

// 4 int8 values packed in 32 bits -> 4 floats, in memory order (exact): each byte, biased to
// unsigned, becomes the low mantissa byte of 2^23 (0x4B0000xx = 8388608 + xx), and one
// subtraction removes 2^23 and the bias: a byte permute and an add per value.
__device__ __forceinline__ void int8x4_to_float(uint32_t v, float* f) {
  const uint32_t u = v ^ 0x80808080u;
  f[0] = __int_as_float(static_cast<int>(__byte_perm(u, 0x4B000000u, 0x7540))) - 8388736.f;
  f[1] = __int_as_float(static_cast<int>(__byte_perm(u, 0x4B000000u, 0x7541))) - 8388736.f;
  f[2] = __int_as_float(static_cast<int>(__byte_perm(u, 0x4B000000u, 0x7542))) - 8388736.f;
  f[3] = __int_as_float(static_cast<int>(__byte_perm(u, 0x4B000000u, 0x7543))) - 8388736.f;
}

// 4 e4m3 values packed in 32 bits -> 4 floats, in memory order (exact: every e4m3 value is a
// half). sm_89+ converts pairs in hardware. Below, the bits are moved into half layout (sign; the
// 4 exponent and 3 mantissa bits at the bottom of half's exponent and top of its mantissa) and
// the bias difference (15 - 7) is restored by an exact multiplication by 2^8, subnormals
// included; the NaN code 0x7f (never written by quantize_fp8_rows) reads as 480 there.
__device__ __forceinline__ void fp8x4_to_float(uint32_t v, float* f) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  const __half2 lo = __half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v & 0xffffu), __NV_E4M3));
  const __half2 hi = __half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v >> 16), __NV_E4M3));
#else
  const uint32_t x0 = __byte_perm(v, 0u, 0x1404), x1 = __byte_perm(v, 0u, 0x3424);  // bytes to 1 and 3
  const uint32_t h0 = ((x0 >> 1) & 0x3F803F80u) | (x0 & 0x80008000u);
  const uint32_t h1 = ((x1 >> 1) & 0x3F803F80u) | (x1 & 0x80008000u);
  const __half2 k256 = __float2half2_rn(256.f);
  const __half2 lo = __hmul2(__halves2half2(__ushort_as_half(static_cast<unsigned short>(h0 & 0xffffu)),
                                            __ushort_as_half(static_cast<unsigned short>(h0 >> 16))), k256);
  const __half2 hi = __hmul2(__halves2half2(__ushort_as_half(static_cast<unsigned short>(h1 & 0xffffu)),
                                            __ushort_as_half(static_cast<unsigned short>(h1 >> 16))), k256);
#endif
  const float2 a = __half22float2(lo), b = __half22float2(hi);
  f[0] = a.x;
  f[1] = a.y;
  f[2] = b.x;
  f[3] = b.y;
}

// The 8 weights of half `h` (0 or 1; always 0 for bf16) of a 16-byte chunk, as floats.
template <typename WT>
__device__ __forceinline__ void weights_to_float(const uint4& v, bool h, float* f) {
  if constexpr (Weights<WT>::kPerChunk == 8) {
    bf16x8_to_float(v, f);
  } else if constexpr (std::is_same_v<WT, int8_t>) {
    int8x4_to_float(h ? v.z : v.x, f);
    int8x4_to_float(h ? v.w : v.y, f + 4);
  } else {
    fp8x4_to_float(h ? v.z : v.x, f);
    fp8x4_to_float(h ? v.w : v.y, f + 4);
  }
}

// The embedding row of batch row b's token in a [table_rows, width] table (kEmbRmsNorm):
// nullptr for token -1 (nothing added), other out-of-range tokens clamp.
__device__ __forceinline__ const __nv_bfloat16* embedding_row(const GemvArgs& a, int b, int width) {
  int tok = a.token[b];
  if (tok == -1) return nullptr;
  tok = tok < 0 ? 0 : (tok >= a.table_rows ? a.table_rows - 1 : tok);
  return a.table + static_cast<int64_t>(tok) * width;
}

// rsqrt(mean(x^2) + eps) from this thread's share of the sum of squares (a block reduction).
__device__ __forceinline__ float rms_scale(float ss, int K, float eps, float* red) {
  ss = block_sum(ss, red);
  return rsqrtf(ss / static_cast<float>(K) + eps);
}

template <GemvIn IN, int B>
__device__ void stage_x(const GemvArgs& a, __nv_bfloat16* xs, float* red) {
  const int K = a.K;
  for (int b = 0; b < B; ++b) {
    const __nv_bfloat16* x = a.x + b * a.x_stride;
    __nv_bfloat16* dst = xs + b * K;
    if constexpr (IN == GemvIn::kPlain) {
      for (int k = threadIdx.x * 8; k < K; k += kThreads * 8) {
        *reinterpret_cast<uint4*>(dst + k) = *reinterpret_cast<const uint4*>(x + k);
      }
    } else if constexpr (IN == GemvIn::kRmsNorm) {
      float ss = 0.f;
      for (int k = threadIdx.x; k < K; k += kThreads) {
        const float v = __bfloat162float(x[k]);
        ss += v * v;
      }
      const float r = rms_scale(ss, K, a.eps, red);
      for (int k = threadIdx.x; k < K; k += kThreads) {
        const float al = __bfloat162float(a.alpha[k]) * r;
        dst[k] = __float2bfloat16(__bfloat162float(x[k]) * al);
      }
    } else if constexpr (IN == GemvIn::kEmbRmsNorm) {
      const __nv_bfloat16* e = embedding_row(a, b, K);
      float ss = 0.f;
      for (int k = threadIdx.x; k < K; k += kThreads) {
        const __nv_bfloat16 z = __float2bfloat16(__bfloat162float(x[k]) + (e ? __bfloat162float(e[k]) : 0.f));
        dst[k] = z;
        const float v = __bfloat162float(z);
        ss += v * v;
      }
      const float r = rms_scale(ss, K, a.eps, red);
      for (int k = threadIdx.x; k < K; k += kThreads) {  // each thread rewrites only its own entries
        const __nv_bfloat16 z = dst[k];
        if (blockIdx.x == 0) a.x_out[static_cast<int64_t>(b) * K + k] = z;
        const float al = __bfloat162float(a.alpha[k]) * r;
        dst[k] = __float2bfloat16(__bfloat162float(z) * al);
      }
    } else {  // kSiluGate
      for (int k = threadIdx.x; k < K; k += kThreads) {
        const float g = __bfloat162float(x[k]);
        const float u = __bfloat162float(x[K + k]);
        dst[k] = __float2bfloat16(silu_mul(g, u));
      }
    }
  }
  __syncthreads();
}

template <GemvOut OUT>
__device__ __forceinline__ void epilogue(const GemvArgs& a, int b, int n, float acc) {
  const float r = __bfloat162float(__float2bfloat16(acc));
  if constexpr (OUT == GemvOut::kStore) {
    a.y[b * a.y_stride + n] = __float2bfloat16(r);
  } else if constexpr (OUT == GemvOut::kResidual) {
    __nv_bfloat16* p = a.y + b * a.y_stride + n;
    *p = __float2bfloat16(__bfloat162float(*p) + r);
  } else {  // kLogits
    a.yf[b * a.y_stride + n] = r;
  }
}

// The batched GEMM's end for output n of batch row b (lm_gemm.cu's epilogue kernel, and the wgmma
// kernel's own end under policy 8): sum(col) is weight row col's fp32 sum before its scale; the
// scale, then `OUT`. kGateUp pairs rows n and n + N / 2, each rounded to bf16 before the SiLU.
template <GemvOut OUT, typename Sum>
__device__ __forceinline__ void gemm_epilogue(const GemvArgs& a, int b, int n, Sum&& sum) {
  auto scaled = [&](int col) {
    const float v = sum(col);
    return a.w_scale ? v * __ldg(a.w_scale + col) : v;
  };
  if constexpr (OUT == GemvOut::kGateUp) {
    const float gg = __bfloat162float(__float2bfloat16(scaled(n)));
    const float uu = __bfloat162float(__float2bfloat16(scaled(n + a.N / 2)));
    a.y[b * a.y_stride + n] = __float2bfloat16(silu_mul(gg, uu));
  } else {
    epilogue<OUT>(a, b, n, scaled(n));
  }
}

// Row units: R consecutive rows (kGateUp: logical row n < N/2, i.e. weight rows n and n + N/2,
// R == 2). Warp w of the grid computes units w, w + W, w + 2W, ... (W warps in the grid): the
// launch sizes the grid to what is resident at once, so there is one wave and each block stages
// its activations once for all its units.
template <typename WT, GemvIn IN, GemvOut OUT, int B, int R>
__global__ void __launch_bounds__(kThreads) gemv_kernel(GemvArgs a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __nv_bfloat16* xs = reinterpret_cast<__nv_bfloat16*>(smem_raw);  // [B, K]
  __shared__ float red[32];
  constexpr int E = Weights<WT>::kPerChunk;   // weights per 16-byte chunk
  constexpr int H = E / 8;                    // 8-value halves per chunk
  constexpr bool kScaled = H == 2;            // 8-bit weights: per-row scales
  constexpr bool kPairs = OUT == GemvOut::kGateUp;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int K = a.K;
  const int rows = kPairs ? a.N / 2 : a.N;
  const int units = kPairs ? rows : (rows + R - 1) / R;
  const int stride = gridDim.x * kWarps;
  const WT* w = static_cast<const WT*>(Weights<WT>::base(a));
  const int chunks = K / E;
  // The first weight row of each of a unit's R rows (clamped to the matrix).
  auto row_of = [&](int unit, int r) {
    return kPairs ? min(unit, rows - 1) + r * rows : min(unit * R + r, a.N - 1);
  };
  // The weights do not depend on the staged activations: each lane requests its first kPre chunks
  // of every row of its unit before the prologue (and of its next unit before the current one's
  // reduction), so that their DRAM latency overlaps other work instead of following it (the
  // whole row for K <= 2048 fp8 / 1024 bf16: the depformer's shapes).
  uint4 pre[kPre][R];
  auto prefetch = [&](int unit) {
#pragma unroll
    for (int i = 0; i < kPre; ++i) {
      const int c = lane + 32 * i;
#pragma unroll
      for (int r = 0; r < R; ++r)
        pre[i][r] = c < chunks ? __ldg(reinterpret_cast<const uint4*>(w + static_cast<int64_t>(row_of(unit, r)) * K) + c)
                               : make_uint4(0u, 0u, 0u, 0u);
    }
  };
  int unit = blockIdx.x * kWarps + warp;
  if (unit < units) prefetch(unit);
  stage_x<IN, B>(a, xs, red);

  // fp8: a lane's 32 bytes of x per chunk are read as two 16-byte halves; lanes 4-7 of each
  // quarter warp take them in the other order so that the 8 lanes of a shared-memory wavefront
  // hit distinct banks (lane addresses are 32 bytes apart).
  const bool swap = H == 2 && (lane & 4) != 0;
  for (; unit < units; unit += stride) {
    const uint4* wrow[R];
#pragma unroll
    for (int r = 0; r < R; ++r) wrow[r] = reinterpret_cast<const uint4*>(w + static_cast<int64_t>(row_of(unit, r)) * K);
    float acc[R][B];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int b = 0; b < B; ++b) acc[r][b] = 0.f;
    auto consume = [&](int c, const uint4(&wv)[R]) {
#pragma unroll
      for (int h = 0; h < H; ++h) {
        const bool hh = (h != 0) != swap;
        float xf[B][8];
#pragma unroll
        for (int b = 0; b < B; ++b)
          bf16x8_to_float(*reinterpret_cast<const uint4*>(xs + b * K + c * E + (hh ? 8 : 0)), xf[b]);
#pragma unroll
        for (int r = 0; r < R; ++r) {
          float wf[8];
          weights_to_float<WT>(wv[r], hh, wf);
#pragma unroll
          for (int b = 0; b < B; ++b)
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[r][b] = fmaf(wf[i], xf[b][i], acc[r][b]);
        }
      }
    };
#pragma unroll
    for (int i = 0; i < kPre; ++i) {
      const int c = lane + 32 * i;
      if (c < chunks) consume(c, pre[i]);
    }
#pragma unroll 4
    for (int c = lane + 32 * kPre; c < chunks; c += 32) {
      uint4 wv[R];
#pragma unroll
      for (int r = 0; r < R; ++r) wv[r] = __ldg(wrow[r] + c);
      consume(c, wv);
    }
    if (unit + stride < units) prefetch(unit + stride);
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int b = 0; b < B; ++b) acc[r][b] = warp_sum(acc[r][b]);
    if (lane == 0) {
      const int row0 = kPairs ? unit : unit * R;
      if constexpr (kScaled) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const float sc = __ldg(a.w_scale + row_of(unit, r));
#pragma unroll
          for (int b = 0; b < B; ++b) acc[r][b] *= sc;
        }
      }
      if constexpr (kPairs) {
#pragma unroll
        for (int b = 0; b < B; ++b) {
          const float g = __bfloat162float(__float2bfloat16(acc[0][b]));
          const float u = __bfloat162float(__float2bfloat16(acc[1][b]));
          a.y[b * a.y_stride + row0] = __float2bfloat16(silu_mul(g, u));
        }
      } else {
#pragma unroll
        for (int r = 0; r < R; ++r) {
          if (row0 + r < a.N) {
#pragma unroll
            for (int b = 0; b < B; ++b) epilogue<OUT>(a, b, row0 + r, acc[r][b]);
          }
        }
      }
    }
  }
}

template <typename WT, GemvIn IN, GemvOut OUT, int B, int R>
void launch(const GemvArgs& a, cudaStream_t s) {
  const int rows = OUT == GemvOut::kGateUp ? a.N / 2 : a.N;
  const int units = OUT == GemvOut::kGateUp ? rows : (rows + R - 1) / R;
  const size_t smem = static_cast<size_t>(a.K) * B * sizeof(__nv_bfloat16);
  int dev = 0, sms = 0, per_sm = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, gemv_kernel<WT, IN, OUT, B, R>, kThreads, smem);
  const int blocks = grid_blocks(units, per_sm * sms);
  gemv_kernel<WT, IN, OUT, B, R><<<blocks, kThreads, smem, s>>>(a);
}

// Rows per warp: two once there are enough rows to fill the GPU several times over (bf16 from
// N = 8192; fp8 rows are half the bytes, so from N = 4096, which also halves the shared-memory
// reads of x per weight byte); the gated projection always reads its two rows (gate, up) per warp.
template <typename WT>
constexpr int kTwoRowsFrom = sizeof(WT) == 1 ? 4096 : 8192;

template <typename WT, GemvIn IN, GemvOut OUT, int B>
void by_rows(const GemvArgs& a, cudaStream_t s) {
  if constexpr (OUT == GemvOut::kGateUp) {
    launch<WT, IN, OUT, B, 2>(a, s);
  } else {
    if (a.N >= kTwoRowsFrom<WT>) {
      launch<WT, IN, OUT, B, 2>(a, s);
    } else {
      launch<WT, IN, OUT, B, 1>(a, s);
    }
  }
}

template <typename WT, GemvIn IN, GemvOut OUT>
void by_batch(const GemvArgs& a, cudaStream_t s) {
  switch (a.B) {
    case 1: by_rows<WT, IN, OUT, 1>(a, s); break;
    case 2: by_rows<WT, IN, OUT, 2>(a, s); break;
    case 3: by_rows<WT, IN, OUT, 3>(a, s); break;
    case 4: by_rows<WT, IN, OUT, 4>(a, s); break;
    default: throw std::runtime_error("gemv: batch must be 1..4");
  }
}

template <typename WT, GemvIn IN>
void by_out(GemvOut out, const GemvArgs& a, cudaStream_t s) {
  if constexpr (IN == GemvIn::kEmbRmsNorm) {
    if (out != GemvOut::kStore) throw std::runtime_error("gemv: kEmbRmsNorm needs kStore");
    by_batch<WT, IN, GemvOut::kStore>(a, s);
  } else {
    switch (out) {
      case GemvOut::kStore: by_batch<WT, IN, GemvOut::kStore>(a, s); break;
      case GemvOut::kResidual: by_batch<WT, IN, GemvOut::kResidual>(a, s); break;
      case GemvOut::kLogits: by_batch<WT, IN, GemvOut::kLogits>(a, s); break;
      case GemvOut::kGateUp: by_batch<WT, IN, GemvOut::kGateUp>(a, s); break;
    }
  }
}

// Every instantiation of one weight type, by prologue (arguments already checked by gemv()).
template <typename WT>
void dispatch(GemvIn in, GemvOut out, const GemvArgs& a, cudaStream_t s) {
  switch (in) {
    case GemvIn::kPlain: by_out<WT, GemvIn::kPlain>(out, a, s); break;
    case GemvIn::kRmsNorm: by_out<WT, GemvIn::kRmsNorm>(out, a, s); break;
    case GemvIn::kSiluGate: by_out<WT, GemvIn::kSiluGate>(out, a, s); break;
    case GemvIn::kEmbRmsNorm: by_out<WT, GemvIn::kEmbRmsNorm>(out, a, s); break;
  }
}

template <typename WT, GemvIn IN, GemvOut OUT, int B>
void set_attrs_b() {
  if constexpr (OUT != GemvOut::kGateUp) {
    cudaFuncSetAttribute(gemv_kernel<WT, IN, OUT, B, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmemBytes);
  }
  cudaFuncSetAttribute(gemv_kernel<WT, IN, OUT, B, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmemBytes);
}
template <typename WT, GemvIn IN, GemvOut OUT>
void set_attrs_o() {
  set_attrs_b<WT, IN, OUT, 1>();
  set_attrs_b<WT, IN, OUT, 2>();
  set_attrs_b<WT, IN, OUT, 3>();
  set_attrs_b<WT, IN, OUT, 4>();
}
template <typename WT, GemvIn IN>
void set_attrs_i() {
  set_attrs_o<WT, IN, GemvOut::kStore>();
  set_attrs_o<WT, IN, GemvOut::kResidual>();
  set_attrs_o<WT, IN, GemvOut::kLogits>();
  set_attrs_o<WT, IN, GemvOut::kGateUp>();
}

// The shared-memory opt-in of every instantiation of one weight type.
template <typename WT>
void init() {
  set_attrs_i<WT, GemvIn::kPlain>();
  set_attrs_i<WT, GemvIn::kRmsNorm>();
  set_attrs_i<WT, GemvIn::kSiluGate>();
  set_attrs_o<WT, GemvIn::kEmbRmsNorm, GemvOut::kStore>();
}

}  // namespace

// Defined in lm_gemv8.cu: dispatch<__nv_fp8_e4m3> and init<__nv_fp8_e4m3>, compiled there; and
// in lm_gemv8i.cu the same for int8_t.
void dispatch_fp8(GemvIn in, GemvOut out, const GemvArgs& a, cudaStream_t s);
void init_fp8();
void dispatch_int8(GemvIn in, GemvOut out, const GemvArgs& a, cudaStream_t s);
void init_int8();

}  // namespace ppx::kern::gemv_impl
