#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "common.cuh"
#include "lm_attention.cuh"

namespace ppx::kern {
namespace {

constexpr int kSplit = 64;  // ring slots per block in the split-K attention (16 per warp)
constexpr int kAttnWarps = 4;

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
    sk[first] = a > 0.f ? a / 448.f : 1.f;
    sv[first] = bm > 0.f ? bm / 448.f : 1.f;
    const int h = e / r.hd;
    const int64_t srow = (static_cast<int64_t>(r.slot[b]) * r.H + h) * r.C + pos % r.C;  // [slots, H, C]
    r.k_scale[srow] = sk[first];
    r.v_scale[srow] = sv[first];
  }
  __syncthreads();
  if (!live) return;
  const float ks = sk[first], vs = sv[first];
  __nv_fp8_storage_t* k8 = reinterpret_cast<__nv_fp8_storage_t*>(r.k8) + base + e;
  __nv_fp8_storage_t* v8 = reinterpret_cast<__nv_fp8_storage_t*>(r.v8) + base + e;
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

// The ring entries that can hold a key after the write of position qpos: idx < E until the ring
// has wrapped, all C after. Chunks of kSplit entries past them are empty.
__device__ __forceinline__ int live_chunks(int qpos, int C) { return (min(qpos + 1, C) + kSplit - 1) / kSplit; }

__device__ __forceinline__ int row_position(const RingArgs& r, int b) {
  return r.row_pos ? r.row_pos[b] : r.pos[r.slot[b]];
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

// Warp 0 of a split-K block, after every warp put its (m, l, acc[n]) into sm, sl, sacc (m = -inf
// when it saw no visible key; the caller's barrier published them): merges them and writes part
// `part` of row b, head h as (m, l, acc[n]) for attention_combine_kernel.
template <int N>
__device__ __forceinline__ void write_block_part(const float* sm, const float* sl, const float (*sacc)[N], float* work,
                                                 int64_t row_head, int parts, int part, int lane) {
  float M = -INFINITY;
#pragma unroll
  for (int w = 0; w < kAttnWarps; ++w) M = fmaxf(M, sm[w]);
  float L = 0.f, f[kAttnWarps];
#pragma unroll
  for (int w = 0; w < kAttnWarps; ++w) {
    f[w] = sm[w] == -INFINITY ? 0.f : expf(sm[w] - M);
    L += sl[w] * f[w];
  }
  float* wp = work + (row_head * parts + part) * (2 + N);
  if (lane == 0) {
    wp[0] = M;
    wp[1] = L;
  }
  for (int d = lane; d < N; d += 32) {
    float o = 0.f;
#pragma unroll
    for (int w = 0; w < kAttnWarps; ++w) o += sacc[w][d] * f[w];
    wp[2 + d] = o;
  }
}

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
  const int64_t cache0 = static_cast<int64_t>(slot) * r.C * D + h * r.hd + dg * DL;
  const KT* kb = (kFp8 ? reinterpret_cast<const KT*>(r.k8) : reinterpret_cast<const KT*>(r.k)) + cache0;
  const KT* vb = (kFp8 ? reinterpret_cast<const KT*>(r.v8) : reinterpret_cast<const KT*>(r.v)) + cache0;
  const int64_t s0 = (static_cast<int64_t>(slot) * r.H + h) * r.C;
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
        kw[u].load(kb + static_cast<int64_t>(idx) * D);
        vw[u].load(vb + static_cast<int64_t>(idx) * D);
        if constexpr (kFp8) {
          ksc[u] = r.k_scale[s0 + idx];
          vsc[u] = r.v_scale[s0 + idx];
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
      if constexpr (kFp8) sc[u] *= ksc[u] * k2p56;
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
      if constexpr (kFp8) p *= vsc[u] * k2p64;
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

// The fp8 cache's attention on tensor cores (hd 128; grid and output as attention_split_kernel).
// The scalar kernel above is bound with an fp8 cache by what it keeps in flight (a warp's 16 keys
// are half the bytes of bf16's) and by instructions (it widens every byte and spends a fused
// multiply-add on it). Here:
// - Each warp streams its chunks (16 keys: 2 KiB of keys, 2 KiB of values, their scales) through a
//   ring of kFp8Stages stages in shared memory by cp.async, kFp8Stages - 1 chunks ahead of the one
//   it computes. Keys that are not visible are zero-filled (0 x NaN would spoil a sum).
// - q . k: the 16 keys are the rows of mma.sync m16n8k16 tiles (half operands, fp32 accumulators;
//   one conversion widens an e4m3 pair to a half pair), q is column 0 of B.
// - p . v: the values are A with dims as rows and keys as columns (two byte permutes gather a pair
//   of keys' values of one dim), p is column 0 of B.
// Columns 1..7 of B are zero; only the lanes with t = lane % 4 == 0 hold real results.
// Shared memory rows are 128 bytes with their 16-byte pieces swizzled (piece ^ 4 (row & 1) for
// keys, piece ^ (row & 6) for values) so that the fragment loads hit distinct banks.
//
// Ranges: q enters as half scaled by a power of two (its largest magnitude at 2^13..2^14; bf16 ->
// half is then exact), undone with the key scale in fp32. p enters as half: each key's value scale
// is folded into its weight as a bias on the score, p_k = 2^(s_k + log2 vscale_k - m) with m the
// running maximum of those biased scores, so every weight is at most 1 and the largest is 1; the
// sum l = sum 2^(s_k - m) stays fp32 (below 2^100: the bias is clamped at -100, which overstates
// only keys whose value scale is below 2^-100, values of at most 448 x 2^-100). Scores run in log2
// units; m leaves in natural units.
constexpr int kFp8Hd = 128;
constexpr int kFp8StageBytes = 2 * 16 * kFp8Hd + 2 * 16 * 4 + 16;  // keys, values, scales, mask
template <int S>
constexpr size_t fp8_attention_smem() {
  return static_cast<size_t>(S) * kAttnWarps * kFp8StageBytes;
}
// ring_visible with E % C given (Em): no division per call.
__device__ __forceinline__ bool ring_visible_em(int idx, int E, int Em, int C, int q, int context) {
  if (idx >= E) return false;
  const int delta = idx - Em;
  const int label = delta <= 0 ? E + delta : E + delta - C;
  return label >= 0 && q - label >= 0 && (context <= 0 || q - label < context);
}

// lg2.approx.ftz: log2 x (a subnormal x counts as 0: -inf, which the caller clamps).
__device__ __forceinline__ float fast_log2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// ex2.approx.ftz: 2^x, subnormal results flushed to zero (a weight below 2^-126 adds nothing here).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// LEAN (shipped; v0.18's kernel without it stays as attention policy 4): fewer instructions a chunk. The p . v
// accumulators keep all four registers of C (columns 1..7 stay zero) instead of two rebuilt per
// MMA; they and l are rescaled only when the running maximum grows (uniform over the warp); 2^x
// is ex2.approx.ftz and log2 lg2.approx.ftz; E % C and the stage index are not recomputed per
// chunk; the copies take 32-bit offsets from the chunk's first key; q . k runs as two
// chains (dims 0..63 and 64..127) summed at the end.
template <int S, bool LEAN = false>
__global__ void __launch_bounds__(kAttnWarps * 32) attention_fp8_mma_kernel(const __nv_bfloat16* q, RingArgs r,
                                                                             int parts, float* work) {
  pdl_trigger();
  pdl_wait();
  constexpr int HD = kFp8Hd;
  constexpr int KS = HD / 16;  // k-steps of q . k, and 16-dim tiles of p . v
  constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;
  extern __shared__ __align__(16) unsigned char fp8_smem[];
  const int h = blockIdx.x, part = blockIdx.y, b = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int D = r.H * HD;
  const int slot = r.slot[b];
  const int qpos = row_position(r, b), E = qpos + 1;
  // Lane (g, t) takes bytes 64 c + 16 t .. + 15 (c = 0, 1) of key rows g and g + 8: k-step j's
  // columns 2t, 2t+1, 2t+8, 2t+9 are dims 64 (j / 4) + 16 t + 4 (j % 4) + 0..3. q's column 0
  // (lanes g == 0) takes the same dims.
  uint32_t bq[KS][2];
  float qmul;
  {
    const __nv_bfloat16* qp = q + static_cast<int64_t>(b) * D + h * HD + 16 * t;
    float qv[KS][4], amax = 0.f;
#pragma unroll
    for (int j = 0; j < KS; ++j) {
      const uint2 u = *reinterpret_cast<const uint2*>(qp + 64 * (j / 4) + 4 * (j % 4));
      const float2 x = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
      const float2 y = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
      qv[j][0] = x.x;
      qv[j][1] = x.y;
      qv[j][2] = y.x;
      qv[j][3] = y.y;
#pragma unroll
      for (int c = 0; c < 4; ++c) amax = fmaxf(amax, fabsf(qv[j][c]));
    }
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    int e = 0;
    (void)frexpf(amax, &e);  // amax = f 2^e, f in [0.5, 1); 0 -> e = 0
    const int sh = max(-126, min(126, 14 - e));
    const float qs = ldexpf(1.f, sh);
    qmul = ldexpf(1.f, -sh) * rsqrtf(static_cast<float>(HD)) * kLog2e;
#pragma unroll
    for (int j = 0; j < KS; ++j) {
      bq[j][0] = g == 0 ? pack_half2(qv[j][0] * qs, qv[j][1] * qs) : 0u;
      bq[j][1] = g == 0 ? pack_half2(qv[j][2] * qs, qv[j][3] * qs) : 0u;
    }
  }
  float m = -INFINITY, l = 0.f;  // m: the running maximum of s + log2(value scale), log2 units
  // Column 0 of tile i's C: dims 16 g + 2i and + 1 on the lanes t == 0 (columns 1..7 of C are zero:
  // they are given fresh zeros per mma instead of living in registers).
  float o[KS][2];
#pragma unroll
  for (int i = 0; i < KS; ++i) o[i][0] = o[i][1] = 0.f;
  float o4[KS][4];  // LEAN: the whole C of tile i ([1] and [3] stay zero)
#pragma unroll
  for (int i = 0; i < KS; ++i) o4[i][0] = o4[i][1] = o4[i][2] = o4[i][3] = 0.f;
  const int64_t cache0 = static_cast<int64_t>(slot) * r.C * D + h * HD;
  const uint8_t* kb = reinterpret_cast<const uint8_t*>(r.k8) + cache0;
  const uint8_t* vb = reinterpret_cast<const uint8_t*>(r.v8) + cache0;
  // A head's scales are contiguous over the positions: a warp's 16 keys take 64 bytes of each.
  const float* ksb = r.k_scale + (static_cast<int64_t>(slot) * r.H + h) * r.C;
  const float* vsb = r.v_scale + (static_cast<int64_t>(slot) * r.H + h) * r.C;
  const int chunks = live_chunks(qpos, r.C);
  const int mine = part < chunks ? (chunks - part + parts - 1) / parts : 0;  // this block's chunks
  unsigned char* ring = fp8_smem + static_cast<size_t>(warp) * S * kFp8StageBytes;
  // Chunk n of this block (ring stage n % S): keys part + n parts's 16 of this warp.
  const int Em = E % r.C;  // LEAN: ring_visible's E % C, once
  auto issue = [&](int n, int stage) {
    if (n < mine) {
      unsigned char* st = ring + stage * kFp8StageBytes;
      const int base = (part + n * parts) * kSplit + warp * 16;
      const int my = base + (lane & 15);
      const bool seen = LEAN ? ring_visible_em(my, E, Em, r.C, qpos, r.context)
                             : ring_visible(my, E, r.C, qpos, r.context);
      const unsigned vis = __ballot_sync(0xffffffffu, my < r.C && seen) & 0xffffu;
      if constexpr (LEAN) {
        // The chunk's first key once in 64 bits; the rows as 32-bit offsets from it. A warp whose
        // keys all lie past the ring (no row visible) copies nothing: its source stays the slot's
        // first key, inside the cache (masked rows read 0 bytes from the warp's first key).
        const uint8_t* kc = kb + static_cast<int64_t>(base < r.C ? base : 0) * D;
        const uint8_t* vc = vb + static_cast<int64_t>(base < r.C ? base : 0) * D;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int pc = lane + 32 * i, row = pc >> 3, col = pc & 7;
          const bool ok = (vis >> row) & 1u;
          const uint32_t off = ok ? static_cast<uint32_t>(row * D + col * 16) : 0u;
          cp_async16(st + row * HD + ((col ^ (4 * (row & 1))) * 16), kc + off, ok);
          cp_async16(st + 16 * HD + row * HD + ((col ^ (row & 6)) * 16), vc + off, ok);
        }
      } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) {  // 128 pieces of 16 bytes per tensor: key p / 8, piece p % 8
        const int pc = lane + 32 * i, row = pc >> 3, col = pc & 7;
        const bool ok = (vis >> row) & 1u;
        const int64_t src = static_cast<int64_t>(ok ? base + row : 0) * D + col * 16;
        cp_async16(st + row * HD + ((col ^ (4 * (row & 1))) * 16), kb + src, ok);
        cp_async16(st + 16 * HD + row * HD + ((col ^ (row & 6)) * 16), vb + src, ok);
      }
      }
      const int row = lane & 15;
      const bool ok = (vis >> row) & 1u;
      const int64_t si = ok ? base + row : 0;
      float* sc = reinterpret_cast<float*>(st + 32 * HD);
      cp_async4(sc + (lane >> 4) * 16 + row, (lane < 16 ? ksb : vsb) + si, ok);
      if (lane == 0) *reinterpret_cast<unsigned*>(st + 32 * HD + 128) = vis;
    }
    cp_async_commit();  // an empty group past the end keeps the wait counts uniform
  };
#pragma unroll
  for (int n = 0; n < S - 1; ++n) issue(n, n);
  int cs = 0;  // LEAN: the stage of chunk n (n % S), kept as a counter
  for (int n = 0; n < mine; ++n) {
    if constexpr (LEAN) {
      issue(n + S - 1, cs == 0 ? S - 1 : cs - 1);  // the stage chunk n - 1 used
    } else {
      issue(n + S - 1, (n + S - 1) % S);
    }
    cp_async_wait<S - 1>();
    __syncwarp();
    const unsigned char* st = ring + (LEAN ? cs : n % S) * kFp8StageBytes;
    if constexpr (LEAN) cs = cs == S - 1 ? 0 : cs + 1;
    const float* ksc = reinterpret_cast<const float*>(st + 32 * HD);
    const float* vsc = ksc + 16;
    const unsigned vis = *reinterpret_cast<const unsigned*>(st + 32 * HD + 128);
    float c[4] = {0.f, 0.f, 0.f, 0.f};
    float c2[4] = {0.f, 0.f, 0.f, 0.f};  // LEAN: dims 64..127's chain
#pragma unroll
    for (int half = 0; half < 2; ++half) {  // dims 0..63, then 64..127
      const int pc = 4 * half + t;
      const uint4 k0 = *reinterpret_cast<const uint4*>(st + g * HD + ((pc ^ (4 * (g & 1))) * 16));
      const uint4 k1 = *reinterpret_cast<const uint4*>(st + (g + 8) * HD + ((pc ^ (4 * (g & 1))) * 16));
      const uint32_t w0[4] = {k0.x, k0.y, k0.z, k0.w}, w1[4] = {k1.x, k1.y, k1.z, k1.w};
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        const int j = 4 * half + jj;
        const uint32_t a[4] = {e4m3x2_to_half2(w0[jj]), e4m3x2_to_half2(w1[jj]), e4m3x2_to_half2(w0[jj] >> 16),
                               e4m3x2_to_half2(w1[jj] >> 16)};
        mma_m16n8k16(LEAN && half == 1 ? c2 : c, a, bq[j][0], bq[j][1], __half{});
      }
    }
    if constexpr (LEAN) {
      c[0] += c2[0];
      c[2] += c2[2];
    }
    // Column 0 of C (lane 4g) holds the scores of keys g and g + 8.
    const bool kok[2] = {((vis >> g) & 1u) != 0, ((vis >> (g + 8)) & 1u) != 0};
    float s[2] = {__shfl_sync(0xffffffffu, c[0], lane & ~3), __shfl_sync(0xffffffffu, c[2], lane & ~3)};
    float bs[2];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      s[u] = kok[u] ? s[u] * ksc[g + 8 * u] * qmul : -INFINITY;
      const float lv = LEAN ? fast_log2(vsc[g + 8 * u]) : __log2f(vsc[g + 8 * u]);
      bs[u] = kok[u] ? s[u] + fmaxf(lv, -100.f) : -INFINITY;
    }
    float cm = fmaxf(bs[0], bs[1]);
    cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 4));
    cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 8));
    cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, 16));
    const float mn = fmaxf(m, cm);
    if (mn != -INFINITY) {  // else nothing visible yet (uniform over the warp)
      float corr = 1.f, w0, w1;
      if constexpr (LEAN) {
        if (mn > m) {  // uniform over the warp: the maximum grew, rescale what was summed
          corr = fast_exp2(m - mn);
          l *= corr;
#pragma unroll
          for (int i = 0; i < KS; ++i) {
            o4[i][0] *= corr;
            o4[i][2] *= corr;
          }
          m = mn;
        }
        l += fast_exp2(s[0] - mn) + fast_exp2(s[1] - mn);
        w0 = fast_exp2(bs[0] - mn);
        w1 = fast_exp2(bs[1] - mn);
      } else {
        corr = exp2f(m - mn);
        m = mn;
        l = l * corr + exp2f(s[0] - mn) + exp2f(s[1] - mn);
        w0 = exp2f(bs[0] - mn);
        w1 = exp2f(bs[1] - mn);
      }
      // Column 0 of B (lanes g == 0): the weights of keys 2t, 2t + 1 and 2t + 8, 2t + 9.
      const float x0 = __shfl_sync(0xffffffffu, w0, 8 * t), x1 = __shfl_sync(0xffffffffu, w0, 8 * t + 4);
      const float x2 = __shfl_sync(0xffffffffu, w1, 8 * t), x3 = __shfl_sync(0xffffffffu, w1, 8 * t + 4);
      const uint32_t pb0 = g == 0 ? pack_half2(x0, x1) : 0u, pb1 = g == 0 ? pack_half2(x2, x3) : 0u;
      // Value rows 2t, 2t + 1, 2t + 8, 2t + 9, bytes 16 g .. + 15 (dims 16 g + 2i and + 1 are bytes
      // 2 (i % 2) and + 1 of word i / 2).
      const unsigned char* vs = st + 16 * HD;
      const int pv = (g ^ (2 * t)) * 16;  // (row & 6) is 2t for all four rows
      const uint4 v0 = *reinterpret_cast<const uint4*>(vs + (2 * t) * HD + pv);
      const uint4 v1 = *reinterpret_cast<const uint4*>(vs + (2 * t + 1) * HD + pv);
      const uint4 v8 = *reinterpret_cast<const uint4*>(vs + (2 * t + 8) * HD + pv);
      const uint4 v9 = *reinterpret_cast<const uint4*>(vs + (2 * t + 9) * HD + pv);
      const uint32_t a0[4] = {v0.x, v0.y, v0.z, v0.w}, a1[4] = {v1.x, v1.y, v1.z, v1.w};
      const uint32_t a8[4] = {v8.x, v8.y, v8.z, v8.w}, a9[4] = {v9.x, v9.y, v9.z, v9.w};
#pragma unroll
      for (int i = 0; i < KS; ++i) {
        const uint32_t sel = (i & 1) ? 0x7362u : 0x5140u;
        const uint32_t p01 = __byte_perm(a0[i / 2], a1[i / 2], sel);
        const uint32_t p89 = __byte_perm(a8[i / 2], a9[i / 2], sel);
        const uint32_t a[4] = {e4m3x2_to_half2(p01), e4m3x2_to_half2(p01 >> 16), e4m3x2_to_half2(p89),
                               e4m3x2_to_half2(p89 >> 16)};
        if constexpr (LEAN) {
          mma_m16n8k16(o4[i], a, pb0, pb1, __half{});
        } else {
          float cc[4] = {o[i][0] * corr, 0.f, o[i][1] * corr, 0.f};
          mma_m16n8k16(cc, a, pb0, pb1, __half{});
          o[i][0] = cc[0];
          o[i][1] = cc[2];
        }
      }
    }
    __syncwarp();  // every lane is done with this stage before the next issue overwrites it
  }
  cp_async_wait<0>();
  if (part >= chunks) return;  // uniform over the block: nothing to write, the combine skips it
  // l: each lane summed its keys g and g + 8 (the 4 lanes of a g alike); sum over g.
  l += __shfl_xor_sync(0xffffffffu, l, 4);
  l += __shfl_xor_sync(0xffffffffu, l, 8);
  l += __shfl_xor_sync(0xffffffffu, l, 16);
  __shared__ float sm[kAttnWarps], sl[kAttnWarps], sacc[kAttnWarps][HD];
  if (lane == 0) {
    sm[warp] = m * kLn2;  // -inf stays -inf
    sl[warp] = l;
  }
  if (t == 0) {
#pragma unroll
    for (int i = 0; i < KS; ++i) {
      sacc[warp][16 * g + 2 * i] = LEAN ? o4[i][0] : o[i][0];
      sacc[warp][16 * g + 2 * i + 1] = LEAN ? o4[i][2] : o[i][1];
    }
  }
  __syncthreads();
  if (warp == 0) write_block_part<HD>(sm, sl, sacc, work, static_cast<int64_t>(b) * r.H + h, parts, part, lane);
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

