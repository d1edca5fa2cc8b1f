// The batched path of kern::gemv() (lm_gemv.cuh) for B > kMaxGemvBatch rows: a split-K tensor-core
// GEMM (mma.sync m16n8k16, fp32 accumulate) that reads each weight once for the whole batch, with
// bf16 or int8 weights. The prologue (RMSNorm, SiluGate, the depformer's embedding + RMSNorm) runs
// first as its own kernel into GemmScratch::xstage, with the GEMV's own staging code, so the
// activations are those the GEMV would have staged; the epilogues are the GEMV's, in a last kernel
// that sums the split-K partials.
//
// Work split: the grid is (P, S). Block (p, s) owns the K slice s (Ks columns) and the 128-row
// weight tiles p, p + P, ...: it copies its slice of the activations of all B rows (up to 64) into
// shared memory once, then streams the weight tiles through a 4-stage cp.async pipeline in k-tiles
// of 128 bytes per row, so every weight byte is read from memory once and the activations come
// from shared memory. P and S are chosen to give about one block per SM (each holds ~200 KB of
// shared memory). Each of the 8 warps owns 16 weight rows of a tile and all B batch columns.
//
// int8 weights: the tensor cores take fp16. An int8 value becomes fp16 exactly with two integer
// instructions and one subtraction (the fp16 of 1024 + 128 + x has x + 128 in its mantissa), and
// the activations are staged as fp16 divided by a power of two per batch row and slice (chosen so
// the row's largest magnitude is at most 2^14; exact for every value above 2^-28 of that maximum),
// which the block multiplies back into its partial sums. The products are then exactly those of
// bf16 x int8. bf16 weights multiply bf16 activations as they are.
//
// Inside a 32-wide k step a lane loads 8 consecutive weights of rows g and g + 8 of its warp's tile
// and the same 8 activations of batch row g of each 8-row batch tile (g = lane / 4), and feeds
// them to two MMAs: the MMA's k order inside the 32 is permuted identically for weights and
// activations, which leaves the sum unchanged and makes every shared-memory load one contiguous
// 8- or 16-byte access. The summation order differs from the GEMV's, so results agree with it to
// fp32 rounding, not bit for bit.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "lm_gemm_sm90a.cuh"
#include "lm_gemv.cuh"
#include "lm_gemv_impl.cuh"

