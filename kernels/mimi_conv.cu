// Mimi streaming convolutions, fp32 with fp32 accumulation (see mimi_conv.cuh for the semantics).
//
// Two kernels cover every conv of the codec:
// - conv_direct: one thread per output position n (32 per warp) and OB output channels; the input
//   channels are split over blockDim.y groups whose partial sums are added in shared memory in group
//   order. Weight reads are warp-uniform (broadcast). The kernel size is a template parameter where
//   it is one of Mimi's, so the taps unroll and their loads issue together.
// - conv_gemv: the weights dominate (up to 33 MB for a T=2 conv), so ksplit warps own one output
//   channel and stream its row with float4 loads: lane = (g, j) with j the tap (fixed per lane) and g
//   one of 32/kernel groups of 4 input channels. Each lane keeps TN accumulators, one per output
//   (conv) or per input sample (transposed), and reads x' from shared memory, staged transposed so
//   that its 4 channels are one LDS.128. Weight loads are double-buffered in registers and the first
//   batch is issued before waiting on the previous kernel (PDL). Partial sums of the ksplit warps
//   are added in shared memory in a fixed order, so results are deterministic.
#include <algorithm>
#include <cstdint>

#include "common.cuh"
#include "mimi_conv.cuh"
#include "mimi_device.cuh"

namespace ppx::kern::mimi {

namespace {
thread_local bool t_pdl_off = false;  // a PdlScope(false) is open on this thread
}  // namespace

bool pdl_enabled() {
  static const bool supported = [] {
    int dev = 0, major = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess) return false;
    return major >= 9;
  }();
  return supported && !t_pdl_off;
}

PdlScope::PdlScope(bool on) : prev_off_(t_pdl_off) { t_pdl_off = !on; }
PdlScope::~PdlScope() { t_pdl_off = prev_off_; }

