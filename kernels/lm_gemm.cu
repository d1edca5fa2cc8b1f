// The batched path of kern::gemv() (lm_gemv.cuh) for B > kMaxGemvBatch rows: tensor-core MMA
// (mma.sync m16n8k16, bf16 in, fp32 accumulate) that reads each weight once for the whole batch,
// bf16 or int8 weights (int8 is widened to bf16 in registers, exactly; the row scale multiplies the
// fp32 sum, as in the GEMV). The prologue (RMSNorm, SiluGate, the depformer's embedding + RMSNorm)
// runs first as its own kernel into GemvArgs::xstage, with the GEMV's own staging code, so the
// activations the MMA reads are those the GEMV would have staged; the epilogues are the GEMV's.
//
// Layout: a block of 4 warps owns 32 weight rows (kGateUp: 16 gate rows and their 16 up rows),
// every warp one quarter of K (split-K, summed through shared memory). Per 32 values of k a lane
// loads 8 consecutive weights of rows g and g + 8 of each 16-row tile (g = lane / 4) and the same 8
// activations of batch row g of each 8-row batch tile, and feeds them to two MMAs: the MMA's k
// order inside the 32 is permuted identically for weights and activations, which leaves the sum
// unchanged and makes every load one contiguous 8- or 16-byte access. The summation order differs
// from the GEMV's, so results agree with it to fp32 rounding, not bit for bit.
#include <cuda_bf16.h>

#include <cstdint>

#include "lm_gemv.cuh"
#include "lm_gemv_impl.cuh"

namespace ppx::kern::gemm_impl {

namespace {

constexpr int kWarpsK = 4;
constexpr int kMaxNt = 8;  // batch tiles of 8: B <= 64 per launch

__device__ __forceinline__ void mma_bf16(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// 8 consecutive weights of one row as 4 packed bf16 pairs (int8: exact widening).
template <typename WT>
__device__ __forceinline__ void load_w8(const WT* row, int k, uint32_t* w) {
  if constexpr (std::is_same_v<WT, int8_t>) {
    const uint2 v = __ldg(reinterpret_cast<const uint2*>(row + k));
    float f[8];
    gemv_impl::int8x4_to_float(v.x, f);
    gemv_impl::int8x4_to_float(v.y, f + 4);
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = pack_bf16(f[2 * i], f[2 * i + 1]);
  } else {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(row + k));
    w[0] = v.x;
    w[1] = v.y;
    w[2] = v.z;
    w[3] = v.w;
  }
}

template <GemvIn IN>
__global__ void __launch_bounds__(gemv_impl::kThreads) stage_rows_kernel(GemvArgs a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __nv_bfloat16* xs = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  __shared__ float red[32];
  const int b = blockIdx.y;
  GemvArgs r = a;
  r.x = a.x + b * a.x_stride;
  if (a.token) r.token = a.token + b;
  if (a.x_out) r.x_out = a.x_out + static_cast<int64_t>(b) * a.K;  // stage_x stores it in block x 0
  gemv_impl::stage_x<IN, 1>(r, xs, red);
  for (int k = threadIdx.x * 8; k < a.K; k += gemv_impl::kThreads * 8)
    *reinterpret_cast<uint4*>(a.xstage + static_cast<int64_t>(b) * a.K + k) = *reinterpret_cast<const uint4*>(xs + k);
}

template <typename WT, GemvOut OUT, int NT>
__global__ void __launch_bounds__(32 * kWarpsK) gemm_kernel(GemvArgs a, const __nv_bfloat16* x, int64_t x_stride) {
  constexpr bool kPairs = OUT == GemvOut::kGateUp;
  constexpr bool kScaled = std::is_same_v<WT, int8_t>;
  __shared__ float part[kWarpsK - 1][2][NT][4][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int K = a.K, B = a.B;
  const int rows = kPairs ? a.N / 2 : a.N;
  const int r0 = blockIdx.x * (kPairs ? 16 : 32);
  const WT* w = static_cast<const WT*>(gemv_impl::Weights<WT>::base(a));
  // The weight row of (tile, half) for this lane, clamped into the matrix (clamped rows are
  // computed and not stored).
  auto wrow = [&](int tile, int half) -> const WT* {
    int n;
    if constexpr (kPairs) {
      n = min(r0 + g + 8 * half, rows - 1) + tile * rows;
    } else {
      n = min(r0 + tile * 16 + g + 8 * half, a.N - 1);
    }
    return w + static_cast<int64_t>(n) * K;
  };
  const WT* wr[2][2] = {{wrow(0, 0), wrow(0, 1)}, {wrow(1, 0), wrow(1, 1)}};
  const __nv_bfloat16* xr[NT];
  bool xok[NT];
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int c = j * 8 + g;
    xok[j] = c < B;
    xr[j] = x + static_cast<int64_t>(xok[j] ? c : 0) * x_stride;
  }
  float acc[2][NT][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
  const int ksteps = K / 32, per = (ksteps + kWarpsK - 1) / kWarpsK;
  const int ks0 = warp * per, ks1 = min(ksteps, ks0 + per);
#pragma unroll 2
  for (int ks = ks0; ks < ks1; ++ks) {
    const int k = ks * 32 + t * 8;
    uint32_t wv[2][2][4];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) load_w8<WT>(wr[i][h], k, wv[i][h]);
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const uint4 xv = xok[j] ? __ldg(reinterpret_cast<const uint4*>(xr[j] + k)) : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        mma_bf16(acc[i][j], wv[i][0][0], wv[i][1][0], wv[i][0][1], wv[i][1][1], xv.x, xv.y);
        mma_bf16(acc[i][j], wv[i][0][2], wv[i][1][2], wv[i][0][3], wv[i][1][3], xv.z, xv.w);
      }
    }
  }
  if (warp > 0) {
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) part[warp - 1][i][j][e][lane] = acc[i][j][e];
  }
  __syncthreads();
  if (warp != 0) return;