constexpr int kFp8Stages = 3;  // and 4 for long streams (fp8_plan)

// Blocks of the fp8 tensor-core kernel with S stages that the current device holds at once, its
// dynamic shared memory allowed first (once per device); 0 when it does not fit the device (the
// launch then refuses, see fp8_blocks_or_throw) or no device is current.
template <int S, bool LEAN = false>
int fp8_resident_blocks() {
  static std::mutex mu;
  static std::map<int, int> by_device;
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 0;
  std::lock_guard<std::mutex> lk(mu);
  auto it = by_device.find(dev);
  if (it != by_device.end()) return it->second;
  int sms = 0, per = 0;
  if (cudaFuncSetAttribute(attention_fp8_mma_kernel<S, LEAN>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(fp8_attention_smem<S>())) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, attention_fp8_mma_kernel<S, LEAN>, kAttnWarps * 32,
                                                    fp8_attention_smem<S>()) != cudaSuccess ||
      per < 1) {
    (void)cudaGetLastError();  // the failed query is not a later kernel's error
    return by_device[dev] = 0;
  }
  return by_device[dev] = per * sms;
}
template <int S, bool LEAN = false>
int fp8_blocks_or_throw() {
  const int cap = fp8_resident_blocks<S, LEAN>();
  if (cap <= 0)
    throw std::runtime_error("attention: the fp8 cache's kernel (" + std::to_string(fp8_attention_smem<S>()) +
                             " bytes of shared memory a block) does not fit this device");
  return cap;
}

