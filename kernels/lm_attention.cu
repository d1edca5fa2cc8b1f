#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "common.cuh"
#include "lm_attention.cuh"
#include "lm_attention_impl.cuh"

namespace ppx::kern {
namespace {
using namespace attn_impl;


// The scale byte of a head whose largest magnitude is a: the smallest power of two 2^e with
// a / 2^e <= 448 (e4m3's largest finite value), as the byte e + 127 clamped to 1..254. With
// a = f 2^E (f in [0.5, 1)): e = E - 9 gives a / 2^e = 512 f, at most 448 when f <= 0.875; else
// e = E - 8 (256 f, in (224, 256)). Zero: 127 (scale 1); infinity: 254.
__device__ __forceinline__ uint8_t fp8_scale_byte(float a) {
  if (!(a > 0.f)) return 127;
  if (isinf(a)) return 254;
  int E = 0;
  const float f = frexpf(a, &E);
  const int e = E - 9 + (f > 0.875f ? 1 : 0);
  return static_cast<uint8_t>(min(254, max(1, e + 127)));
}

// One thread per rotation pair of q and of k, plus a copy of v. With an fp8 cache (r.k8) each
// block holds whole heads (hd / 2 divides blockDim.x): the rotated keys and the values are
// gathered in shared memory, one thread per head finds the head's largest magnitudes, and every
// thread writes its pair scaled by them.
constexpr int kRopeThreads = 256;
__global__ void rope_append_kernel(const __nv_bfloat16* qkv, __nv_bfloat16* q_out, RingArgs r, float c,
                                   int pairs_per_row) {
  pdl_trigger();
  pdl_wait();
  const int b = blockIdx.y;
  const int D = r.H * r.hd;
  const int pos = r.row_pos ? r.row_pos[b] : r.pos[r.slot[b]];
  const int64_t base = (static_cast<int64_t>(r.slot[b]) * r.C + pos % r.C) * D;
  const __nv_bfloat16* row = qkv + static_cast<int64_t>(b) * 3 * D;
  const int p = blockIdx.x * blockDim.x + threadIdx.x;
  const bool live = p < pairs_per_row;
  float kr0 = 0.f, kr1 = 0.f, v0 = 0.f, v1 = 0.f;
  const int e = 2 * p;  // element index inside [H * hd]
  if (live) {
    const int i = p % (r.hd / 2);  // frequency index inside the head
    const float omega = expf(static_cast<float>(i) * c);
    const float theta = static_cast<float>(pos) * omega;
    const float cs = cosf(theta), sn = sinf(theta);
    const float q0 = __bfloat162float(row[e]), q1 = __bfloat162float(row[e + 1]);
    const float k0 = __bfloat162float(row[D + e]), k1 = __bfloat162float(row[D + e + 1]);
    q_out[static_cast<int64_t>(b) * D + e] = __float2bfloat16(q0 * cs - q1 * sn);
    q_out[static_cast<int64_t>(b) * D + e + 1] = __float2bfloat16(q0 * sn + q1 * cs);
    // The cache holds bf16-rounded keys either way (what the bf16 cache stores).
    kr0 = __bfloat162float(__float2bfloat16(k0 * cs - k1 * sn));
    kr1 = __bfloat162float(__float2bfloat16(k0 * sn + k1 * cs));
    v0 = __bfloat162float(row[2 * D + e]);
    v1 = __bfloat162float(row[2 * D + e + 1]);
    if (r.k8 == nullptr) {
      r.k[base + e] = __float2bfloat16(kr0);
      r.k[base + e + 1] = __float2bfloat16(kr1);
      r.v[base + e] = row[2 * D + e];
      r.v[base + e + 1] = row[2 * D + e + 1];
    }
  }
  if (r.k8 == nullptr) return;  // uniform over the grid
  __shared__ float mk[kRopeThreads], mv[kRopeThreads], sk[kRopeThreads], sv[kRopeThreads];
  mk[threadIdx.x] = fmaxf(fabsf(kr0), fabsf(kr1));
  mv[threadIdx.x] = fmaxf(fabsf(v0), fabsf(v1));
  __syncthreads();
  const int per_head = r.hd / 2;  // pairs (threads) per head
  const int first = threadIdx.x - threadIdx.x % per_head;
  if (threadIdx.x == first && live) {
    float a = 0.f, bm = 0.f;
    for (int t = first; t < first + per_head; ++t) {
      a = fmaxf(a, mk[t]);
      bm = fmaxf(bm, mv[t]);
    }
    const uint8_t ek = fp8_scale_byte(a), ev = fp8_scale_byte(bm);
    sk[first] = fp8_scale_value(ek);
    sv[first] = fp8_scale_value(ev);
    const int h = e / r.hd;
    // [slots, H, fp8_scale_pitch(C)]
    const int64_t srow = (static_cast<int64_t>(r.slot[b]) * r.H + h) * fp8_scale_pitch(r.C) + pos % r.C;
    r.k_scale[srow] = ek;
    r.v_scale[srow] = ev;
  }
  __syncthreads();
  if (!live) return;
  const float ks = sk[first], vs = sv[first];
  // [slots, C, H * hd], or by head [slots, H, C, hd] (RingArgs::fp8_by_head).
  const int64_t at = r.fp8_by_head ? ((static_cast<int64_t>(r.slot[b]) * r.H + e / r.hd) * r.C + pos % r.C) * r.hd +
                                         e % r.hd
                                   : base + e;
  __nv_fp8_storage_t* k8 = reinterpret_cast<__nv_fp8_storage_t*>(r.k8) + at;
  __nv_fp8_storage_t* v8 = reinterpret_cast<__nv_fp8_storage_t*>(r.v8) + at;
  k8[0] = __nv_cvt_float_to_fp8(kr0 / ks, __NV_SATFINITE, __NV_E4M3);
  k8[1] = __nv_cvt_float_to_fp8(kr1 / ks, __NV_SATFINITE, __NV_E4M3);
  v8[0] = __nv_cvt_float_to_fp8(v0 / vs, __NV_SATFINITE, __NV_E4M3);
  v8[1] = __nv_cvt_float_to_fp8(v1 / vs, __NV_SATFINITE, __NV_E4M3);
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

// A lane's DPL (<= 4) dims of one cached fp8 row, times the row's scale.
template <int DPL>
__device__ __forceinline__ void load_dims(const __nv_fp8_e4m3* p, float scale, float* f) {
  const __nv_fp8_storage_t* b = reinterpret_cast<const __nv_fp8_storage_t*>(p);
  if constexpr (DPL == 4) {
    const uint32_t u = *reinterpret_cast<const uint32_t*>(b);  // 4-byte aligned: lane * 4 dims
    const float2 lo = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(u & 0xffffu), __NV_E4M3)));
    const float2 hi = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(u >> 16), __NV_E4M3)));
    f[0] = lo.x * scale;
    f[1] = lo.y * scale;
    f[2] = hi.x * scale;
    f[3] = hi.y * scale;
  } else {
#pragma unroll
    for (int j = 0; j < DPL; ++j) f[j] = __half2float(__half(__nv_cvt_fp8_to_halfraw(b[j], __NV_E4M3))) * scale;
  }
}