namespace {

constexpr int kMaxSplit = 16;  // conv_direct: max blockDim.y
constexpr int kGemvWarps = 8;  // conv_gemv: warps per block

// x'[i, m] of one slot (see mimi_conv.cuh). load() always dereferences a valid address and selects,
// so unrolled loops can issue their loads together.
struct Src {
  const float* x;
  int sc, st;
  const float* hist;  // read parity, [cin][ctx]
  int ctx, first, replicate;
  __device__ __forceinline__ float load(int i, int m) const {
    const float* ptr = m >= ctx ? x + i * sc + (m - ctx) * st : first ? x + i * sc : hist + i * ctx + m;
    const float v = *ptr;
    return (m < ctx && first && !replicate) ? 0.f : v;
  }
};

__device__ __forceinline__ Src make_src(const ConvParams& p, int b, int slot, float** hist_w) {
  const int frame = *slot_int(p.frame, slot);
  const int ctx = conv_ctx(p);
  const long long par_size = static_cast<long long>(p.cin) * ctx;
  float* base = p.hist + static_cast<long long>(slot) * p.hist_stride;
  *hist_w = base + ((frame & 1) ^ 1) * par_size;
  return Src{row(p.x, b, slot), p.x.sc, p.x.st, base + (frame & 1) * par_size, ctx, frame == 0, p.replicate};
}

__device__ __forceinline__ void store_output(const ConvParams& p, int b, int slot, int o, int n, float acc) {
  float v = p.bias ? __fadd_rn(acc, p.bias[o]) : acc;
  if (p.ls) v = __fmul_rn(p.ls[o], v);
  if (p.residual.p) {
    const float* r = row(p.residual, b, slot);
    v = __fadd_rn(r[o * p.residual.sc + n * p.residual.st], v);
  }
  if (p.out_raw.p) row(p.out_raw, b, slot)[o * p.out_raw.sc + n * p.out_raw.st] = v;
  if (p.out_elu.p) row(p.out_elu, b, slot)[o * p.out_elu.sc + n * p.out_elu.st] = elu(v);
  if (p.out_gelu.p) row(p.out_gelu, b, slot)[o * p.out_gelu.sc + n * p.out_gelu.st] = gelu(v);
}

// New history x'[i, t_in + m], m < ctx, into the other parity; by all threads of one block.
__device__ __forceinline__ void write_history(const ConvParams& p, const Src& src, float* hist_w, int tid, int nt) {
  const int ctx = src.ctx;
  for (int e = tid; e < p.cin * ctx; e += nt) {
    const int i = e / ctx, m = e - i * ctx;
    hist_w[e] = src.load(i, p.t_in + m);
  }
}

// grid (ceil(t_out / 32), cout / OB, B), block (32, split). KT: kernel size, 0 = runtime.
template <int OB, int KT>
__global__ void __launch_bounds__(32 * kMaxSplit) conv_direct_kernel(ConvParams p, Batch batch) {
  __shared__ float red[kMaxSplit][OB][32];
  const int b = blockIdx.z, slot = batch.slots[b];
  const int tx = threadIdx.x, ty = threadIdx.y, split = blockDim.y;
  const int t_out = conv_t_out(p), cin = p.cin, K = KT > 0 ? KT : p.kernel, S = p.stride;
  const int n = blockIdx.x * 32 + tx, o0 = blockIdx.y * OB;
  const int wrow = cin * K;  // floats per output channel (< 2^31 for any Mimi layer)
  const float* w0 = p.w + static_cast<size_t>(o0) * wrow;
  pdl_wait();
  float* hist_w;
  const Src src = make_src(p, b, slot, &hist_w);

  float acc[OB];
#pragma unroll
  for (int q = 0; q < OB; ++q) acc[q] = 0.f;
  if (n < t_out) {
    if (!p.transposed) {
      const int m0 = n * S;
      if (m0 >= src.ctx) {
        // All taps inside this call's input.
        const float* xb = src.x + (m0 - src.ctx) * src.st;
#pragma unroll 4
        for (int i = ty; i < cin; i += split) {
          const float* xi = xb + i * src.sc;
          const float* wi = w0 + i * K;
          float xv[KT > 0 ? KT : 1];
          if constexpr (KT > 0) {
#pragma unroll
            for (int j = 0; j < KT; ++j) xv[j] = xi[j * src.st];
#pragma unroll
            for (int j = 0; j < KT; ++j)
#pragma unroll
              for (int q = 0; q < OB; ++q) acc[q] = fmaf(__ldg(wi + q * wrow + j), xv[j], acc[q]);
          } else {
            for (int j = 0; j < K; ++j) {
              xv[0] = xi[j * src.st];
#pragma unroll
              for (int q = 0; q < OB; ++q) acc[q] = fmaf(__ldg(wi + q * wrow + j), xv[0], acc[q]);
            }
          }
        }
      } else {
        for (int i = ty; i < cin; i += split) {
          const float* wi = w0 + i * K;
          for (int j = 0; j < K; ++j) {
            const float xv = src.load(i, m0 + j);
#pragma unroll
            for (int q = 0; q < OB; ++q) acc[q] = fmaf(__ldg(wi + q * wrow + j), xv, acc[q]);
          }
        }
      }
    } else {
      // Output position n = nn*S + r: taps r (input nn, x' column nn+1) and r+S (input nn-1, column nn).
      const int nn = n / S, r = n - nn * S;
#pragma unroll 4
      for (int i = ty; i < cin; i += split) {
        const float xa = src.load(i, nn + 1), xb = src.load(i, nn);
        const float* wi = w0 + i * K;
#pragma unroll
        for (int q = 0; q < OB; ++q) {
          acc[q] = fmaf(__ldg(wi + q * wrow + r), xa, acc[q]);
          acc[q] = fmaf(__ldg(wi + q * wrow + r + S), xb, acc[q]);
        }
      }
    }
  }
  if (split > 1) {
#pragma unroll
    for (int q = 0; q < OB; ++q) red[ty][q][tx] = acc[q];
    __syncthreads();
    if (ty == 0) {
#pragma unroll
      for (int q = 0; q < OB; ++q) {
        float s = red[0][q][tx];
        for (int g = 1; g < split; ++g) s += red[g][q][tx];
        acc[q] = s;
      }
    }
  }
  if (ty == 0 && n < t_out) {
#pragma unroll
    for (int q = 0; q < OB; ++q) store_output(p, b, slot, o0 + q, n, acc[q]);
  }
  if (blockIdx.x == 0 && blockIdx.y == 0)
    write_history(p, src, hist_w, ty * blockDim.x + tx, blockDim.x * blockDim.y);
  if (p.done.p) advance_after_last_block(slot_int(p.done, slot), slot_int(p.advance, slot), gridDim.x * gridDim.y);
}

// grid (G, B) with G <= ceil(cout / rows) and rows = kGemvWarps / ksplit output channels per block
// and group, block 32 * kGemvWarps, dynamic smem conv_gemv_smem_bytes(). Block x stages its batch
// row's x' once and computes channel groups x, x + G, ...: alone G covers every group once (the
// lowest latency); batched, fewer blocks per row stage x' fewer times. The ksplit warps of a
// channel take interleaved shares of its reduction and are summed in shared memory in a fixed
// order, so a channel's result does not depend on G.
// x' is staged transposed, [L][cin + 4], so a lane reads its 4 input channels with one LDS.128.
template <int TN>
__global__ void __launch_bounds__(32 * kGemvWarps) conv_gemv_kernel(ConvParams p, Batch batch, int ksplit) {
  extern __shared__ __align__(16) float xs[];  // [L][cin + 4], then red
  const int b = blockIdx.y, slot = batch.slots[b];
  const int tid = threadIdx.x, nthreads = blockDim.x;
  const int cin = p.cin, K = p.kernel, S = p.stride;
  const int warp = tid >> 5, lane = tid & 31, warps = nthreads >> 5;
  const int per_group = warps / ksplit, groups = (p.cout + per_group - 1) / per_group;
  int o = blockIdx.x * per_group + warp / ksplit;
  const int slice = warp % ksplit;
  const int G = 32 / K, GT = G * ksplit, nb = cin / 4;
  const int g = lane / K, j = lane - g * K, gi = slice * G + g;
  bool active = o < p.cout && g < G;
  const float4* w4 = reinterpret_cast<const float4*>(p.w) + static_cast<size_t>(active ? o : 0) * nb * K + j;
  auto load_batch = [&](float4* wv, int ib0) {
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int ib = ib0 + u * GT;
      wv[u] = active && ib < nb ? __ldg(w4 + static_cast<size_t>(ib) * K) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  };
  float4 wv[4];
  load_batch(wv, gi);  // independent of earlier kernels: overlaps their tail
  pdl_wait();

  float* hist_w;
  const Src src = make_src(p, b, slot, &hist_w);
  const int ctx = src.ctx, L = ctx + p.t_in, n_x = cin * L, ldx = cin + 4;
  // Stage x' (read in input order, 16 loads in flight per thread).
  for (int e0 = tid; e0 < n_x; e0 += 16 * nthreads) {
    float v[16];
#pragma unroll
    for (int u = 0; u < 16; ++u) {
      const int e = min(e0 + u * nthreads, n_x - 1), i = e / L;
      v[u] = src.load(i, e - i * L);
    }
#pragma unroll
    for (int u = 0; u < 16; ++u) {
      const int e = e0 + u * nthreads, i = e / L;
      if (e < n_x) xs[(e - i * L) * ldx + i] = v[u];
    }
  }
  __syncthreads();
  if (blockIdx.x == 0) {
    for (int e = tid; e < cin * ctx; e += nthreads) {
      const int i = e / ctx, m = e - i * ctx;
      hist_w[e] = xs[(p.t_in + m) * ldx + i];
    }
  }

  // Number of accumulators in use, x' column of accumulator 0 and the column step between them.
  const int nv = p.transposed ? p.t_in : p.t_in / S;
  const int col0 = p.transposed ? (j >= S ? 0 : 1) : j;
  const int nstride = (p.transposed ? 1 : S) * ldx;
  float* red = xs + L * ldx;
  for (int grp = blockIdx.x; grp < groups; grp += gridDim.x) {
  if (grp != static_cast<int>(blockIdx.x)) {
    // The next channel group: its weights (the first group's were loaded before pdl_wait), after
    // every warp is done reading red for the previous one.
    o = grp * per_group + warp / ksplit;
    active = o < p.cout && g < G;
    w4 = reinterpret_cast<const float4*>(p.w) + static_cast<size_t>(active ? o : 0) * nb * K + j;
    load_batch(wv, gi);
    __syncthreads();
  }
  float acc[TN];
#pragma unroll
  for (int n = 0; n < TN; ++n) acc[n] = 0.f;
  if (active) {
    const float* x0 = xs + col0 * ldx;
    for (int ib0 = gi; ib0 < nb; ib0 += 4 * GT) {
      float4 nxt[4];
      load_batch(nxt, ib0 + 4 * GT);
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int ib = ib0 + u * GT;
        if (ib >= nb) break;
        const float* xr = x0 + 4 * ib;
#pragma unroll
        for (int n = 0; n < TN; ++n) {
          if (n < nv) {
            const float4 xv = *reinterpret_cast<const float4*>(xr + n * nstride);
            float a = acc[n];
            a = fmaf(wv[u].x, xv.x, a);
            a = fmaf(wv[u].y, xv.y, a);
            a = fmaf(wv[u].z, xv.z, a);
            a = fmaf(wv[u].w, xv.w, a);
            acc[n] = a;
          }
        }
      }
#pragma unroll
      for (int u = 0; u < 4; ++u) wv[u] = nxt[u];
    }
  }

  const int lead = warp - slice;  // first warp of this output channel
  if (!p.transposed) {
    // red [warps][TN]: per-warp sums; the channel's outputs add its ksplit warps in order.
#pragma unroll
    for (int n = 0; n < TN; ++n) {
      const float v = warp_sum(acc[n]);
      if (lane == 0) red[warp * TN + n] = v;
    }
    __syncthreads();
    if (slice == 0 && lane < nv && o < p.cout) {
      float v = red[lead * TN + lane];
      for (int q = 1; q < ksplit; ++q) v += red[(lead + q) * TN + lane];
      store_output(p, b, slot, o, lane, v);
    }
  } else {
    // red [warps][32][TN]. Output n*S + r sums lanes with tap r (x[n]) and tap r + S (x[n-1]) over
    // the groups of all ksplit warps.
#pragma unroll
    for (int n = 0; n < TN; ++n) red[(warp * 32 + lane) * TN + n] = acc[n];
    __syncthreads();
    if (slice == 0 && o < p.cout) {
      for (int q = lane; q < S * nv; q += 32) {
        const int n = q / S, r = q - n * S;
        float v = 0.f;
        for (int sl = 0; sl < ksplit; ++sl) {
          const float* rw = red + (lead + sl) * 32 * TN;
          for (int gg = 0; gg < G; ++gg) {
            v += rw[(gg * K + r) * TN + n];
            v += rw[(gg * K + r + S) * TN + n];
          }
        }
        store_output(p, b, slot, o, q, v);
      }
    }
  }
  }
  if (p.done.p) advance_after_last_block(slot_int(p.done, slot), slot_int(p.advance, slot), gridDim.x);
}

