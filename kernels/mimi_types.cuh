// Plain argument types shared by the Mimi kernels and their host callers (no device code here, so
// the C++ compiler can include it). Every launch is batched: row b of a launch works on stream slot
// slots[b]; per-slot state and activations live at `base + slot * stride`, the caller's inputs and
// outputs (PCM, codes) may instead be indexed by the row b.
#pragma once

#include <cuda_runtime.h>

// Small helpers callable from host and device code.
#ifdef __CUDACC__
#define PPX_MIMI_HD __host__ __device__
#else
#define PPX_MIMI_HD
#endif

namespace ppx::kern::mimi {

// The B rows of a launch.
struct Batch {
  const int* slots = nullptr;  // device [count] slot ids
  int count = 1;
};

// A per-row 2-D tensor. Row base: p + (by_slot ? slot : b) * row_stride; element (c, t) at
// base[c * sc + t * st]. Channel-major [C, T] is (sc = T, st = 1); token-major [T, C] is (sc = 1, st = C).
struct Act {
  float* p = nullptr;
  long long row_stride = 0;
  int by_slot = 1;
  int sc = 0, st = 1;
};

// One int per slot in device memory: p[slot * stride].
struct SlotInt {
  int* p = nullptr;
  int stride = 0;
};

}  // namespace ppx::kern::mimi