namespace ppx::kern::gemm_impl {

namespace {

constexpr int kRowGroups = 8;               // warps along a tile's rows, 16 rows each
constexpr int kTileRows = 16 * kRowGroups;  // weight rows per tile
// Column groups: with CG = 2 a block has 16 warps, each pair of warps sharing a row group and
// splitting the batch tiles between them (more warps per SM to hide the shared-memory and MMA
// latencies; each weight fragment is then converted by both warps of the pair).
template <int CG>
constexpr int kThreadsOf = 32 * kRowGroups * CG;
constexpr int kRowBytes = 128;          // bytes of a weight row per k-tile
constexpr int kStages = 4;
// Activation rows in shared memory are padded by 32 elements (16 words), so that the 8 lanes of a
// quarter warp (g = 0, 1; t = 0..3) read 16-byte fragments from 32 distinct banks (the row pitch in
// words is 16 mod 32 for every slice length, a multiple of 64 elements).
constexpr int kXPad = 32;
constexpr int kMaxNt = 8;       // batch tiles of 8: B <= 64 per launch
constexpr int kMaxSlice = 1024;  // K columns of a block's activation slice
constexpr int kSmemLimit = 227 * 1024;

template <typename WT>
struct Fmt;
// kPitch: bytes per weight row of a stage. int8: a lane reads 8 bytes of rows g and g + 8; 160
// bytes (8 words mod 32) puts the 16 lanes of a half warp on 32 distinct banks. bf16: 16-byte
// reads, 144 bytes (the 16 words mod 32 that would avoid every conflict do not fit beside the
// largest activation slice).
template <>
struct Fmt<__nv_bfloat16> {
  using X = __nv_bfloat16;  // activation type in shared memory
  static constexpr int kKt = kRowBytes / 2;  // k per tile
  static constexpr int kPitch = kRowBytes + 16;
};
template <>
struct Fmt<int8_t> {
  using X = __half;
  static constexpr int kKt = kRowBytes;
  static constexpr int kPitch = kRowBytes + 32;
};
template <typename WT>
constexpr int kStageBytes = kTileRows * Fmt<WT>::kPitch;

template <typename WT>
constexpr size_t smem_bytes(int nt, int ks) {
  return static_cast<size_t>(kStages) * kStageBytes<WT> + static_cast<size_t>(nt) * 8 * (ks + kXPad) * 2 +
         static_cast<size_t>(nt) * 8 * sizeof(float);
}
static_assert(smem_bytes<int8_t>(kMaxNt, kMaxSlice) <= kSmemLimit &&
                  smem_bytes<__nv_bfloat16>(kMaxNt, kMaxSlice) <= kSmemLimit,
              "the largest block must fit in an SM's shared memory");

// 8 consecutive weights of one row from shared memory as 4 packed pairs of the MMA's type.
__device__ __forceinline__ void load_a(const unsigned char* p, uint32_t* w, __nv_bfloat16) {
  const uint4 v = *reinterpret_cast<const uint4*>(p);
  w[0] = v.x;
  w[1] = v.y;
  w[2] = v.z;
  w[3] = v.w;
}
__device__ __forceinline__ void load_a(const unsigned char* p, uint32_t* w, int8_t) { int8x8_to_half(p, w); }

// One m16n8 accumulator tile's partial sums into ws[s][b][n]: rows n0 + g (c[0], c[1]) and
// n0 + g + 8 (c[2], c[3]), batch columns b0 + 2t and + 1; outside B x N skipped; for int8 weights
// times the batch row's activation scale.
template <bool kI8>
__device__ __forceinline__ void store_partial(float* ws, const float* c, int s, int B, int N, int b0, int n0, int g,
                                              int t, const float* xscale) {
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int b = b0 + 2 * t + (e & 1), n = n0 + g + (e >= 2 ? 8 : 0);
    if (b >= B || n >= N) continue;
    float v = c[e];
    if constexpr (kI8) v *= xscale[b];
    ws[(static_cast<int64_t>(s) * B + b) * N + n] = v;
  }
}

// The activation slice [k0, k0 + ks_len) of NT x 8 batch rows into shared memory by cp.async, as
// one commit group (rows past B and columns past klen zero-filled); row r at xs + r * xpitch.
template <int NT, int kThreads, typename XT>
__device__ __forceinline__ void stage_x_slice(const __nv_bfloat16* x, int64_t x_stride, int B, int k0, int klen,
                                              int ks_len, XT* xs, int xpitch, int tid) {
  const int cpr = ks_len / 8;  // 16-byte chunks per row
  for (int c = tid; c < NT * 8 * cpr; c += kThreads) {
    const int r = c / cpr, k = (c % cpr) * 8;
    const bool full = r < B && k < klen;
    const __nv_bfloat16* src = x + static_cast<int64_t>(full ? r : 0) * x_stride + k0 + (full ? k : 0);
    cp_async16(xs + r * xpitch + k, src, full);
  }
  cp_async_commit();
}

// For int8 weights: each staged row's largest magnitude, and the row in fp16 over a power of two
// (xscale[r], chosen so the row's largest magnitude is at most 2^14), in place. One warp per row.
template <int NT, int kWarps>
__device__ __forceinline__ void convert_x_slice(__half* xs, int xpitch, int ks_len, float* xscale, int warp, int lane) {
  for (int r = warp; r < NT * 8; r += kWarps) {
    __half* row = xs + r * xpitch;
    float mx = 0.f;
    for (int k = lane * 8; k < ks_len; k += 256) {
      const uint4 u = *reinterpret_cast<const uint4*>(row + k);
      const uint32_t w4[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w4[i]));
        mx = fmaxf(mx, fmaxf(fabsf(f.x), fabsf(f.y)));
      }
    }
    mx = warp_max(mx);
    const float sc = fp16_pow2_scale(mx);
    const float inv = 1.f / sc;  // exact: a power of two
    if (lane == 0) xscale[r] = sc;
    for (int k = lane * 8; k < ks_len; k += 256)
      *reinterpret_cast<uint4*>(row + k) = bf16x8_to_half_scaled(*reinterpret_cast<const uint4*>(row + k), inv);
  }
}

