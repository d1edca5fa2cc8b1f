#include "common.cuh"
#include "lm_misc.cuh"

#include <stdexcept>

namespace ppx::kern {

namespace {

__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__global__ void embed_kernel(const __nv_bfloat16* const* tables, const int32_t* rows, int streams,
                             const int32_t* tok, const int32_t* use_ext, const float* ext, int D,
                             __nv_bfloat16* x) {
  const int b = blockIdx.y;
  for (int d = blockIdx.x * blockDim.x + threadIdx.x; d < D; d += gridDim.x * blockDim.x) {
    float acc = 0.f;
    if (use_ext && use_ext[b]) {
      acc = ext[static_cast<int64_t>(b) * D + d];
    } else {
      // Audio streams 1..streams-1 first, then text (stream 0).
      for (int j = 1; j <= streams; ++j) {
        const int k = j % streams;
        int t = tok[b * streams + k];
        if (t == -1) continue;
        t = t < 0 ? 0 : (t >= rows[k] ? rows[k] - 1 : t);
        acc = __bfloat162float(__float2bfloat16(acc + __bfloat162float(tables[k][static_cast<int64_t>(t) * D + d])));
      }
    }
    x[static_cast<int64_t>(b) * D + d] = __float2bfloat16(acc);
  }
}

// Order-preserving map of a float to uint32 (larger float -> larger key).
__device__ __forceinline__ uint32_t fkey(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

constexpr int kSampleThreads = 1024;

// One block per batch row.
__global__ void __launch_bounds__(kSampleThreads) sample_kernel(SampleArgs a) {
  pdl_trigger();
  pdl_wait();
  const int b = blockIdx.x;
  const float* lg = a.logits + b * a.logits_stride;
  const int n = a.n;
  __shared__ float red[32];
  __shared__ int redi[32];
  __shared__ uint32_t hist[256];
  __shared__ uint32_t whist[kSampleThreads / 32][256];  // per-warp histograms: no atomic pile-up
  __shared__ uint32_t s_prefix, s_remaining;
  __shared__ int s_choice;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  // Argmax over `score(i)` restricted to `keep(i)`; lowest index on ties.
  auto block_argmax = [&](auto score, auto keep) {
    float best = -INFINITY;
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      if (!keep(i)) continue;
      const float v = score(i);
      if (v > best || (v == best && i < bi)) {
        best = v;
        bi = i;
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (ov > best || (ov == best && oi < bi)) {
        best = ov;
        bi = oi;
      }
    }
    __syncthreads();
    if (lane == 0) {
      red[warp] = best;
      redi[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
      const int nw = blockDim.x / 32;
      best = lane < nw ? red[lane] : -INFINITY;
      bi = lane < nw ? redi[lane] : 0x7fffffff;
      for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, best, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > best || (ov == best && oi < bi)) {
          best = ov;
          bi = oi;
        }
      }
      if (lane == 0) s_choice = bi;
    }
    __syncthreads();
    return s_choice;
  };

  const int si = a.slot ? a.slot[b] : b;  // the session parameters' index
  const float temp = a.temp[si];
  int choice;
  if (a.force && a.force[b] >= 0) {
    choice = a.force[b];
  } else if (temp <= 0.f) {
    choice = block_argmax([&](int i) { return lg[i]; }, [](int) { return true; });
  } else {
    // k-th largest key by 4 rounds of 8-bit radix selection.
    const int k = (a.top_k[si] > 0 && a.top_k[si] < n) ? a.top_k[si] : n;
    uint32_t threshold = 0;
    if (k < n) {
      if (threadIdx.x == 0) {
        s_prefix = 0;
        s_remaining = k;
      }
      for (int shift = 24; shift >= 0; shift -= 8) {
        const int nwarps = blockDim.x / 32;
        for (int i = lane; i < 256; i += 32) whist[warp][i] = 0;
        __syncthreads();
        const uint32_t prefix = s_prefix;
        const uint32_t mask = shift == 24 ? 0u : (0xffffffffu << (shift + 8));
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
          const uint32_t key = fkey(lg[i]);
          if ((key & mask) == (prefix & mask)) atomicAdd(&whist[warp][(key >> shift) & 0xffu], 1u);
        }
        __syncthreads();
        for (int i = threadIdx.x; i < 256; i += blockDim.x) {
          uint32_t c = 0;
          for (int w = 0; w < nwarps; ++w) c += whist[w][i];
          hist[i] = c;
        }
        __syncthreads();
        if (warp == 0) {
          // Lane l owns bins 255-8l .. 248-8l (largest first); an exclusive scan over lanes finds
          // the lane holding the k-th largest, which then walks its 8 bins.
          uint32_t own = 0;
          for (int j = 0; j < 8; ++j) own += hist[255 - 8 * lane - j];
          uint32_t incl = own;
          for (int o = 1; o < 32; o <<= 1) {
            const uint32_t v = __shfl_up_sync(0xffffffffu, incl, o);
            if (lane >= o) incl += v;
          }
          const uint32_t excl = incl - own, rem = s_remaining;
          const unsigned hit = __ballot_sync(0xffffffffu, incl >= rem && excl < rem);
          if (lane == __ffs(hit) - 1) {
            uint32_t r = rem - excl, digit = 0;
            for (int j = 0; j < 8; ++j) {
              const int d = 255 - 8 * lane - j;
              if (hist[d] >= r) {
                digit = d;
                break;
              }
              r -= hist[d];
            }
            s_prefix = prefix | (digit << shift);
            s_remaining = r;
          }
        }
        __syncthreads();
      }
      threshold = s_prefix;
    }
    const float mx = block_max([&] {
      float m = -INFINITY;
      for (int i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, lg[i]);
      return m;
    }(), red);
    const uint64_t base = mix64(a.seed[si] ^ mix64(a.counter[si] * 0x9e3779b97f4a7c15ull + a.stream_id));
    choice = block_argmax(
        [&](int i) {
          const uint64_t h = mix64(base + static_cast<uint64_t>(i) * 0xd1342543de82ef95ull);
          const float u = (static_cast<float>(h >> 40) + 0.5f) * (1.0f / 16777216.0f);  // (0, 1)
          const float g = -logf(-logf(u));
          return (lg[i] - mx) / temp + g;
        },
        [&](int i) { return fkey(lg[i]) >= threshold; });
  }
  if (threadIdx.x == 0) {
    a.sampled[b] = choice;
    if (a.next) a.next[b] = (a.provided && a.provided[b]) ? a.target[b] : choice;
  }
}

__global__ void advance_kernel(int32_t* pos, uint64_t* counter, const int32_t* slot, int B) {
  pdl_wait();
  const int b = threadIdx.x;
  if (b < B) {
    if (pos) pos[slot[b]] += 1;
    if (counter) counter[slot[b]] += 1;
  }
}

__global__ void copy_spans_kernel(const __grid_constant__ CopySpans c) {
  pdl_wait();
  const CopySpans::Span sp = c.span[blockIdx.x];
  const auto* src = static_cast<const unsigned char*>(sp.src);
  auto* dst = static_cast<unsigned char*>(sp.dst);
  const bool words = (reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) | sp.bytes) % 4 == 0;
  if (words) {
    for (size_t i = threadIdx.x; i < sp.bytes / 4; i += blockDim.x)
      reinterpret_cast<uint32_t*>(dst)[i] = reinterpret_cast<const uint32_t*>(src)[i];
  } else {
    for (size_t i = threadIdx.x; i < sp.bytes; i += blockDim.x) dst[i] = src[i];
  }
}

