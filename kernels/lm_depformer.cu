// The depformer step as one persistent kernel. At batch 1 a step's 26 GEMVs read 1-12 MB each
// (166 MB in all at full size), which the H200 streams in 0.3-3 us, while each dependent kernel
// boundary of the per-op path costs about 5-7 us (docs/PERF.md). So every phase runs inside one
// cooperative launch, all blocks resident, separated by a grid-wide barrier on a counter in global
// memory instead of a kernel boundary.
//
// Work split: each phase's GEMV gives every block one contiguous range of rows, so a block's
// weight slice is contiguous and one bulk L2 prefetch, issued two phases ahead, has it in L2 by the
// time the block gets there (the prefetch needs no data, so it overlaps the barrier waits). Inside
// a block the rows are cut into K segments so that all warps have work even when a block owns only
// a few rows; partial sums meet in shared memory in a fixed order (deterministic). Every block
// stages the phase's input itself (the RMSNorm of the residual stream, or the attention of all
// heads, a few KB from L2): cheaper than another barrier. The residual rows a block owns are the
// same in every DD-row GEMV, so the block keeps them in shared memory between phases.
#include <algorithm>
#include <stdexcept>

#include "common.cuh"
#include "lm_depformer.cuh"

namespace ppx::kern {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kPrefetchPiece = 16384;  // bytes per bulk prefetch instruction

__host__ __device__ constexpr int phase_count(int layers) { return 2 + 4 * layers; }
__host__ __device__ constexpr size_t align16(size_t n) { return (n + 15) / 16 * 16; }

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Every block adds 1 except block 0, which adds 2^31 - (G - 1): the G arrivals add exactly 2^31,
// so bit 31 flips when the last block arrives and the low bits return to zero, ready for the next
// barrier and the next launch without a reset. A block's own arrival leaves bit 31 as it found it,
// whatever the order. Needs every block resident (cooperative launch).
__device__ __forceinline__ void grid_barrier(unsigned* bar) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned add = blockIdx.x == 0 ? 0x80000000u - (gridDim.x - 1) : 1u;
    __threadfence();  // releases the block's writes, ordered before this by __syncthreads
    const unsigned old = atomicAdd(bar, add);
    while (((load_acquire(bar) ^ old) & 0x80000000u) == 0) {
    }
  }
  __syncthreads();
}

// This block's rows of an N-row GEMV and how its items (row, K segment) are cut.
struct Rows {
  int r0, nr;  // rows [r0, r0 + nr)
  int segs;    // K segments per row: about two items per warp, at least 32 chunks per segment
  int chunks;  // K / 8 (16-byte chunks)
};

__device__ __forceinline__ Rows rows_of(int rows, int K) {
  Rows r;
  const int64_t G = gridDim.x, b = blockIdx.x;
  r.r0 = static_cast<int>(rows * b / G);
  r.nr = static_cast<int>(rows * (b + 1) / G) - r.r0;
  r.chunks = K / 8;
  const int want = r.nr > 0 ? (2 * kWarps + r.nr - 1) / r.nr : 1;
  r.segs = max(1, min(want, r.chunks / 32));
  return r;
}

// Phase p's weights: 0 = input projection, 1 + 4l + {0 qkv, 1 out, 2 gate/up, 3 down}, P - 1 = head;
// P and P + 1 are the next step's first two.
struct PhaseWeights {
  const bf16* w;
  int rows, K;
  bool pairs;  // gate/up: logical row n reads weight rows n and n + rows
};

__device__ __forceinline__ PhaseWeights phase_weights(const DepStepArgs& a, int p) {
  const int P = phase_count(a.layers);
  if (p == 0) return {a.w_in, a.DD, a.D, false};
  if (p == P - 1) return {a.w_head, a.card, a.DD, false};
  if (p == P) return {a.next_w_in, a.DD, a.D, false};
  if (p == P + 1) return {a.next_qkv0, 3 * a.DD, a.DD, false};
  if (p > P + 1) return {nullptr, 0, 0, false};
  const DepLayerWeights& L = a.layer[(p - 1) / 4];
  switch ((p - 1) % 4) {
    case 0: return {L.qkv, 3 * a.DD, a.DD, false};
    case 1: return {L.out, a.DD, a.DD, false};
    case 2: return {L.gate_up, a.DH, a.DD, true};
    default: return {L.down, a.DD, a.DH, false};
  }
}