// One warp's online softmax over the cached keys idx in [k0, k1) that `vis(idx)` admits, lanes over
// head dims (DPL each). The loads of kGroup keys and values are issued together, so a warp waits
// for memory once per group instead of once per key.
constexpr int kGroup = 8;
// KT: bf16, or fp8 with per-row scales at kscale / vscale [idx * sstride] (nullptr for bf16).
template <int DPL, typename KT, typename Vis>
__device__ __forceinline__ void attend(const float* qf, const KT* kbase, const KT* vbase, int64_t stride,
                                       const float* kscale, const float* vscale, int64_t sstride, int k0, int k1,
                                       float scale, Vis vis, float& m, float& l, float* acc) {
  for (int g0 = k0; g0 < k1; g0 += kGroup) {
    float kf[kGroup][DPL], vf[kGroup][DPL], sc[kGroup];
    bool ok[kGroup];
#pragma unroll
    for (int i = 0; i < kGroup; ++i) {
      const int idx = g0 + i;
      ok[i] = idx < k1 && vis(idx);
      if (ok[i]) {
        if constexpr (std::is_same_v<KT, __nv_bfloat16>) {
          load_dims<DPL>(kbase + static_cast<int64_t>(idx) * stride, kf[i]);
          load_dims<DPL>(vbase + static_cast<int64_t>(idx) * stride, vf[i]);
        } else {
          load_dims<DPL>(kbase + static_cast<int64_t>(idx) * stride, kscale[idx * sstride], kf[i]);
          load_dims<DPL>(vbase + static_cast<int64_t>(idx) * stride, vscale[idx * sstride], vf[i]);
        }
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


// Raw loads of one key's DL values (bf16: DL / 2 words; fp8: DL / 4 words), issued for all of a
// round's keys before any is converted, so a warp waits for memory once per round.
template <int DL, typename KT>
struct KeyWords {
  static constexpr int kWords = std::is_same_v<KT, __nv_bfloat16> ? DL / 2 : DL / 4;
  uint32_t w[kWords];
  __device__ __forceinline__ void load(const KT* p) {
    const uint32_t* src = reinterpret_cast<const uint32_t*>(p);
    if constexpr (kWords % 4 == 0) {
#pragma unroll
      for (int c = 0; c < kWords / 4; ++c) {
        const uint4 u = reinterpret_cast<const uint4*>(src)[c];
        w[4 * c] = u.x;
        w[4 * c + 1] = u.y;
        w[4 * c + 2] = u.z;
        w[4 * c + 3] = u.w;
      }
    } else if constexpr (kWords % 2 == 0) {
#pragma unroll
      for (int c = 0; c < kWords / 2; ++c) {
        const uint2 u = reinterpret_cast<const uint2*>(src)[c];
        w[2 * c] = u.x;
        w[2 * c + 1] = u.y;
      }
    } else {
#pragma unroll
      for (int c = 0; c < kWords; ++c) w[c] = src[c];
    }
  }
  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int c = 0; c < kWords; ++c) w[c] = 0u;
  }
  __device__ __forceinline__ void to_float(float scale, float* f) const {
    if constexpr (std::is_same_v<KT, __nv_bfloat16>) {
#pragma unroll
      for (int c = 0; c < kWords; ++c) {
        const float2 t = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[c]));
        f[2 * c] = t.x;
        f[2 * c + 1] = t.y;
      }
    } else {
      // e4m3 -> f32 by moving the bits into place, no conversion instructions (the bound of this
      // kernel with them): the f32 holds the value times 2^-120 exactly (e4m3's exponent bias 7
      // against f32's 127; e4m3 subnormals land on f32 subnormals). The caller undoes the 2^-120.
#pragma unroll
      for (int c = 0; c < kWords; ++c) {
        const uint32_t u = w[c];
        f[4 * c] = __uint_as_float(((u << 20) & 0x07f00000u) | ((u << 24) & 0x80000000u));
        f[4 * c + 1] = __uint_as_float(((u << 12) & 0x07f00000u) | ((u << 16) & 0x80000000u));
        f[4 * c + 2] = __uint_as_float(((u << 4) & 0x07f00000u) | ((u << 8) & 0x80000000u));
        f[4 * c + 3] = __uint_as_float(((u >> 4) & 0x07f00000u) | (u & 0x80000000u));
      }
      (void)scale;
    }
  }
};
// The fp8 path's 2^120 (see KeyWords::to_float), split so no intermediate leaves f32's range: q
// takes 2^64 and the key scale 2^56; p takes 2^64 with the value scale and the sum 2^56 at the end.
constexpr float k2p64 = 18446744073709551616.f;
constexpr float k2p56 = 72057594037927936.f;


