#include "backend/cuda/cuda_util.h"

#include <cstdio>

namespace ppx::cuda {

namespace {
// Errors after which the CUDA context is corrupt: every later call in the process fails too.
bool is_sticky(cudaError_t e) {
  switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorLaunchTimeout:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorECCUncorrectable:
    case cudaErrorAssert:
    case cudaErrorContextIsDestroyed:
      return true;
    default:
      return false;
  }
}
}  // namespace

void throw_cuda(cudaError_t e, const char* what, const char* file, int line) {
  const std::string msg = std::string("CUDA error ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) +
                          ") in " + what + " at " + file + ":" + std::to_string(line);
  if (is_sticky(e)) throw DeviceError(msg + "; the device is unusable until the process restarts");
  throw Error(msg);
}

cudaGraphExec_t capture_graph(cudaStream_t s, const std::function<void()>& body) {
  cudaGraph_t g = nullptr;
  PPX_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  try {
    body();
  } catch (...) {
    if (cudaStreamEndCapture(s, &g) == cudaSuccess && g) cudaGraphDestroy(g);
    (void)cudaGetLastError();
    throw;
  }
  PPX_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, g, 0);
  cudaGraphDestroy(g);
  PPX_CUDA_CHECK(e);
  return exec;
}

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error
    return 0;
  }
  return n;
}

std::string device_description() {
  int dev = 0;
  PPX_CUDA_CHECK(cudaGetDevice(&dev));
  cudaDeviceProp p{};
  PPX_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
  char mem[32];
  std::snprintf(mem, sizeof(mem), "%.1f", static_cast<double>(p.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0));
  return std::string(p.name) + " (sm_" + std::to_string(p.major) + std::to_string(p.minor) + ", " +
         std::to_string(p.multiProcessorCount) + " SMs, " + mem + " GiB)";
}

}  // namespace ppx::cuda
