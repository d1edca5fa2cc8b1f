// GEMM policies 4, 5 and 8 (and 6, the default, 8 from 40 rows): the batched int8-weight GEMM on wgmma
// (see lm_gemm_sm90a.cuh). Compiled for sm_90a alone (kernels/CMakeLists.txt); the kernels' bodies
// exist only under the architecture's feature macro, and init() probes for them.
//
// Work split: the grid is (tiles, S). Block (p, s) owns weight rows [128 p, 128 p + 128) (under
// policy 8's fused kGateUp: gate rows [64 p, 64 p + 64) and their up rows N / 2 later) and the K
// slice s, and streams both operands through a cp.async pipeline in k-tiles of KT = 64 (policy 4)
// or 128 (policy 5, where 4 stages fit) with as many stages, up to 8, as fit in shared memory (the
// weight bytes in flight are what bounds an SM's share of the memory bandwidth): the tile's
// 128 x KT weight bytes and the KT columns of every batch row's staged activations (already in
// the MMA's order, so one contiguous copy). Its two warpgroups each own 64 weight rows and all
// batch columns: per 32-wide k step a lane loads 8 consecutive weights of rows g and g + 8 of its
// warp's 16, converts them to fp16 (the A fragments of two k16 MMAs, with the k order inside the
// 32 permuted as in lm_gemm.cu), and issues one m64nNk16 MMA per 32 (or 16) batch columns reading
// the activations from shared memory. One k-tile's MMAs stay in flight while the next tile's
// fragments are loaded and converted (two register sets, wgmma.wait_group 1).
//
// Shared-memory layout of the activations (the "no swizzle" canonical K-major layout of the MMA's B
// operand): per k16 step, per group of 8 batch rows, two 8 x 8 core matrices (k 0-7, then 8-15 of
// the step, in the MMA's k order), each 8 rows of 16 contiguous bytes. So the distance between the
// two core matrices of a group along K is 128 bytes and between groups 256 bytes.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include "lm_gemm_sm90a.cuh"
#include "lm_gemv_impl.cuh"