template <typename WT, int NT, int CG>
__global__ void __launch_bounds__(kThreadsOf<CG>) gemm_kernel(const void* wbase, int N, int K, int B,
                                                              const __nv_bfloat16* x, int64_t x_stride, int ks_len,
                                                              float* ws) {
  constexpr int kThreads = kThreadsOf<CG>, kWarps = kThreads / 32;
  // This warp's batch tiles: [j0, j0 + NTW), those below NT.
  constexpr int NTW = (NT + CG - 1) / CG;
  using XT = typename Fmt<WT>::X;
  constexpr int KT = Fmt<WT>::kKt;
  constexpr bool kI8 = std::is_same_v<WT, int8_t>;
  extern __shared__ __align__(16) unsigned char smem[];
  unsigned char* wtiles = smem;
  constexpr int kRowPitch = Fmt<WT>::kPitch;
  XT* xs = reinterpret_cast<XT*>(smem + kStages * kStageBytes<WT>);
  const int xpitch = ks_len + kXPad;  // elements (see kXPad)
  float* xscale = reinterpret_cast<float*>(xs + NT * 8 * xpitch);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int rg = warp % kRowGroups, j0 = CG == 1 ? 0 : (warp / kRowGroups) * NTW;
  const int s = blockIdx.y, k0 = s * ks_len, klen = min(ks_len, K - k0);
  const WT* w = static_cast<const WT*>(wbase);
  const int tiles = (N + kTileRows - 1) / kTileRows;
  const int my_tiles = blockIdx.x < tiles ? (tiles - 1 - blockIdx.x) / gridDim.x + 1 : 0;
  const int ktiles = (klen + KT - 1) / KT;
  const int total = my_tiles * ktiles;

  // Weight k-tile `it` (of this block's sequence) into stage it % kStages: 128 rows x 128 bytes,
  // 4 chunks of 16 bytes per thread; rows past N are clamped (computed, not stored), columns past
  // the slice are zero-filled.
  auto issue = [&](int it) {
    if (it < total) {
      const int tile = blockIdx.x + (it / ktiles) * gridDim.x, kt = it % ktiles;
      unsigned char* st = wtiles + (it % kStages) * kStageBytes<WT>;
#pragma unroll
      for (int c = 0; c < kTileRows * kRowBytes / 16 / kThreads; ++c) {
        const int chunk = tid + c * kThreads, row = chunk / (kRowBytes / 16), col = chunk % (kRowBytes / 16);
        const int n = min(tile * kTileRows + row, N - 1);
        const int k = kt * KT + col * (16 / static_cast<int>(sizeof(WT)));
        const bool full = k < klen;
        const WT* src = w + static_cast<int64_t>(n) * K + k0 + (full ? k : 0);
        cp_async16(st + row * kRowPitch + col * 16, src, full);
      }
    }
    cp_async_commit();  // an empty group past the end keeps the wait counts uniform
  };
  // The activation slice of every batch row, once, by cp.async ahead of the weight stages; then,
  // for int8 weights, converted in place (stage_x_slice, convert_x_slice).
  stage_x_slice<NT, kThreads>(x, x_stride, B, k0, klen, ks_len, xs, xpitch, tid);
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) issue(i);
  cp_async_wait<kStages - 1>();  // the activation group (the weight stages may still be in flight)
  __syncthreads();
  if constexpr (kI8) convert_x_slice<NT, kWarps>(xs, xpitch, ks_len, xscale, warp, lane);
  // (the first __syncthreads of the loop publishes the converted slice)

  float acc[NTW][4];
  for (int it = 0; it < total; ++it) {
    const int kt = it % ktiles;
    if (kt == 0) {
#pragma unroll
      for (int j = 0; j < NTW; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;
    }
    cp_async_wait<kStages - 2>();
    __syncthreads();  // stage it is in for every thread; stage it - 1 is free for the next issue
    issue(it + kStages - 1);
    const unsigned char* st = wtiles + (it % kStages) * kStageBytes<WT> + (rg * 16 + g) * kRowPitch;
#pragma unroll
    for (int kk = 0; kk < KT; kk += 32) {
      uint32_t a0[4], a1[4];  // rows g and g + 8
      load_a(st + (kk + 8 * t) * sizeof(WT), a0, WT{});
      load_a(st + 8 * kRowPitch + (kk + 8 * t) * sizeof(WT), a1, WT{});
      const uint32_t fa[4] = {a0[0], a1[0], a0[1], a1[1]}, fb[4] = {a0[2], a1[2], a0[3], a1[3]};
#pragma unroll
      for (int j = 0; j < NTW; ++j) {
        if (NT % CG != 0 && j0 + j >= NT) break;
        const uint4 xv = *reinterpret_cast<const uint4*>(xs + ((j0 + j) * 8 + g) * xpitch + kt * KT + kk + 8 * t);
        mma_m16n8k16(acc[j], fa, xv.x, xv.y, XT{});
        mma_m16n8k16(acc[j], fb, xv.z, xv.w, XT{});
      }
    }
    if (kt == ktiles - 1) {
      // This tile's partial sums over the slice: ws[s][b][n].
      const int tile = blockIdx.x + (it / ktiles) * gridDim.x;
#pragma unroll
      for (int j = 0; j < NTW; ++j)
        store_partial<kI8>(ws, acc[j], s, B, N, (j0 + j) * 8, tile * kTileRows + rg * 16, g, t, xscale);
    }
  }
  cp_async_wait<0>();
}

// Policy 2 (gemm_set_policy; an experiment, not shipped): "row warps". The block stages its
// activation slice as gemm_kernel does, but each warp then works alone on 32 weight rows at a time
// (two m16 tiles sharing every activation fragment): it streams its rows through a ring of 4
// private shared-memory stages of 64 bytes a row, in which each lane copies (cp.async) exactly the
// 16 bytes a row it later reads, so the main loop needs neither a block barrier nor a warp one.
// Per 16 MMAs a warp reads 4 activation wavefronts where gemm_kernel reads 8 (plus its weights
// from shared memory). The MMA's k order inside a 64-byte chunk is permuted identically for
// weights and activations: lane t holds the chunk's elements [E t, E t + E) (E = 16 int8 or 8
// bf16), and MMA kk of the chunk uses elements E t + 4 kk + {0, 1} as its k pair (2t, 2t + 1) and
// E t + 4 kk + {2, 3} as (2t + 8, 2t + 9).
constexpr int kRwWarps = 8;
constexpr int kRwThreads = 32 * kRwWarps;
constexpr int kRwRows = 32;      // weight rows of a warp's unit
constexpr int kRwChunk = 64;     // bytes of a row per stage
constexpr int kRwStages = 4;
constexpr int kRwStageBytes = kRwRows * kRwChunk;
template <typename WT>
constexpr int kRwXPad = std::is_same_v<WT, int8_t> ? 8 : 32;  // activation row pad (elements): no bank conflicts
template <typename WT>
constexpr size_t rw_smem_bytes(int nt, int ks) {
  return static_cast<size_t>(kRwWarps) * kRwStages * kRwStageBytes +
         static_cast<size_t>(nt) * 8 * (ks + kRwXPad<WT>) * 2 + static_cast<size_t>(nt) * 8 * sizeof(float);
}

