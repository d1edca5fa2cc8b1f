// One warp computes R output rows for all B batch columns: each lane streams 16-byte chunks of
// the weight rows (8 bf16) and the staged activations from shared memory; the loop is unrolled so
// several 16-byte loads per lane are in flight, which is what a memory-bound GEMV needs. The
// activation prologue is recomputed by every block (a few KB from L2) so that no separate norm or
// gate kernel is launched.
#include "lm_gemv.cuh"

#include <stdexcept>

#include "common.cuh"

namespace ppx::kern {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxSmemBytes = 100 * 1024;
constexpr unsigned kEarlyTriggerBlocks = 384;


// The embedding row of batch row b's token in a [table_rows, width] table (kAddEmb, kEmbRmsNorm):
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
    } else if constexpr (IN == GemvIn::kSiluGate) {
      for (int k = threadIdx.x; k < K; k += kThreads) {
        const float g = __bfloat162float(x[k]);
        const float u = __bfloat162float(x[K + k]);
        dst[k] = __float2bfloat16(g / (1.f + expf(-g)) * u);
      }
    } else {  // kDepAttn: one warp per head (looping), lanes over head dims
      const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
      const int hd = K / a.heads, dpl = hd / 32, E = a.step + 1;
      const float scale = rsqrtf(static_cast<float>(hd));
      for (int h = warp; h < a.heads; h += kWarps) {
        const int off = h * hd + lane * dpl;
        float qf[4], acc[4] = {0.f, 0.f, 0.f, 0.f};
        for (int j = 0; j < dpl; ++j) qf[j] = __bfloat162float(x[off + j]);
        float m = -INFINITY, l = 0.f;
        for (int idx = 0; idx < a.ring; ++idx) {
          // Upstream's ring visibility with E = step + 1 tokens and no context limit.
          if (idx >= E) continue;
          const int delta = idx - E % a.ring;
          const int label = delta <= 0 ? E + delta : E + delta - a.ring;
          if (label < 0 || a.step - label < 0) continue;
          const __nv_bfloat16* kp = idx == a.step ? x + K + off : a.kc + static_cast<int64_t>(idx) * K + off;
          const __nv_bfloat16* vp = idx == a.step ? x + 2 * K + off : a.vc + static_cast<int64_t>(idx) * K + off;
          float sd = 0.f;
          for (int j = 0; j < dpl; ++j) sd += qf[j] * __bfloat162float(kp[j]);
          sd = warp_sum(sd) * scale;
          const float mn = fmaxf(m, sd), corr = expf(m - mn), p = expf(sd - mn);
          l = l * corr + p;
          for (int j = 0; j < dpl; ++j) acc[j] = acc[j] * corr + p * __bfloat162float(vp[j]);
          m = mn;
        }
        for (int j = 0; j < dpl; ++j) dst[off + j] = __float2bfloat16(l > 0.f ? acc[j] / l : 0.f);
      }
      if (blockIdx.x == 0) {  // append this step's key and value for the later steps
        const int64_t slot = static_cast<int64_t>(a.step % a.ring) * K;
        for (int k = threadIdx.x; k < K; k += kThreads) {
          a.kc[slot + k] = x[K + k];
          a.vc[slot + k] = x[2 * K + k];
        }
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
  } else if constexpr (OUT == GemvOut::kLogits) {
    a.yf[b * a.y_stride + n] = r;
  } else {  // kAddEmb
    const __nv_bfloat16* row = embedding_row(a, b, a.N);
    const float e = row ? __bfloat162float(row[n]) : 0.f;
    a.y[b * a.y_stride + n] = __float2bfloat16(r + e);
  }
}