namespace ppx::kern::gemm_wg {

namespace {

constexpr int kKt = 64;        // k per stage (policy 4; policy 5 takes 128 where it fits)
constexpr int kRows = 128;     // weight rows per block: two warpgroups of 64
constexpr int kThreads = 256;
// Bytes per weight row in a stage: a half warp reads 8 bytes at 8 t of rows g = 0..3 (or 4..7);
// a pitch of 96 (24 words) puts those 16 reads on 32 distinct banks. At k-tiles of 128 a stage
// keeps 160 bytes a row of room (its size fixes the stages and the plan), but the rows sit at 128
// (w_row, below).
constexpr int w_pitch(int kt) { return kt + 32; }
constexpr int w_stage(int kt) { return kRows * w_pitch(kt); }
// At k-tiles of 128 the rows are laid at a pitch of 128 instead (each row one 128-byte line of
// shared memory: a 160-byte pitch made three rows in four straddle two lines, so a quarter warp's
// cp.async took two wavefronts and, as the fp8 attention showed, the L2 more sectors than the row
// holds: docs/PERF.md v0.37), with its 32-byte pieces swizzled by the row (piece ^ (row & 3)) so
// that a half warp's reads still hit 32 distinct banks. The stage keeps w_stage's size, so the
// stages, the k-tiles and the plan are as before.
constexpr bool w_swizzled(int kt) { return kt == 128; }
constexpr int w_row(int kt) { return w_swizzled(kt) ? kt : w_pitch(kt); }
// The byte offset in its row of 32-byte piece c of row r (bytes 32 c .. 32 c + 31 of the k-tile).
template <int KT>
__device__ __forceinline__ int w_piece(int c, int r) {
  return (w_swizzled(KT) ? (c ^ (r & 3)) : c) * 32;
}
constexpr int kMaxUnits = kMaxRows / 16;  // 16-column units of the MMA's N

constexpr int stage_bytes(int nu, int kt) { return w_stage(kt) + nu * 16 * kt * static_cast<int>(sizeof(__half)); }
// As many stages as fit, up to 8, one block an SM: the weight bytes in flight bound an SM's share
// of the bandwidth, and the pipeline copies stages - 2 tiles ahead.
constexpr int stages_of(int nu, int kt) { return std::min(8, 220 * 1024 / stage_bytes(nu, kt)); }
constexpr size_t smem_bytes(int nu, int kt) { return static_cast<size_t>(stages_of(nu, kt)) * stage_bytes(nu, kt); }
// Policy 5 ("wide"): k-tiles of 128, half the barriers and waits per byte, where 4 stages fit (up
// to 128 rows); above, its launches are policy 4's.
constexpr int kt_of(int nu, bool wide) { return wide && stages_of(nu, 128) >= 4 ? 128 : kKt; }
// The k-tile a launch of nu units over K takes (plan() and launch() must agree): 128 needs K % 128.
constexpr int kt_for(int nu, bool wide, int K) { return kt_of(nu, wide && K % 128 == 0); }
static_assert(stages_of(kMaxUnits, kKt) >= 4 && smem_bytes(kMaxUnits, kKt) <= 227 * 1024,
              "the largest block must fit in an SM's shared memory with 4 stages");
static_assert(kt_of(8, true) == 128, "policy 5 takes k-tiles of 128 up to 128 rows");
// The prologue's row in dynamic shared memory: with the kernels' 128 static bytes, within the 48 KB
// a launch gets without an attribute.
constexpr int kMaxStageK = 24512;

// Tiles of an N-row weight: 128 rows each, or (paired: kGateUp, rows n and n + N / 2 together) 64
// gate rows and their 64 up rows. tile_row: the weight row of tile p's row lr (0..127), or -1
// where there is none (past N; paired: past the N / 2 pairs).
__host__ __device__ __forceinline__ int tile_count(int N, bool paired) {
  return paired ? (N / 2 + 63) / 64 : (N + kRows - 1) / kRows;
}
__host__ __device__ __forceinline__ int tile_row(int p, int lr, int N, bool paired) {
  if (!paired) return p * kRows + lr < N ? p * kRows + lr : -1;
  const int h = N / 2, r = p * 64 + (lr & 63);
  return r < h ? (lr < 64 ? r : h + r) : -1;
}

bool g_avail = false;
int g_occ[2][kMaxUnits] = {};  // resident blocks an SM, [wide][NU - 1]

// 8 staged values at k (a multiple of 8) of the row that starts at `row` (xw + (b / 8) * 128 +
// (b % 8) * 8), to the positions the MMA reads (see the file comment).
template <int KT>
__device__ __forceinline__ void put8(__half* row, int bp, int k, const uint32_t* h) {
  const int kt = k / KT, c32 = (k % KT) / 32, t = (k % 32) / 8;
  __half* p = row + static_cast<int64_t>(kt) * bp * KT + 2 * t;
  const int64_t slab = static_cast<int64_t>(bp / 8) * 128;  // halves per k16 step
  // Values 8t + {0,1} and {2,3} are k (2t, 2t+1) and (2t+8, 2t+9) of step 2 c32; {4,5} and {6,7}
  // the same of step 2 c32 + 1.
  *reinterpret_cast<uint32_t*>(p + 2 * c32 * slab) = h[0];
  *reinterpret_cast<uint32_t*>(p + 2 * c32 * slab + 64) = h[1];
  *reinterpret_cast<uint32_t*>(p + (2 * c32 + 1) * slab) = h[2];
  *reinterpret_cast<uint32_t*>(p + (2 * c32 + 1) * slab + 64) = h[3];
}

// The staged activations of rows [0, bp) over K slice blockIdx.x, [k0, k0 + ks): row b's fp16
// values over a power of two at the positions the MMA reads (see the file comment), and
// xscale[slice * kMaxRows + b] that power (taken over the slice, as policy 0 takes it). Rows past
// a.B are zeros. The norms see the whole row (their sum of squares) and write the slice; the plain
// and SiLU inputs read only the slice, so a row is staged by S blocks at once.
template <GemvIn IN, int KT>
__global__ void __launch_bounds__(gemv_impl::kThreads) stage_kernel(GemvArgs a, __half* xw, float* xscale, int bp, int ks) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __nv_bfloat16* xs = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  __shared__ float red[32];
  constexpr bool kWholeRow = IN == GemvIn::kRmsNorm || IN == GemvIn::kEmbRmsNorm;
  const int b = blockIdx.y, K = a.K;
  const int k0 = blockIdx.x * ks, k1 = min(K, k0 + ks);
  __half* row = xw + (b / 8) * 128 + (b % 8) * 8;
  auto put = [&](int k, const uint32_t* h) { put8<KT>(row, bp, k, h); };
  if (b >= a.B) {
    const uint32_t z[4] = {0u, 0u, 0u, 0u};
    for (int k = k0 + threadIdx.x * 8; k < k1; k += blockDim.x * 8) put(k, z);
    return;
  }
  // xs[k - off] holds the bf16 input value k for k in [k0, k1).
  const int off = kWholeRow ? 0 : k0;
  if constexpr (kWholeRow) {
    GemvArgs r = a;
    r.x = a.x + b * a.x_stride;
    if (a.token) r.token = a.token + b;
    if (a.x_out) r.x_out = a.x_out + static_cast<int64_t>(b) * K;
    gemv_impl::stage_x<IN, 1>(r, xs, red);  // writes x_out from slice 0's blocks only
  } else {
    const __nv_bfloat16* x = a.x + b * a.x_stride;
    for (int k = k0 + threadIdx.x * 8; k < k1; k += blockDim.x * 8) {
      uint4 v = *reinterpret_cast<const uint4*>(x + k);
      if constexpr (IN == GemvIn::kSiluGate) {  // gate x[k], up x[K + k], as stage_x
        const uint4 u = *reinterpret_cast<const uint4*>(x + K + k);
        const __nv_bfloat16* gv = reinterpret_cast<const __nv_bfloat16*>(&v);
        const __nv_bfloat16* uv = reinterpret_cast<const __nv_bfloat16*>(&u);
        uint4 o;
        __nv_bfloat16* ov = reinterpret_cast<__nv_bfloat16*>(&o);
#pragma unroll
        for (int i = 0; i < 8; ++i) ov[i] = __float2bfloat16(silu_mul(__bfloat162float(gv[i]), __bfloat162float(uv[i])));
        v = o;
      }
      *reinterpret_cast<uint4*>(xs + (k - off)) = v;
    }
    __syncthreads();
  }
  float mx = 0.f;
  for (int k = k0 + threadIdx.x; k < k1; k += blockDim.x) mx = fmaxf(mx, fabsf(__bfloat162float(xs[k - off])));
  mx = block_max(mx, red);
  const float sc = fp16_pow2_scale(mx);  // as lm_gemm.cu's convert_x_slice
  const float inv = 1.f / sc;            // exact: a power of two
  if (threadIdx.x == 0) xscale[blockIdx.x * kMaxRows + b] = sc;
  for (int k = k0 + threadIdx.x * 8; k < k1; k += blockDim.x * 8) {
    const uint4 u = bf16x8_to_half_scaled(*reinterpret_cast<const uint4*>(xs + (k - off)), inv);
    const uint32_t h[4] = {u.x, u.y, u.z, u.w};
    put(k, h);
  }
}

// The previous GEMM's split-K epilogue for outputs [n_begin, outs) of batch row b (lm_gemm.cu's
// epilogue kernel for them: each output's PS partials added as 0 + p[0] + p[1] + ..., the same
// bits). Each thread takes kU outputs at a time and issues every partial they need before the
// first add; PS is a template argument so that the loads are unconditional (0: the count at run
// time, up to kMaxSlices).
template <GemvOut PO, int PS>
__device__ __forceinline__ void epilogue_row(const GemvArgs& p, const float* ws, int ps, int b, int n_begin, int outs) {
  constexpr int kU = PS > 0 ? 4 : 1;  // (any count: one output at a time, as the epilogue kernel)
  constexpr int kP = PS > 0 ? PS : kMaxSlices;
  constexpr int kC = PO == GemvOut::kGateUp ? 2 : 1;  // columns an output reads: gate and up
  const int64_t sstride = static_cast<int64_t>(p.B) * p.N;
  const float* wrow = ws + static_cast<int64_t>(b) * p.N;
  for (int n0 = n_begin + threadIdx.x; n0 < outs; n0 += kU * static_cast<int>(blockDim.x)) {
    float part[kU][kC][kP];
#pragma unroll
    for (int i = 0; i < kU; ++i) {
      const int n = min(n0 + i * static_cast<int>(blockDim.x), outs - 1);  // past the end: read, not used
#pragma unroll
      for (int c = 0; c < kC; ++c)
#pragma unroll
        for (int s = 0; s < kP; ++s)
          part[i][c][s] = (PS > 0 || s < ps) ? wrow[s * sstride + n + c * (p.N / 2)] : 0.f;
    }
#pragma unroll
    for (int i = 0; i < kU; ++i) {
      const int n = n0 + i * static_cast<int>(blockDim.x);
      if (n >= outs) continue;
      float sum[kC];
#pragma unroll
      for (int c = 0; c < kC; ++c) {
        float v = 0.f;
#pragma unroll
        for (int s = 0; s < kP; ++s)
          if (PS > 0 || s < ps) v += part[i][c][s];
        sum[c] = v;
      }
      gemv_impl::gemm_epilogue<PO>(p, b, n, [&](int col) { return col == n ? sum[0] : sum[kC - 1]; });
    }
  }
}

// A chain's step (GemmChain), grid (S, bp) as stage_kernel<kPlain>: block (s, b) runs the previous
// GEMM's epilogue for the outputs of row b that are this launch's slice s (its input columns
// [s ks, (s + 1) ks)), then stages that slice from them as stage_kernel does (the same values and
// scale: the same bits). Each output is written by one thread of one block, so an in-place
// residual is safe. Rows past a.B: zeros.
template <GemvOut PO, int KT>
__global__ void __launch_bounds__(gemv_impl::kThreads)
    chain_stage_kernel(GemvArgs p, const float* ws, int ps, GemvArgs a, __half* xw, float* xscale, int bp, int ks) {
  static_assert(PO != GemvOut::kLogits, "logits are no GEMM's input");
  extern __shared__ __align__(16) unsigned char smem_raw[];
  __nv_bfloat16* xs = reinterpret_cast<__nv_bfloat16*>(smem_raw);  // the slice's inputs
  __shared__ float red[32];
  const int b = blockIdx.y, K = a.K;
  const int k0 = blockIdx.x * ks, k1 = min(K, k0 + ks);
  __half* row = xw + (b / 8) * 128 + (b % 8) * 8;
  if (b >= a.B) {
    const uint32_t z[4] = {0u, 0u, 0u, 0u};
    for (int k = k0 + threadIdx.x * 8; k < k1; k += blockDim.x * 8) put8<KT>(row, bp, k, z);
    return;
  }
  switch (ps) {  // the slice counts the model's GEMMs take at 40-256 rows, then any
    case 1: epilogue_row<PO, 1>(p, ws, ps, b, k0, k1); break;
    case 2: epilogue_row<PO, 2>(p, ws, ps, b, k0, k1); break;
    case 3: epilogue_row<PO, 3>(p, ws, ps, b, k0, k1); break;
    case 4: epilogue_row<PO, 4>(p, ws, ps, b, k0, k1); break;
    case 8: epilogue_row<PO, 8>(p, ws, ps, b, k0, k1); break;
    default: epilogue_row<PO, 0>(p, ws, ps, b, k0, k1); break;
  }
  __syncthreads();  // the slice's outputs, each written by one thread of this block, are its input
  const __nv_bfloat16* x = a.x + b * a.x_stride;
  for (int k = k0 + threadIdx.x * 8; k < k1; k += blockDim.x * 8)
    *reinterpret_cast<uint4*>(xs + (k - k0)) = *reinterpret_cast<const uint4*>(x + k);
  __syncthreads();
  float mx = 0.f;
  for (int k = k0 + threadIdx.x; k < k1; k += blockDim.x) mx = fmaxf(mx, fabsf(__bfloat162float(xs[k - k0])));
  mx = block_max(mx, red);
  const float sc = fp16_pow2_scale(mx);  // as stage_kernel
  const float inv = 1.f / sc;
  if (threadIdx.x == 0) xscale[blockIdx.x * kMaxRows + b] = sc;
  for (int k = k0 + threadIdx.x * 8; k < k1; k += blockDim.x * 8) {
    const uint4 u = bf16x8_to_half_scaled(*reinterpret_cast<const uint4*>(xs + (k - k0)), inv);
    const uint32_t h[4] = {u.x, u.y, u.z, u.w};
    put8<KT>(row, bp, k, h);
  }
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// The MMA's shared-memory descriptor of B: start address, 128 bytes between the two core matrices
// along K (leading), 256 between groups of 8 batch rows (stride), no swizzle.
__device__ __forceinline__ uint64_t b_desc(const void* p) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  return static_cast<uint64_t>((a & 0x3FFFFu) >> 4) | (static_cast<uint64_t>(128 >> 4) << 16) |
         (static_cast<uint64_t>(256 >> 4) << 32);
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// Keeps the compiler from moving accumulator accesses across the asynchronous MMAs.
__device__ __forceinline__ void fence_operand(float& r) { asm volatile("" : "+f"(r)::"memory"); }
// cp.async's writes (generic proxy) visible to the MMA's reads of shared memory (async proxy).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// d += A (64 x 16, fp16 fragments in a[4] per warp) x B (16 x 32 or 16 x 16 at desc), fp32.
__device__ __forceinline__ void wgmma_n32(float* d, const uint32_t* a, uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "{%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1)
      : "memory");
}
__device__ __forceinline__ void wgmma_n16(float* d, const uint32_t* a, uint64_t desc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(1)
      : "memory");
}

