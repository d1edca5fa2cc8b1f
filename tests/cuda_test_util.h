// Helpers shared by the CUDA test files (ppx_cuda_tests): the skip on a machine without a GPU,
// and a bf16 device buffer read back as floats.
#pragma once

#include <cuda_bf16.h>

#include <vector>

#include "backend/cuda/cuda_util.h"

#define SKIP_WITHOUT_GPU() \
  if (::ppx::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device"

namespace ppx::test {

inline std::vector<float> to_host(const cuda::DeviceBuffer<__nv_bfloat16>& d) {
  const std::vector<__nv_bfloat16> h = d.download();
  std::vector<float> f(h.size());
  for (size_t i = 0; i < h.size(); ++i) f[i] = __bfloat162float(h[i]);
  return f;
}

}  // namespace ppx::test
