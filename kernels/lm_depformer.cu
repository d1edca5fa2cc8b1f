// The depformer step as one persistent kernel. At batch 1 a step's 25 GEMVs read 2-12 MB each
// (158 MB in all at full size), which the H200 streams in 0.5-3 us, while each dependent kernel
// boundary of the per-op path costs about 5-7 us (docs/PERF.md). So every phase runs inside one
// cooperative launch, all blocks resident, separated by a grid-wide barrier on a counter in global
// memory instead of a kernel boundary.
//
// Weight stream: each phase's GEMV gives every block one contiguous range of rows (two for the
// gate/up pair), and the weights do not depend on the data, so one thread per block copies its
// slices of the coming phases into a ring buffer in shared memory with bulk asynchronous copies
// (cp.async.bulk, completion on an mbarrier per phase), as far ahead as the ring has room. The
// copies run through the barrier waits and the input staging; a phase's GEMV then reads its
// weights from shared memory, on the tensor cores (each warp a range of K, partial sums meeting
// in shared memory in a fixed order: deterministic). Every block stages the phase's input itself
// (the RMSNorm of the residual stream, or the attention of all heads, a few KB): cheaper than
// another barrier. The residual rows a block owns are the same in every DD-row GEMV, so the block
// keeps them in shared memory between phases.
#include <algorithm>
#include <stdexcept>

#include "common.cuh"
#include "lm_depformer.cuh"

namespace ppx::kern {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kSlots = 6;  // phases in flight in the weight ring (one mbarrier each)
constexpr int kMaxPhases = dep_phase_count(kDepMaxLayers);
constexpr int kStageChunks = 2;  // RMSNorm staging holds K <= kThreads * 8 * kStageChunks in registers

__host__ __device__ constexpr size_t align16(size_t n) { return (n + 15) / 16 * 16; }

// Every block adds 1 except block 0, which adds 2^31 - (G - 1): the G arrivals add exactly 2^31,
// so bit 31 flips when the last block arrives and the low bits return to zero, ready for the next
// barrier and the next launch without a reset. A block's own arrival leaves bit 31 as it found it,
// whatever the order. Needs every block resident (cooperative launch). The arrival is a release
// (after __syncthreads, it carries the block's writes); the spin reads relaxed and one acquire
// fence follows the flip.
__device__ __forceinline__ void grid_barrier(unsigned* bar) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned add = blockIdx.x == 0 ? 0x80000000u - (gridDim.x - 1) : 1u;
    unsigned old, now;
    asm volatile("atom.add.release.gpu.global.u32 %0, [%1], %2;" : "=r"(old) : "l"(bar), "r"(add) : "memory");
    do {
      asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(now) : "l"(bar) : "memory");
    } while (((now ^ old) & 0x80000000u) == 0);
    asm volatile("fence.acq_rel.gpu;" ::: "memory");
  }
  __syncthreads();
}

// mbarrier and bulk-copy primitives (sm_90+; the plan refuses older devices).
__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(bar)) : "memory");
#endif
}
__device__ __forceinline__ void mbar_init_fence() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}
// Arrives on `bar` expecting `bytes` of bulk copies (0: the phase completes at once).
__device__ __forceinline__ void mbar_arrive_tx(uint64_t* bar, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (bytes > 0) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes)
                 : "memory");
  } else {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
  }
#endif
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
#endif
}
// An L2 policy for data read once (the weights): evicted first, so that the stream of 158 MB per
// step does not push the activations and the K/V ring out of L2.
__device__ __forceinline__ uint64_t l2_evict_first() {
  uint64_t pol = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
#endif
  return pol;
}
// dst (shared) <- src (global), 16-byte aligned, bytes a multiple of 16, completing on `bar`;
// with an L2 cache policy when hint is set.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, unsigned bytes, uint64_t* bar, bool hint,
                                          uint64_t pol) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (hint) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
            smem_u32(dst)),
        "l"(__cvta_generic_to_global(src)), "r"(bytes), "r"(smem_u32(bar)), "l"(pol)
        : "memory");
  } else {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     smem_u32(dst)),
                 "l"(__cvta_generic_to_global(src)), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
  }
#else
  __trap();
#endif
}

// This block's rows of an N-row GEMV: [r0, r0 + nr), contiguous, about N / G of them.
struct Rows {
  int r0, nr;
};