// conv_mma (see mimi_conv.cuh): block tile kMmaM rows x kMmaN columns, reduction chunks of kMmaK;
// 4 warps in 2 x 2, each 32 x 32 (2 m16 x 4 n8 tiles). Each chunk is loaded into registers while the
// previous one is multiplied from shared memory: A (weights) with two 16-byte loads per thread, B
// (x' gathered per column) 16 values per thread, one column per thread.
constexpr int kMmaM = 64, kMmaN = 64, kMmaK = 32, kMmaLd = kMmaK + 8;  // smem row: 80 bytes

// Saturates to fp16's finite range (a NaN stays NaN, as the fp32 kernels would carry it).
__device__ __forceinline__ float sat_half(float v) { return isnan(v) ? v : fminf(fmaxf(v, -65504.f), 65504.f); }

__global__ void __launch_bounds__(128) conv_mma_kernel(ConvParams p, Batch batch) {
  __shared__ __align__(16) __half As[kMmaM][kMmaLd];
  __shared__ __align__(16) __half Bs[kMmaN][kMmaLd];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int S = p.stride, taps = p.transposed ? 2 : p.kernel;
  const int M = p.transposed ? S * p.cout : p.cout;
  const int kred = p.cin * taps, kpad = (kred + kMmaK - 1) / kMmaK * kMmaK;
  const int tn = p.transposed ? p.t_in : p.t_in / S;  // columns per batch row
  const int ncols = batch.count * tn;
  const int m0 = blockIdx.y * kMmaM, c0 = blockIdx.x * kMmaN;

  // A: this thread's 16 halves of row ar of each chunk (rows past M read row M - 1, unused).
  const int ar = tid >> 1, ac = (tid & 1) * 16;
  const uint4* wa = reinterpret_cast<const uint4*>(static_cast<const __half*>(p.w16) +
                                                   static_cast<size_t>(min(m0 + ar, M - 1)) * kpad + ac);
  uint4 a_reg[2] = {__ldg(wa), __ldg(wa + 1)};  // weights: before the wait, overlapping the previous kernel
  pdl_wait();

  // B: column jn of the tile, reduction rows kh * 16 .. + 15 of each chunk.
  const int jn = tid & 63, kh = tid >> 6;
  const int col = c0 + jn;
  const bool cvalid = col < ncols;
  const int cb = cvalid ? col / tn : 0, cn = cvalid ? col - cb * tn : 0;
  float* hist_w;
  const Src src = make_src(p, cb, batch.slots[cb], &hist_w);
  const int mbase = p.transposed ? cn + 1 : cn * S, mstep = p.transposed ? -1 : 1;
  float b_reg[16];
  auto gather = [&](int k0) {
    int k = k0 + kh * 16, i = k / taps, j = k - i * taps;
#pragma unroll
    for (int u = 0; u < 16; ++u) {
      b_reg[u] = cvalid && k < kred ? src.load(i, mbase + j * mstep) : 0.f;
      ++k;
      if (++j == taps) j = 0, ++i;
    }
  };
  gather(0);

  float acc[2][4][4];
#pragma unroll
  for (int a = 0; a < 2; ++a)
#pragma unroll
    for (int b = 0; b < 4; ++b)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[a][b][q] = 0.f;
  const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32, g = lane >> 2, c2 = (lane & 3) * 2;
  for (int k0 = 0; k0 < kpad; k0 += kMmaK) {
    *reinterpret_cast<uint4*>(&As[ar][ac]) = a_reg[0];
    *reinterpret_cast<uint4*>(&As[ar][ac + 8]) = a_reg[1];
    uint32_t bp[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) bp[u] = pack_half2(sat_half(b_reg[2 * u]), sat_half(b_reg[2 * u + 1]));
    *reinterpret_cast<uint4*>(&Bs[jn][kh * 16]) = make_uint4(bp[0], bp[1], bp[2], bp[3]);
    *reinterpret_cast<uint4*>(&Bs[jn][kh * 16 + 8]) = make_uint4(bp[4], bp[5], bp[6], bp[7]);
    __syncthreads();
    if (k0 + kMmaK < kpad) {  // the next chunk's loads, in flight during the multiplies
      wa += kMmaK / 8;
      a_reg[0] = __ldg(wa);
      a_reg[1] = __ldg(wa + 1);
      gather(k0 + kMmaK);
    }
#pragma unroll
    for (int ks = 0; ks < kMmaK; ks += 16) {
      uint32_t af[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const int r = wm + mt * 16 + g;
        af[mt][0] = *reinterpret_cast<const uint32_t*>(&As[r][ks + c2]);
        af[mt][1] = *reinterpret_cast<const uint32_t*>(&As[r + 8][ks + c2]);
        af[mt][2] = *reinterpret_cast<const uint32_t*>(&As[r][ks + c2 + 8]);
        af[mt][3] = *reinterpret_cast<const uint32_t*>(&As[r + 8][ks + c2 + 8]);
      }
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) {
        const int cidx = wn + nt * 8 + g;
        const uint32_t b0 = *reinterpret_cast<const uint32_t*>(&Bs[cidx][ks + c2]);
        const uint32_t b1 = *reinterpret_cast<const uint32_t*>(&Bs[cidx][ks + c2 + 8]);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) mma_m16n8k16(acc[mt][nt], af[mt], b0, b1, __half{});
      }
    }
    __syncthreads();
  }

  // Epilogue: c[0], c[1] at (row g, columns 2c, 2c + 1), c[2], c[3] at row g + 8.
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int mrow = m0 + wm + mt * 16 + g + (q >> 1) * 8;
        const int c = c0 + wn + nt * 8 + c2 + (q & 1);
        if (mrow >= M || c >= ncols) continue;
        const int b = c / tn, n = c - b * tn;
        const int r = p.transposed ? mrow / p.cout : 0, o = mrow - r * p.cout;
        store_output(p, b, batch.slots[b], o, p.transposed ? n * S + r : n, acc[mt][nt][q]);
      }
  // The new history of each batch row whose first column is in this tile, by the first row tile.
  if (blockIdx.y == 0) {
    for (int b = (c0 + tn - 1) / tn; b < batch.count && b * tn < c0 + kMmaN; ++b) {
      const Src sb = make_src(p, b, batch.slots[b], &hist_w);
      write_history(p, sb, hist_w, tid, blockDim.x);
    }
  }
}