template <typename WT, int NT>
__global__ void __launch_bounds__(kRwThreads) gemm_rw_kernel(const void* wbase, int N, int K, int B,
                                                             const __nv_bfloat16* x, int64_t x_stride, int ks_len,
                                                             float* ws) {
  using XT = typename Fmt<WT>::X;
  constexpr bool kI8 = std::is_same_v<WT, int8_t>;
  constexpr int KC = kRwChunk / static_cast<int>(sizeof(WT));  // elements of a row per chunk
  constexpr int E = KC / 4;                                     // a lane's elements of a row per chunk
  constexpr int NL = E / 8;                                     // 16-byte activation loads per batch tile
  extern __shared__ __align__(16) unsigned char smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  unsigned char* ring = smem + warp * kRwStages * kRwStageBytes;
  XT* xs = reinterpret_cast<XT*>(smem + kRwWarps * kRwStages * kRwStageBytes);
  const int xpitch = ks_len + kRwXPad<WT>;
  float* xscale = reinterpret_cast<float*>(xs + NT * 8 * xpitch);
  const int s = blockIdx.y, k0 = s * ks_len, klen = min(ks_len, K - k0);
  const WT* w = static_cast<const WT*>(wbase);
  // This warp's units: row groups first, first + stride, ...
  const int groups = (N + kRwRows - 1) / kRwRows;
  const int first = blockIdx.x * kRwWarps + warp, stride = gridDim.x * kRwWarps;
  const int my_units = first < groups ? (groups - 1 - first) / stride + 1 : 0;
  const int kch = (klen + KC - 1) / KC;
  const int total = my_units * kch;

  // Chunk `it` of this warp's sequence into its stage it % kRwStages: the lane's 16 bytes of rows
  // g, g + 8, g + 16, g + 24 (rows past N clamped, columns past the slice zero-filled).
  auto issue = [&](int it) {
    if (it < total) {
      const int rg = first + (it / kch) * stride, kc = it % kch;
      unsigned char* st = ring + (it % kRwStages) * kRwStageBytes;
      const int k = kc * KC + t * E;
      const bool full = k < klen;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int n = min(rg * kRwRows + g + 8 * i, N - 1);
        cp_async16(st + (g + 8 * i) * kRwChunk + 16 * t, w + static_cast<int64_t>(n) * K + k0 + (full ? k : 0), full);
      }
    }
    cp_async_commit();
  };
  stage_x_slice<NT, kRwThreads>(x, x_stride, B, k0, klen, ks_len, xs, xpitch, tid);
#pragma unroll
  for (int i = 0; i < kRwStages - 1; ++i) issue(i);
  cp_async_wait<kRwStages - 1>();  // the activation group
  __syncthreads();
  if constexpr (kI8) convert_x_slice<NT, kRwWarps>(xs, xpitch, ks_len, xscale, warp, lane);
  __syncthreads();  // the converted slice, for every warp

  float acc[2][NT][4];
  for (int it = 0; it < total; ++it) {
    const int kc = it % kch;
    if (kc == 0) {
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[m][j][e] = 0.f;
    }
    cp_async_wait<kRwStages - 2>();  // this lane's copies of chunk it have landed (only it reads them)
    __syncwarp();                    // (and no read of them is moved above the wait)
    issue(it + kRwStages - 1);       // into the stage this lane finished reading last iteration
    const unsigned char* st = ring + (it % kRwStages) * kRwStageBytes;
    uint4 wv[4];  // rows g, g + 8, g + 16, g + 24
#pragma unroll
    for (int i = 0; i < 4; ++i) wv[i] = *reinterpret_cast<const uint4*>(st + (g + 8 * i) * kRwChunk + 16 * t);
#pragma unroll
    for (int h = 0; h < NL; ++h) {
      uint4 xv[NT];
#pragma unroll
      for (int j = 0; j < NT; ++j)
        xv[j] = *reinterpret_cast<const uint4*>(xs + (j * 8 + g) * xpitch + kc * KC + E * t + 8 * h);
#pragma unroll
      for (int k2 = 0; k2 < 2; ++k2) {
        const int kk = 2 * h + k2;
        // Each row's k pairs for MMA kk: lo = (2t, 2t + 1), hi = (2t + 8, 2t + 9).
        uint32_t lo[4], hi[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const uint32_t* wd = reinterpret_cast<const uint32_t*>(&wv[i]);
          if constexpr (kI8) {
            int8x4_to_half2x2(wd[kk] ^ 0x80808080u, lo[i], hi[i]);
          } else {
            lo[i] = wd[2 * kk];
            hi[i] = wd[2 * kk + 1];
          }
        }
        const uint32_t a0[4] = {lo[0], lo[1], hi[0], hi[1]}, a1[4] = {lo[2], lo[3], hi[2], hi[3]};
#pragma unroll
        for (int j = 0; j < NT; ++j) {
          const uint32_t* xw = reinterpret_cast<const uint32_t*>(&xv[j]);
          mma_m16n8k16(acc[0][j], a0, xw[2 * k2], xw[2 * k2 + 1], XT{});
          mma_m16n8k16(acc[1][j], a1, xw[2 * k2], xw[2 * k2 + 1], XT{});
        }
      }
    }
    if (kc == kch - 1) {
      // This unit's partial sums over the slice: ws[s][b][n].
      const int rg = first + (it / kch) * stride;
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int j = 0; j < NT; ++j)
          store_partial<kI8>(ws, acc[m][j], s, B, N, j * 8, rg * kRwRows + 16 * m, g, t, xscale);
    }
  }
  cp_async_wait<0>();
}

