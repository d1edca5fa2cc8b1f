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
// Epilogue: v = y (+ residual[o, n]); out_raw = v and out_elu = elu(v), each optional (conv_mma
// also: v = ls[o] * y before the residual, out_gelu = gelu(v)).
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
  // conv_mma only: fp16 weights [conv_mma_rows()][conv_mma_kpad()] (see conv_mma below).
  const void* w16 = nullptr;
  // conv_mma only, for the transformer's linears run as k = 1 convs over their tokens: v is scaled
  // by ls[o] (LayerScale) before the residual is added; out_gelu = gelu(v) (exact erf).
  const float* ls = nullptr;
  Act out_gelu;
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

// fp16 tensor cores (--mimi-fp16): the conv as a GEMM, mma.sync m16n8k16 with fp16 operands and
// fp32 accumulators. Rows are output channels (a transposed conv's row r * cout + o computes its
// outputs n * S + r), columns are the output positions of every batch row in turn (a transposed
// conv's: its input positions), the reduction is (input channel, tap) = i * taps + j, taps = kernel
// (conv: x' column n * S + j) or 2 (transposed: x' column n + 1 - j). The weights are w16, fp16
// [rows][kpad], zero past cin * taps; inputs are rounded to fp16 (saturating at +-65504) as they are
// staged. A row's result does not depend on the batch or on where its columns fall in the grid.
// Any shape but the one with `done` (the frame-advancing last conv).
int conv_mma_rows(const ConvParams& p);
int conv_mma_kpad(const ConvParams& p);
bool conv_mma_supported(const ConvParams& p);
// Whether conv_mma of `rows` batch rows has at least one tile per SM. Below that its few blocks
// each run the whole reduction and it is slower than conv_direct (batch 1 on an H200: encode
// 0.79 ms against 0.44), so CudaMimi runs such launches in fp32.
bool conv_mma_fills_device(const ConvParams& p, int rows);
void conv_mma(const ConvParams& p, const Batch& batch, cudaStream_t s);

// The same GEMM computed elsewhere (cuda::set_mimi_blas_rows: cuBLAS, fp32 operands), in three
// steps. conv_im2col writes each batch row's columns, x [batch.count * conv_gemm_cols][conv_gemm_k]
// (row b's columns b * conv_gemm_cols .. in turn; element (column, k) is x' as conv_mma gathers it,
// unrounded), and the slots' new history; then the caller forms c [columns][conv_mma_rows] = x . W^T
// with W fp32 [conv_mma_rows][conv_gemm_k] (conv_mma's row and reduction order, unpadded); then
// conv_gemm_epilogue stores c through the epilogue (bias, ls, residual, outputs) as conv_mma does.
// Any shape conv_mma supports.
int conv_gemm_cols(const ConvParams& p);
int conv_gemm_k(const ConvParams& p);
void conv_im2col(const ConvParams& p, float* x, const Batch& batch, cudaStream_t s);
void conv_gemm_epilogue(const ConvParams& p, const float* c, const Batch& batch, cudaStream_t s);

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