// One k16 step over all NU x 16 batch columns: the step's slab holds NU x 2 groups of 8 rows, at
// descriptor `desc` (its start address in 16-byte units in the low bits: a byte offset below the
// 256 KB of shared memory is added as offset / 16 without a carry out of the field).
template <int NU>
__device__ __forceinline__ void mma_step(float* acc, const uint32_t* a, uint64_t desc) {
#pragma unroll
  for (int i = 0; i < NU / 2; ++i) wgmma_n32(acc + 16 * i, a, desc + i * 4 * 128 * 2 / 16);
  if constexpr (NU % 2 != 0) wgmma_n16(acc + 16 * (NU / 2), a, desc + (NU / 2) * 4 * 128 * 2 / 16);
}
// cp.async of 16 bytes to a shared-space address.
__device__ __forceinline__ void cp_async16_s(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}

// One k-tile of a warpgroup's MMAs, committed as one group: every A fragment of the tile first
// (k16 steps 2c and 2c + 1 of 32-wide chunk c; rows g and g + 8 of this warp's 16 at wr and 8
// rows further; g & 3 is both rows' swizzle) converted into fr, then the MMAs over the
// activations at descriptor xs.
template <int NU, int KT>
__device__ __forceinline__ void mma_ktile(float* acc, uint32_t (&fr)[KT / 16][4], const unsigned char* wr,
                                          uint64_t xs, int g, int t) {
  constexpr int kBp = NU * 16, kWRow = w_row(KT);
#pragma unroll
  for (int i = 0; i < NU * 8; ++i) fence_operand(acc[i]);
#pragma unroll
  for (int c = 0; c < KT / 32; ++c) {
    uint32_t a0[4], a1[4];  // rows g and g + 8 (the same row mod 4)
    int8x8_to_half(wr + w_piece<KT>(c, g) + 8 * t, a0);
    int8x8_to_half(wr + 8 * kWRow + w_piece<KT>(c, g) + 8 * t, a1);
    fr[2 * c][0] = a0[0], fr[2 * c][1] = a1[0], fr[2 * c][2] = a0[1], fr[2 * c][3] = a1[1];
    fr[2 * c + 1][0] = a0[2], fr[2 * c + 1][1] = a1[2];
    fr[2 * c + 1][2] = a0[3], fr[2 * c + 1][3] = a1[3];
  }
  wg_fence();
#pragma unroll
  for (int k16 = 0; k16 < KT / 16; ++k16) mma_step<NU>(acc, fr[k16], xs + k16 * (kBp / 8) * 128 * 2 / 16);
  wg_commit();
}

