// Host launchers of Mimi's streaming convolutions (fp32, batched over stream slots, graph-capturable).
//
// A call consumes t_in new input samples per channel. The input seen by the kernel is
//   x'[i, m] = m < ctx ? history[i, m] : x[i, m - ctx],   m in [0, ctx + t_in)
// with ctx = kernel - stride for a conv and ctx = 1 for a transposed conv. On the first call after a
// reset (frame counter == 0) the history reads as zeros, or as copies of x[i, 0] when `replicate`.
// Each launch reads history parity (frame & 1) and writes the new history to the other parity, so no
// block ever overwrites what another block still reads; the frame counter is advanced elsewhere.
//
// Conv:            y[o, n] = b[o] + sum_{i,j} W[o, i, j] x'[i, n*S + j],              n < t_in / S
// Transposed conv: y[o, n*S + r] = b[o] + sum_i W[i, o, r] x[i, n] + W[i, o, r+S] x[i, n-1]
//                  (kernel == 2 * stride; x[i, -1] is the history). This equals the upstream
//                  "emit S*T, carry the K-S tail" overlap-add, with the tail kept as its input.
// Epilogue: v = y (+ residual[o, n]); out_raw = v and out_elu = elu(v), each optional.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "mimi_types.cuh"

namespace ppx::kern::mimi {

struct ConvParams {
  // conv_direct: W [cout][cin][kernel] (a transposed conv's [cin][cout][kernel] transposed on the host).
  // conv_gemv:   W [cout][cin/4][kernel][4] (element (o, i, j) at ((o*cin/4 + i/4)*kernel + j)*4 + i%4).
  const float* w = nullptr;
  const float* bias = nullptr;  // [cout] or null
  int cin = 0, cout = 0, kernel = 0, stride = 0;
  int t_in = 0;        // new input samples per call
  int transposed = 0;  // 1: ConvTranspose1d (requires kernel == 2 * stride, groups 1)
  int replicate = 0;   // 1: first chunk padded with its first sample (downsampler)
  Act x;               // input (c < cin, t < t_in)
  Act residual;        // optional (p == null: none), (c < cout, t < t_out)
  Act out_raw;         // optional output v
  Act out_elu;         // optional output elu(v)
  SlotInt frame;       // calls since reset of this stream direction (read only)
  float* hist = nullptr;      // per slot [2][cin][ctx] at hist + slot * hist_stride
  long long hist_stride = 0;  // floats
  SlotInt done;        // optional: scratch counter (0 between launches) for...
  SlotInt advance;     // ...incrementing advance[slot] once the slot's last block is done
};

PPX_MIMI_HD inline int conv_ctx(const ConvParams& p) { return p.transposed ? 1 : p.kernel - p.stride; }
PPX_MIMI_HD inline int conv_t_out(const ConvParams& p) { return p.transposed ? p.t_in * p.stride : p.t_in / p.stride; }

// Thread per output (o, n) with a few output channels per thread and the input channels split over
// blockDim.y; for long time axes (t_out >= ~32). Any shape (transposed: kernel == 2 * stride).
void conv_direct(const ConvParams& p, const Batch& batch, cudaStream_t s);

// Warps per output channel, lanes split the contiguous (i, j) reduction with float4 weight loads;
// the block stages x' in shared memory. For short time axes (t_out <= 16, or t_in <= 16 transposed).
// Needs cin % 4 == 0, kernel <= 32 and 16-byte aligned weights.
bool conv_gemv_supported(const ConvParams& p);
size_t conv_gemv_smem_bytes(const ConvParams& p);
// Raises the dynamic shared-memory limit of the GEMV kernels to `bytes` (call once, before capture).
cudaError_t conv_gemv_reserve_smem(size_t bytes);
void conv_gemv(const ConvParams& p, const Batch& batch, cudaStream_t s);

// Programmatic dependent launch (PDL) of the Mimi kernels: every launch of conv_*, linear,
// attention and rvq_* uses it where the device supports it (compute capability 9.0+; a kernel's
// blocks start as its predecessor's exit), except launches enqueued on this thread while a
// PdlScope(false) is open. CudaMimi opens one around each encode and decode with its `pdl` option
// (ppx::CudaOptions::mimi_pdl, --no-mimi-pdl). Results do not depend on it.
class PdlScope {
 public:
  explicit PdlScope(bool on);
  ~PdlScope();
  PdlScope(const PdlScope&) = delete;
  PdlScope& operator=(const PdlScope&) = delete;

 private:
  bool prev_off_;
};

}  // namespace ppx::kern::mimi