__device__ __forceinline__ Rows rows_of(int rows) {
  Rows r;
  const unsigned G = gridDim.x, b = blockIdx.x, n = static_cast<unsigned>(rows);  // n * G < 2^32
  r.r0 = static_cast<int>(n * b / G);
  r.nr = static_cast<int>(n * (b + 1) / G) - r.r0;
  return r;
}

// Phase p's weights: 4l + {0 qkv, 1 out, 2 gate/up, 3 down}, then the head.
struct PhaseWeights {
  const bf16* w;
  int rows, K;
  bool pairs;  // gate/up: logical row n reads weight rows n and n + rows
};

__device__ __forceinline__ PhaseWeights phase_weights(const DepStepArgs& a, int p) {
  if (p == 4 * a.layers) return {a.w_head, a.card, a.DD, false};
  const DepLayerWeights& L = a.layer[p / 4];
  switch (p % 4) {
    case 0: return {L.qkv, 3 * a.DD, a.DD, false};
    case 1: return {L.out, a.DD, a.DD, false};
    case 2: return {L.gate_up, a.DH, a.DD, true};
    default: return {L.down, a.DD, a.DH, false};
  }
}

// A weight row in the ring is padded by 16 bytes, so that the 8 rows of an ldmatrix tile fall in
// distinct banks.
__host__ __device__ constexpr unsigned ring_row_bytes(int K) { return static_cast<unsigned>(K) * 2u + 16u; }

// Bytes of this block's weight rows of a phase (the pair's second rows after the first), each
// padded.
__device__ __forceinline__ unsigned rows_bytes(const PhaseWeights& pw) {
  const Rows r = rows_of(pw.rows);
  return static_cast<unsigned>(r.nr) * (pw.pairs ? 2u : 1u) * ring_row_bytes(pw.K);
}

// With kv_in_ring, an attention phase's slice also carries the earlier steps' keys and values of
// its layer (static during the launch): K [B, step, DD] then V [B, step, DD], after the rows.
__device__ __forceinline__ unsigned kv_bytes(const DepStepArgs& a, int p) {
  if (!a.kv_in_ring || p % 4 != 1 || p >= 4 * a.layers) return 0;
  return 2u * a.B * a.step * a.DD * 2u;
}

// The weight ring of one block. Only thread 0 issues; phases are issued and consumed in order,
// each placed contiguously (wrapping to offset 0 when the end has no room), at most kSlots ahead.
struct WeightRing {
  unsigned char* buf;
  unsigned cap;
  uint64_t* bar;    // [kSlots]
  unsigned* off;    // [kMaxPhases] shared: where phase p's slice starts
  unsigned* bytes;  // [kMaxPhases] shared: its size
  int issued = 0;   // thread 0 only
  unsigned tail = 0;

  // Thread 0, after every phase before `next` has been consumed by the whole block (the
  // __syncthreads after the reads orders them before the bulk writes into the same bytes).
  __device__ __forceinline__ void issue(const DepStepArgs& a, int next, int P) {
    const uint64_t pol = l2_evict_first();
    while (issued < P && issued < next + kSlots) {
      const PhaseWeights pw = phase_weights(a, issued);
      const unsigned wsz = rows_bytes(pw), kvsz = kv_bytes(a, issued), sz = wsz + kvsz;
      unsigned o = 0;
      if (sz > 0) {
        int h = next;  // oldest live phase with weights
        while (h < issued && bytes[h] == 0) ++h;
        if (h < issued) {
          const unsigned head = off[h];
          if (head < tail) {  // live bytes [head, tail)
            if (tail + sz <= cap) o = tail;
            else if (sz <= head) o = 0;
            else break;
          } else {  // wrapped: live bytes [head, cap) and [0, tail)
            if (tail + sz <= head) o = tail;
            else break;
          }
        }
        tail = o + sz;
      }
      off[issued] = o;
      bytes[issued] = sz;
      uint64_t* mb = bar + issued % kSlots;
      // The transaction count is the bytes copied (the rows without their padding).
      mbar_arrive_tx(mb, wsz / ring_row_bytes(pw.K) * static_cast<unsigned>(pw.K) * 2u + kvsz);
      if (kvsz > 0) {  // ring entries [0, step) of each batch row's slot are contiguous
        const int layer = issued / 4;
        const unsigned n = static_cast<unsigned>(a.step) * a.DD * 2u;
        for (int b = 0; b < a.B; ++b) {
          const int64_t src = layer * a.ring_layer_stride + static_cast<int64_t>(a.slot[b]) * a.ring * a.DD;
          unsigned char* dst = buf + o + wsz + b * n;
          bulk_copy(dst, a.k_ring + src, n, mb, false, pol);
          bulk_copy(dst + a.B * n, a.v_ring + src, n, mb, false, pol);
        }
      }
      if (wsz > 0) {  // one bulk copy per row (rows are contiguous in global memory, padded here)
        const Rows r = rows_of(pw.rows);
        const unsigned rb = ring_row_bytes(pw.K), n = static_cast<unsigned>(pw.K) * 2u;
        for (int q = 0; q < (pw.pairs ? 2 : 1); ++q) {
          const bf16* src = pw.w + (static_cast<int64_t>(r.r0) + q * pw.rows) * pw.K;
          unsigned char* dst = buf + o + static_cast<unsigned>(q * r.nr) * rb;
          for (int i = 0; i < r.nr; ++i)
            bulk_copy(dst + i * rb, src + static_cast<int64_t>(i) * pw.K, n, mb, a.evict_first, pol);
        }
      }
      ++issued;
    }
  }
  // All threads: phase p's slice is in shared memory.
  __device__ const bf16* wait(int p) const {
    mbar_wait(bar + p % kSlots, static_cast<unsigned>(p / kSlots) & 1u);
    return reinterpret_cast<const bf16*>(buf + off[p]);
  }
};