#endif

// Policy 8's fused end (Epi::mode >= 0, one K slice): the GEMV epilogue applied by the block that
// computed the tile, from shared memory, instead of partial sums and a kernel of its own. kGateUp
// pairs weight rows n and n + N / 2, so there a tile takes 64 gate rows (the first warpgroup) and
// the matching 64 up rows (the second).
struct Epi {
  int mode = -1;  // -1: partial sums only (policies 4 and 5, and 8 over several K slices); else a GemvOut
  const float* w_scale = nullptr;
  __nv_bfloat16* y = nullptr;
  float* yf = nullptr;
  int64_t y_stride = 0;
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// The end of block (blockIdx.x, blockIdx.y)'s tile, from its accumulators: with e.mode < 0 the
// partial sums of slice blockIdx.y, times its activation scales, to ws; else the fused epilogue
// through shared memory (`smem`, kSmem bytes of it, free once every warp is past its MMAs). Every
// thread of the block calls it (the barriers).
template <int NU, size_t kSmem>
__device__ __forceinline__ void finish(const float* acc, unsigned char* smem, int N, int B, float* ws,
                                       const float* xscale, const Epi& e, bool pair) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  // Accumulator 4 j + q is the tile's row lb (+ 8 for q >= 2), batch column 8 j + 2 t + (q & 1) (the
  // m16n8 fragment order, repeated along N).
  const int lb = warp * 16 + g;
  constexpr int kBp = NU * 16;
  static_assert(static_cast<size_t>(kBp) * kRows * sizeof(float) <= kSmem, "the sums fit the stages");
  if (e.mode < 0) {  // the partial sums of slice blockIdx.y, times its activation scales
#pragma unroll
    for (int j = 0; j < 2 * NU; ++j) {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int b = 8 * j + 2 * t + (q & 1), n = tile_row(blockIdx.x, lb + (q >= 2 ? 8 : 0), N, pair);
        if (b < B && n >= 0)
          ws[(static_cast<int64_t>(blockIdx.y) * B + b) * N + n] = acc[4 * j + q] * xscale[blockIdx.y * kMaxRows + b];
      }
    }
    return;
  }
  // The tile's sums, [b][lr] (fused end): over the pipeline's shared memory from its start, free
  // once every warp is past its last MMA.
  float* sums = reinterpret_cast<float*>(smem);
  // One K slice (gridDim.y == 1): the sums stay on the chip. 0.f + p with p rounded first (no FMA
  // contraction), as policy 5 stores p and the epilogue kernel adds it to 0: the same bits, a
  // negative zero's sign included.
  __syncthreads();  // every warp past its MMAs: the stages are free