#pragma unroll
  for (int p = 0; p < kWarpsK - 1; ++p)
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][j][e] += part[p][i][j][e][lane];
  // D fragment: element e of tile (i, j) is weight row g (+8 for e >= 2), batch row j * 8 + 2t + (e & 1).
#pragma unroll
  for (int j = 0; j < NT; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int b = j * 8 + 2 * t + (e & 1);
      if (b >= B) continue;
      const int rr = g + (e >= 2 ? 8 : 0);
      if constexpr (kPairs) {
        const int n = r0 + rr;
        if (n >= rows) continue;
        float gs = acc[0][j][e], us = acc[1][j][e];
        if constexpr (kScaled) {
          gs *= __ldg(a.w_scale + n);
          us *= __ldg(a.w_scale + n + rows);
        }
        const float gg = __bfloat162float(__float2bfloat16(gs));
        const float uu = __bfloat162float(__float2bfloat16(us));
        a.y[b * a.y_stride + n] = __float2bfloat16(gg / (1.f + expf(-gg)) * uu);
      } else {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int n = r0 + i * 16 + rr;
          if (n >= a.N) continue;
          float v = acc[i][j][e];
          if constexpr (kScaled) v *= __ldg(a.w_scale + n);
          gemv_impl::epilogue<OUT>(a, b, n, v);
        }
      }
    }
  }
}

template <typename WT, GemvOut OUT, int NT>
void launch_nt(const GemvArgs& a, const __nv_bfloat16* x, int64_t xs, cudaStream_t s) {
  const int rows = OUT == GemvOut::kGateUp ? a.N / 2 : a.N;
  const int blocks = OUT == GemvOut::kGateUp ? (rows + 15) / 16 : (rows + 31) / 32;
  gemm_kernel<WT, OUT, NT><<<blocks, 32 * kWarpsK, 0, s>>>(a, x, xs);
}

template <typename WT, GemvOut OUT>
void launch(const GemvArgs& a, const __nv_bfloat16* x, int64_t xs, cudaStream_t s) {
  switch ((a.B + 7) / 8) {
    case 1: return launch_nt<WT, OUT, 1>(a, x, xs, s);
    case 2: return launch_nt<WT, OUT, 2>(a, x, xs, s);
    case 3: return launch_nt<WT, OUT, 3>(a, x, xs, s);
    case 4: return launch_nt<WT, OUT, 4>(a, x, xs, s);
    case 5: return launch_nt<WT, OUT, 5>(a, x, xs, s);
    case 6: return launch_nt<WT, OUT, 6>(a, x, xs, s);
    case 7: return launch_nt<WT, OUT, 7>(a, x, xs, s);
    default: return launch_nt<WT, OUT, 8>(a, x, xs, s);
  }
}

template <typename WT>
void launch_out(GemvOut out, const GemvArgs& a, const __nv_bfloat16* x, int64_t xs, cudaStream_t s) {
  switch (out) {
    case GemvOut::kStore: return launch<WT, GemvOut::kStore>(a, x, xs, s);
    case GemvOut::kResidual: return launch<WT, GemvOut::kResidual>(a, x, xs, s);
    case GemvOut::kLogits: return launch<WT, GemvOut::kLogits>(a, x, xs, s);
    case GemvOut::kGateUp: return launch<WT, GemvOut::kGateUp>(a, x, xs, s);
  }
}

}  // namespace

bool gemm_batched(GemvIn in, GemvOut out, const GemvArgs& a, cudaStream_t s) {
  if (a.w8 != nullptr || a.K % 32 != 0) return false;  // fp8 weights, odd K: the chunked GEMV
  if (in != GemvIn::kPlain && a.xstage == nullptr) return false;
  const __nv_bfloat16* x = a.x;
  int64_t xs = a.x_stride;
  if (in != GemvIn::kPlain) {
    const dim3 grid(1, a.B);
    const size_t smem = static_cast<size_t>(a.K) * sizeof(__nv_bfloat16);
    switch (in) {
      case GemvIn::kRmsNorm: stage_rows_kernel<GemvIn::kRmsNorm><<<grid, gemv_impl::kThreads, smem, s>>>(a); break;
      case GemvIn::kSiluGate: stage_rows_kernel<GemvIn::kSiluGate><<<grid, gemv_impl::kThreads, smem, s>>>(a); break;
      case GemvIn::kEmbRmsNorm: stage_rows_kernel<GemvIn::kEmbRmsNorm><<<grid, gemv_impl::kThreads, smem, s>>>(a); break;
      case GemvIn::kPlain: break;
    }
    x = a.xstage;
    xs = a.K;
  }
  for (int b0 = 0; b0 < a.B; b0 += 8 * kMaxNt) {
    GemvArgs c = a;
    c.B = a.B - b0 < 8 * kMaxNt ? a.B - b0 : 8 * kMaxNt;
    if (a.y) c.y = a.y + static_cast<int64_t>(b0) * a.y_stride;
    if (a.yf) c.yf = a.yf + static_cast<int64_t>(b0) * a.y_stride;
    const __nv_bfloat16* xc = x + static_cast<int64_t>(b0) * xs;
    if (a.wi8)
      launch_out<int8_t>(out, c, xc, xs, s);
    else
      launch_out<__nv_bfloat16>(out, c, xc, xs, s);
  }
  return true;
}

}  // namespace ppx::kern::gemm_impl