// Activations written by other blocks during this launch are read with ld.global.cg (L2, never a
// stale L1 line); read-only inputs with __ldg.

// Where the dynamic shared memory of a block is cut (host and device agree).
struct SmemLayout {
  size_t part, zown, wbuf;  // byte offsets; the weight ring (wcap bytes) ends the block's memory
};
__host__ __device__ inline SmemLayout smem_layout(int B, int kmax, int part_floats, int own_rows) {
  SmemLayout l;
  l.part = align16(static_cast<size_t>(B) * kmax * sizeof(bf16));
  l.zown = l.part + align16(static_cast<size_t>(part_floats) * sizeof(float));
  l.wbuf = (l.zown + static_cast<size_t>(B) * own_rows * sizeof(bf16) + 127) / 128 * 128;
  return l;
}

// xs[b] = bf16(v * (alpha * rsqrt(mean(v^2) + eps))) with v = load(b, k) (8 bf16 at column k), fp32
// math as lm_gemv's kRmsNorm. alpha is loaded before the reduction so that its latency overlaps.
template <int B, typename Load>
__device__ void stage_rmsnorm(int K, const bf16* alpha, float eps, bf16* xs, float* red, Load load) {
  uint4 g[kStageChunks];
#pragma unroll
  for (int i = 0; i < kStageChunks; ++i) {
    const int k = (threadIdx.x + i * kThreads) * 8;
    if (k < K) g[i] = __ldg(reinterpret_cast<const uint4*>(alpha + k));
  }
  for (int b = 0; b < B; ++b) {
    uint4 v[kStageChunks];
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < kStageChunks; ++i) {
      const int k = (threadIdx.x + i * kThreads) * 8;
      if (k < K) {
        v[i] = load(b, k);
        float f[8];
        bf16x8_to_float(v[i], f);
#pragma unroll
        for (int j = 0; j < 8; ++j) ss += f[j] * f[j];
      }
    }
    ss = block_sum(ss, red);
    const float r = rsqrtf(ss / static_cast<float>(K) + eps);
#pragma unroll
    for (int i = 0; i < kStageChunks; ++i) {
      const int k = (threadIdx.x + i * kThreads) * 8;
      if (k < K) {
        float f[8], al[8];
        bf16x8_to_float(v[i], f);
        bf16x8_to_float(g[i], al);
        uint4 o;
        __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
        for (int j = 0; j < 4; ++j)
          h[j] = __floats2bfloat162_rn(f[2 * j] * (al[2 * j] * r), f[2 * j + 1] * (al[2 * j + 1] * r));
        *reinterpret_cast<uint4*>(xs + b * K + k) = o;
      }
    }
  }
}

// xs = x, both [B, K] (rows of K contiguous).
template <int B>
__device__ void stage_copy(const bf16* x, int K, bf16* xs) {
  for (int k = threadIdx.x * 8; k < B * K; k += kThreads * 8)
    *reinterpret_cast<uint4*>(xs + k) = __ldcg(reinterpret_cast<const uint4*>(x + k));
}

