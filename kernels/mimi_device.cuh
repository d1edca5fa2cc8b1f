// Device helpers of the Mimi kernels: row addressing, exact fp32 activations, double-precision
// block sums (LayerNorm statistics as the CPU reference computes them), and the "last block of the
// slot advances its frame counter" pattern that lets a graph-captured launch sequence keep its
// streaming position in device memory.
#pragma once

#include <cuda_runtime.h>

#include "mimi_types.cuh"

namespace ppx::kern::mimi {

__device__ __forceinline__ float* row(const Act& a, int b, int slot) {
  return a.p + static_cast<long long>(a.by_slot ? slot : b) * a.row_stride;
}

__device__ __forceinline__ int* slot_int(const SlotInt& s, int slot) {
  return s.p + static_cast<long long>(slot) * s.stride;
}

// ELU (alpha 1) with the exact expm1.
__device__ __forceinline__ float elu(float x) { return x > 0.f ? x : expm1f(x); }

// Exact GELU, rounded step by step as the CPU reference: (0.5 x) (1 + erf(x / sqrt 2)).
__device__ __forceinline__ float gelu(float x) {
  const float c = 0.70710678118654752440f;
  return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.f, erff(__fmul_rn(x, c))));
}

__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Sum over the block (1-D, multiple of 32 threads); `scratch` holds 32 doubles. All threads get it.
__device__ __forceinline__ double block_sum_d(double v, double* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = warp_sum_d(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < nwarps ? scratch[lane] : 0.0;
  return warp_sum_d(v);
}

// Programmatic dependent launch (sm_90+): a kernel may start while its predecessor in the stream
// finishes (its blocks launch as the predecessor's blocks exit; an explicit early trigger measured
// slower on an H200). Before pdl_wait() a kernel may only read what no earlier kernel writes
// (weights, slot ids); pdl_wait() returns once all earlier kernels are complete and their writes
// visible. A no-op when launched without the attribute.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Called by every thread of every block of one slot's part of a launch, after the block's last read
// of `counter`: the last block to get here resets `done` and increments `counter`. `nblocks` is the
// number of blocks of the slot. Works because each block reads the counter before it signs off.
__device__ __forceinline__ void advance_after_last_block(int* done, int* counter, int nblocks) {
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0) {
    __threadfence();
    const int prev = atomicAdd(done, 1);
    if (prev == nblocks - 1) {
      atomicExch(done, 0);
      atomicAdd(counter, 1);
    }
  }
}

// Host: launches `kernel` with the programmatic-stream-serialization attribute where the device
// supports it (compute capability 9.0+) and no PdlScope(false) is open on this thread
// (mimi_conv.cuh), else as a plain launch.
bool pdl_enabled();
template <typename... KArgs, typename... Args>
void launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...);
}

}  // namespace ppx::kern::mimi
