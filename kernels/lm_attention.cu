#include <cmath>
#include <stdexcept>

#include "common.cuh"
#include "lm_attention.cuh"

namespace ppx::kern {
namespace {

constexpr int kSplit = 64;  // ring slots per block in the split-K attention (16 per warp)
constexpr int kAttnWarps = 4;

// One thread per rotation pair of q and of k, plus a copy of v.
__global__ void rope_append_kernel(const __nv_bfloat16* qkv, __nv_bfloat16* q_out, RingArgs r, float c,
                                   int pairs_per_row) {
  pdl_trigger();
  pdl_wait();
  const int b = blockIdx.y;
  const int D = r.H * r.hd;
  const int pos = r.pos[r.slot[b]];
  const int64_t base = (static_cast<int64_t>(r.slot[b]) * r.C + pos % r.C) * D;
  const __nv_bfloat16* row = qkv + static_cast<int64_t>(b) * 3 * D;
  for (int p = blockIdx.x * blockDim.x + threadIdx.x; p < pairs_per_row; p += gridDim.x * blockDim.x) {
    const int i = p % (r.hd / 2);  // frequency index inside the head
    const float omega = expf(static_cast<float>(i) * c);
    const float theta = static_cast<float>(pos) * omega;
    const float cs = cosf(theta), sn = sinf(theta);
    const int e = 2 * p;  // element index inside [H * hd]
    const float q0 = __bfloat162float(row[e]), q1 = __bfloat162float(row[e + 1]);
    const float k0 = __bfloat162float(row[D + e]), k1 = __bfloat162float(row[D + e + 1]);
    q_out[static_cast<int64_t>(b) * D + e] = __float2bfloat16(q0 * cs - q1 * sn);
    q_out[static_cast<int64_t>(b) * D + e + 1] = __float2bfloat16(q0 * sn + q1 * cs);
    r.k[base + e] = __float2bfloat16(k0 * cs - k1 * sn);
    r.k[base + e + 1] = __float2bfloat16(k0 * sn + k1 * cs);
    r.v[base + e] = row[2 * D + e];
    r.v[base + e + 1] = row[2 * D + e + 1];
  }
}

// A lane's DPL (<= 4) dims of one cached row.
template <int DPL>
__device__ __forceinline__ void load_dims(const __nv_bfloat16* p, float* f) {
  if constexpr (DPL == 4) {
    const uint2 u = *reinterpret_cast<const uint2*>(p);  // 8-byte aligned: lane * 4 dims
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
    f[0] = a.x;
    f[1] = a.y;
    f[2] = b.x;
    f[3] = b.y;
  } else if constexpr (DPL == 2) {
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
    f[0] = a.x;
    f[1] = a.y;
  } else {
#pragma unroll
    for (int j = 0; j < DPL; ++j) f[j] = __bfloat162float(p[j]);
  }
}

// One warp's online softmax over the cached keys idx in [k0, k1) that `vis(idx)` admits, lanes over
// head dims (DPL each). The loads of kGroup keys and values are issued together, so a warp waits
// for memory once per group instead of once per key.
constexpr int kGroup = 8;
template <int DPL, typename Vis>
__device__ __forceinline__ void attend(const float* qf, const __nv_bfloat16* kbase, const __nv_bfloat16* vbase,
                                       int64_t stride, int k0, int k1, float scale, Vis vis, float& m, float& l,
                                       float* acc) {
  for (int g0 = k0; g0 < k1; g0 += kGroup) {
    float kf[kGroup][DPL], vf[kGroup][DPL], sc[kGroup];
    bool ok[kGroup];
#pragma unroll
    for (int i = 0; i < kGroup; ++i) {
      const int idx = g0 + i;
      ok[i] = idx < k1 && vis(idx);
      if (ok[i]) {
        load_dims<DPL>(kbase + static_cast<int64_t>(idx) * stride, kf[i]);
        load_dims<DPL>(vbase + static_cast<int64_t>(idx) * stride, vf[i]);
      }
    }
#pragma unroll
    for (int i = 0; i < kGroup; ++i) {
      float d = 0.f;
      if (ok[i]) {
#pragma unroll
        for (int j = 0; j < DPL; ++j) d += qf[j] * kf[i][j];
      }
      sc[i] = d;
    }
#pragma unroll
    for (int i = 0; i < kGroup; ++i) sc[i] = warp_sum(sc[i]) * scale;
    float mn = m;
#pragma unroll
    for (int i = 0; i < kGroup; ++i)
      if (ok[i]) mn = fmaxf(mn, sc[i]);
    if (mn == -INFINITY) continue;  // nothing visible yet (uniform over the warp)
    const float corr = expf(m - mn);
    l *= corr;
#pragma unroll
    for (int j = 0; j < DPL; ++j) acc[j] *= corr;
#pragma unroll
    for (int i = 0; i < kGroup; ++i) {
      if (!ok[i]) continue;
      const float p = expf(sc[i] - mn);
      l += p;
#pragma unroll
      for (int j = 0; j < DPL; ++j) acc[j] = fmaf(p, vf[i][j], acc[j]);
    }
    m = mn;
  }
}

// grid (H, splits, B), kAttnWarps warps. Each warp runs an online softmax over its kSplit /
// kAttnWarps keys; the block merges its warps and writes (m, l, acc[hd]) for its split.
template <int DPL>
__global__ void attention_split_kernel(const __nv_bfloat16* q, RingArgs r, int splits, float* work) {
  pdl_trigger();
  pdl_wait();
  const int h = blockIdx.x, sp = blockIdx.y, b = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int D = r.H * r.hd;
  const int slot = r.slot[b];
  const int qpos = r.pos[slot], E = qpos + 1;
  const float scale = rsqrtf(static_cast<float>(r.hd));
  float qf[DPL], acc[DPL];
#pragma unroll
  for (int j = 0; j < DPL; ++j) {
    qf[j] = __bfloat162float(q[static_cast<int64_t>(b) * D + h * r.hd + lane * DPL + j]);
    acc[j] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  constexpr int kPerWarp = kSplit / kAttnWarps;
  const int k0 = sp * kSplit + warp * kPerWarp, k1 = min(k0 + kPerWarp, r.C);
  const int64_t cache0 = static_cast<int64_t>(slot) * r.C * D + h * r.hd + lane * DPL;
  attend<DPL>(qf, r.k + cache0, r.v + cache0, D, k0, k1, scale,
              [&](int idx) { return ring_visible(idx, E, r.C, qpos, r.context); }, m, l, acc);
  __shared__ float sm[kAttnWarps], sl[kAttnWarps], sacc[kAttnWarps][32 * DPL];
  if (lane == 0) {
    sm[warp] = m;
    sl[warp] = l;
  }
#pragma unroll
  for (int j = 0; j < DPL; ++j) sacc[warp][lane * DPL + j] = acc[j];
  __syncthreads();
  if (warp != 0) return;
  float M = -INFINITY;
  for (int w = 0; w < kAttnWarps; ++w) M = fmaxf(M, sm[w]);
  float L = 0.f, out[DPL];
#pragma unroll
  for (int j = 0; j < DPL; ++j) out[j] = 0.f;
  for (int w = 0; w < kAttnWarps; ++w) {
    const float f = sm[w] == -INFINITY ? 0.f : expf(sm[w] - M);
    L += sl[w] * f;
#pragma unroll
    for (int j = 0; j < DPL; ++j) out[j] += sacc[w][lane * DPL + j] * f;
  }
  float* wp = work + ((static_cast<int64_t>(b) * r.H + h) * splits + sp) * (2 + r.hd);
  if (lane == 0) {
    wp[0] = M;
    wp[1] = L;
  }
#pragma unroll
  for (int j = 0; j < DPL; ++j) wp[2 + lane * DPL + j] = out[j];
}

// grid (H, B), hd threads, `splits` floats of dynamic shared memory: merges the splits. The
// weights exp(m_s - M) are computed once per split (in parallel), so the loads of the partial sums
// do not wait on one another.
__global__ void attention_combine_kernel(const float* work, int H, int hd, int splits, __nv_bfloat16* out) {
  pdl_trigger();
  pdl_wait();
  extern __shared__ float wt[];
  __shared__ float red[32];
  const int h = blockIdx.x, b = blockIdx.y, d = threadIdx.x;
  const int row = 2 + hd;
  const float* wp = work + (static_cast<int64_t>(b) * H + h) * splits * row;
  float mx = -INFINITY;
  for (int s = d; s < splits; s += blockDim.x) mx = fmaxf(mx, wp[s * row]);
  const float M = block_max(mx, red);
  float ls = 0.f;
  for (int s = d; s < splits; s += blockDim.x) {
    const float m = wp[s * row];
    const float f = m == -INFINITY ? 0.f : expf(m - M);
    wt[s] = f;
    ls += f * wp[s * row + 1];
  }
  const float L = block_sum(ls, red);  // its barriers also publish wt
  float acc = 0.f;
#pragma unroll 8
  for (int s = 0; s < splits; ++s) acc = fmaf(wt[s], wp[s * row + 2 + d], acc);
  out[(static_cast<int64_t>(b) * H + h) * hd + d] = __float2bfloat16(L > 0.f ? acc / L : 0.f);
}

// grid (H, B), one warp: append this step's k, v, then attend over steps 0..step.
template <int DPL>
__global__ void depformer_attention_kernel(const __nv_bfloat16* qkv, RingArgs r, int step, __nv_bfloat16* out) {
  pdl_trigger();
  pdl_wait();
  const int h = blockIdx.x, b = blockIdx.y, lane = threadIdx.x;
  const int D = r.H * r.hd;
  const int slot = r.slot[b];
  const __nv_bfloat16* row = qkv + static_cast<int64_t>(b) * 3 * D + h * r.hd + lane * DPL;
  const int64_t cache0 = static_cast<int64_t>(slot) * r.C * D + h * r.hd + lane * DPL;
  float qf[DPL], acc[DPL];
#pragma unroll
  for (int j = 0; j < DPL; ++j) {
    qf[j] = __bfloat162float(row[j]);
    acc[j] = 0.f;
    r.k[cache0 + static_cast<int64_t>(step % r.C) * D + j] = row[D + j];
    r.v[cache0 + static_cast<int64_t>(step % r.C) * D + j] = row[2 * D + j];
  }
  __syncwarp();
  const float scale = rsqrtf(static_cast<float>(r.hd));
  const int E = step + 1;
  float m = -INFINITY, l = 0.f;
  attend<DPL>(qf, r.k + cache0, r.v + cache0, D, 0, min(r.C, E), scale,
              [&](int idx) { return ring_visible(idx, E, r.C, step, 0); }, m, l, acc);
#pragma unroll
  for (int j = 0; j < DPL; ++j)
    out[static_cast<int64_t>(b) * D + h * r.hd + lane * DPL + j] = __float2bfloat16(l > 0.f ? acc[j] / l : 0.f);
}

// Head dims per lane (hd / 32, 1..4) as a template argument.
template <template <int> class K, typename F>
void by_dpl(int hd, F&& f) {
  switch (hd / 32) {
    case 1: f(K<1>{}); break;
    case 2: f(K<2>{}); break;
    case 3: f(K<3>{}); break;
    case 4: f(K<4>{}); break;
    default: throw std::runtime_error("attention: head dim must be 32, 64, 96 or 128");
  }
}
template <int N>
struct Dpl {
  static constexpr int value = N;
};

}  // namespace

void rope_append(const __nv_bfloat16* qkv, __nv_bfloat16* q_out, const RingArgs& r, int B, float max_period,
                 cudaStream_t s) {
  const float c = static_cast<float>(-std::log(static_cast<double>(max_period)) * 2.0 / static_cast<double>(r.hd));
  const int pairs = r.H * r.hd / 2;
  const int threads = 256;
  const dim3 grid((pairs + threads - 1) / threads, B);
  pdl_launch(rope_append_kernel, grid, dim3(threads), 0, s, qkv, q_out, r, c, pairs);
}

size_t attention_work_floats(int B, int H, int hd, int C) {
  const int splits = (C + kSplit - 1) / kSplit;
  return static_cast<size_t>(B) * H * splits * (2 + hd);
}

void ring_attention(const __nv_bfloat16* q, const RingArgs& r, int B, float* work, __nv_bfloat16* out,
                    cudaStream_t s) {
  if (r.hd % 32 != 0) throw std::runtime_error("attention: head dim must be a multiple of 32");
  const int splits = (r.C + kSplit - 1) / kSplit;
  by_dpl<Dpl>(r.hd, [&](auto dpl) {
    pdl_launch(attention_split_kernel<decltype(dpl)::value>, dim3(r.H, splits, B), dim3(kAttnWarps * 32), 0, s, q,
               r, splits, work);
  });
  pdl_launch(attention_combine_kernel, dim3(r.H, B), dim3(r.hd), splits * sizeof(float), s,
             static_cast<const float*>(work), r.H, r.hd, splits, out);
}

void depformer_attention(const __nv_bfloat16* qkv, const RingArgs& r, int B, int step, __nv_bfloat16* out,
                         cudaStream_t s) {
  if (r.hd % 32 != 0) throw std::runtime_error("attention: head dim must be a multiple of 32");
  by_dpl<Dpl>(r.hd, [&](auto dpl) {
    pdl_launch(depformer_attention_kernel<decltype(dpl)::value>, dim3(r.H, B), dim3(32), 0, s, qkv, r, step, out);
  });
}

}  // namespace ppx::kern