// xs[b] = attention output of layer `layer` at step a.step ([DD], heads concatenated): one warp per
// (row, head); lane j scores ring slot j (this step's key comes from qkv), softmax in fp32 with
// upstream's visibility rule, then lanes over head dims sum p_j * v_j. Every load of a round is
// issued before its first use (the q and k chunks of 32 dims, the values of 8 slots), so a head of
// 64 dims costs about three memory round trips. The last block appends this step's k, v at slot `step` for
// the later steps (which read it from the next launch on).
template <int B>
__device__ __forceinline__ void stage_attention(const DepStepArgs& a, int layer, const int* slot, const bf16* kvs,
                                                bf16* xs) {
  constexpr int kDots = 4;  // q/k chunks (of 8 dims) loaded per round: 32 dims (8 spilled)
  constexpr int kVals = 8;  // slots whose values are loaded per round
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int DD = a.DD, hd = DD / a.heads, dpl = hd / 32;
  const int step = a.step, E = step + 1, C = a.ring;
  const float scale = rsqrtf(static_cast<float>(hd));
  const int64_t lofs = static_cast<int64_t>(layer) * a.ring_layer_stride;
  for (int item = warp; item < B * a.heads; item += kWarps) {
    const int b = item / a.heads, h = item - b * a.heads;
    const bf16* row = a.qkv + static_cast<int64_t>(b) * 3 * DD;
    const int64_t ring0 = lofs + static_cast<int64_t>(slot[b]) * C * DD + h * hd;
    const bool vis = lane < C && ring_visible(lane, E, C, step, 0);
    float s = -INFINITY;
    if (vis) {
      // Earlier steps' keys from shared memory (kvs) or the ring; this step's from qkv.
      const bool sh = kvs != nullptr && lane < step;
      const bf16* kp = lane == step ? row + DD + h * hd
                       : sh         ? kvs + (b * step + lane) * DD + h * hd
                                    : a.k_ring + ring0 + static_cast<int64_t>(lane) * DD;
      const bf16* qp = row + h * hd;
      float dot = 0.f;
      for (int c0 = 0; c0 < hd; c0 += 8 * kDots) {
        uint4 qv[kDots], kv[kDots];
#pragma unroll
        for (int i = 0; i < kDots; ++i) {
          if (c0 + 8 * i < hd) {
            qv[i] = __ldcg(reinterpret_cast<const uint4*>(qp + c0 + 8 * i));
            const uint4* k16 = reinterpret_cast<const uint4*>(kp + c0 + 8 * i);
            kv[i] = sh ? *k16 : __ldcg(k16);
          }
        }
#pragma unroll
        for (int i = 0; i < kDots; ++i) {
          if (c0 + 8 * i < hd) {
            float qf[8], kf[8];
            bf16x8_to_float(qv[i], qf);
            bf16x8_to_float(kv[i], kf);
#pragma unroll
            for (int j = 0; j < 8; ++j) dot = fmaf(qf[j], kf[j], dot);
          }
        }
      }
      s = dot * scale;
    }
    const float m = warp_max(s);  // finite: slot `step` is always visible
    const float p = vis ? expf(s - m) : 0.f;
    const float l = warp_sum(p);
    const int last = 31 - __clz(__ballot_sync(0xffffffffu, vis));
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int j0 = 0; j0 <= last; j0 += kVals) {
      float vv[kVals][4];
#pragma unroll
      for (int u = 0; u < kVals; ++u) {
        const int j = j0 + u;
        if (j <= last) {
          const bool sh = kvs != nullptr && j < step;
          const bf16* vp = (j == step ? row + 2 * DD + h * hd
                            : sh      ? kvs + (B * step + b * step + j) * DD + h * hd
                                      : a.v_ring + ring0 + static_cast<int64_t>(j) * DD) +
                           lane * dpl;
          if (dpl % 2 == 0) {  // 4-byte loads (the offsets are even)
#pragma unroll
            for (int d = 0; d < 4; d += 2) {
              float2 f = make_float2(0.f, 0.f);
              if (d < dpl) {
                const __nv_bfloat162* v2 = reinterpret_cast<const __nv_bfloat162*>(vp + d);
                f = __bfloat1622float2(sh ? *v2 : __ldcg(v2));
              }
              vv[u][d] = f.x;
              vv[u][d + 1] = f.y;
            }
          } else {
#pragma unroll
            for (int d = 0; d < 4; ++d) vv[u][d] = d < dpl ? __bfloat162float(sh ? vp[d] : __ldcg(vp + d)) : 0.f;
          }
        }
      }
#pragma unroll
      for (int u = 0; u < kVals; ++u) {
        const int j = j0 + u;
        const float pj = __shfl_sync(0xffffffffu, p, j & 31);
        if (j <= last) {
#pragma unroll
          for (int d = 0; d < 4; ++d) acc[d] = fmaf(pj, vv[u][d], acc[d]);
        }
      }
    }
#pragma unroll
    for (int d = 0; d < 4; ++d)
      if (d < dpl) xs[b * DD + h * hd + lane * dpl + d] = __float2bfloat16(l > 0.f ? acc[d] / l : 0.f);
  }
  if (blockIdx.x == gridDim.x - 1) {
    for (int t = threadIdx.x * 8; t < B * DD; t += kThreads * 8) {
      const int b = t / DD, k = t - b * DD;
      const int64_t dst = lofs + (static_cast<int64_t>(slot[b]) * C + step % C) * DD + k;
      const bf16* row = a.qkv + static_cast<int64_t>(b) * 3 * DD;
      *reinterpret_cast<uint4*>(a.k_ring + dst) = __ldcg(reinterpret_cast<const uint4*>(row + DD + k));
      *reinterpret_cast<uint4*>(a.v_ring + dst) = __ldcg(reinterpret_cast<const uint4*>(row + 2 * DD + k));
    }
  }
}

