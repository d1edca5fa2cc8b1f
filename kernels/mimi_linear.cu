// Mimi transformer linears (see mimi_linear.cuh). fp32 weights and accumulation; the LayerNorm
// statistics are two-pass double sums and the normalisation is rounded step by step, as the CPU
// reference does, so normalised inputs match it to the last bit in practice.
//
// Latency is what matters at 2 tokens: every warp loads its whole weight row into registers before
// waiting on the previous kernel (PDL), and each thread loads its share of the input with all
// float4 loads in flight, computing the norm statistics from registers.
#include "common.cuh"
#include "mimi_device.cuh"
#include "mimi_linear.cuh"

namespace ppx::kern::mimi {
namespace {

constexpr int kWarps = 4, kThreads = 32 * kWarps;

// out[t] = (sum over the block of part[t]) / n for TT tokens at once; red: [TT][kWarps] shared.
template <int TT>
__device__ __forceinline__ void block_sum_tokens(const double* part, double* out, double (*red)[kWarps], int lane,
                                                 int warp, int n) {
#pragma unroll
  for (int t = 0; t < TT; ++t) {
    const double s = warp_sum_d(part[t]);
    if (lane == 0) red[t][warp] = s;
  }
  __syncthreads();
#pragma unroll
  for (int t = 0; t < TT; ++t) {
    double s = 0.0;
#pragma unroll
    for (int q = 0; q < kWarps; ++q) s += red[t][q];
    out[t] = s / n;
  }
  __syncthreads();
}

// Row b's input [TT][din] into dst (float4 tid + k * kThreads of the block's threads), LayerNorm'd
// when p.ln_w (two-pass mean and variance per token in double, reduced over the block for all
// tokens at once), else copied. red: [TT][kWarps] shared.
template <int TT, int NV>
__device__ __forceinline__ void stage_input(const LinearParams& p, int b, int slot, float4* dst,
                                            double (*red)[kWarps]) {
  constexpr int din = NV * 128, row4 = din / 4, total4 = TT * row4, per = (total4 + kThreads - 1) / kThreads;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  // Input [TT][din], token-major and contiguous: element k of this thread is float4 tid + k*kThreads.
  const float4* x4 = reinterpret_cast<const float4*>(row(p.x, b, slot));
  float4 v[per];
#pragma unroll
  for (int k = 0; k < per; ++k) {
    const int idx = tid + k * kThreads;
    v[k] = idx < total4 ? x4[idx] : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  if (p.ln_w) {
    double mean[TT], rstd[TT], part[TT];
#pragma unroll
    for (int t = 0; t < TT; ++t) part[t] = 0.0;
#pragma unroll
    for (int k = 0; k < per; ++k) {
      const int idx = tid + k * kThreads;
      if (idx < total4) {
        const double s = static_cast<double>(v[k].x) + v[k].y + v[k].z + v[k].w;
#pragma unroll
        for (int t = 0; t < TT; ++t)
          if (idx / row4 == t) part[t] += s;
      }
    }
    block_sum_tokens<TT>(part, mean, red, lane, warp, din);
#pragma unroll
    for (int t = 0; t < TT; ++t) part[t] = 0.0;
#pragma unroll
    for (int k = 0; k < per; ++k) {
      const int idx = tid + k * kThreads;
      if (idx < total4) {
#pragma unroll
        for (int t = 0; t < TT; ++t) {
          if (idx / row4 == t) {
            const double a = v[k].x - mean[t], bb = v[k].y - mean[t], c = v[k].z - mean[t], d = v[k].w - mean[t];
            part[t] += a * a + bb * bb + c * c + d * d;
          }
        }
      }
    }
    block_sum_tokens<TT>(part, rstd, red, lane, warp, din);  // variance for now
#pragma unroll
    for (int t = 0; t < TT; ++t) rstd[t] = 1.0 / sqrt(rstd[t] + static_cast<double>(p.ln_eps));
    const float4* g4 = reinterpret_cast<const float4*>(p.ln_w);
    const float4* b4 = reinterpret_cast<const float4*>(p.ln_b);
#pragma unroll
    for (int k = 0; k < per; ++k) {
      const int idx = tid + k * kThreads;
      if (idx < total4) {
        float m = 0.f, inv = 0.f;
#pragma unroll
        for (int t = 0; t < TT; ++t)
          if (idx / row4 == t) m = static_cast<float>(mean[t]), inv = static_cast<float>(rstd[t]);
        const float4 gw = __ldg(g4 + idx % row4), gb = __ldg(b4 + idx % row4);
        auto nrm = [&](float x, float gg, float bb) {
          return __fadd_rn(__fmul_rn(__fmul_rn(__fsub_rn(x, m), inv), gg), bb);
        };
        dst[idx] = make_float4(nrm(v[k].x, gw.x, gb.x), nrm(v[k].y, gw.y, gb.y), nrm(v[k].z, gw.z, gb.z),
                              nrm(v[k].w, gw.w, gb.w));
      }
    }
  } else {
#pragma unroll
    for (int k = 0; k < per; ++k) {
      const int idx = tid + k * kThreads;
      if (idx < total4) dst[idx] = v[k];
    }
  }
}

// grid (ceil(dout / kWarps), B), block kThreads. NV = din / 128: float4 loads per lane per row.
template <int TT, int NV>
__global__ void __launch_bounds__(kThreads) linear_kernel(LinearParams p, Batch batch) {
  constexpr int din = NV * 128, row4 = din / 4, total4 = TT * row4;
  __shared__ __align__(16) float4 xs[total4];  // normalised input [TT][din]
  __shared__ double red[TT][kWarps];
  const int b = blockIdx.y, slot = batch.slots[b];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int o = blockIdx.x * kWarps + warp;

  float4 w[NV];
  const float4* w4 = reinterpret_cast<const float4*>(p.w) + static_cast<size_t>(o < p.dout ? o : 0) * row4 + lane;
#pragma unroll
  for (int v = 0; v < NV; ++v) w[v] = o < p.dout ? __ldg(w4 + 32 * v) : make_float4(0.f, 0.f, 0.f, 0.f);
  pdl_wait();
  stage_input<TT, NV>(p, b, slot, xs, red);
  __syncthreads();
  if (o >= p.dout) return;  // no block-wide barrier below

  float acc[TT];
#pragma unroll
  for (int t = 0; t < TT; ++t) {
    const float4* xt = xs + t * row4 + lane;
    float a = 0.f;
#pragma unroll
    for (int q = 0; q < NV; ++q) {
      const float4 xv = xt[32 * q];
      a = fmaf(w[q].x, xv.x, a);
      a = fmaf(w[q].y, xv.y, a);
      a = fmaf(w[q].z, xv.z, a);
      a = fmaf(w[q].w, xv.w, a);
    }
    acc[t] = warp_sum(a);
  }
  if (lane == 0) {
    float* y = row(p.y, b, slot);
#pragma unroll
    for (int t = 0; t < TT; ++t) {
      float* yo = y + o * p.y.sc + t * p.y.st;
      if (p.epilogue == kLinearGelu) {
        *yo = gelu(acc[t]);
      } else if (p.epilogue == kLinearScaledResidual) {
        *yo = __fadd_rn(*yo, __fmul_rn(p.ls[o], acc[t]));
      } else {
        *yo = acc[t];
      }
    }
  }
}

// grid (B), block kThreads: row b's LayerNorm'd input into `out` (token-major, contiguous).
template <int TT, int NV>
__global__ void __launch_bounds__(kThreads) layer_norm_kernel(LinearParams p, Act out, Batch batch) {
  __shared__ double red[TT][kWarps];
  const int b = blockIdx.x, slot = batch.slots[b];
  pdl_wait();
  stage_input<TT, NV>(p, b, slot, reinterpret_cast<float4*>(row(out, b, slot)), red);
}

// grid (ceil(tokens * dout / 256), B), block 256: element (t, o) of row b's product, read from the
// contiguous c [B][tokens][dout], through the epilogue into p.y as linear_kernel stores it.
__global__ void __launch_bounds__(256) linear_epilogue_kernel(LinearParams p, const float* c, Batch batch) {
  const int b = blockIdx.y, slot = batch.slots[b];
  const int e = blockIdx.x * 256 + threadIdx.x;
  pdl_wait();
  if (e >= p.tokens * p.dout) return;
  const int t = e / p.dout, o = e - t * p.dout;
  const float v = c[static_cast<long long>(b) * p.tokens * p.dout + e];
  float* yo = row(p.y, b, slot) + o * p.y.sc + t * p.y.st;
  if (p.epilogue == kLinearGelu) {
    *yo = gelu(v);
  } else if (p.epilogue == kLinearScaledResidual) {
    *yo = __fadd_rn(*yo, __fmul_rn(p.ls[o], v));
  } else {
    *yo = v;
  }
}

template <int TT, int NV>
void launch_linear(const LinearParams& p, const Batch& batch, cudaStream_t s) {
  const dim3 grid((p.dout + kWarps - 1) / kWarps, batch.count);
  launch(linear_kernel<TT, NV>, grid, dim3(kThreads), 0, s, p, batch);
}

template <int TT, int NV>
void launch_norm(const LinearParams& p, const Act& out, const Batch& batch, cudaStream_t s) {
  launch(layer_norm_kernel<TT, NV>, dim3(batch.count), dim3(kThreads), 0, s, p, out, batch);
}

template <int TT>
void launch_tt(const LinearParams& p, const Batch& batch, cudaStream_t s) {
  switch (p.din / 128) {
    case 1: launch_linear<TT, 1>(p, batch, s); break;
    case 2: launch_linear<TT, 2>(p, batch, s); break;
    case 4: launch_linear<TT, 4>(p, batch, s); break;
    case 8: launch_linear<TT, 8>(p, batch, s); break;
    default: launch_linear<TT, 16>(p, batch, s); break;
  }
}

template <int TT>
void launch_norm_tt(const LinearParams& p, const Act& out, const Batch& batch, cudaStream_t s) {
  switch (p.din / 128) {
    case 1: launch_norm<TT, 1>(p, out, batch, s); break;
    case 2: launch_norm<TT, 2>(p, out, batch, s); break;
    case 4: launch_norm<TT, 4>(p, out, batch, s); break;
    case 8: launch_norm<TT, 8>(p, out, batch, s); break;
    default: launch_norm<TT, 16>(p, out, batch, s); break;
  }
}

}  // namespace

bool linear_supported(int din, int tokens) {
  const int nv = din / 128;
  return din % 128 == 0 && (nv == 1 || nv == 2 || nv == 4 || nv == 8 || nv == 16) && (tokens == 1 || tokens == 2);
}

void linear(const LinearParams& p, const Batch& batch, cudaStream_t s) {
  if (p.tokens == 1) {
    launch_tt<1>(p, batch, s);
  } else {
    launch_tt<2>(p, batch, s);
  }
}

void layer_norm(const LinearParams& p, const Act& out, const Batch& batch, cudaStream_t s) {
  if (p.tokens == 1) {
    launch_norm_tt<1>(p, out, batch, s);
  } else {
    launch_norm_tt<2>(p, out, batch, s);
  }
}

void linear_epilogue(const LinearParams& p, const float* c, const Batch& batch, cudaStream_t s) {
  const dim3 grid((p.tokens * p.dout + 255) / 256, batch.count);
  launch(linear_epilogue_kernel, grid, dim3(256), 0, s, p, c, batch);
}

}  // namespace ppx::kern::mimi