#pragma unroll
  for (int j = 0; j < 2 * NU; ++j) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int b = 8 * j + 2 * t + (q & 1);
      if (b < B) sums[b * kRows + lb + (q >= 2 ? 8 : 0)] = 0.f + __fmul_rn(acc[4 * j + q], xscale[b]);
    }
  }
  __syncthreads();
  // lm_gemm.cu's epilogue kernel's end (gemv_impl::gemm_epilogue), over the tile: output n of the
  // tile is its row n - 128 p (kGateUp: gate row r at r - 64 p, its up row 64 further).
  GemvArgs o;
  o.N = N;
  o.w_scale = e.w_scale;
  o.y = e.y;
  o.yf = e.yf;
  o.y_stride = e.y_stride;
  const int first = pair ? blockIdx.x * 64 : blockIdx.x * kRows, outs = pair ? 64 : kRows, end = pair ? N / 2 : N;
  for (int i = tid; i < B * outs; i += kThreads) {
    const int b = i / outs, n = first + i % outs;
    if (n >= end) continue;
    const float* row = sums + b * kRows;
    auto sum = [&](int col) { return row[col < end ? col - first : col - end - first + 64]; };
    switch (e.mode) {
      case static_cast<int>(GemvOut::kStore): gemv_impl::gemm_epilogue<GemvOut::kStore>(o, b, n, sum); break;
      case static_cast<int>(GemvOut::kResidual): gemv_impl::gemm_epilogue<GemvOut::kResidual>(o, b, n, sum); break;
      case static_cast<int>(GemvOut::kGateUp): gemv_impl::gemm_epilogue<GemvOut::kGateUp>(o, b, n, sum); break;
      default: gemv_impl::gemm_epilogue<GemvOut::kLogits>(o, b, n, sum); break;
    }
  }
}

#endif

