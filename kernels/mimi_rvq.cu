// Mimi split RVQ (see mimi_rvq.cuh). Each search block scores kEntries codebook entries (a warp per
// entry, float4 lanes over dim, the entries loaded before waiting on the previous kernel), keeps the
// packed minimum per warp and merges it into the slot's cell with atomicMin; the last block of a
// codebook (done counter) publishes the code. Vectors are limited to 512 floats (kMaxPer).
#include <cstdint>

#include "common.cuh"
#include "mimi_device.cuh"
#include "mimi_rvq.cuh"

namespace ppx::kern::mimi {
namespace {

constexpr int kProjWarps = 4;
constexpr int kSearchWarps = 8;
constexpr int kEntries = 32;  // codebook entries per search block

constexpr int kMaxPer = 4;  // float4 per lane per vector: vectors of up to 512 floats

// Loads this lane's float4 share (k = lane + 32 u) of an n-float vector into registers.
__device__ __forceinline__ void load_lanes(float4 (&r)[kMaxPer], const float* a, int n, int lane, bool ok) {
  const float4* a4 = reinterpret_cast<const float4*>(a);
#pragma unroll
  for (int u = 0; u < kMaxPer; ++u) {
    const int k = lane + 32 * u;
    r[u] = ok && k < n / 4 ? __ldg(a4 + k) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

// Warp dot product of register shares with a shared-memory vector.
__device__ __forceinline__ float dot_lanes(const float4 (&r)[kMaxPer], const float* b, int n, int lane) {
  const float4* b4 = reinterpret_cast<const float4*>(b);
  float s = 0.f;
#pragma unroll
  for (int u = 0; u < kMaxPer; ++u) {
    const int k = lane + 32 * u;
    if (k < n / 4) {
      const float4 y = b4[k];
      s = fmaf(r[u].x, y.x, s);
      s = fmaf(r[u].y, y.y, s);
      s = fmaf(r[u].z, y.z, s);
      s = fmaf(r[u].w, y.w, s);
    }
  }
  return warp_sum(s);
}

// grid (ceil(2 dim / kProjWarps), B), block 32 * kProjWarps, dynamic smem in_dim floats.
__global__ void __launch_bounds__(32 * kProjWarps) rvq_project_kernel(RvqEncodeParams p, Batch batch) {
  extern __shared__ __align__(16) float zs[];
  const int b = blockIdx.y, slot = batch.slots[b];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int o = blockIdx.x * kProjWarps + warp;
  const int rows = p.ncb > 1 ? 2 * p.dim : p.dim;
  float4 w[kMaxPer];
  load_lanes(w, p.proj + static_cast<size_t>(o < rows ? o : 0) * p.in_dim, p.in_dim, lane, o < rows);
  pdl_wait();
  const float* z = row(p.z, b, slot);
  for (int i = tid; i < p.in_dim; i += blockDim.x) zs[i] = z[i * p.z.sc];
  if (blockIdx.x == 0 && tid < p.ncb) {
    p.state[static_cast<long long>(slot) * p.state_stride + tid] = 0;
    p.cells[static_cast<long long>(slot) * p.cells_stride + tid] = ~0ull;
  }
  __syncthreads();
  if (o >= rows) return;
  const float v = dot_lanes(w, zs, p.in_dim, lane);
  if (lane == 0) p.resid[slot * p.resid_stride + o] = v;  // rows [dim, 2 dim) land in resid[1]
}

// grid (bpb * count, B), block 32 * kSearchWarps, dynamic smem dim floats.
__global__ void __launch_bounds__(32 * kSearchWarps) rvq_search_kernel(RvqEncodeParams p, int first, int count,
                                                                        int last, Batch batch) {
  constexpr int kPerWarp = kEntries / kSearchWarps;
  extern __shared__ __align__(16) float xs[];
  __shared__ float scratch[32];
  __shared__ unsigned long long best[kSearchWarps];
  const int b = blockIdx.y, slot = batch.slots[b];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int bpb = (p.bins + kEntries - 1) / kEntries;
  const int book = first + blockIdx.x / bpb, chunk = blockIdx.x % bpb;
  const int dim = p.dim;
  // This warp's entries, loaded before waiting on the previous kernel.
  const float* e0 = p.books + static_cast<size_t>(book) * p.bins * dim;
  const float* n0 = p.norms + static_cast<size_t>(book) * p.bins;
  float4 ent[kPerWarp][kMaxPer];
  float nrm[kPerWarp];
#pragma unroll
  for (int u = 0; u < kPerWarp; ++u) {
    const int j = chunk * kEntries + warp + u * kSearchWarps;
    load_lanes(ent[u], e0 + static_cast<size_t>(j < p.bins ? j : 0) * dim, dim, lane, j < p.bins);
    nrm[u] = j < p.bins ? __ldg(n0 + j) : 0.f;
  }
  pdl_wait();
  float* resid = p.resid + slot * p.resid_stride;
  int* done = p.state + static_cast<long long>(slot) * p.state_stride;
  int* codes = done + p.ncb;
  unsigned long long* cells = p.cells + static_cast<long long>(slot) * p.cells_stride;

  // The vector to quantise: resid[book], formed here for the acoustic codebooks after the first.
  float xx = 0.f;
  if (book >= 2) {
    const float* prev = p.books + (static_cast<size_t>(book - 1) * p.bins + codes[book - 1]) * dim;
    for (int d = tid; d < dim; d += blockDim.x) {
      const float v = __fsub_rn(resid[(book - 1) * dim + d], prev[d]);
      xs[d] = v;
      xx = fmaf(v, v, xx);
      if (chunk == 0) resid[book * dim + d] = v;
    }
  } else {
    for (int d = tid; d < dim; d += blockDim.x) {
      const float v = resid[book * dim + d];
      xs[d] = v;
      xx = fmaf(v, v, xx);
    }
  }
  const float xn = block_sum(xx, scratch);  // also the barrier for xs

  unsigned long long mine = ~0ull;
#pragma unroll
  for (int u = 0; u < kPerWarp; ++u) {
    const int j = chunk * kEntries + warp + u * kSearchWarps;
    const float dot = dot_lanes(ent[u], xs, dim, lane);
    const float d2 = fmaxf(__fadd_rn(__fsub_rn(xn, __fmul_rn(2.f, dot)), nrm[u]), 0.f);
    const unsigned long long key = (static_cast<unsigned long long>(__float_as_uint(sqrtf(d2))) << 32) |
                                   static_cast<unsigned int>(j);
    if (j < p.bins && key < mine) mine = key;
  }
  if (lane == 0) best[warp] = mine;
  __syncthreads();
  if (tid == 0) {
    unsigned long long m = best[0];
    for (int w = 1; w < kSearchWarps; ++w) m = best[w] < m ? best[w] : m;
    atomicMin(cells + book, m);
    __threadfence();
    if (atomicAdd(done + book, 1) == bpb - 1) {
      __threadfence();
      const int code = static_cast<int>(atomicAdd(cells + book, 0ull) & 0xffffffffull);
      codes[book] = code;
      p.codes_out[static_cast<long long>(b) * p.ncb + book] = code;
      if (last && book == first + count - 1) atomicAdd(slot_int(p.advance, slot), 1);
    }
  }
}

// grid (ceil(out_dim / kProjWarps), B), block 32 * kProjWarps, dynamic smem 2 * dim floats.
__global__ void __launch_bounds__(32 * kProjWarps) rvq_decode_kernel(RvqDecodeParams p, Batch batch) {
  extern __shared__ __align__(16) float es[];  // [2][dim]: e_0[c_0], sum of the acoustic vectors
  const int b = blockIdx.y, slot = batch.slots[b];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int dim = p.dim;
  const int o = blockIdx.x * kProjWarps + warp;
  const bool ok = o < p.out_dim;
  float4 wf[kMaxPer], wr[kMaxPer];
  load_lanes(wf, p.out_first + static_cast<size_t>(ok ? o : 0) * dim, dim, lane, ok);
  load_lanes(wr, p.out_rest + static_cast<size_t>(ok ? o : 0) * dim, dim, lane, ok);
  pdl_wait();
  const int* codes = p.codes + static_cast<long long>(b) * p.ncb;
  auto code = [&](int k) { return min(max(codes[k], 0), p.bins - 1); };
  const float* sem = p.books + static_cast<size_t>(code(0)) * dim;
  for (int d = tid; d < dim; d += blockDim.x) {
    es[d] = sem[d];
    float a = 0.f;
    for (int k = 1; k < p.ncb; ++k) a = __fadd_rn(a, p.books[(static_cast<size_t>(k) * p.bins + code(k)) * dim + d]);
    es[dim + d] = a;
  }
  __syncthreads();
  if (!ok) return;
  const float a = dot_lanes(wf, es, dim, lane);
  const float r = dot_lanes(wr, es + dim, dim, lane);
  if (lane == 0) {
    const float z = __fadd_rn(a, r);
    float* zprev = p.zprev + slot * p.zprev_stride + o;
    const float zp = *slot_int(p.frame, slot) == 0 ? 0.f : *zprev;
    const int S = p.stride;
    const float* w = p.up_w + static_cast<size_t>(o) * 2 * S;
    float* y = row(p.y, b, slot);
    for (int t = 0; t < S; ++t) y[o * p.y.sc + t * p.y.st] = __fadd_rn(__fmul_rn(w[t], z), __fmul_rn(w[t + S], zp));
    *zprev = z;
  }
}

}  // namespace

void rvq_project(const RvqEncodeParams& p, const Batch& batch, cudaStream_t s) {
  const int rows = p.ncb > 1 ? 2 * p.dim : p.dim;
  const dim3 grid((rows + kProjWarps - 1) / kProjWarps, batch.count);
  launch(rvq_project_kernel, grid, dim3(32 * kProjWarps), p.in_dim * sizeof(float), s, p, batch);
}

void rvq_search(const RvqEncodeParams& p, int first, int count, bool last, const Batch& batch, cudaStream_t s) {
  const int bpb = (p.bins + kEntries - 1) / kEntries;
  const dim3 grid(bpb * count, batch.count);
  launch(rvq_search_kernel, grid, dim3(32 * kSearchWarps), p.dim * sizeof(float), s, p, first, count, last ? 1 : 0,
         batch);
}

void rvq_decode_upsample(const RvqDecodeParams& p, const Batch& batch, cudaStream_t s) {
  const dim3 grid((p.out_dim + kProjWarps - 1) / kProjWarps, batch.count);
  launch(rvq_decode_kernel, grid, dim3(32 * kProjWarps), 2 * p.dim * sizeof(float), s, p, batch);
}

}  // namespace ppx::kern::mimi
