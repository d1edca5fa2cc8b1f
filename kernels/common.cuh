// Device helpers shared by the kernels: bf16 conversion, warp and block reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

namespace ppx::kern {

// One warp's mma.sync m16n8k16 with fp32 accumulators c[4] (A row-major 16 x 16 in a[4], B
// column-major 16 x 8 in b0, b1; the tag picks bf16 or f16 operands).
__device__ __forceinline__ void mma_m16n8k16(float* c, const uint32_t* a, uint32_t b0, uint32_t b1, __nv_bfloat16) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_m16n8k16(float* c, const uint32_t* a, uint32_t b0, uint32_t b1, __half) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four int8 values x, given as the bytes x + 128 (the word ^ 0x80808080, first value in the low
// byte) -> two fp16 pairs, exact: lo = values 0, 1 and hi = values 2, 3 (first in the low half). The
// byte x + 128 under the exponent of 1024 is the fp16 1024 + x + 128; minus 1152.
__device__ __forceinline__ void int8x4_to_half2x2(uint32_t u, uint32_t& lo, uint32_t& hi) {
  const __half2 bias = __halves2half2(__ushort_as_half(0x6480), __ushort_as_half(0x6480));  // 1152
  const uint32_t l = __byte_perm(u, 0x64646464u, 0x5140), h = __byte_perm(u, 0x64646464u, 0x7362);
  const __half2 lf = __hsub2(*reinterpret_cast<const __half2*>(&l), bias);
  const __half2 hf = __hsub2(*reinterpret_cast<const __half2*>(&h), bias);
  lo = *reinterpret_cast<const uint32_t*>(&lf);
  hi = *reinterpret_cast<const uint32_t*>(&hf);
}
// Two e4m3 values (the low 16 bits of v, first in the low byte) -> a half2's bits (first in the low
// half), exact: every e4m3 value is a half. sm_89+ converts in hardware; below, the bits are moved
// into half layout and half's larger exponent bias restored by an exact multiplication by 2^8.
__device__ __forceinline__ uint32_t e4m3x2_to_half2(uint32_t v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v & 0xffffu), __NV_E4M3);
  return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
#else
  const uint32_t x = __byte_perm(v, 0u, 0x1404);  // byte 0 -> byte 1, byte 1 -> byte 3
  const uint32_t bits = ((x >> 1) & 0x3F803F80u) | (x & 0x80008000u);
  const __half2 r = __hmul2(*reinterpret_cast<const __half2*>(&bits), __float2half2_rn(256.f));
  return *reinterpret_cast<const uint32_t*>(&r);
#endif
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// The FFN's gated activation: SiLU(g) x u.
__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.f + expf(-g)) * u; }

// 8 consecutive int8 weights at p (8-byte aligned) -> 4 packed fp16 pairs, exact.
__device__ __forceinline__ void int8x8_to_half(const unsigned char* p, uint32_t* w) {
  const uint2 v = *reinterpret_cast<const uint2*>(p);
  int8x4_to_half2x2(v.x ^ 0x80808080u, w[0], w[1]);
  int8x4_to_half2x2(v.y ^ 0x80808080u, w[2], w[3]);
}

// The power of two 2^e that the int8 GEMMs divide an activation row (or slice) by before rounding
// it to fp16: mx / 2^e < 2^14, so every value keeps fp16's full precision and none overflows;
// dividing by it and multiplying the fp32 sums back are exact. frexp: mx = f 2^ex, f in [0.5, 1).
__device__ __forceinline__ float fp16_pow2_scale(float mx) {
  int ex = 0;
  frexpf(mx, &ex);
  return mx > 0.f ? ldexpf(1.f, ex - 14) : 1.f;
}
// 8 bf16 values (a uint4) times inv -> 8 fp16 values in the same order.
__device__ __forceinline__ uint4 bf16x8_to_half_scaled(uint4 u, float inv) {
  uint32_t* w4 = reinterpret_cast<uint32_t*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w4[i]));
    w4[i] = pack_half2(f.x * inv, f.y * inv);
  }
  return u;
}

// cp.async of 16 (or 4) bytes into shared memory, zero-filled when !full; commit and wait as in PTX.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool full) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(full ? 16 : 0));
}
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem, bool full) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(gmem), "r"(full ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block; `scratch` holds 32 floats. All threads get the result.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : 0.f;
  return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : -INFINITY;
  return warp_max(v);
}

__device__ __forceinline__ float bf(float x) { return __bfloat162float(__float2bfloat16(x)); }

// 8 bf16 packed in 16 bytes -> 8 floats, in memory order.
__device__ __forceinline__ void bf16x8_to_float(const uint4& v, float* f) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 t = __bfloat1622float2(h[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}

// Upstream's ring visibility (the rule in lm_attention.cuh), shared by the GPU attentions over a
// ring: after the write E tokens exist; slot idx is seen by the query at position q iff its label
// is in [0, q] and, when context > 0, q - label < context.
// ring_visible_em takes E % C (Em) from a caller that hoists it out of its loop.
__device__ __forceinline__ bool ring_visible_em(int idx, int E, int Em, int C, int q, int context) {
  if (idx >= E) return false;
  const int delta = idx - Em;
  const int label = delta <= 0 ? E + delta : E + delta - C;
  return label >= 0 && q - label >= 0 && (context <= 0 || q - label < context);
}
__device__ __forceinline__ bool ring_visible(int idx, int E, int C, int q, int context) {
  return ring_visible_em(idx, E, E % C, C, q, context);
}

}  // namespace ppx::kern

namespace ppx::kern {

// Programmatic Dependent Launch (sm_90+) device hooks: pdl_wait() waits for the previous kernels in
// the stream, pdl_trigger() lets the next one launch early. Both are no-ops below sm_90 and when
// the kernel was launched without the PDL attribute, which is always the case for the LM kernels:
// PDL for them measured slower on an H200 (docs/PERF.md v0.2, v0.3) and left the code on
// 2026-12-03. The hooks remain where kernels still call them (the Mimi kernels launch with PDL
// through mimi_device.cuh, which has its own pdl_wait).
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}
__device__ __forceinline__ void prefetch_l2(const void* p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#endif
}

// Launches an LM kernel, without the PDL attribute (see above; the name predates that).
template <typename... KArgs, typename... Args>
inline cudaError_t pdl_launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                              Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace ppx::kern