// Phase p's GEMV over this block's rows with the weights from the ring, on the tensor cores:
// mma.m16n8k16 (bf16 in, fp32 accumulate) with the batch rows as the M side (rows B..15 zero) and
// 16 weight rows (two n8 tiles, one ldmatrix.x4) as the N side. Warp w takes a contiguous range of
// the K/16 k-tiles for every row group, so its x fragments are reused across rows; partial sums go
// to part[(w * B + b) * rt + row] (rt = the slice's rows rounded up to 16), summed over the warps
// in fixed order by the epilogue. Rows past the slice in the last group read a clamped row and
// land in part columns nobody reads.
__device__ __forceinline__ void mma_bf16(float* d, const unsigned* a, unsigned b0, unsigned b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}
__device__ __forceinline__ void ldmatrix_x4(unsigned addr, unsigned& r0, unsigned& r1, unsigned& r2, unsigned& r3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
#endif
}

__host__ __device__ constexpr int round16(int n) { return (n + 15) / 16 * 16; }

template <int B>
__device__ __forceinline__ void gemv_partials(const bf16* ws, int rows, int K, const bf16* xs, float* part) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int kt_all = K / 16, kt0 = warp * kt_all / kWarps, kt1 = (warp + 1) * kt_all / kWarps;
  const int rt = round16(rows);
  const unsigned rb = ring_row_bytes(K);
  const unsigned wbase = smem_u32(ws);
  // ldmatrix row addresses: lane l feeds matrix l / 8, row l % 8; matrices (rows +0, k +0),
  // (+0, +8), (+8, +0), (+8, +8) give the B fragments of the group's two n8 tiles.
  const int mrow = (lane & 7) + ((lane >> 4) << 3), mk = ((lane >> 3) & 1) * 8;
  const bf16* xg = xs + (g < B ? g : 0) * K + 2 * t;
  for (int r0 = 0; r0 < rows; r0 += 16) {
    float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
    const unsigned waddr = wbase + static_cast<unsigned>(min(r0 + mrow, rows - 1)) * rb + mk * 2;
    for (int kt = kt0; kt < kt1; ++kt) {
      unsigned a[4] = {0u, 0u, 0u, 0u};
      if (g < B) {
        a[0] = *reinterpret_cast<const unsigned*>(xg + kt * 16);
        a[2] = *reinterpret_cast<const unsigned*>(xg + kt * 16 + 8);
      }
      unsigned b0, b1, b2, b3;
      ldmatrix_x4(waddr + kt * 32, b0, b1, b2, b3);
      mma_bf16(acc[0], a, b0, b1);
      mma_bf16(acc[1], a, b2, b3);
    }
    if (g < B) {
      float* dst = part + (warp * B + g) * rt + r0 + 2 * t;
      dst[0] = acc[0][0];
      dst[1] = acc[0][1];
      dst[8] = acc[1][0];
      dst[9] = acc[1][1];
    }
  }
}