bool fp8_tensor_core(const RingArgs& r) { return r.k8 != nullptr && r.hd == kFp8Hd && g_attention_policy != 2; }
}  // namespace

void attention_set_policy(int policy) {
  g_attention_policy = policy;
  // v0.18's kernel's shared memory is allowed here, on the current device, before a graph captures it.
  if (policy == 4) (void)fp8_resident_blocks<kFp8Stages>();
}

void attention_init() {
  (void)fp8_resident_blocks<kFp8Stages, true>();
  (void)fp8_resident_blocks<4, true>();
}

namespace {
// The fewest parts that minimise the fp8 kernel's estimated time with `cap` resident blocks: its
// blocks each stream their chunks, so the step takes about (waves of resident blocks) x (chunks
// per block + a block's fixed cost: filling its pipeline, q, the merge; about 3 chunks' time).
int fp8_parts(int splits, int64_t rows_heads, int cap) {
  constexpr int kBlockCostChunks = 3;
  int best = 1;
  int64_t best_cost = -1;
  for (int p = 1; p <= splits; ++p) {
    const int64_t blocks = rows_heads * p;
    const int64_t cost = ((blocks + cap - 1) / cap) * ((splits + p - 1) / p + kBlockCostChunks);
    if (best_cost < 0 || cost < best_cost) {
      best = p;
      best_cost = cost;
    }
  }
  return best;
}

// The fp8 tensor-core kernel a launch takes (its stages, its parts). Shipped (policy 0): the lean
// kernel with 4 stages from kDeepRows rows, else 3. The plan cannot see how many chunks are live
// (the positions are on the device, and a graph serves every context length), and 4 stages hold
// fewer blocks an SM: over a long context their extra bytes in flight pay off, but over a short one
// the 4-stage plan's grid of small blocks can take more waves (v0.27 on an H100: 16 rows over 300
// keys 38% slower with 4 stages, 64 rows as fast over 300 keys and 2% faster over 3000; rows in
// between were not measured, so they keep 3). Policies (benchmarks and tests): 3 and 5, the lean
// kernel with 3 and 4 stages (up to 4 rows, 3: a block a chunk); 4, v0.18's kernel (3 stages).
struct Fp8Plan {
  int stages;
  bool lean;
  int parts;
};
Fp8Plan fp8_plan(int B, int H, int C) {
  constexpr int kDeepRows = 64;
  const int splits = (C + kSplit - 1) / kSplit;
  const int64_t rh = static_cast<int64_t>(H) * B;
  // The shared memory of each kernel is allowed once per device in fp8_blocks_or_throw (outside
  // stream capture when CudaLm readied them first, see attention_init); a device it does not fit is
  // refused.
  if (g_attention_policy == 4) {
    const int cap = fp8_blocks_or_throw<kFp8Stages>();
    return {kFp8Stages, false, B <= 4 ? splits : fp8_parts(splits, rh, cap)};
  }
  const int cap3 = fp8_blocks_or_throw<kFp8Stages, true>();
  // Up to 4 rows (kMaxGemvBatch: the rows whose GEMVs keep one row's order) or with policy 1: a
  // block per chunk.
  if (B <= 4 || g_attention_policy == 1) return {kFp8Stages, true, splits};
  if (g_attention_policy == 3 || (g_attention_policy != 5 && B < kDeepRows))
    return {kFp8Stages, true, fp8_parts(splits, rh, cap3)};
  return {4, true, fp8_parts(splits, rh, fp8_blocks_or_throw<4, true>())};
}
}  // namespace

int attention_parts(int B, int H, int C, bool fp8) {
  const int splits = (C + kSplit - 1) / kSplit;
  if (fp8) return fp8_plan(B, H, C).parts;
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
  const bool tc = fp8_tensor_core(r);
  const Fp8Plan plan = tc ? fp8_plan(B, r.H, r.C) : Fp8Plan{0, false, attention_parts(B, r.H, r.C, false)};
  const int parts = plan.parts;
  auto launch = [&](auto dl) {
    constexpr int DL = decltype(dl)::value;
    if (tc) {
      const dim3 grid(r.H, parts, B), block(kAttnWarps * 32);
      if (!plan.lean)
        pdl_launch(attention_fp8_mma_kernel<kFp8Stages>, grid, block, fp8_attention_smem<kFp8Stages>(), s, q, r, parts,
                   work);
      else if (plan.stages == 4)
        pdl_launch(attention_fp8_mma_kernel<4, true>, grid, block, fp8_attention_smem<4>(), s, q, r, parts, work);
      else
        pdl_launch(attention_fp8_mma_kernel<kFp8Stages, true>, grid, block, fp8_attention_smem<kFp8Stages>(), s, q, r,
                   parts, work);
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