// conv_im2col (see mimi_conv.cuh): grid (ceil(max(tn * kred, cin * ctx) / 256), B), block 256.
// Thread e of row b writes element e of the row's columns [tn][kred] (x' as conv_mma gathers it)
// and, for e < cin * ctx, element e of the slot's new history.
__global__ void __launch_bounds__(256) conv_im2col_kernel(ConvParams p, float* x, Batch batch) {
  const int b = blockIdx.y, slot = batch.slots[b];
  const int e = blockIdx.x * 256 + threadIdx.x;
  const int S = p.stride, taps = p.transposed ? 2 : p.kernel, kred = p.cin * taps;
  const int tn = p.transposed ? p.t_in : p.t_in / S;
  pdl_wait();
  float* hist_w;
  const Src src = make_src(p, b, slot, &hist_w);
  if (e < tn * kred) {
    const int n = e / kred, k = e - n * kred, i = k / taps, j = k - i * taps;
    const int m = p.transposed ? n + 1 - j : n * S + j;
    x[static_cast<long long>(b) * tn * kred + e] = src.load(i, m);
  }
  if (e < p.cin * src.ctx) {
    const int i = e / src.ctx, m = e - i * src.ctx;
    hist_w[e] = src.load(i, p.t_in + m);
  }
}

// conv_gemm_epilogue: grid (ceil(tn * rows / 256), B), block 256; element (n, row) of row b's
// product c [B * tn][rows] through store_output, as conv_mma's epilogue.
__global__ void __launch_bounds__(256) conv_gemm_epilogue_kernel(ConvParams p, const float* c, Batch batch) {
  const int b = blockIdx.y, slot = batch.slots[b];
  const int e = blockIdx.x * 256 + threadIdx.x;
  const int S = p.stride, M = p.transposed ? S * p.cout : p.cout;
  const int tn = p.transposed ? p.t_in : p.t_in / S;
  pdl_wait();
  if (e >= tn * M) return;
  const int n = e / M, mrow = e - n * M;
  const int r = p.transposed ? mrow / p.cout : 0, o = mrow - r * p.cout;
  store_output(p, b, slot, o, p.transposed ? n * S + r : n, c[static_cast<long long>(b) * tn * M + e]);
}