// The grid is (tiles, S): block (p, s) takes k-tiles [s ks / KT, (s + 1) ks / KT) of tile p and
// writes its partial sums at slot s, times slice s's activation scales (or, under policy 8 with one
// slice, applies the epilogue).
template <int NU, int KT>
__global__ void __launch_bounds__(kThreads, 1)
    wg_kernel(const int8_t* w, int N, int K, int ks, const __half* xw, const float* xscale, int B, float* ws, Epi e) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int kBp = NU * 16;
  constexpr int kStages = stages_of(NU, KT);
  static_assert(kStages >= 4, "the pipeline needs two stages ahead");
  constexpr int kXStage = kBp * KT;  // halves of a stage's activations
  constexpr int kWRow = w_row(KT), kWStage = w_stage(KT);
  extern __shared__ __align__(128) unsigned char smem[];
  unsigned char* wst = smem;
  __half* xst = reinterpret_cast<__half*>(smem + kStages * kWStage);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int p = blockIdx.x, kk0 = blockIdx.y * (ks / KT);  // the tile, its first k-tile here
  const int units = min(K / KT, (blockIdx.y + 1) * (ks / KT)) - kk0;  // k-tiles here
  const bool pair = e.mode == static_cast<int>(GemvOut::kGateUp);
  auto grow = [&](int lr) { return tile_row(p, lr, N, pair); };  // the weight row of the tile's row lr
  // This thread's copies of a stage: weight chunks tid + c * kThreads (row chunk / (KT / 16) of
  // the tile, 16 bytes at column chunk % (KT / 16)), then activation chunks of 16 bytes the same
  // way, from bases advanced a k-tile and a stage at each issue (rows past the end read row N - 1:
  // computed, not stored; plan() keeps N x K below 2^31 for the 32-bit row offsets).
  constexpr int kCopies = kRows * KT / 16 / kThreads, kRowStep = kThreads / (KT / 16);
  static_assert(kThreads % (KT / 16) == 0, "whole rows per copy step");
  constexpr int kXChunks = kXStage / 8, kXCopies = (kXChunks + kThreads - 1) / kThreads;
  const uint32_t s_base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  // This thread's row (the same mod 4 for every copy c: kRowStep is a multiple of 4) and 16-byte
  // piece j of it: half j % 2 of its 32-byte piece j / 2.
  static_assert(kRowStep % 4 == 0, "a thread's rows share their swizzle");
  const int w_r = tid / (KT / 16), w_j = tid % (KT / 16);
  const uint32_t w_dst = s_base + w_r * kWRow + w_piece<KT>(w_j / 2, w_r) + (w_j % 2) * 16;
  const uint32_t x_dst = s_base + kStages * kWStage + tid * 16;
  const __half* x_src = xw + tid * 8;
  int roff[kCopies];
#pragma unroll
  for (int c = 0; c < kCopies; ++c) {
    const int n = grow(tid / (KT / 16) + c * kRowStep);
    roff[c] = (n < 0 ? N - 1 : n) * K + (tid % (KT / 16)) * 16;
  }
  int is_kk = kk0, is_stage = 0;
  auto issue = [&](int it) {
    if (it < units) {
      const int8_t* wk = w + is_kk * KT;
      const uint32_t wd = w_dst + is_stage * kWStage;
#pragma unroll
      for (int c = 0; c < kCopies; ++c) cp_async16_s(wd + c * kRowStep * kWRow, wk + roff[c]);
      const __half* xs = x_src + is_kk * kXStage;
      const uint32_t xd = x_dst + is_stage * (kXStage * 2);
#pragma unroll
      for (int c = 0; c < kXCopies; ++c)
        if (kXChunks % kThreads == 0 || tid + c * kThreads < kXChunks) cp_async16_s(xd + c * kThreads * 16, xs + c * kThreads * 8);
      is_stage = is_stage + 1 == kStages ? 0 : is_stage + 1;
      ++is_kk;
    }
    cp_async_commit();  // an empty group past the end keeps the wait counts uniform
  };

  // One k-tile's MMA group stays in flight while the next tile's fragments are loaded and
  // converted: the fragments alternate between two register sets, and a tile's stage is refilled
  // two tiles later (when its group has completed in both warpgroups), so kStages - 2 tiles are
  // copied ahead of the one being multiplied.
  constexpr int kAhead = kStages - 2;
  float acc[NU * 8];
#pragma unroll
  for (int i = 0; i < NU * 8; ++i) acc[i] = 0.f;
  uint32_t fr[2][KT / 16][4];
#pragma unroll
  for (int i = 0; i < kAhead; ++i) issue(i);
  // The stage tile it reads (it % kStages, advanced by one a tile) and the descriptor base of
  // activations of stage 0.
  int cs = 0;
  const uint64_t x_desc = b_desc(xst);
  auto tile = [&](auto set, int it) {
    constexpr int f = decltype(set)::value;
    cp_async_wait<kAhead - 1>();
    fence_proxy_async();
    // Tile it's stage is in for every thread; tile it - 2's group has completed in both warpgroups
    // (each waited for all but its newest group at the end of tile it - 1), so its stage is free.
    __syncthreads();
    issue(it + kAhead);
    const unsigned char* wr = wst + cs * kWStage + (warp * 16 + g) * kWRow;
    const uint64_t xs = x_desc + static_cast<uint32_t>(cs * (kXStage * 2 / 16));
    cs = cs + 1 == kStages ? 0 : cs + 1;
    // Into the set no group in flight reads (tile it - 2's, completed).
    mma_ktile<NU, KT>(acc, fr[f], wr, xs, g, t);  // row warp * 16 + g: g mod 4
    wg_wait<1>();
#pragma unroll
    for (int i = 0; i < NU * 8; ++i) fence_operand(acc[i]);
  };
  int it = 0;
  for (; it + 1 < units; it += 2) {
    tile(std::integral_constant<int, 0>{}, it);
    tile(std::integral_constant<int, 1>{}, it + 1);
  }
  if (it < units) tile(std::integral_constant<int, 0>{}, it);
  wg_wait<0>();