__global__ void fill_kernel(__nv_bfloat16* w, int64_t n, uint64_t seed, float scale, float offset) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint64_t h = mix64(seed + static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ull);
    const float u = static_cast<float>(h >> 40) * (1.0f / 8388608.0f) - 1.0f;
    w[i] = __float2bfloat16(offset + scale * u);
  }
}

__global__ void f32_to_bf16_kernel(const float* src, __nv_bfloat16* dst, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = __float2bfloat16(src[i]);
}

}  // namespace

void embed_sum(const __nv_bfloat16* const* tables, const int32_t* rows, int streams, const int32_t* tok,
               const int32_t* use_ext, const float* ext, int D, int B, __nv_bfloat16* x, cudaStream_t s) {
  const int threads = 256;
  embed_kernel<<<dim3((D + threads - 1) / threads, B), threads, 0, s>>>(tables, rows, streams, tok, use_ext, ext, D, x);
}

void sample_tokens(const SampleArgs& a, int B, cudaStream_t s) {
  // Small vocabularies (audio, 2048) are done faster by fewer threads.
  const int threads = a.n > 4096 ? kSampleThreads : 256;
  pdl_launch(sample_kernel, dim3(B), dim3(threads), 0, s, a);
}

void advance(int32_t* pos, uint64_t* counter, const int32_t* slot, int B, cudaStream_t s) {
  pdl_launch(advance_kernel, dim3(1), dim3(32 * ((B + 31) / 32)), 0, s, pos, counter, slot, B);
}

void CopySpans::add(const void* src, void* dst, size_t bytes) {
  if (n >= kMaxCopySpans) throw std::length_error("CopySpans: more than kMaxCopySpans spans");
  span[n++] = {src, dst, bytes};
}

void copy_spans(const CopySpans& c, cudaStream_t s) {
  if (c.n > 0) pdl_launch(copy_spans_kernel, dim3(c.n), dim3(256), 0, s, c);
}

void fill_random_bf16(__nv_bfloat16* w, int64_t n, uint64_t seed, float scale, float offset, cudaStream_t s) {
  fill_kernel<<<1024, 256, 0, s>>>(w, n, seed, scale, offset);
}

void f32_to_bf16(const float* src, __nv_bfloat16* dst, int64_t n, cudaStream_t s) {
  f32_to_bf16_kernel<<<1024, 256, 0, s>>>(src, dst, n);
}

}  // namespace ppx::kern
