#include <cmath>

#include "common.cuh"
#include "lm_attention.cuh"

namespace ppx::kern {
namespace {

constexpr int kSplit = 256;  // ring slots per block in the split-K attention
constexpr int kAttnWarps = 4;
constexpr int kMaxDimsPerLane = 4;  // head dim <= 128

__device__ __forceinline__ bool visible(int idx, int E, int C, int q, int context) {
  if (idx >= E) return false;
  const int delta = idx - E % C;
  const int label = delta <= 0 ? E + delta : E + delta - C;
  return label >= 0 && q - label >= 0 && (context <= 0 || q - label < context);
}

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

// grid (H, splits, B), kAttnWarps warps. Each warp runs an online softmax over its keys; the block
// merges its warps and writes (m, l, acc[hd]) for its split.
__global__ void attention_split_kernel(const __nv_bfloat16* q, RingArgs r, int splits, float* work) {
  pdl_trigger();
  pdl_wait();
  const int h = blockIdx.x, sp = blockIdx.y, b = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int D = r.H * r.hd, dpl = r.hd / 32;
  const int slot = r.slot[b];
  const int qpos = r.pos[slot], E = qpos + 1;
  const float scale = rsqrtf(static_cast<float>(r.hd));
  float qf[kMaxDimsPerLane], acc[kMaxDimsPerLane];
  for (int j = 0; j < dpl; ++j) {
    qf[j] = __bfloat162float(q[static_cast<int64_t>(b) * D + h * r.hd + lane * dpl + j]);
    acc[j] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  const int lo = sp * kSplit, hi = min(lo + kSplit, r.C);
  const int64_t cache0 = static_cast<int64_t>(slot) * r.C * D + h * r.hd + lane * dpl;
  for (int idx = lo + warp; idx < hi; idx += kAttnWarps) {
    if (!visible(idx, E, r.C, qpos, r.context)) continue;
    const __nv_bfloat16* kp = r.k + cache0 + static_cast<int64_t>(idx) * D;
    float sdot = 0.f;
    for (int j = 0; j < dpl; ++j) sdot += qf[j] * __bfloat162float(kp[j]);
    sdot = warp_sum(sdot) * scale;
    const float mn = fmaxf(m, sdot);
    const float corr = expf(m - mn), p = expf(sdot - mn);
    l = l * corr + p;
    const __nv_bfloat16* vp = r.v + cache0 + static_cast<int64_t>(idx) * D;
    for (int j = 0; j < dpl; ++j) acc[j] = acc[j] * corr + p * __bfloat162float(vp[j]);
    m = mn;
  }
  __shared__ float sm[kAttnWarps], sl[kAttnWarps], sacc[kAttnWarps][128];
  if (lane == 0) {
    sm[warp] = m;
    sl[warp] = l;
  }
  for (int j = 0; j < dpl; ++j) sacc[warp][lane * dpl + j] = acc[j];
  __syncthreads();
  if (warp != 0) return;
  float M = -INFINITY;
  for (int w = 0; w < kAttnWarps; ++w) M = fmaxf(M, sm[w]);
  float L = 0.f, out[kMaxDimsPerLane] = {0.f, 0.f, 0.f, 0.f};
  for (int w = 0; w < kAttnWarps; ++w) {
    const float f = sm[w] == -INFINITY ? 0.f : expf(sm[w] - M);
    L += sl[w] * f;
    for (int j = 0; j < dpl; ++j) out[j] += sacc[w][lane * dpl + j] * f;
  }
  float* wp = work + ((static_cast<int64_t>(b) * r.H + h) * splits + sp) * (2 + r.hd);
  if (lane == 0) {
    wp[0] = M;
    wp[1] = L;
  }
  for (int j = 0; j < dpl; ++j) wp[2 + lane * dpl + j] = out[j];
}

// grid (H, B), hd threads: merges the splits.
__global__ void attention_combine_kernel(const float* work, int H, int hd, int splits, __nv_bfloat16* out) {
  pdl_trigger();
  pdl_wait();
  const int h = blockIdx.x, b = blockIdx.y, d = threadIdx.x;
  const float* wp = work + (static_cast<int64_t>(b) * H + h) * splits * (2 + hd);
  float M = -INFINITY;
  for (int s = 0; s < splits; ++s) M = fmaxf(M, wp[s * (2 + hd)]);
  float L = 0.f, acc = 0.f;
  for (int s = 0; s < splits; ++s) {
    const float m = wp[s * (2 + hd)];
    if (m == -INFINITY) continue;
    const float f = expf(m - M);
    L += wp[s * (2 + hd) + 1] * f;
    acc += wp[s * (2 + hd) + 2 + d] * f;
  }
  out[(static_cast<int64_t>(b) * H + h) * hd + d] = __float2bfloat16(L > 0.f ? acc / L : 0.f);
}

// grid (H, B), one warp: append this step's k, v, then attend over steps 0..step.
__global__ void depformer_attention_kernel(const __nv_bfloat16* qkv, RingArgs r, int step, __nv_bfloat16* out) {
  pdl_trigger();
  pdl_wait();
  const int h = blockIdx.x, b = blockIdx.y, lane = threadIdx.x;
  const int D = r.H * r.hd, dpl = r.hd / 32;
  const int slot = r.slot[b];
  const __nv_bfloat16* row = qkv + static_cast<int64_t>(b) * 3 * D + h * r.hd + lane * dpl;
  const int64_t cache0 = static_cast<int64_t>(slot) * r.C * D + h * r.hd + lane * dpl;
  float qf[kMaxDimsPerLane], acc[kMaxDimsPerLane];
  for (int j = 0; j < dpl; ++j) {
    qf[j] = __bfloat162float(row[j]);
    acc[j] = 0.f;
    r.k[cache0 + static_cast<int64_t>(step % r.C) * D + j] = row[D + j];
    r.v[cache0 + static_cast<int64_t>(step % r.C) * D + j] = row[2 * D + j];
  }
  __syncwarp();
  const float scale = rsqrtf(static_cast<float>(r.hd));
  const int E = step + 1;
  float m = -INFINITY, l = 0.f;
  for (int idx = 0; idx < r.C; ++idx) {
    if (!visible(idx, E, r.C, step, 0)) continue;
    const __nv_bfloat16* kp = r.k + cache0 + static_cast<int64_t>(idx) * D;
    float sdot = 0.f;
    for (int j = 0; j < dpl; ++j) sdot += qf[j] * __bfloat162float(kp[j]);
    sdot = warp_sum(sdot) * scale;
    const float mn = fmaxf(m, sdot);
    const float corr = expf(m - mn), p = expf(sdot - mn);
    l = l * corr + p;
    const __nv_bfloat16* vp = r.v + cache0 + static_cast<int64_t>(idx) * D;
    for (int j = 0; j < dpl; ++j) acc[j] = acc[j] * corr + p * __bfloat162float(vp[j]);
    m = mn;
  }
  for (int j = 0; j < dpl; ++j)
    out[static_cast<int64_t>(b) * D + h * r.hd + lane * dpl + j] = __float2bfloat16(l > 0.f ? acc[j] / l : 0.f);
}

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
  const int splits = (r.C + kSplit - 1) / kSplit;
  pdl_launch(attention_split_kernel, dim3(r.H, splits, B), dim3(kAttnWarps * 32), 0, s, q, r, splits, work);
  pdl_launch(attention_combine_kernel, dim3(r.H, B), dim3(r.hd), 0, s, static_cast<const float*>(work), r.H, r.hd,
             splits, out);
}

void depformer_attention(const __nv_bfloat16* qkv, const RingArgs& r, int B, int step, __nv_bfloat16* out,
                         cudaStream_t s) {
  pdl_launch(depformer_attention_kernel, dim3(r.H, B), dim3(32), 0, s, qkv, r, step, out);
}

}  // namespace ppx::kern