// Sums the S partials of each output and applies the row scale and the GEMV's epilogue.
template <GemvOut OUT>
__global__ void epilogue_kernel(GemvArgs a, const float* ws, int S) {
  const int b = blockIdx.y;
  const int rows = OUT == GemvOut::kGateUp ? a.N / 2 : a.N;
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= rows) return;
  gemv_impl::gemm_epilogue<OUT>(a, b, n, [&](int col) {
    float v = 0.f;
    for (int s = 0; s < S; ++s) v += ws[(static_cast<int64_t>(s) * a.B + b) * a.N + col];
    return v;
  });
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
    *reinterpret_cast<uint4*>(a.gemm.xstage + static_cast<int64_t>(b) * a.K + k) =
        *reinterpret_cast<const uint4*>(xs + k);
}

// The epilogue kernel over c's outputs from S partial sums in ws.
void launch_epilogue(GemvOut out, const GemvArgs& c, const float* ws, int S, cudaStream_t s) {
  const int rows = out == GemvOut::kGateUp ? c.N / 2 : c.N;
  const dim3 eg((rows + 127) / 128, c.B);
  switch (out) {
    case GemvOut::kStore: epilogue_kernel<GemvOut::kStore><<<eg, 128, 0, s>>>(c, ws, S); break;
    case GemvOut::kResidual: epilogue_kernel<GemvOut::kResidual><<<eg, 128, 0, s>>>(c, ws, S); break;
    case GemvOut::kLogits: epilogue_kernel<GemvOut::kLogits><<<eg, 128, 0, s>>>(c, ws, S); break;
    case GemvOut::kGateUp: epilogue_kernel<GemvOut::kGateUp><<<eg, 128, 0, s>>>(c, ws, S); break;
  }
}

int g_sms = 0;
int g_policy = kGemmPolicyAuto;  // gemm_set_policy()
bool g_chain = true;              // gemm_set_chain()
// Policy 3: one cuBLAS handle with its own workspace, made by gemm_set_policy(3) (never freed: a
// measurement hook of the benchmarks and tests).
cublasHandle_t g_blas = nullptr;
void* g_blas_ws = nullptr;
constexpr size_t kBlasWorkspaceBytes = size_t{32} << 20;

void blas_check(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string("lm_gemm policy 3: ") + what + ": " + cublasGetStatusString(st));
}
int g_smem_optin = 0;  // the largest dynamic shared memory a block may opt into on this device

// Lets the kernel use up to what its largest slice needs, or what the device allows (sm_80: 163 KB,
// sm_86/89/120/121: 99 KB, sm_90/100: 227 KB); gemm_batched() then keeps slices within it.
template <typename WT, int NT>
void set_smem_attr() {
  const size_t need = std::min<size_t>(smem_bytes<WT>(NT, kMaxSlice), static_cast<size_t>(g_smem_optin));
  const size_t need_rw = std::min<size_t>(rw_smem_bytes<WT>(NT, kMaxSlice), static_cast<size_t>(g_smem_optin));
  if (cudaFuncSetAttribute(gemm_kernel<WT, NT, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(need)) != cudaSuccess)
    throw std::runtime_error("lm_gemm: cannot set the shared-memory size of the GEMM kernel");
  // The experiments (gemm_set_policy 1, 2): a failure here must not stop the shipped kernel; a
  // launch of theirs would then report it.
  if (cudaFuncSetAttribute(gemm_kernel<WT, NT, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(need)) != cudaSuccess ||
      cudaFuncSetAttribute(gemm_rw_kernel<WT, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(need_rw)) != cudaSuccess)
    (void)cudaGetLastError();
}
template <typename WT, int... NT>
void set_all(std::integer_sequence<int, NT...>) {
  (set_smem_attr<WT, NT + 1>(), ...);
}

template <typename WT, int NT>
void launch_nt(int policy, dim3 grid, size_t smem, const GemvArgs& a, const __nv_bfloat16* x, int64_t xs, int ks,
               float* ws, cudaStream_t s) {
  const void* w = std::is_same_v<WT, int8_t> ? static_cast<const void*>(a.wi8) : static_cast<const void*>(a.w);
  if (policy == 2)
    gemm_rw_kernel<WT, NT><<<grid, kRwThreads, smem, s>>>(w, a.N, a.K, a.B, x, xs, ks, ws);
  else if (policy == 1 && NT >= 2)
    gemm_kernel<WT, NT, 2><<<grid, kThreadsOf<2>, smem, s>>>(w, a.N, a.K, a.B, x, xs, ks, ws);
  else
    gemm_kernel<WT, NT, 1><<<grid, kThreadsOf<1>, smem, s>>>(w, a.N, a.K, a.B, x, xs, ks, ws);
}