int gemv_tn(const ConvParams& p) {
  const int nv = p.transposed ? p.t_in : conv_t_out(p);
  for (int tn : {1, 2, 4, 8, 16})
    if (nv <= tn) return tn;
  return 0;
}

// Warps per output channel: enough for ~16 warps per SM over the whole launch, while each warp
// keeps at least 2 float4 groups of its row per lane.
int gemv_ksplit(const ConvParams& p) {
  const int G = 32 / p.kernel, nb = p.cin / 4;
  int ks = 1;
  while (ks < kGemvWarps && p.cout * ks < 2048 && nb >= G * ks * 2 * 2) ks *= 2;
  return ks;
}

int device_sms() {
  static const int sms = [] {
    int dev = 0, n = 0;
    return cudaGetDevice(&dev) == cudaSuccess &&
                   cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && n > 0
               ? n
               : 132;
  }();
  return sms;
}

template <int TN>
void launch_gemv(const ConvParams& p, const Batch& batch, cudaStream_t s) {
  const int ks = gemv_ksplit(p), rows = kGemvWarps / ks;
  const int groups = (p.cout + rows - 1) / rows;
  // Alone: one block per channel group. Batched: about 4 blocks per SM in all (at least 1 per row),
  // so each row's x' is staged a few times instead of once per group.
  const int sms = device_sms();
  const int per_row = batch.count <= 1 ? groups : std::max(1, std::min(groups, 4 * sms / batch.count));
  const dim3 grid(per_row, batch.count);
  launch(conv_gemv_kernel<TN>, grid, dim3(32 * kGemvWarps), conv_gemv_smem_bytes(p), s, p, batch, ks);
}

