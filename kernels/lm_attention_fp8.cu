// The fp8 cache's temporal attention on tensor cores (lm_attention_impl.cuh): the kernel, how many
// stages and parts a launch takes, and the launch. lm_attention.cu's ring_attention calls it and
// merges its parts.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>

#include "common.cuh"
#include "lm_attention_impl.cuh"

namespace ppx::kern::attn_fp8 {
namespace {
using namespace attn_impl;

// The fp8 cache's attention on tensor cores (hd 128; grid and output as attention_split_kernel).
// The scalar kernel (attention_split_kernel, lm_attention.cu) is bound with an fp8 cache by what it keeps in flight (a warp's 16 keys
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
// is folded into its weight as a bias on the score, p_k = 2^(s_k + log2 vscale_k - m) (log2 vscale_k
// is its stored exponent, exact) with m the running maximum of those biased scores, so every weight
// is at most 1 and the largest is 1; the
// sum l = sum 2^(s_k - m) stays fp32 (below 2^100: the bias is clamped at -100, which overstates
// only keys whose value scale is below 2^-100, values of at most 448 x 2^-100). Scores run in log2
// units; m leaves in natural units.
constexpr int kFp8Hd = 128;
// A stage: keys, values, scale bytes, mask, padded to whole 128-byte lines. Every stage starts on
// a 128-byte line of shared memory (the ring's base is aligned in the kernel, below). With
// 4144-byte stages after the static shared memory's 2080 bytes, all but 2 of a block's 12 or 16
// stages began inside a line, so each quarter warp's 128-byte key or value row straddled two lines
// and took two shared-memory wavefronts (docs/PERF.md v0.37, an H200: 6.7 wavefronts a copy
// instruction where 4 would do, and the L2 asked for 73.7M sectors for the 49.5M in the cache,
// busy at 93% with the DRAM at 83%). With whole-line stages (v0.38, an H100) the 64-row
// full-context --kv-fp8 step took 0.84 ms less (25.55 -> 24.70 ms p50).
constexpr int kFp8StageBytes = (2 * 16 * kFp8Hd + 2 * 16 + 16 + 127) / 128 * 128;
constexpr int kSmemAlign = 128;
static_assert(kFp8StageBytes % kSmemAlign == 0, "a stage is whole 128-byte lines");
template <int S>
constexpr size_t fp8_attention_smem() {
  return static_cast<size_t>(S) * kAttnWarps * kFp8StageBytes + kSmemAlign;  // + the base's alignment
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
// is ex2.approx.ftz; E % C and the stage index are not recomputed per
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
  // A key row's stride: D in the [slots, C, H * hd] layout, HD in the by-head [slots, H, C, hd].
  const int rs = r.fp8_by_head ? HD : D;
  const int64_t cache0 = r.fp8_by_head ? (static_cast<int64_t>(slot) * r.H + h) * r.C * HD
                                       : static_cast<int64_t>(slot) * r.C * D + h * HD;
  const uint8_t* kb = reinterpret_cast<const uint8_t*>(r.k8) + cache0;
  const uint8_t* vb = reinterpret_cast<const uint8_t*>(r.v8) + cache0;
  // A head's scales are contiguous over the positions: a warp's 16 keys take one aligned 16-byte
  // piece of each (fp8_scale_pitch).
  const uint8_t* ksb = r.k_scale + (static_cast<int64_t>(slot) * r.H + h) * fp8_scale_pitch(r.C);
  const uint8_t* vsb = r.v_scale + (static_cast<int64_t>(slot) * r.H + h) * fp8_scale_pitch(r.C);
  const int chunks = live_chunks(qpos, r.C);
  const int mine = part < chunks ? (chunks - part + parts - 1) / parts : 0;  // this block's chunks
  // The dynamic shared memory follows the static (sm, sl, sacc below): its base is aligned here.
  unsigned char* const smem0 =
      fp8_smem + ((kSmemAlign - (static_cast<unsigned>(__cvta_generic_to_shared(fp8_smem)) & (kSmemAlign - 1))) &
                  (kSmemAlign - 1));
  unsigned char* ring = smem0 + static_cast<size_t>(warp) * S * kFp8StageBytes;
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
        const uint8_t* kc = kb + static_cast<int64_t>(base < r.C ? base : 0) * rs;
        const uint8_t* vc = vb + static_cast<int64_t>(base < r.C ? base : 0) * rs;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int pc = lane + 32 * i, row = pc >> 3, col = pc & 7;
          const bool ok = (vis >> row) & 1u;
          const uint32_t off = ok ? static_cast<uint32_t>(row * rs + col * 16) : 0u;
          cp_async16(st + row * HD + ((col ^ (4 * (row & 1))) * 16), kc + off, ok);
          cp_async16(st + 16 * HD + row * HD + ((col ^ (row & 6)) * 16), vc + off, ok);
        }
      } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) {  // 128 pieces of 16 bytes per tensor: key p / 8, piece p % 8
        const int pc = lane + 32 * i, row = pc >> 3, col = pc & 7;
        const bool ok = (vis >> row) & 1u;
        const int64_t src = static_cast<int64_t>(ok ? base + row : 0) * rs + col * 16;
        cp_async16(st + row * HD + ((col ^ (4 * (row & 1))) * 16), kb + src, ok);
        cp_async16(st + 16 * HD + row * HD + ((col ^ (row & 6)) * 16), vb + src, ok);
      }
      }
      // Lanes 0 and 1: the chunk's 16 key and 16 value scale bytes (base is a multiple of 16, and
      // below C when any key is visible, so the piece lies inside the padded row). The bytes of
      // keys that are not visible are never read as scales of visible ones.
      if (lane < 2) cp_async16(st + 32 * HD + 16 * lane, (lane == 0 ? ksb : vsb) + (vis ? base : 0), vis != 0);
      if (lane == 0) *reinterpret_cast<unsigned*>(st + 32 * HD + 32) = vis;
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
    const uint8_t* ksc = st + 32 * HD;
    const uint8_t* vsc = ksc + 16;
    const unsigned vis = *reinterpret_cast<const unsigned*>(st + 32 * HD + 32);
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
      s[u] = kok[u] ? s[u] * fp8_scale_value(ksc[g + 8 * u]) * qmul : -INFINITY;
      const float lv = static_cast<float>(static_cast<int>(vsc[g + 8 * u]) - 127);  // log2 of the value scale, exact
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