// grid (H, G, B), kAttnWarps warps. Block y takes the live chunks y, y + G, ... of kSplit ring
// entries (none past the live ones, so a short context costs little however large the grid).
// Inside a warp 8 lanes share a key (each holds DL = hd / 8 of its dimensions) and the warp's 4
// groups of 8 lanes take 4 keys at once: a key's dot product needs 3 shuffles, and a warp's 16 keys
// of a chunk are loaded in 4 rounds issued together. Each group keeps its own online softmax across
// the block's chunks; the groups, then the warps, are merged at the end, and the block writes
// (m, l, acc[hd]) for part y (m = -inf when it saw no visible key). With G = splits (batches up to
// kMaxGemvBatch rows) a block has at most one chunk, the order of one row alone.
template <int DL, typename KT>
__global__ void __launch_bounds__(kAttnWarps * 32) attention_split_kernel(const __nv_bfloat16* q, RingArgs r,
                                                                           int parts, float* work) {
  pdl_trigger();
  pdl_wait();
  constexpr int kRounds = kSplit / kAttnWarps / 4;  // keys per group and chunk
  constexpr bool kFp8 = !std::is_same_v<KT, __nv_bfloat16>;
  const int h = blockIdx.x, part = blockIdx.y, b = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int grp = lane >> 3, dg = lane & 7;  // key group, dimension group
  const int D = r.H * r.hd;
  const int slot = r.slot[b];
  const int qpos = row_position(r, b), E = qpos + 1;
  const float scale = rsqrtf(static_cast<float>(r.hd));
  float qf[DL], acc[DL];
  {
    KeyWords<DL, __nv_bfloat16> qw;
    qw.load(q + static_cast<int64_t>(b) * D + h * r.hd + dg * DL);
    qw.to_float(1.f, qf);
  }
  const float qscale = kFp8 ? scale * k2p64 : scale;
#pragma unroll
  for (int j = 0; j < DL; ++j) {
    qf[j] *= qscale;
    acc[j] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  // A key row's stride: D, or hd in the fp8 cache laid out by head (RingArgs::fp8_by_head).
  const bool by_head = kFp8 && r.fp8_by_head;
  const int rs = by_head ? r.hd : D;
  const int64_t cache0 = (by_head ? (static_cast<int64_t>(slot) * r.H + h) * r.C * r.hd
                                  : static_cast<int64_t>(slot) * r.C * D + h * r.hd) +
                         dg * DL;
  const KT* kb = (kFp8 ? reinterpret_cast<const KT*>(r.k8) : reinterpret_cast<const KT*>(r.k)) + cache0;
  const KT* vb = (kFp8 ? reinterpret_cast<const KT*>(r.v8) : reinterpret_cast<const KT*>(r.v)) + cache0;
  const int64_t s0 = (static_cast<int64_t>(slot) * r.H + h) * fp8_scale_pitch(r.C);
  const int chunks = live_chunks(qpos, r.C);
  for (int sp = part; sp < chunks; sp += parts) {
    const int k0 = sp * kSplit + warp * (kSplit / kAttnWarps) + grp;
    KeyWords<DL, KT> kw[kRounds], vw[kRounds];
    bool ok[kRounds];
    float ksc[kRounds], vsc[kRounds];  // fp8: the keys' and values' scales, loaded with them
#pragma unroll
    for (int u = 0; u < kRounds; ++u) {
      const int idx = k0 + 4 * u;
      ok[u] = idx < r.C && ring_visible(idx, E, r.C, qpos, r.context);
      ksc[u] = vsc[u] = 0.f;
      if (ok[u]) {
        kw[u].load(kb + static_cast<int64_t>(idx) * rs);
        vw[u].load(vb + static_cast<int64_t>(idx) * rs);
        if constexpr (kFp8) {
          ksc[u] = fp8_scale_value(r.k_scale[s0 + idx]);
          vsc[u] = fp8_scale_value(r.v_scale[s0 + idx]);
        }
      } else {
        kw[u].zero();
        vw[u].zero();
      }
    }
    float sc[kRounds];
#pragma unroll
    for (int u = 0; u < kRounds; ++u) {
      float kf[DL];
      kw[u].to_float(1.f, kf);
      float d = 0.f;
#pragma unroll
      for (int j = 0; j < DL; ++j) d = fmaf(qf[j], kf[j], d);
      sc[u] = d;
    }
#pragma unroll
    for (int u = 0; u < kRounds; ++u) {
      sc[u] += __shfl_xor_sync(0xffffffffu, sc[u], 1);
      sc[u] += __shfl_xor_sync(0xffffffffu, sc[u], 2);
      sc[u] += __shfl_xor_sync(0xffffffffu, sc[u], 4);
    }
    // Branch-free below (the groups of a warp differ in what they see; the shuffles of the next
    // chunk need the whole warp together): a group with nothing visible yet keeps m = -inf.
    float mn = m;
#pragma unroll
    for (int u = 0; u < kRounds; ++u) {
      if constexpr (kFp8) sc[u] = sc[u] * ksc[u] * k2p56;  // no product of the two factors alone (2^183)
      mn = ok[u] ? fmaxf(mn, sc[u]) : mn;
    }
    const bool any = mn != -INFINITY;
    const float corr = any ? expf(m - mn) : 1.f;
    l *= corr;
#pragma unroll
    for (int j = 0; j < DL; ++j) acc[j] *= corr;
#pragma unroll
    for (int u = 0; u < kRounds; ++u) {
      float p = ok[u] ? expf(sc[u] - mn) : 0.f;
      l += p;
      if constexpr (kFp8) p = p * vsc[u] * k2p64;  // p <= 1 first: vsc x 2^64 alone overflows from 2^64
      float vf[DL];
      vw[u].to_float(1.f, vf);
#pragma unroll
      for (int j = 0; j < DL; ++j) acc[j] = fmaf(p, vf[j], acc[j]);
    }
    m = mn;
  }
  if (part >= chunks) return;  // uniform over the block: nothing to write, the combine skips it
  if constexpr (kFp8) {
#pragma unroll
    for (int j = 0; j < DL; ++j) acc[j] *= k2p56;
  }
  // Merge the warp's 4 key groups (lanes dg, dg + 8, dg + 16, dg + 24 hold the same dimensions).
#pragma unroll
  for (int off = 8; off <= 16; off <<= 1) {
    const float mo = __shfl_xor_sync(0xffffffffu, m, off), lo = __shfl_xor_sync(0xffffffffu, l, off);
    const float M = fmaxf(m, mo);
    const float f = m == -INFINITY ? 0.f : expf(m - M), fo = mo == -INFINITY ? 0.f : expf(mo - M);
    l = l * f + lo * fo;
#pragma unroll
    for (int j = 0; j < DL; ++j) acc[j] = acc[j] * f + __shfl_xor_sync(0xffffffffu, acc[j], off) * fo;
    m = M;
  }
  __shared__ float sm[kAttnWarps], sl[kAttnWarps], sacc[kAttnWarps][8 * DL];
  if (lane == 0) {
    sm[warp] = m;
    sl[warp] = l;
  }
  if (grp == 0) {
#pragma unroll
    for (int j = 0; j < DL; ++j) sacc[warp][dg * DL + j] = acc[j];
  }
  __syncthreads();
  if (warp == 0) write_block_part<8 * DL>(sm, sl, sacc, work, static_cast<int64_t>(b) * r.H + h, parts, part, lane);
}

// grid (H, B), hd threads, `parts` floats of dynamic shared memory: merges the parts the split
// kernel wrote (those below the row's live chunks). The weights exp(m_s - M) are computed once per
// part (in parallel), so the loads of the partial sums do not wait on one another.
__global__ void attention_combine_kernel(const float* work, RingArgs r, int parts, __nv_bfloat16* out) {
  pdl_trigger();
  pdl_wait();
  extern __shared__ float wt[];
  __shared__ float red[32];
  const int H = r.H, hd = r.hd;
  const int h = blockIdx.x, b = blockIdx.y, d = threadIdx.x;
  const int row = 2 + hd;
  const int splits = min(parts, live_chunks(row_position(r, b), r.C));
  const float* wp = work + (static_cast<int64_t>(b) * H + h) * parts * row;
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
  attend<DPL>(qf, r.k + cache0, r.v + cache0, D, static_cast<const float*>(nullptr), static_cast<const float*>(nullptr),
              0, 0, min(r.C, E), scale, [&](int idx) { return ring_visible(idx, E, r.C, step, 0); }, m, l, acc);
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
  if (r.k8 && (r.hd % 2 != 0 || kRopeThreads % (r.hd / 2) != 0 || !r.v8 || !r.k_scale || !r.v_scale))
    throw std::runtime_error("rope_append: an fp8 cache needs k8, v8, both scales and hd / 2 dividing 256");
  const dim3 grid((pairs + kRopeThreads - 1) / kRopeThreads, B);
  pdl_launch(rope_append_kernel, grid, dim3(kRopeThreads), 0, s, qkv, q_out, r, c, pairs);
}

namespace {
int g_attention_policy = 0;
int g_attention_parts = 0;  // attention_set_parts: 0, the plan's
bool g_fp8_by_head = true;  // as shipped since v0.34
}  // namespace

void attention_set_fp8_by_head(bool on) { g_fp8_by_head = on; }
bool attention_fp8_by_head() { return g_fp8_by_head; }

void attention_set_policy(int policy) {
  g_attention_policy = policy;
  attn_fp8::ready_policy(policy);
}

void attention_set_parts(int parts) { g_attention_parts = std::max(0, parts); }

void attention_init() { attn_fp8::init(); }

int attention_parts(int B, int H, int C, bool fp8) {
  const int splits = (C + kSplit - 1) / kSplit;
  if (fp8) return attn_fp8::plan(B, H, C, g_attention_policy, g_attention_parts).parts;
  // Up to 4 rows or with policy 1: a block per chunk; else about 2048 blocks of 4 warps.
  if (B <= 4 || g_attention_policy == 1) return splits;
  constexpr int kTargetBlocks = 2048;
  return std::max(1, std::min(splits, (kTargetBlocks + H * B - 1) / (H * B)));
}

size_t attention_work_floats(int B, int H, int hd, int C) {
  const int splits = (C + kSplit - 1) / kSplit;
  return static_cast<size_t>(B) * H * splits * (2 + hd);
}

void ring_attention(const __nv_bfloat16* q, const RingArgs& r, int B, float* work, __nv_bfloat16* out,
                    cudaStream_t s) {
  if (r.hd % 32 != 0) throw std::runtime_error("attention: head dim must be a multiple of 32");
  // The tensor-core kernel copies each chunk's scale bytes as one 16-byte piece.
  if (r.k8 && (reinterpret_cast<uintptr_t>(r.k_scale) % 16 != 0 || reinterpret_cast<uintptr_t>(r.v_scale) % 16 != 0))
    throw std::runtime_error("attention: the fp8 cache's scales must start 16-byte aligned");
  const bool tc = attn_fp8::applies(r, g_attention_policy);
  const attn_fp8::Plan plan =
      tc ? attn_fp8::plan(B, r.H, r.C, g_attention_policy, g_attention_parts) : attn_fp8::Plan{0, false, attention_parts(B, r.H, r.C)};
  const int parts = plan.parts;
  auto launch = [&](auto dl) {
    constexpr int DL = decltype(dl)::value;
    if (tc) {
      attn_fp8::launch(q, r, B, plan, work, s);
    } else if (r.k8) {
      pdl_launch(attention_split_kernel<DL, __nv_fp8_e4m3>, dim3(r.H, parts, B), dim3(kAttnWarps * 32), 0, s, q, r,
                 parts, work);
    } else {
      pdl_launch(attention_split_kernel<DL, __nv_bfloat16>, dim3(r.H, parts, B), dim3(kAttnWarps * 32), 0, s, q, r,
                 parts, work);
    }
  };
  switch (r.hd) {  // DL = hd / 8 values per lane
    case 32: launch(Dpl<4>{}); break;
    case 64: launch(Dpl<8>{}); break;
    case 96: launch(Dpl<12>{}); break;
    case 128: launch(Dpl<16>{}); break;
    default: throw std::runtime_error("attention: head dim must be 32, 64, 96 or 128");
  }
  pdl_launch(attention_combine_kernel, dim3(r.H, B), dim3(r.hd), parts * sizeof(float), s,
             static_cast<const float*>(work), r, parts, out);
}

void depformer_attention(const __nv_bfloat16* qkv, const RingArgs& r, int B, int step, __nv_bfloat16* out,
                         cudaStream_t s) {
  if (r.hd % 32 != 0) throw std::runtime_error("attention: head dim must be a multiple of 32");
  by_dpl<Dpl>(r.hd, [&](auto dpl) {
    pdl_launch(depformer_attention_kernel<decltype(dpl)::value>, dim3(r.H, B), dim3(32), 0, s, qkv, r, step, out);
  });
}

}  // namespace ppx::kern