template <int OB, int KT>
void launch_direct(const ConvParams& p, const Batch& batch, int split, cudaStream_t s) {
  const dim3 grid((conv_t_out(p) + 31) / 32, p.cout / OB, batch.count);
  launch(conv_direct_kernel<OB, KT>, grid, dim3(32, split), 0, s, p, batch);
}

template <int OB>
void launch_direct_k(const ConvParams& p, const Batch& batch, int split, cudaStream_t s) {
  switch (p.transposed ? 0 : p.kernel) {
    case 1: launch_direct<OB, 1>(p, batch, split, s); break;
    case 3: launch_direct<OB, 3>(p, batch, split, s); break;
    case 7: launch_direct<OB, 7>(p, batch, split, s); break;
    case 8: launch_direct<OB, 8>(p, batch, split, s); break;
    case 10: launch_direct<OB, 10>(p, batch, split, s); break;
    case 12: launch_direct<OB, 12>(p, batch, split, s); break;
    default: launch_direct<OB, 0>(p, batch, split, s); break;
  }
}

}  // namespace

void conv_direct(const ConvParams& p, const Batch& batch, cudaStream_t s) {
  const int t_blocks = (conv_t_out(p) + 31) / 32;
  int ob = p.cout % 4 == 0 ? 4 : p.cout % 2 == 0 ? 2 : 1;
  // Fewer channels per thread when that is what it takes to fill the GPU.
  while (ob > 1 && t_blocks * (p.cout / ob) < 256) ob /= 2;
  // 16 input-channel groups pay off from 128 input channels (and for the single-output final conv).
  const int want = p.cin >= 128 || p.cout < 4 ? kMaxSplit : kMaxSplit / 2;
  const int split = p.cin < want ? p.cin : want;
  switch (ob) {
    case 4: launch_direct_k<4>(p, batch, split, s); break;
    case 2: launch_direct_k<2>(p, batch, split, s); break;
    default: launch_direct_k<1>(p, batch, split, s); break;
  }
}