// 16-byte aligned range, size a multiple of 16 (rows of K % 8 == 0 bf16).
__device__ __forceinline__ void prefetch_range(const bf16* p, size_t bytes) {
  const char* c = reinterpret_cast<const char*>(p);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  for (size_t off = threadIdx.x * static_cast<size_t>(kPrefetchPiece); off < bytes;
       off += static_cast<size_t>(kThreads) * kPrefetchPiece) {
    const unsigned n = static_cast<unsigned>(min(bytes - off, static_cast<size_t>(kPrefetchPiece)));
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(__cvta_generic_to_global(c + off)), "r"(n)
                 : "memory");
  }
#else
  for (size_t off = threadIdx.x * 128; off < bytes; off += kThreads * 128) prefetch_l2(c + off);
#endif
}

__device__ __forceinline__ void prefetch_phase(const DepStepArgs& a, int p) {
  const PhaseWeights pw = phase_weights(a, p);
  if (!pw.w) return;
  const Rows r = rows_of(pw.rows, pw.K);
  const size_t bytes = static_cast<size_t>(r.nr) * pw.K * sizeof(bf16);
  prefetch_range(pw.w + static_cast<int64_t>(r.r0) * pw.K, bytes);
  if (pw.pairs) prefetch_range(pw.w + static_cast<int64_t>(r.r0 + pw.rows) * pw.K, bytes);
}

// Activations written by other blocks during this launch are read with ld.global.cg (L2, never a
// stale L1 line); weights, read-only for the whole launch, with __ldg.

// xs[b] = bf16(x[b] * (alpha * rsqrt(mean(x[b]^2) + eps))), fp32 math as lm_gemv's kRmsNorm.
template <int B>
__device__ void stage_rmsnorm(const bf16* x, int64_t stride, int K, const bf16* alpha, float eps, bf16* xs,
                              float* red) {
  for (int b = 0; b < B; ++b) {
    bf16* dst = xs + b * K;
    float ss = 0.f;
    for (int k = threadIdx.x * 8; k < K; k += kThreads * 8) {
      const uint4 v = __ldcg(reinterpret_cast<const uint4*>(x + b * stride + k));
      *reinterpret_cast<uint4*>(dst + k) = v;
      float f[8];
      bf16x8_to_float(v, f);
#pragma unroll
      for (int i = 0; i < 8; ++i) ss += f[i] * f[i];
    }
    ss = block_sum(ss, red);
    const float r = rsqrtf(ss / static_cast<float>(K) + eps);
    for (int k = threadIdx.x * 8; k < K; k += kThreads * 8) {  // the chunks this thread staged
      float f[8], g[8];
      bf16x8_to_float(*reinterpret_cast<const uint4*>(dst + k), f);
      bf16x8_to_float(__ldg(reinterpret_cast<const uint4*>(alpha + k)), g);
      uint4 o;
      __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&o);
#pragma unroll
      for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(f[2 * i] * (g[2 * i] * r), f[2 * i + 1] * (g[2 * i + 1] * r));
      *reinterpret_cast<uint4*>(dst + k) = o;
    }
  }
}

template <int B>
__device__ void stage_copy(const bf16* x, int64_t stride, int K, bf16* xs) {
  for (int b = 0; b < B; ++b) {
    for (int k = threadIdx.x * 8; k < K; k += kThreads * 8)
      *reinterpret_cast<uint4*>(xs + b * K + k) = __ldcg(reinterpret_cast<const uint4*>(x + b * stride + k));
  }
}