enum class Epi { kQkv, kResidual, kGateUp, kLogits };

// The phase's outputs from the partial sums, one thread per (row, batch row), rounded as the
// per-op kernels round.
template <int B>
__device__ __forceinline__ void epilogue(const DepStepArgs& a, Epi kind, const Rows r, const float* part, bf16* zown) {
  const int R = kind == Epi::kGateUp ? 2 : 1;
  const int rt = round16(R * r.nr);
  for (int t = threadIdx.x; t < r.nr * B; t += kThreads) {
    const int lr = t / B, b = t - lr * B, n = r.r0 + lr;
    float s[2] = {0.f, 0.f};
    for (int q = 0; q < R; ++q)
      for (int w = 0; w < kWarps; ++w) s[q] += part[(w * B + b) * rt + q * r.nr + lr];
    switch (kind) {
      case Epi::kQkv:
        a.qkv[static_cast<int64_t>(b) * 3 * a.DD + n] = __float2bfloat16(s[0]);
        break;
      case Epi::kResidual: {
        const bf16 h = __float2bfloat16(__bfloat162float(zown[b * a.own_rows + lr]) + bf(s[0]));
        a.z[static_cast<int64_t>(b) * a.DD + n] = h;
        zown[b * a.own_rows + lr] = h;
        break;
      }
      case Epi::kGateUp: {
        const float g = bf(s[0]), u = bf(s[1]);
        a.gu[static_cast<int64_t>(b) * a.DH + n] = __float2bfloat16(g / (1.f + expf(-g)) * u);
        break;
      }
      case Epi::kLogits:
        a.logits[b * a.logits_stride + n] = bf(s[0]);
        break;
    }
  }
}

// xs[b] = RMSNorm(z[b]) with z read from a.z, or, for the step's first phase (from_input), z =
// bf16(pre + emb[token]) (the per-op kAddEmb epilogue) computed whole by every block, which also
// stores the rows it owns.
template <int B>
__device__ __forceinline__ void stage_norm(const DepStepArgs& a, const bf16* alpha, bool from_input, const Rows own,
                                        bf16* zown, bf16* xs, float* red) {
  const int DD = a.DD;
  if (!from_input) {
    stage_rmsnorm<B>(DD, alpha, a.eps, xs, red,
                     [&](int b, int k) { return __ldcg(reinterpret_cast<const uint4*>(a.z + b * DD + k)); });
    return;
  }
  stage_rmsnorm<B>(DD, alpha, a.eps, xs, red, [&](int b, int k) {
    const uint4 pv = __ldcg(reinterpret_cast<const uint4*>(a.pre + b * a.pre_stride + k));
    int tok = a.token[b];
    uint4 ev = make_uint4(0, 0, 0, 0);
    if (tok != -1) {
      tok = tok < 0 ? 0 : (tok >= a.emb_rows ? a.emb_rows - 1 : tok);
      ev = __ldg(reinterpret_cast<const uint4*>(a.emb + static_cast<int64_t>(tok) * DD + k));
    }
    float pf[8], ef[8];
    bf16x8_to_float(pv, pf);
    bf16x8_to_float(ev, ef);
    uint4 o;
    bf16* h = reinterpret_cast<bf16*>(&o);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      h[j] = __float2bfloat16(pf[j] + ef[j]);
      const int n = k + j;
      if (n >= own.r0 && n < own.r0 + own.nr) {
        a.z[static_cast<int64_t>(b) * DD + n] = h[j];
        zown[b * a.own_rows + n - own.r0] = h[j];
      }
    }
    return o;
  });
}