#pragma unroll
  for (int i = 0; i < NU * 8; ++i) fence_operand(acc[i]);
  cp_async_wait<0>();
  finish<NU, smem_bytes(NU, KT)>(acc, smem, N, B, ws, xscale, e, pair);
#else
  (void)w, (void)N, (void)K, (void)ks, (void)xw, (void)xscale, (void)B, (void)ws, (void)e;
  __trap();
#endif
}

__global__ void probe_kernel(int* out) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  *out = 1;
#else
  *out = 0;
#endif
}

using LaunchFn = void (*)(dim3, const GemvArgs&, int, const __half*, const float*, const Epi&, cudaStream_t);
template <int NU, int KT>
void launch_nu(dim3 grid, const GemvArgs& a, int ks, const __half* xw, const float* xscale, const Epi& e,
               cudaStream_t s) {
  wg_kernel<NU, KT><<<grid, kThreads, smem_bytes(NU, KT), s>>>(a.wi8, a.N, a.K, ks, xw, xscale, a.B, a.gemm.ws, e);
}
template <bool kWide, int... I>
constexpr LaunchFn launch_table(int nu, std::integer_sequence<int, I...>) {
  constexpr LaunchFn t[] = {&launch_nu<I + 1, kt_of(I + 1, kWide)>...};
  return t[nu - 1];
}
template <int NU, bool kWide>
bool set_one() {
  constexpr int KT = kt_of(NU, kWide);
  if (cudaFuncSetAttribute(wg_kernel<NU, KT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                           static_cast<int>(smem_bytes(NU, KT))) != cudaSuccess)
    return false;
  int occ = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, wg_kernel<NU, KT>, kThreads, smem_bytes(NU, KT)) !=
      cudaSuccess)
    return false;
  g_occ[kWide ? 1 : 0][NU - 1] = std::max(occ, 1);
  return true;
}
template <int... I>
bool set_smem(std::integer_sequence<int, I...>) {
  return ((set_one<I + 1, false>() && set_one<I + 1, true>()) && ...);
}
template <GemvIn IN>
void stage(const GemvArgs& a, int kt, dim3 grid, size_t smem, __half* xw, float* xscale, int bp, int ks,
           cudaStream_t s) {
  if (kt == 128)
    stage_kernel<IN, 128><<<grid, gemv_impl::kThreads, smem, s>>>(a, xw, xscale, bp, ks);
  else
    stage_kernel<IN, kKt><<<grid, gemv_impl::kThreads, smem, s>>>(a, xw, xscale, bp, ks);
}

template <int KT>
void chain_stage(const GemmChain& c, const GemvArgs& a, __half* xw, float* xscale, int bp, int ks, int S,
                 cudaStream_t s) {
  if (c.slices < 1 || c.slices > kMaxSlices) throw std::logic_error("gemm_wg: a chain's pending epilogue has no valid slice count");
  const GemvArgs& p = c.args;
  const size_t smem = static_cast<size_t>(ks) * sizeof(__nv_bfloat16);
  const dim3 grid(S, bp);
  switch (static_cast<GemvOut>(c.out)) {
    case GemvOut::kStore:
      chain_stage_kernel<GemvOut::kStore, KT><<<grid, gemv_impl::kThreads, smem, s>>>(p, a.gemm.ws, c.slices, a, xw, xscale, bp, ks);
      break;
    case GemvOut::kResidual:
      chain_stage_kernel<GemvOut::kResidual, KT><<<grid, gemv_impl::kThreads, smem, s>>>(p, a.gemm.ws, c.slices, a, xw, xscale, bp, ks);
      break;
    case GemvOut::kGateUp:
      chain_stage_kernel<GemvOut::kGateUp, KT><<<grid, gemv_impl::kThreads, smem, s>>>(p, a.gemm.ws, c.slices, a, xw, xscale, bp, ks);
      break;
    default: throw std::logic_error("gemm_wg: a chain cannot defer the logits' epilogue");
  }
}

}  // namespace

void init() {
  g_avail = false;
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess || major != 9 ||
      minor != 0) {
    (void)cudaGetLastError();
    return;
  }
  int* d = nullptr;
  int h = 0;
  if (cudaMalloc(&d, sizeof(int)) != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  probe_kernel<<<1, 1>>>(d);
  const bool ran = cudaGetLastError() == cudaSuccess && cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess;
  (void)cudaFree(d);
  g_avail = ran && h == 1 && set_smem(std::make_integer_sequence<int, kMaxUnits>{});
  (void)cudaGetLastError();  // a kernel image missing for this device is not an error: policy 0 runs
}

bool available() { return g_avail; }

int tiles_of(const GemvArgs& a, int out) {
  return tile_count(a.N, out == static_cast<int>(GemvOut::kGateUp));
}