// xs[b] = attention output of layer `layer` at step a.step ([DD], heads concatenated): one warp per
// (row, head); lane j scores ring slot j (this step's key comes from qkv), softmax in fp32 with
// upstream's visibility rule, then lanes over head dims sum p_j * v_j. The last block appends this
// step's k, v at slot `step` for the later steps (which read it from the next launch on).
template <int B>
__device__ void stage_attention(const DepStepArgs& a, int layer, bf16* xs) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int DD = a.DD, hd = DD / a.heads, dpl = hd / 32;
  const int step = a.step, E = step + 1, C = a.ring;
  const float scale = rsqrtf(static_cast<float>(hd));
  const int64_t lofs = static_cast<int64_t>(layer) * a.ring_layer_stride;
  for (int item = warp; item < B * a.heads; item += kWarps) {
    const int b = item / a.heads, h = item - b * a.heads;
    const bf16* row = a.qkv + static_cast<int64_t>(b) * 3 * DD;
    const int64_t ring0 = lofs + static_cast<int64_t>(a.slot[b]) * C * DD + h * hd;
    const bool vis = lane < C && ring_visible(lane, E, C, step, 0);
    float s = -INFINITY;
    if (vis) {
      const bf16* kp = lane == step ? row + DD + h * hd : a.k_ring + ring0 + static_cast<int64_t>(lane) * DD;
      const bf16* qp = row + h * hd;
      float dot = 0.f;
      for (int c = 0; c < hd; c += 8) {
        float qf[8], kf[8];
        bf16x8_to_float(__ldcg(reinterpret_cast<const uint4*>(qp + c)), qf);
        bf16x8_to_float(__ldcg(reinterpret_cast<const uint4*>(kp + c)), kf);
#pragma unroll
        for (int i = 0; i < 8; ++i) dot = fmaf(qf[i], kf[i], dot);
      }
      s = dot * scale;
    }
    const float m = warp_max(s);  // finite: slot `step` is always visible
    const float p = vis ? expf(s - m) : 0.f;
    const float l = warp_sum(p);
    const int last = 31 - __clz(__ballot_sync(0xffffffffu, vis));
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int j = 0; j <= last; ++j) {
      const float pj = __shfl_sync(0xffffffffu, p, j);
      const bf16* vp =
          (j == step ? row + 2 * DD + h * hd : a.v_ring + ring0 + static_cast<int64_t>(j) * DD) + lane * dpl;
#pragma unroll
      for (int d = 0; d < 4; ++d)
        if (d < dpl) acc[d] = fmaf(pj, __bfloat162float(__ldcg(vp + d)), acc[d]);
    }
#pragma unroll
    for (int d = 0; d < 4; ++d)
      if (d < dpl) xs[b * DD + h * hd + lane * dpl + d] = __float2bfloat16(l > 0.f ? acc[d] / l : 0.f);
  }
  if (blockIdx.x == gridDim.x - 1) {
    for (int t = threadIdx.x * 8; t < B * DD; t += kThreads * 8) {
      const int b = t / DD, k = t - b * DD;
      const int64_t dst = lofs + (static_cast<int64_t>(a.slot[b]) * C + step % C) * DD + k;
      const bf16* row = a.qkv + static_cast<int64_t>(b) * 3 * DD;
      *reinterpret_cast<uint4*>(a.k_ring + dst) = __ldcg(reinterpret_cast<const uint4*>(row + DD + k));
      *reinterpret_cast<uint4*>(a.v_ring + dst) = __ldcg(reinterpret_cast<const uint4*>(row + 2 * DD + k));
    }
  }
}