bool conv_gemv_supported(const ConvParams& p) {
  if (p.cin % 4 != 0 || p.kernel > 32 || p.kernel < 1 || gemv_tn(p) == 0) return false;
  if (p.transposed && p.kernel != 2 * p.stride) return false;
  return reinterpret_cast<uintptr_t>(p.w) % 16 == 0;
}

size_t conv_gemv_smem_bytes(const ConvParams& p) {
  const size_t xs = static_cast<size_t>(p.cin + 4) * (conv_ctx(p) + p.t_in);
  const size_t red = static_cast<size_t>(kGemvWarps) * (p.transposed ? 32 : 1) * gemv_tn(p);
  return (xs + red) * sizeof(float);
}

cudaError_t conv_gemv_reserve_smem(size_t bytes) {
  const int b = static_cast<int>(bytes);
  const cudaFuncAttribute a = cudaFuncAttributeMaxDynamicSharedMemorySize;
  cudaError_t e = cudaFuncSetAttribute(conv_gemv_kernel<1>, a, b);
  if (e == cudaSuccess) e = cudaFuncSetAttribute(conv_gemv_kernel<2>, a, b);
  if (e == cudaSuccess) e = cudaFuncSetAttribute(conv_gemv_kernel<4>, a, b);
  if (e == cudaSuccess) e = cudaFuncSetAttribute(conv_gemv_kernel<8>, a, b);
  if (e == cudaSuccess) e = cudaFuncSetAttribute(conv_gemv_kernel<16>, a, b);
  return e;
}