// kGateUp: each warp owns logical row n < N/2 and reads weight rows n and n + N/2 (R == 2).
template <GemvIn IN, GemvOut OUT, int B, int R>
__global__ void __launch_bounds__(kThreads) gemv_kernel(GemvArgs a) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __nv_bfloat16* xs = reinterpret_cast<__nv_bfloat16*>(smem_raw);  // [B, K]
  __shared__ float red[32];
  // Small grids let the next kernel launch early (its blocks fit beside ours); large ones do not,
  // since waiting blocks would take the slots this memory-bound kernel needs.
  if (gridDim.x <= kEarlyTriggerBlocks) pdl_trigger();
  constexpr bool kPairs = OUT == GemvOut::kGateUp;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int K = a.K;
  const int rows = kPairs ? a.N / 2 : a.N;
  const int row0 = kPairs ? blockIdx.x * kWarps + warp : (blockIdx.x * kWarps + warp) * R;
  const uint4* wrow[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int n = kPairs ? min(row0, rows - 1) + r * rows : min(row0 + r, a.N - 1);
    wrow[r] = reinterpret_cast<const uint4*>(a.w + static_cast<int64_t>(n) * K);
  }
  // The weights do not depend on earlier kernels: a small grid (which may start early, beside its
  // predecessor) pulls them into L2 before waiting. Large grids skip it: there the extra requests
  // cost about 30% (measured on an H200, bench/results/h200_2026-12-02_v2).
  if (gridDim.x <= kEarlyTriggerBlocks && row0 < rows) {
    const char* base;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      base = reinterpret_cast<const char*>(wrow[r]);
      for (int off = lane * 128; off < K * 2; off += 32 * 128) prefetch_l2(base + off);
    }
  }
  pdl_wait();
  stage_x<IN, B>(a, xs, red);
  if (row0 >= rows) return;
  float acc[R][B];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int b = 0; b < B; ++b) acc[r][b] = 0.f;

  const int chunks = K / 8;