// This block's rows of y = W xs (R weight rows per logical row, `pair_off` rows apart), then
// epi(b, local row, row, sums[R]) once per (row, batch row). xs: [B, K] bf16 in shared memory.
template <int B, int R, typename Epi>
__device__ __forceinline__ void gemv_rows(const bf16* w, int rows, int K, const bf16* xs, float* part, Epi epi) {
  const Rows r = rows_of(rows, K);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // xs staged
  const int items = r.nr * r.segs;
  for (int it = warp; it < items; it += kWarps) {
    const int lr = it / r.segs, sg = it - lr * r.segs;
    const int c0 = sg * r.chunks / r.segs, c1 = (sg + 1) * r.chunks / r.segs;
    const uint4* wr[R];
#pragma unroll
    for (int q = 0; q < R; ++q)
      wr[q] = reinterpret_cast<const uint4*>(w + static_cast<int64_t>(r.r0 + lr + q * rows) * K);
    float acc[R][B];
#pragma unroll
    for (int q = 0; q < R; ++q)
#pragma unroll
      for (int b = 0; b < B; ++b) acc[q][b] = 0.f;
#pragma unroll 4
    for (int c = c0 + lane; c < c1; c += 32) {
      uint4 wv[R];
#pragma unroll
      for (int q = 0; q < R; ++q) wv[q] = __ldg(wr[q] + c);
      float xf[B][8];
#pragma unroll
      for (int b = 0; b < B; ++b) bf16x8_to_float(*reinterpret_cast<const uint4*>(xs + b * K + c * 8), xf[b]);
#pragma unroll
      for (int q = 0; q < R; ++q) {
        float wf[8];
        bf16x8_to_float(wv[q], wf);
#pragma unroll
        for (int b = 0; b < B; ++b)
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[q][b] = fmaf(wf[i], xf[b][i], acc[q][b]);
      }
    }
#pragma unroll
    for (int q = 0; q < R; ++q)
#pragma unroll
      for (int b = 0; b < B; ++b) {
        const float v = warp_sum(acc[q][b]);
        if (lane == 0) part[(it * R + q) * B + b] = v;
      }
  }
  __syncthreads();
  for (int t = threadIdx.x; t < r.nr * B; t += kThreads) {
    const int lr = t / B, b = t - lr * B;
    float s[R];
#pragma unroll
    for (int q = 0; q < R; ++q) {
      s[q] = 0.f;
      for (int sg = 0; sg < r.segs; ++sg) s[q] += part[((lr * r.segs + sg) * R + q) * B + b];
    }
    epi(b, lr, r.r0 + lr, s);
  }
}

