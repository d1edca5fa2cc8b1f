#include "backend/cuda/cuda_util.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace ppx::cuda {

void throw_cuda(cudaError_t e, const char* what, const char* file, int line) {
  throw Error(std::string("CUDA error ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ") in " + what +
              " at " + file + ":" + std::to_string(line));
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

cudaGraphExec_t instantiate_graph(cudaGraph_t g, bool urgent) {
  const char* env = std::getenv("PPX_GRAPH_PRIORITY");
  if (urgent && !(env && std::strcmp(env, "0") == 0)) {
    int least = 0, greatest = 0;
    PPX_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    size_t n = 0;
    PPX_CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &n));
    std::vector<cudaGraphNode_t> nodes(n);
    PPX_CUDA_CHECK(cudaGraphGetNodes(g, nodes.data(), &n));
    cudaLaunchAttributeValue v{};
    v.priority = greatest;
    for (cudaGraphNode_t node : nodes) {
      cudaGraphNodeType t;
      PPX_CUDA_CHECK(cudaGraphNodeGetType(node, &t));
      if (t == cudaGraphNodeTypeKernel)
        PPX_CUDA_CHECK(cudaGraphKernelNodeSetAttribute(node, cudaLaunchAttributePriority, &v));
    }
  }
  cudaGraphExec_t exec = nullptr;
  PPX_CUDA_CHECK(cudaGraphInstantiate(&exec, g, 0));
  return exec;
}

}  // namespace ppx::cuda