template <int B>
__global__ void __launch_bounds__(kThreads, 1) depformer_kernel(const __grid_constant__ DepStepArgs a) {
  extern __shared__ __align__(128) unsigned char smem[];
  const SmemLayout lay = smem_layout(B, a.kmax, a.part_floats, a.own_rows);
  bf16* xs = reinterpret_cast<bf16*>(smem);  // [B, kmax]: the staged GEMV input
  float* part = reinterpret_cast<float*>(smem + lay.part);
  bf16* zown = reinterpret_cast<bf16*>(smem + lay.zown);  // [B, own_rows]: this block's rows of z
  __shared__ float red[32];
  __shared__ __align__(8) uint64_t mbar[kSlots];
  __shared__ unsigned ring_off[kMaxPhases], ring_bytes[kMaxPhases];
  __shared__ int slot[B];  // the batch rows' K/V ring slots, read once
  const int P = dep_phase_count(a.layers);
  if (threadIdx.x < B) slot[threadIdx.x] = a.slot[threadIdx.x];
  WeightRing ring{smem + lay.wbuf, a.wcap, mbar, ring_off, ring_bytes};
  if (threadIdx.x == 0) {
    for (int i = 0; i < kSlots; ++i) mbar_init(&mbar[i]);
    mbar_init_fence();
    ring.issue(a, 0, P);
  }
  // The z rows of this block: those of every DD-row GEMV (output and down projections).
  const Rows own = rows_of(a.DD);
  long long* trace = nullptr;
  if (a.trace && (blockIdx.x == 0 || blockIdx.x == gridDim.x - 1))
    trace = a.trace + (blockIdx.x == 0 ? 0 : 5 * P);
  auto stamp = [&](int i) {
    __syncthreads();
    if (threadIdx.x == 0) trace[i] = clock64();
  };
  if (trace) stamp(0);
  __syncthreads();  // the mbarriers and the first ring offsets
  for (int p = 0; p < P; ++p) {
    if (p > 0) {
      if (trace) stamp(5 * p - 1);
      grid_barrier(a.barrier);
      if (trace) stamp(5 * p);
    }
    const int l = p / 4, kind = p == P - 1 ? 4 : p % 4;
    const PhaseWeights pw = phase_weights(a, p);
    const Rows r = rows_of(pw.rows);
    if (kind == 0 || kind == 2) {
      stage_norm<B>(a, kind == 0 ? a.layer[l].norm1 : a.layer[l].norm2, p == 0, own, zown, xs, red);
    } else if (kind == 1) {
      const bf16* kvs = nullptr;
      if (a.kv_in_ring) {
        const unsigned char* slice = reinterpret_cast<const unsigned char*>(ring.wait(p));
        kvs = reinterpret_cast<const bf16*>(slice + rows_bytes(pw));
      }
      stage_attention<B>(a, l, slot, kvs, xs);
    } else {
      stage_copy<B>(kind == 3 ? a.gu : a.z, kind == 3 ? a.DH : a.DD, xs);
    }
    if (trace) stamp(5 * p + 1);
    const bf16* ws = ring.wait(p);
    __syncthreads();  // xs staged
    if (trace && threadIdx.x == 0) trace[5 * p + 2] = clock64();
    gemv_partials<B>(ws, (pw.pairs ? 2 : 1) * r.nr, pw.K, xs, part);
    __syncthreads();  // partial sums written, the ring slice consumed
    if (trace && threadIdx.x == 0) trace[5 * p + 3] = clock64();
    if (threadIdx.x == 0) ring.issue(a, p + 1, P);
    const Epi e = kind == 0 ? Epi::kQkv : kind == 2 ? Epi::kGateUp : kind == 4 ? Epi::kLogits : Epi::kResidual;
    epilogue<B>(a, e, r, part, zown);
  }
  if (trace) stamp(5 * P - 1);
}

const void* kernel_for(int B) {
  switch (B) {
    case 1: return reinterpret_cast<const void*>(depformer_kernel<1>);
    case 2: return reinterpret_cast<const void*>(depformer_kernel<2>);
    case 3: return reinterpret_cast<const void*>(depformer_kernel<3>);
    default: return reinterpret_cast<const void*>(depformer_kernel<4>);
  }
}

}  // namespace