constexpr int kFp8Stages = 3;  // and 4 for long streams (plan)

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

}  // namespace

bool applies(const RingArgs& r, int policy) { return r.k8 != nullptr && r.hd == kFp8Hd && policy != 2; }

// The fp8 tensor-core kernel a launch takes (its stages, its parts). Shipped (policy 0): the lean
// kernel with 4 stages from kDeepRows rows, else 3. The plan cannot see how many chunks are live
// (the positions are on the device, and a graph serves every context length), and 4 stages hold
// fewer blocks an SM: over a long context their extra bytes in flight pay off, but over a short one
// the 4-stage plan's grid of small blocks can take more waves (v0.27 on an H100: 16 rows over 300
// keys 38% slower with 4 stages, 64 rows as fast over 300 keys and 2% faster over 3000; rows in
// between were not measured, so they keep 3). Policies (benchmarks and tests): 3 and 5, the lean
// kernel with 3 and 4 stages (up to 4 rows, 3: a block a chunk); 4, v0.18's kernel (3 stages).
static int splits_of(int C) { return (C + kSplit - 1) / kSplit; }

static Plan plan_of(int B, int H, int C, int policy) {
  constexpr int kDeepRows = 64;
  const int splits = splits_of(C);
  const int64_t rh = static_cast<int64_t>(H) * B;
  // The shared memory of each kernel is allowed once per device in fp8_blocks_or_throw (outside
  // stream capture when CudaLm readied them first, see attention_init); a device it does not fit is
  // refused.
  if (policy == 4) {
    const int cap = fp8_blocks_or_throw<kFp8Stages>();
    return {kFp8Stages, false, B <= 4 ? splits : fp8_parts(splits, rh, cap)};
  }
  const int cap3 = fp8_blocks_or_throw<kFp8Stages, true>();
  // Up to 4 rows (kMaxGemvBatch: the rows whose GEMVs keep one row's order) or with policy 1: a
  // block per chunk.
  if (B <= 4 || policy == 1) return {kFp8Stages, true, splits};
  if (policy == 3 || (policy != 5 && B < kDeepRows))
    return {kFp8Stages, true, fp8_parts(splits, rh, cap3)};
  return {4, true, fp8_parts(splits, rh, fp8_blocks_or_throw<4, true>())};
}

Plan plan(int B, int H, int C, int policy, int forced_parts) {
  Plan p = plan_of(B, H, C, policy);
  if (forced_parts > 0 && B > 4 && policy != 1) p.parts = std::min(forced_parts, splits_of(C));
  return p;
}

void launch(const __nv_bfloat16* q, const RingArgs& r, int B, const Plan& p, float* work, cudaStream_t s) {
  const dim3 grid(r.H, p.parts, B), block(kAttnWarps * 32);
  if (!p.lean)
    pdl_launch(attention_fp8_mma_kernel<kFp8Stages>, grid, block, fp8_attention_smem<kFp8Stages>(), s, q, r, p.parts,
               work);
  else if (p.stages == 4)
    pdl_launch(attention_fp8_mma_kernel<4, true>, grid, block, fp8_attention_smem<4>(), s, q, r, p.parts, work);
  else
    pdl_launch(attention_fp8_mma_kernel<kFp8Stages, true>, grid, block, fp8_attention_smem<kFp8Stages>(), s, q, r,
               p.parts, work);
}

void init() {
  (void)fp8_resident_blocks<kFp8Stages, true>();
  (void)fp8_resident_blocks<4, true>();
}

void ready_policy(int policy) {
  // v0.18's kernel's shared memory is allowed here, on the current device, before a graph captures it.
  if (policy == 4) (void)fp8_resident_blocks<kFp8Stages>();
}

}  // namespace ppx::kern::attn_fp8