#pragma unroll 4
  for (int c = lane; c < chunks; c += 32) {
    uint4 wv[R];
#pragma unroll
    for (int r = 0; r < R; ++r) wv[r] = __ldg(wrow[r] + c);
    float xf[B][8];
#pragma unroll
    for (int b = 0; b < B; ++b) bf16x8_to_float(*reinterpret_cast<const uint4*>(xs + b * K + c * 8), xf[b]);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float wf[8];
      bf16x8_to_float(wv[r], wf);
#pragma unroll
      for (int b = 0; b < B; ++b)
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[r][b] = fmaf(wf[i], xf[b][i], acc[r][b]);
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int b = 0; b < B; ++b) acc[r][b] = warp_sum(acc[r][b]);
  if (lane == 0) {
    if constexpr (kPairs) {
#pragma unroll
      for (int b = 0; b < B; ++b) {
        const float g = __bfloat162float(__float2bfloat16(acc[0][b]));
        const float u = __bfloat162float(__float2bfloat16(acc[1][b]));
        a.y[b * a.y_stride + row0] = __float2bfloat16(g / (1.f + expf(-g)) * u);
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

template <GemvIn IN, GemvOut OUT, int B, int R>
void launch(const GemvArgs& a, cudaStream_t s) {
  const int rows_per_block = OUT == GemvOut::kGateUp ? kWarps : kWarps * R;
  const int rows = OUT == GemvOut::kGateUp ? a.N / 2 : a.N;
  const int blocks = (rows + rows_per_block - 1) / rows_per_block;
  const size_t smem = static_cast<size_t>(a.K) * B * sizeof(__nv_bfloat16);
  pdl_launch(gemv_kernel<IN, OUT, B, R>, dim3(blocks), dim3(kThreads), smem, s, a);
}

template <GemvIn IN, GemvOut OUT, int B>
void by_rows(const GemvArgs& a, cudaStream_t s) {
  // Two rows per warp once there are enough rows to fill the GPU several times over; the gated
  // projection always reads its two rows (gate, up) per warp.
  if constexpr (OUT == GemvOut::kGateUp) {
    launch<IN, OUT, B, 2>(a, s);
  } else {
    if (a.N >= 8192) {
      launch<IN, OUT, B, 2>(a, s);
    } else {
      launch<IN, OUT, B, 1>(a, s);
    }
  }
}

template <GemvIn IN, GemvOut OUT>
void by_batch(const GemvArgs& a, cudaStream_t s) {
  switch (a.B) {
    case 1: by_rows<IN, OUT, 1>(a, s); break;
    case 2: by_rows<IN, OUT, 2>(a, s); break;
    case 3: by_rows<IN, OUT, 3>(a, s); break;
    case 4: by_rows<IN, OUT, 4>(a, s); break;
    default: throw std::runtime_error("gemv: batch must be 1..4");
  }
}

template <GemvIn IN>
void by_out(GemvOut out, const GemvArgs& a, cudaStream_t s) {
  if constexpr (IN == GemvIn::kDepAttn) {
    if (out != GemvOut::kResidual || a.B != 1) throw std::runtime_error("gemv: kDepAttn needs kResidual, B = 1");
    launch<IN, GemvOut::kResidual, 1, 1>(a, s);
  } else if constexpr (IN == GemvIn::kEmbRmsNorm) {
    if (out != GemvOut::kStore) throw std::runtime_error("gemv: kEmbRmsNorm needs kStore");
    by_batch<IN, GemvOut::kStore>(a, s);
  } else {
    switch (out) {
      case GemvOut::kStore: by_batch<IN, GemvOut::kStore>(a, s); break;
      case GemvOut::kResidual: by_batch<IN, GemvOut::kResidual>(a, s); break;
      case GemvOut::kLogits: by_batch<IN, GemvOut::kLogits>(a, s); break;
      case GemvOut::kAddEmb: by_batch<IN, GemvOut::kAddEmb>(a, s); break;
      case GemvOut::kGateUp: by_batch<IN, GemvOut::kGateUp>(a, s); break;
    }
  }
}

template <GemvIn IN, GemvOut OUT, int B>
void set_attrs_b() {
  if constexpr (OUT != GemvOut::kGateUp) {
    cudaFuncSetAttribute(gemv_kernel<IN, OUT, B, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmemBytes);
  }
  cudaFuncSetAttribute(gemv_kernel<IN, OUT, B, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmemBytes);
}
template <GemvIn IN, GemvOut OUT>
void set_attrs_o() {
  set_attrs_b<IN, OUT, 1>();
  set_attrs_b<IN, OUT, 2>();
  set_attrs_b<IN, OUT, 3>();
  set_attrs_b<IN, OUT, 4>();
}
template <GemvIn IN>
void set_attrs_i() {
  set_attrs_o<IN, GemvOut::kStore>();
  set_attrs_o<IN, GemvOut::kResidual>();
  set_attrs_o<IN, GemvOut::kLogits>();
  set_attrs_o<IN, GemvOut::kAddEmb>();
  set_attrs_o<IN, GemvOut::kGateUp>();
}

}  // namespace

void gemv_init() {
  set_attrs_i<GemvIn::kPlain>();
  set_attrs_i<GemvIn::kRmsNorm>();
  set_attrs_i<GemvIn::kSiluGate>();
  set_attrs_o<GemvIn::kEmbRmsNorm, GemvOut::kStore>();
  cudaFuncSetAttribute(gemv_kernel<GemvIn::kDepAttn, GemvOut::kResidual, 1, 1>,
                       cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmemBytes);
}

void gemv(GemvIn in, GemvOut out, const GemvArgs& a, cudaStream_t s) {
  if (a.K % 8 != 0) throw std::runtime_error("gemv: K must be a multiple of 8");
  if (out == GemvOut::kGateUp && a.N % 2 != 0) throw std::runtime_error("gemv: gate/up rows must be even");
  if (static_cast<int64_t>(a.K) * a.B * 2 > kMaxSmemBytes) throw std::runtime_error("gemv: K * B too large");
  switch (in) {
    case GemvIn::kPlain: by_out<GemvIn::kPlain>(out, a, s); break;
    case GemvIn::kRmsNorm: by_out<GemvIn::kRmsNorm>(out, a, s); break;
    case GemvIn::kSiluGate: by_out<GemvIn::kSiluGate>(out, a, s); break;
    case GemvIn::kDepAttn: by_out<GemvIn::kDepAttn>(out, a, s); break;
    case GemvIn::kEmbRmsNorm: by_out<GemvIn::kEmbRmsNorm>(out, a, s); break;
  }
}

}  // namespace ppx::kern