DepPlan depformer_plan(const DepStepArgs& a, int max_blocks) {
  DepPlan p;
  auto fail = [&](const std::string& why) {
    p.blocks = 0;
    p.why = why;
    return p;
  };
  if (a.B < 1 || a.B > kDepMaxBatch) return fail("batch must be 1.." + std::to_string(kDepMaxBatch));
  if (a.layers < 1 || a.layers > kDepMaxLayers) return fail("depformer layers must be 1.." + std::to_string(kDepMaxLayers));
  if (a.heads < 1 || a.DD % a.heads != 0) return fail("depformer width not a multiple of the heads");
  const int hd = a.DD / a.heads;
  if (hd % 32 != 0 || hd > 128) return fail("depformer head dim must be a multiple of 32, at most 128");
  if (a.ring < 1 || a.ring > kDepMaxRing) return fail("depformer ring must be 1.." + std::to_string(kDepMaxRing));
  if (a.DD % 16 || a.DH % 16 || a.pre_stride % 8 || a.DH <= 0 || a.card <= 0)
    return fail("depformer widths must be positive multiples of 16");
  if (a.DD > kThreads * 8 * kStageChunks) return fail("depformer width above " + std::to_string(kThreads * 8 * kStageChunks));
  int dev = 0, coop = 0, sms = 0, optin = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return fail("device attributes unavailable");
  }
  if (major < 9) return fail("needs compute capability 9.0 or newer (bulk asynchronous copies)");
  if (!coop) return fail("the device has no cooperative launch");
  const int G = max_blocks > 0 ? std::min(sms, max_blocks) : sms;
  p.kmax = std::max(a.DD, a.DH);
  p.own_rows = (a.DD + G - 1) / G;
  const int max_rows = std::max({3 * a.DD, a.DH, a.card});
  // Partial sums: [warps, B, rows of the largest slice rounded up to 16] (gate/up: two rows each).
  const int max_slice_rows = std::max({(max_rows + G - 1) / G, 2 * ((a.DH + G - 1) / G)});
  p.part_floats = kWarps * a.B * ((max_slice_rows + 15) / 16 * 16);
  // The largest weight slice a block copies for one phase (rows padded as in the ring).
  auto slice = [&](int rows, int K, int copies) {
    return static_cast<size_t>((rows + G - 1) / G) * copies * (static_cast<size_t>(K) * 2 + 16);
  };
  const size_t max_slice =
      std::max({slice(3 * a.DD, a.DD, 1), slice(a.DD, a.DD, 1), slice(a.DH, a.DD, 2), slice(a.DD, a.DH, 1),
                slice(a.card, a.DD, 1)});
  // The attention phase's slice with the keys and values of the last step (kv_in_ring).
  const size_t max_kv_slice = slice(a.DD, a.DD, 1) + static_cast<size_t>(2) * a.B * (a.ring - 1) * a.DD * 2;
  const void* fn = kernel_for(a.B);
  cudaFuncAttributes fa{};
  if (cudaFuncGetAttributes(&fa, fn) != cudaSuccess) {
    const std::string e = cudaGetErrorString(cudaGetLastError());
    return fail("kernel attributes unavailable: " + e);
  }
  const SmemLayout lay = smem_layout(a.B, p.kmax, p.part_floats, p.own_rows);
  const size_t avail = static_cast<size_t>(optin) - fa.sharedSizeBytes;
  if (lay.wbuf + max_slice > avail)
    return fail("a phase's weight slice (" + std::to_string(max_slice) + " bytes) does not fit in shared memory");
  p.wcap = static_cast<unsigned>((avail - lay.wbuf) / 16 * 16);
  p.kv_fits = max_kv_slice <= p.wcap;
  p.smem = lay.wbuf + p.wcap;
  int occ = 0;
  if (cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(p.smem)) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, fn, kThreads, p.smem) != cudaSuccess) {
    const std::string e = cudaGetErrorString(cudaGetLastError());
    return fail("occupancy query failed: " + e);
  }
  if (occ < 1) return fail("a block of the kernel does not fit on a multiprocessor");
  p.blocks = G;  // <= one per multiprocessor: co-resident
  p.threads = kThreads;
  return p;
}

void depformer_step(const DepStepArgs& a, const DepPlan& plan, cudaStream_t s) {
  if (plan.blocks <= 0) throw std::runtime_error("depformer_step: no launch plan (" + plan.why + ")");
  if (a.step < 0 || a.step >= a.ring) throw std::runtime_error("depformer_step: step outside the ring");
  DepStepArgs k = a;
  k.kmax = plan.kmax;
  k.part_floats = plan.part_floats;
  k.own_rows = plan.own_rows;
  k.wcap = plan.wcap;
  k.kv_in_ring = a.kv_in_ring && plan.kv_fits;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(plan.blocks);
  cfg.blockDim = dim3(plan.threads);
  cfg.dynamicSmemBytes = plan.smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  DepStepArgs* kp = &k;
  if (a.B < 1 || a.B > kDepMaxBatch) throw std::runtime_error("depformer_step: batch must be 1..4");
  const cudaError_t e = cudaLaunchKernelExC(&cfg, kernel_for(a.B), reinterpret_cast<void**>(&kp));
  if (e != cudaSuccess) throw std::runtime_error(std::string("depformer_step: ") + cudaGetErrorString(e));
}

}  // namespace ppx::kern
