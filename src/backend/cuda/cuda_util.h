// Host-side CUDA helpers: error checking that throws ppx::Error, RAII device buffers, pinned host
// buffers. Everything here is host code compiled by the C++ compiler against the CUDA runtime.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "ppx/error.h"

namespace ppx::cuda {

[[noreturn]] void throw_cuda(cudaError_t e, const char* what, const char* file, int line);

// Captures what `body` enqueues on `s` (thread-local capture mode) and instantiates it. If `body`
// throws, the capture is ended and discarded and the exception propagates.
cudaGraphExec_t capture_graph(cudaStream_t s, const std::function<void()>& body);

#define PPX_CUDA_CHECK(expr)                                                  \
  do {                                                                        \
    const cudaError_t ppx_err_ = (expr);                                      \
    if (ppx_err_ != cudaSuccess) ::ppx::cuda::throw_cuda(ppx_err_, #expr, __FILE__, __LINE__); \
  } while (0)

// Owning device allocation of n elements of T (uninitialised unless zero() is called).
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) { resize(n); }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  void resize(size_t n) {
    release();
    if (n) PPX_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)));
    n_ = n;
  }
  void zero(cudaStream_t s = nullptr) {
    if (n_) PPX_CUDA_CHECK(cudaMemsetAsync(p_, 0, n_ * sizeof(T), s));
  }
  void upload(const T* host, size_t n, cudaStream_t s = nullptr) {
    if (n > n_) throw Error("DeviceBuffer::upload: " + std::to_string(n) + " > " + std::to_string(n_));
    if (n) PPX_CUDA_CHECK(cudaMemcpyAsync(p_, host, n * sizeof(T), cudaMemcpyHostToDevice, s));
  }
  // The first n elements (all of them by default), copied to the host by cudaMemcpy, which is
  // ordered after the legacy default stream's work and blocking streams' only: synchronize a
  // non-blocking stream that wrote them first (tests and one-off reads, not the per-frame path).
  std::vector<T> download() const { return download(n_); }
  std::vector<T> download(size_t n) const {
    if (n > n_) throw Error("DeviceBuffer::download: " + std::to_string(n) + " > " + std::to_string(n_));
    std::vector<T> host(n);
    if (n) PPX_CUDA_CHECK(cudaMemcpy(host.data(), p_, n * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  T* get() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }

 private:
  void release() {
    if (p_) cudaFree(p_);
    p_ = nullptr;
    n_ = 0;
  }
  T* p_ = nullptr;
  size_t n_ = 0;
};

// Page-locked host allocation, for async copies that can live inside a CUDA graph.
template <typename T>
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t n) {
    if (n) PPX_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&p_), n * sizeof(T)));
    n_ = n;
  }
  ~PinnedBuffer() {
    if (p_) cudaFreeHost(p_);
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  PinnedBuffer(PinnedBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  T* get() const { return p_; }
  T& operator[](size_t i) const { return p_[i]; }
  size_t size() const { return n_; }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

// Number of usable CUDA devices (0 when there is no driver or GPU); never throws.
int device_count();
// "NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB)" for the current device.
std::string device_description();

}  // namespace ppx::cuda