template <typename WT>
void launch_gemm(int policy, int nt, dim3 grid, size_t smem, const GemvArgs& a, const __nv_bfloat16* x, int64_t xs,
                 int ks, float* ws, cudaStream_t s) {
  switch (nt) {
    case 1: return launch_nt<WT, 1>(policy, grid, smem, a, x, xs, ks, ws, s);
    case 2: return launch_nt<WT, 2>(policy, grid, smem, a, x, xs, ks, ws, s);
    case 3: return launch_nt<WT, 3>(policy, grid, smem, a, x, xs, ks, ws, s);
    case 4: return launch_nt<WT, 4>(policy, grid, smem, a, x, xs, ks, ws, s);
    case 5: return launch_nt<WT, 5>(policy, grid, smem, a, x, xs, ks, ws, s);
    case 6: return launch_nt<WT, 6>(policy, grid, smem, a, x, xs, ks, ws, s);
    case 7: return launch_nt<WT, 7>(policy, grid, smem, a, x, xs, ks, ws, s);
    default: return launch_nt<WT, 8>(policy, grid, smem, a, x, xs, ks, ws, s);
  }
}

}  // namespace

void init() {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
    g_sms = 132;
  if (cudaDeviceGetAttribute(&g_smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
    g_smem_optin = 48 * 1024;
  set_all<__nv_bfloat16>(std::make_integer_sequence<int, kMaxNt>{});
  set_all<int8_t>(std::make_integer_sequence<int, kMaxNt>{});
  gemm_wg::init();
}

}  // namespace ppx::kern::gemm_impl

namespace ppx::kern {
void gemm_set_policy(int policy) {
  using namespace gemm_impl;
  if (policy < 0 || policy > 8 || policy == 7)
    throw std::invalid_argument("lm_gemm: no GEMM policy " + std::to_string(policy) + " (0-6 and 8)");
  if (policy == 3 && g_blas == nullptr) {
    if (g_blas_ws == nullptr && cudaMalloc(&g_blas_ws, kBlasWorkspaceBytes) != cudaSuccess) {
      g_blas_ws = nullptr;
      throw std::runtime_error("lm_gemm policy 3: cannot allocate the cuBLAS workspace");
    }
    blas_check(cublasCreate(&g_blas), "cublasCreate");
  }
  const bool wg = policy == 4 || policy == 5 || policy == 8;
  if (wg && !gemm_wg::available()) gemm_wg::init();  // before gemv_init() too
  if (wg && !gemm_wg::available())
    throw std::runtime_error("lm_gemm policy " + std::to_string(policy) + ": this device or build has no sm_90a kernels (an H100 or H200 and a "
                             "build with sm_90 among its architectures)");
  g_policy = policy;
}
int gemm_policy() { return gemm_impl::g_policy; }
void gemm_set_chain(bool on) { gemm_impl::g_chain = on; }
bool gemm_chain() { return gemm_impl::g_chain; }
bool gemm_wg_available() { return gemm_wg::available(); }

size_t gemm_xstage_elems(int B, int max_k) {
  return static_cast<size_t>((B + 15) / 16 * 16) * static_cast<size_t>(max_k);
}

// Four K slices of every width up to max_n, or 64K columns of slices (16 of 4096): what the
// full-size model's shapes take (the widest, the text head, 4 slices; 4096-wide ones up to 16).
// gemm_batched() takes fewer slices where this is short, down to the K / 1024 it must have.
// Policy 4 needs at least one slice of a full launch (256 rows) and the launch's activation scales.
size_t gemm_ws_floats(int B, int max_n) {
  const size_t split = static_cast<size_t>(std::min(B, 64)) * std::max<size_t>(4 * static_cast<size_t>(max_n), 65536);
  const size_t wg =
      static_cast<size_t>(std::min(B, gemm_wg::kMaxRows)) * static_cast<size_t>(max_n) + gemm_wg::kScaleFloats;
  return std::max(split, wg);
}

void gemm_chain_flush(const GemmScratch& g, cudaStream_t s) {
  GemmChain* c = g.chain;
  if (c == nullptr || !c->pending) return;
  gemm_impl::launch_epilogue(static_cast<GemvOut>(c->out), c->args, g.ws, c->slices, s);
  c->pending = false;
}
}  // namespace ppx::kern

namespace ppx::kern::gemm_impl {

bool gemm_batched(GemvIn in, GemvOut out, const GemvArgs& a, cudaStream_t s) {
  if (a.w8 != nullptr || a.K % 32 != 0) return false;  // fp8 weights, odd K: the chunked GEMV
  if (a.gemm.xstage == nullptr && in != GemvIn::kPlain) return false;
  if (a.gemm.ws == nullptr) return false;
  // Read once: the plan and the launch must agree. The shipped choice (policy 6): wgmma with
  // k-tiles of 128 where they fit, ending in the epilogue where one K slice runs (policy 8), from
  // kGemmWgMinRows rows where it runs, the mma.sync kernel below (v0.26, v0.28: where each is faster).
  int policy = g_policy;
  if (policy == kGemmPolicyAuto)
    policy = a.wi8 != nullptr && a.B >= kGemmWgMinRows && gemm_wg::available() ? 8 : 0;
  // The activations the GEMM multiplies: x as given (kPlain), or staged by the GEMV's prologue
  // into xstage (bf16 [B, K]).
  auto stage = [&](const __nv_bfloat16*& x, int64_t& xs) {
    x = a.x;
    xs = a.x_stride;
    if (in == GemvIn::kPlain) return;
    const dim3 grid(1, a.B);
    const size_t smem = static_cast<size_t>(a.K) * sizeof(__nv_bfloat16);
    switch (in) {
      case GemvIn::kRmsNorm: stage_rows_kernel<GemvIn::kRmsNorm><<<grid, gemv_impl::kThreads, smem, s>>>(a); break;
      case GemvIn::kSiluGate: stage_rows_kernel<GemvIn::kSiluGate><<<grid, gemv_impl::kThreads, smem, s>>>(a); break;
      case GemvIn::kEmbRmsNorm: stage_rows_kernel<GemvIn::kEmbRmsNorm><<<grid, gemv_impl::kThreads, smem, s>>>(a); break;
      case GemvIn::kPlain: break;
    }
    x = a.gemm.xstage;
    xs = a.K;
  };
  auto epilogue = [&](const GemvArgs& c, int S) { launch_epilogue(out, c, a.gemm.ws, S, s); };
  GemmChain* chain = a.gemm.chain;
  // Policy 3 (gemm_set_policy; an experiment, not shipped): cuBLAS's bf16 GEMM over all B rows,
  // ws [B, N] = x [B, K] . W [N, K]^T with fp32 sums, on the bf16 weights or on the int8 weights'
  // exact bf16 copy (bf16 x bf16 products are exact in fp32, as ours are), then the same epilogue
  // with one "slice". A measurement hook must not measure something else quietly: int8 weights
  // without their copy, or a scratch too small for B x N sums, are errors.
  const __nv_bfloat16* wb = a.wi8 ? a.wq : a.w;
  if (policy == 3) {
    if (wb == nullptr)
      throw std::runtime_error("lm_gemm policy 3: int8 weights without their bf16 copy (build the model after "
                               "gemm_set_policy(3))");
    if (a.gemm.ws_floats < static_cast<size_t>(a.B) * static_cast<size_t>(a.N))
      throw std::runtime_error("lm_gemm policy 3: the GEMM scratch holds fewer than B x N sums (B = " +
                               std::to_string(a.B) + ", N = " + std::to_string(a.N) + ")");
    const __nv_bfloat16* x = nullptr;
    int64_t xs = 0;
    gemm_chain_flush(a.gemm, s);
    stage(x, xs);
    const float one = 1.f, zero = 0.f;
    blas_check(cublasSetStream(g_blas, s), "cublasSetStream");
    blas_check(cublasSetWorkspace(g_blas, g_blas_ws, kBlasWorkspaceBytes), "cublasSetWorkspace");
    blas_check(cublasGemmEx(g_blas, CUBLAS_OP_T, CUBLAS_OP_N, a.N, a.B, a.K, &one, wb, CUDA_R_16BF, a.K, x,
                            CUDA_R_16BF, static_cast<int>(xs), &zero, a.gemm.ws, CUDA_R_32F, a.N,
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
    epilogue(a, 1);
    return true;
  }
  const int sms = g_sms > 0 ? g_sms : 132;
  // Policy 4: int8 weights on wgmma, up to gemm_wg::kMaxRows rows a launch, each launch staging its
  // own rows (the largest fits, so the others do).
  // Policy 8: policy 5, ending in its own epilogue where the launch runs one K slice.
  const bool wide = policy == 5 || policy == 8;
  const int fout = policy == 8 ? static_cast<int>(out) : -1;
  if ((policy == 4 || wide) && a.wi8 != nullptr &&
      gemm_wg::plan(a, std::min(a.B, gemm_wg::kMaxRows), sms, wide) > 0) {
    // A chain (GemvArgs::defer): the pending epilogue whose output this launch reads as plain rows
    // runs inside its staging kernel, a slice per block; one this launch cannot take (a norm needs
    // whole rows) runs first. A launch of one row chunk whose
    // epilogue is a kernel of its own (several K slices) leaves it pending when the caller defers.
    const bool single = a.B <= gemm_wg::kMaxRows;
    const GemvArgs* pa = chain != nullptr ? &chain->args : nullptr;
    const bool fuse = chain != nullptr && chain->pending && single && in == GemvIn::kPlain && a.x == pa->y &&
                      a.x_stride == pa->y_stride && a.B == pa->B &&
                      a.K == (chain->out == static_cast<int>(GemvOut::kGateUp) ? pa->N / 2 : pa->N);
    if (!fuse) gemm_chain_flush(a.gemm, s);
    for (int b0 = 0; b0 < a.B; b0 += gemm_wg::kMaxRows) {
      GemvArgs c = a;
      c.B = std::min(a.B - b0, gemm_wg::kMaxRows);
      c.x = a.x + static_cast<int64_t>(b0) * a.x_stride;
      if (a.token) c.token = a.token + b0;
      if (a.x_out) c.x_out = a.x_out + static_cast<int64_t>(b0) * a.K;
      if (a.y) c.y = a.y + static_cast<int64_t>(b0) * a.y_stride;
      if (a.yf) c.yf = a.yf + static_cast<int64_t>(b0) * a.y_stride;
      // Policy 8 fuses where policy 5's plan runs one K slice, so it computes what 5 computes.
      const int S = gemm_wg::plan(c, c.B, sms, wide, -1);
      const int fo = S == 1 ? fout : -1;
      gemm_wg::launch(in, c, S, wide, fo, s, fuse ? chain : nullptr);
      if (fuse) {
        chain->pending = false;
        ++chain->fused;
      }
      if (fo < 0 && a.defer && g_chain && chain != nullptr && single && out != GemvOut::kLogits) {
        chain->pending = true;
        chain->out = static_cast<int>(out);
        chain->slices = S;
        chain->args = c;
      } else if (fo < 0) {
        epilogue(c, S);
      }
    }
    return true;
  }
  const int bmax = std::min(a.B, 8 * kMaxNt);
  const bool rw = policy == 2;
  auto smem_of = [&](int nt, int ks_len) {
    if (rw) return a.wi8 ? rw_smem_bytes<int8_t>(nt, ks_len) : rw_smem_bytes<__nv_bfloat16>(nt, ks_len);
    return a.wi8 ? smem_bytes<int8_t>(nt, ks_len) : smem_bytes<__nv_bfloat16>(nt, ks_len);
  };
  // KT: the slice's granule (a k-tile of gemm_kernel; for gemm_rw_kernel 64 elements, a whole number
  // of its chunks that keeps the activation rows' bank pattern).
  const int KT = rw ? 64 : a.wi8 ? Fmt<int8_t>::kKt : Fmt<__nv_bfloat16>::kKt;
  const int kmax = (a.K + KT - 1) / KT;  // granules in all
  // The longest slice (whole granules, at most kMaxSlice) whose block fits the device's shared
  // memory at the largest chunk's batch tiles; none: the chunked GEMV.
  int max_slice = kMaxSlice / KT * KT;
  while (max_slice >= KT && smem_of((bmax + 7) / 8, max_slice) > static_cast<size_t>(g_smem_optin)) max_slice -= KT;
  if (max_slice < KT) return false;
  const int s_need = (a.K + max_slice - 1) / max_slice;
  const int s_ws = static_cast<int>(std::min<size_t>(a.gemm.ws_floats / (static_cast<size_t>(bmax) * a.N), kmax));
  if (s_ws < s_need) return false;  // the partial sums do not fit the scratch
  int S = 0, P = 0, ks = 0;
  if (!rw) {
    // K slices: at least K / max_slice of them (the slice must fit in shared memory), more while
    // the tiles alone leave SMs idle; then as many tile groups as fill the SMs with one block each.
    const int tiles = (a.N + kTileRows - 1) / kTileRows;
    S = std::min(std::max(s_need, (sms + tiles - 1) / tiles), s_ws);
    ks = (kmax + S - 1) / S * KT;  // slice length, a whole number of k-tiles
    S = (a.K + ks - 1) / ks;
    P = std::max(1, std::min(tiles, sms / S));
  } else {
    // One block an SM: P x S blocks, each warp of a block on row groups of 32 for its slice. The
    // slice count with the least estimated time: the longest warp's chunks (~0.5 us a 64-wide
    // chunk, 8 warps an SM streaming ~16 KB per round) plus the partial sums it writes and the
    // epilogue reads back (S x B x N floats, ~3 TB/s). Estimates to be measured, not fitted.
    constexpr double kChunkUs = 0.5, kPartialBytesPerUs = 3e6;
    const int groups = (a.N + kRwRows - 1) / kRwRows;
    double best = 0;
    for (int cand = s_need; cand <= std::min(s_ws, sms); ++cand) {
      const int cks = (kmax + cand - 1) / cand * KT;
      const int cs = (a.K + cks - 1) / cks;
      if (cs != cand) continue;  // another count gives this slice length
      const int cp = std::max(1, std::min(sms / cs, (groups + kRwWarps - 1) / kRwWarps));
      const int units = (groups + cp * kRwWarps - 1) / (cp * kRwWarps);
      const double cost = static_cast<double>(units) * (cks / KT) * kChunkUs +
                          static_cast<double>(cs) * bmax * a.N * 8.0 / kPartialBytesPerUs;
      if (S == 0 || cost < best) {
        best = cost;
        S = cs;
        P = cp;
        ks = cks;
      }
    }
    if (S == 0) return false;
  }
  if (ks > max_slice) return false;
  const __nv_bfloat16* x = nullptr;
  int64_t xs = 0;
  gemm_chain_flush(a.gemm, s);
  stage(x, xs);
  for (int b0 = 0; b0 < a.B; b0 += 8 * kMaxNt) {
    GemvArgs c = a;
    c.B = std::min(a.B - b0, 8 * kMaxNt);
    if (a.y) c.y = a.y + static_cast<int64_t>(b0) * a.y_stride;
    if (a.yf) c.yf = a.yf + static_cast<int64_t>(b0) * a.y_stride;
    const int nt = (c.B + 7) / 8;
    const size_t smem = smem_of(nt, ks);
    const dim3 grid(P, S);
    const __nv_bfloat16* xc = x + static_cast<int64_t>(b0) * xs;
    if (a.wi8)
      launch_gemm<int8_t>(policy, nt, grid, smem, c, xc, xs, ks, a.gemm.ws, s);
    else
      launch_gemm<__nv_bfloat16>(policy, nt, grid, smem, c, xc, xs, ks, a.gemm.ws, s);
    epilogue(c, S);
  }
  return true;
}

}  // namespace ppx::kern::gemm_impl
