// Mimi streaming attention (see mimi_attention.cuh). One block owns one head of one slot: it rotates
// the call's queries and keys, writes the keys/values into its head's columns of the ring (no other
// block touches them), then scores every ring slot, applies the softmax over the visible ones and
// sums the values. Ring slots never written or not visible are skipped, never multiplied by zero, so
// uninitialised cache memory cannot leak into the result.
#include "common.cuh"
#include "mimi_attention.cuh"
#include "mimi_device.cuh"

namespace ppx::kern::mimi {
namespace {

constexpr int kThreads = 256;

// Position label of ring slot idx once `end` tokens have been written (-1: never written).
__device__ __forceinline__ long long slot_pos(int idx, long long end, int capacity) {
  if (idx >= end) return -1;
  const long long delta = idx - end % capacity;
  return delta <= 0 ? end + delta : end + delta - capacity;
}

// grid (heads, B), block kThreads, dynamic smem attention_smem_bytes(). HD: head dim (32, 64, 128).
template <int HD>
__global__ void __launch_bounds__(kThreads) attention_kernel(AttentionParams p, Batch batch) {
  constexpr int E = HD / 32;  // dims per lane when summing values
  extern __shared__ __align__(16) float sm[];
  __shared__ float scratch[32];
  const int h = blockIdx.x, b = blockIdx.y, slot = batch.slots[b];
  const int tid = threadIdx.x, nt = blockDim.x, lane = tid & 31, warp = tid >> 5, nwarps = nt >> 5;
  const int T = p.tokens, C = p.capacity, D = p.dim, TH = T * HD;
  float* sq = sm;           // [T][HD] rotated queries
  float* sc = sq + TH;      // [T][C] scores, then probabilities
  float* red = sc + T * C;  // [nwarps][T][HD] partial outputs
  pdl_wait();

  const long long offset = static_cast<long long>(*slot_int(p.frame, slot)) * T;
  const long long end = offset + T;
  const float* qkv = p.qkv + slot * p.qkv_stride;
  float* kc = p.k_cache + slot * p.cache_stride;
  float* vc = p.v_cache + slot * p.cache_stride;
  float* out = p.out + slot * p.out_stride;

  // 1. RoPE (interleaved pairs) on q and k; append k, v to the ring.
  for (int e = tid; e < T * (HD / 2); e += nt) {
    const int t = e / (HD / 2), i = e - t * (HD / 2);
    const float theta = __fmul_rn(static_cast<float>(offset + t), p.omega[i]);
    const float cs = cosf(theta), sn = sinf(theta);
    const float* qr = qkv + static_cast<size_t>(t) * 3 * D + h * HD + 2 * i;
    const float* kr = qr + D;
    const float* vr = qr + 2 * D;
    const size_t ring = static_cast<size_t>((offset + t) % C) * D + h * HD + 2 * i;
    sq[t * HD + 2 * i] = __fsub_rn(__fmul_rn(qr[0], cs), __fmul_rn(qr[1], sn));
    sq[t * HD + 2 * i + 1] = __fadd_rn(__fmul_rn(qr[0], sn), __fmul_rn(qr[1], cs));
    kc[ring] = __fsub_rn(__fmul_rn(kr[0], cs), __fmul_rn(kr[1], sn));
    kc[ring + 1] = __fadd_rn(__fmul_rn(kr[0], sn), __fmul_rn(kr[1], cs));
    vc[ring] = vr[0];
    vc[ring + 1] = vr[1];
  }
  __syncthreads();

  // 2. Scores of visible slots (thread per slot, whole key row in flight); -inf marks the others.
  for (int idx = tid; idx < C; idx += nt) {
    const long long pos = slot_pos(idx, end, C);
    bool any = false;
    for (int t = 0; t < T; ++t) {
      const long long q = offset + t;
      any |= pos >= 0 && q - pos >= 0 && (p.context <= 0 || q - pos < p.context);
    }
    float4 kv[HD / 4];
    if (any) {
      const float4* k4 = reinterpret_cast<const float4*>(kc + static_cast<size_t>(idx) * D + h * HD);
#pragma unroll
      for (int d = 0; d < HD / 4; ++d) kv[d] = k4[d];
    }
    for (int t = 0; t < T; ++t) {
      const long long q = offset + t;
      const bool vis = pos >= 0 && q - pos >= 0 && (p.context <= 0 || q - pos < p.context);
      float s = -INFINITY;
      if (vis) {
        const float4* q4 = reinterpret_cast<const float4*>(sq + t * HD);
        float a = 0.f;
#pragma unroll
        for (int d = 0; d < HD / 4; ++d) {
          const float4 qv = q4[d];
          a = fmaf(qv.x, kv[d].x, a);
          a = fmaf(qv.y, kv[d].y, a);
          a = fmaf(qv.z, kv[d].z, a);
          a = fmaf(qv.w, kv[d].w, a);
        }
        s = a * p.scale;
      }
      sc[t * C + idx] = s;
    }
  }
  __syncthreads();

  // 3. Softmax per token over the visible slots (none visible: all probabilities 0, output 0).
  for (int t = 0; t < T; ++t) {
    float* st = sc + t * C;
    float mx = -INFINITY;
    for (int idx = tid; idx < C; idx += nt) mx = fmaxf(mx, st[idx]);
    mx = block_max(mx, scratch);
    float sum = 0.f;
    for (int idx = tid; idx < C; idx += nt) {
      const float e = st[idx] == -INFINITY ? 0.f : expf(st[idx] - mx);
      st[idx] = e;
      sum += e;
    }
    sum = block_sum(sum, scratch);
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    for (int idx = tid; idx < C; idx += nt) st[idx] *= inv;
    __syncthreads();  // scratch reuse by the next token's reductions, sc reads below
  }

  // 4. Warp w sums slots w, w + nwarps, ...; lane owns dims [lane*E, lane*E + E). A zero probability
  //    (not visible) selects 0 instead of the value, so unwritten cache memory never enters.
  float acc[2][E];
#pragma unroll
  for (int t = 0; t < 2; ++t)
#pragma unroll
    for (int e = 0; e < E; ++e) acc[t][e] = 0.f;
  constexpr int U = 16;  // slots per batch of loads in flight
  const float* vbase = vc + h * HD + lane * E;
  for (int idx0 = warp; idx0 < C; idx0 += U * nwarps) {
    float vv[U][E], pr[U][2];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int idx = idx0 + u * nwarps;
      const int ic = idx < C ? idx : 0;
#pragma unroll
      for (int e = 0; e < E; ++e) vv[u][e] = vbase[static_cast<size_t>(ic) * D + e];
#pragma unroll
      for (int t = 0; t < 2; ++t) pr[u][t] = (idx < C && t < T) ? sc[t * C + ic] : 0.f;
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int e = 0; e < E; ++e) acc[t][e] = fmaf(pr[u][t], pr[u][t] != 0.f ? vv[u][e] : 0.f, acc[t][e]);
  }
#pragma unroll
  for (int t = 0; t < 2; ++t)
    if (t < T)
#pragma unroll
      for (int e = 0; e < E; ++e) red[(warp * T + t) * HD + lane * E + e] = acc[t][e];
  __syncthreads();
  for (int e = tid; e < TH; e += nt) {
    float a = red[e];
    for (int w = 1; w < nwarps; ++w) a += red[w * TH + e];
    const int t = e / HD, d = e - t * HD;
    out[static_cast<size_t>(t) * D + h * HD + d] = a;
  }
}

}  // namespace

bool attention_supported(const AttentionParams& p) {
  const int hd = p.heads > 0 ? p.dim / p.heads : 0;
  return (hd == 32 || hd == 64 || hd == 128) && p.dim == hd * p.heads && p.tokens >= 1 && p.tokens <= 2 &&
         p.capacity >= 1;
}

size_t attention_smem_bytes(const AttentionParams& p) {
  const size_t th = static_cast<size_t>(p.tokens) * (p.dim / p.heads);
  return (th + static_cast<size_t>(p.tokens) * p.capacity + (kThreads / 32) * th) * sizeof(float);
}

void attention(const AttentionParams& p, const Batch& batch, cudaStream_t s) {
  const dim3 grid(p.heads, batch.count);
  const size_t smem = attention_smem_bytes(p);
  switch (p.dim / p.heads) {
    case 32: launch(attention_kernel<32>, grid, dim3(kThreads), smem, s, p, batch); break;
    case 64: launch(attention_kernel<64>, grid, dim3(kThreads), smem, s, p, batch); break;
    default: launch(attention_kernel<128>, grid, dim3(kThreads), smem, s, p, batch); break;
  }
}

}  // namespace ppx::kern::mimi