void conv_gemv(const ConvParams& p, const Batch& batch, cudaStream_t s) {
  switch (gemv_tn(p)) {
    case 1: launch_gemv<1>(p, batch, s); break;
    case 2: launch_gemv<2>(p, batch, s); break;
    case 4: launch_gemv<4>(p, batch, s); break;
    case 8: launch_gemv<8>(p, batch, s); break;
    default: launch_gemv<16>(p, batch, s); break;
  }
}

int conv_mma_rows(const ConvParams& p) { return p.transposed ? p.stride * p.cout : p.cout; }

int conv_mma_kpad(const ConvParams& p) {
  const int kred = p.cin * (p.transposed ? 2 : p.kernel);
  return (kred + kMmaK - 1) / kMmaK * kMmaK;
}

bool conv_mma_supported(const ConvParams& p) {
  if (p.done.p != nullptr || p.kernel < 1 || p.stride < 1) return false;
  if (p.transposed && p.kernel != 2 * p.stride) return false;
  return reinterpret_cast<uintptr_t>(p.w16) % 16 == 0;
}

namespace {
dim3 mma_grid(const ConvParams& p, int rows) {
  const int tn = p.transposed ? p.t_in : p.t_in / p.stride;
  return dim3((rows * tn + kMmaN - 1) / kMmaN, (conv_mma_rows(p) + kMmaM - 1) / kMmaM);
}
}  // namespace

int conv_gemm_cols(const ConvParams& p) { return p.transposed ? p.t_in : p.t_in / p.stride; }
int conv_gemm_k(const ConvParams& p) { return p.cin * (p.transposed ? 2 : p.kernel); }

void conv_im2col(const ConvParams& p, float* x, const Batch& batch, cudaStream_t s) {
  const int n = std::max(conv_gemm_cols(p) * conv_gemm_k(p), p.cin * conv_ctx(p));
  launch(conv_im2col_kernel, dim3((n + 255) / 256, batch.count), dim3(256), 0, s, p, x, batch);
}

void conv_gemm_epilogue(const ConvParams& p, const float* c, const Batch& batch, cudaStream_t s) {
  const int n = conv_gemm_cols(p) * conv_mma_rows(p);
  launch(conv_gemm_epilogue_kernel, dim3((n + 255) / 256, batch.count), dim3(256), 0, s, p, c, batch);
}

bool conv_mma_fills_device(const ConvParams& p, int rows) {
  const dim3 g = mma_grid(p, rows);
  return static_cast<long long>(g.x) * g.y >= device_sms();
}

void conv_mma(const ConvParams& p, const Batch& batch, cudaStream_t s) {
  const dim3 grid = mma_grid(p, batch.count);
  launch(conv_mma_kernel, grid, dim3(128), 0, s, p, batch);
}

}  // namespace ppx::kern::mimi