int plan(const GemvArgs& a, int B, int sms, bool wide, int out) {
  if (!g_avail || a.wi8 == nullptr || a.K <= 0 || a.K > kMaxStageK || B < 1 || B > kMaxRows) return 0;
  const int KT = kt_for((B + 15) / 16, wide, a.K);
  if (a.K % KT != 0) return 0;
  if (static_cast<int64_t>(a.N) * a.K >= (int64_t{1} << 31)) return 0;  // the kernel's 32-bit row offsets
  const size_t bp = static_cast<size_t>((B + 15) / 16 * 16);
  if (a.gemm.xstage == nullptr || a.gemm.ws == nullptr || a.gemm.xstage_elems < bp * static_cast<size_t>(a.K))
    return 0;
  if (a.gemm.ws_floats <= static_cast<size_t>(kScaleFloats)) return 0;  // the scales sit at its end
  const int kt = a.K / KT;
  const size_t s_ws = (a.gemm.ws_floats - kScaleFloats) / (static_cast<size_t>(B) * static_cast<size_t>(a.N));
  if (s_ws < 1) return 0;
  // K slices: the count with the least estimated time, in units of the time the weights take at the
  // full memory bandwidth. Blocks run in waves of R = sms x resident blocks an SM, and a wave of A
  // blocks draws min(1, A / R) of the bandwidth (v0.25 measured a lone block bound by its MMA and
  // barrier latencies, not by bytes); the partial sums cost S x B x N floats written and read back
  // against the N x K weight bytes. Estimates, to be checked against measurements.
  const int tiles = tiles_of(a, out);
  const int R = sms * g_occ[wide ? 1 : 0][(B + 15) / 16 - 1];
  auto bw = [&](int blocks) { return std::min(1.0, static_cast<double>(blocks) / R); };
  int best_s = 0;
  double best = 0.0;
  for (int S = 1; S <= std::min<int>({static_cast<int>(std::min<size_t>(s_ws, 64)), kt, kMaxSlices}); ++S) {
    const int per = (kt + S - 1) / S;
    if ((kt + per - 1) / per != S) continue;  // another count gives this slice length
    const int blocks = tiles * S, full = blocks / R, rest = blocks % R;
    const double d = 1.0 / blocks;  // a block's share of the weights
    double cost = full * (R * d / bw(R)) + (rest > 0 ? rest * d / bw(rest) : 0.0);
    cost += static_cast<double>(S) * B * 8.0 / a.K;
    if (best_s == 0 || cost < best) best = cost, best_s = S;
  }
  return best_s;
}

void launch(GemvIn in, const GemvArgs& a, int S, bool wide, int out, cudaStream_t s, const GemmChain* prev) {
  if (out >= 0 && S != 1) throw std::runtime_error("gemm_wg::launch: an epilogue in the GEMM needs one K slice");
  wide = wide && a.K % 128 == 0;  // the launch table below takes the k-tile from (nu, wide)
  const int nu = (a.B + 15) / 16, bp = nu * 16, KT = kt_for(nu, wide, a.K);
  const int kt = a.K / KT, ks = (kt + S - 1) / S * KT;
  __half* xw = reinterpret_cast<__half*>(a.gemm.xstage);
  float* xscale = a.gemm.ws + a.gemm.ws_floats - kScaleFloats;
  const dim3 sg(S, bp);  // plan() chose S so that no slice is empty
  const bool whole = in == GemvIn::kRmsNorm || in == GemvIn::kEmbRmsNorm;
  const size_t ssm = static_cast<size_t>(whole ? a.K : ks) * sizeof(__nv_bfloat16);
  if (prev != nullptr && in != GemvIn::kPlain)
    throw std::logic_error("gemm_wg::launch: a chain's next GEMM stages plain rows (its slices are the epilogue's outputs)");
  if (prev != nullptr && KT == 128) {
    chain_stage<128>(*prev, a, xw, xscale, bp, ks, S, s);
  } else if (prev != nullptr) {
    chain_stage<kKt>(*prev, a, xw, xscale, bp, ks, S, s);
  } else switch (in) {
    case GemvIn::kPlain: stage<GemvIn::kPlain>(a, KT, sg, ssm, xw, xscale, bp, ks, s); break;
    case GemvIn::kRmsNorm: stage<GemvIn::kRmsNorm>(a, KT, sg, ssm, xw, xscale, bp, ks, s); break;
    case GemvIn::kSiluGate: stage<GemvIn::kSiluGate>(a, KT, sg, ssm, xw, xscale, bp, ks, s); break;
    case GemvIn::kEmbRmsNorm: stage<GemvIn::kEmbRmsNorm>(a, KT, sg, ssm, xw, xscale, bp, ks, s); break;
  }
  const dim3 grid(tiles_of(a, out), S);
  Epi e;
  if (out >= 0) {
    e.mode = out;
    e.w_scale = a.w_scale;
    e.y = a.y;
    e.yf = a.yf;
    e.y_stride = a.y_stride;
  }
  if (wide)
    launch_table<true>(nu, std::make_integer_sequence<int, kMaxUnits>{})(grid, a, ks, xw, xscale, e, s);
  else
    launch_table<false>(nu, std::make_integer_sequence<int, kMaxUnits>{})(grid, a, ks, xw, xscale, e, s);
}

}  // namespace ppx::kern::gemm_wg