template <int B>
__global__ void __launch_bounds__(kThreads, 1) depformer_kernel(const __grid_constant__ DepStepArgs a) {
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* xs = reinterpret_cast<bf16*>(smem);  // [B, kmax]: the staged GEMV input
  float* part = reinterpret_cast<float*>(smem + align16(static_cast<size_t>(B) * a.kmax * sizeof(bf16)));
  bf16* zown = reinterpret_cast<bf16*>(part + a.part_floats);  // [B, own_rows]: this block's rows of z
  __shared__ float red[32];
  const int P = phase_count(a.layers);
  const int DD = a.DD;
  // z rows of this block: the epilogue of every DD-row GEMV (input, output and down projections).
  auto store_z = [&](int b, int lr, int n, float v) {
    const bf16 h = __float2bfloat16(v);
    a.z[static_cast<int64_t>(b) * DD + n] = h;
    zown[b * a.own_rows + lr] = h;
  };
  auto residual = [&](int b, int lr, int n, const float* s) {
    store_z(b, lr, n, __bfloat162float(zown[b * a.own_rows + lr]) + bf(s[0]));
  };
  auto rmsnorm = [&](const bf16* x, int64_t stride, int K, const bf16* alpha) {
    stage_rmsnorm<B>(x, stride, K, alpha, a.eps, xs, red);
  };
  auto copy = [&](const bf16* x, int K) { stage_copy<B>(x, K, K, xs); };
  long long* trace = nullptr;
  if (a.trace && (blockIdx.x == 0 || blockIdx.x == gridDim.x - 1))
    trace = a.trace + (blockIdx.x == 0 ? 0 : 3 * P);
  auto stamp = [&](int i) {
    __syncthreads();
    if (threadIdx.x == 0) trace[i] = clock64();
  };
  if (trace) stamp(0);
  auto staged = [&](int p) {
    if (trace) stamp(3 * p + 1);
  };
  if (a.prefetch) {
    prefetch_phase(a, 0);
    prefetch_phase(a, 1);
  }
  for (int p = 0; p < P; ++p) {
    if (a.prefetch) prefetch_phase(a, p + 2);
    if (p > 0) {
      if (trace) stamp(3 * p - 1);
      grid_barrier(a.barrier);
      if (trace) stamp(3 * p);
    }
    if (p == 0) {
      rmsnorm(a.x, a.x_stride, a.D, a.out_norm);
      staged(p);
      gemv_rows<B, 1>(a.w_in, DD, a.D, xs, part, [&](int b, int lr, int n, const float* s) {
        int tok = a.token[b];
        float e = 0.f;
        if (tok != -1) {
          tok = tok < 0 ? 0 : (tok >= a.emb_rows ? a.emb_rows - 1 : tok);
          e = __bfloat162float(a.emb[static_cast<int64_t>(tok) * DD + n]);
        }
        store_z(b, lr, n, bf(s[0]) + e);
      });
    } else if (p == P - 1) {
      copy(a.z, DD);
      staged(p);
      gemv_rows<B, 1>(a.w_head, a.card, DD, xs, part, [&](int b, int, int n, const float* s) {
        a.logits[b * a.logits_stride + n] = bf(s[0]);
      });
    } else {
      const int l = (p - 1) / 4;
      const DepLayerWeights& L = a.layer[l];
      switch ((p - 1) % 4) {
        case 0:
          rmsnorm(a.z, DD, DD, L.norm1);
          staged(p);
          gemv_rows<B, 1>(L.qkv, 3 * DD, DD, xs, part, [&](int b, int, int n, const float* s) {
            a.qkv[static_cast<int64_t>(b) * 3 * DD + n] = __float2bfloat16(s[0]);
          });
          break;
        case 1:
          stage_attention<B>(a, l, xs);
          staged(p);
          gemv_rows<B, 1>(L.out, DD, DD, xs, part, residual);
          break;
        case 2:
          rmsnorm(a.z, DD, DD, L.norm2);
          staged(p);
          gemv_rows<B, 2>(L.gate_up, a.DH, DD, xs, part, [&](int b, int, int n, const float* s) {
            const float g = bf(s[0]), u = bf(s[1]);
            a.gu[static_cast<int64_t>(b) * a.DH + n] = __float2bfloat16(g / (1.f + expf(-g)) * u);
          });
          break;
        default:
          copy(a.gu, a.DH);
          staged(p);
          gemv_rows<B, 1>(L.down, DD, a.DH, xs, part, residual);
          break;
      }
    }
  }
  if (trace) stamp(3 * P - 1);
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
  if (a.D % 8 || a.DD % 8 || a.DH % 8 || a.x_stride % 8 || a.D <= 0 || a.DH <= 0 || a.card <= 0)
    return fail("widths must be positive multiples of 8");
  int dev = 0, coop = 0, sms = 0, optin = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return fail("device attributes unavailable");
  }
  if (!coop) return fail("the device has no cooperative launch");
  const int G = max_blocks > 0 ? std::min(sms, max_blocks) : sms;
  p.kmax = std::max({a.D, a.DD, a.DH});
  p.own_rows = (a.DD + G - 1) / G;
  const int max_rows = std::max({3 * a.DD, a.DH, a.card, a.DD});
  p.part_floats = (2 * kWarps + (max_rows + G - 1) / G) * 2 * a.B;
  p.smem = align16(static_cast<size_t>(a.B) * p.kmax * sizeof(bf16)) + align16(p.part_floats * sizeof(float)) +
           static_cast<size_t>(a.B) * p.own_rows * sizeof(bf16);
  if (p.smem > static_cast<size_t>(optin)) return fail("shared memory per block exceeds the device's limit");
  const void* fn = kernel_for(a.B);
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
