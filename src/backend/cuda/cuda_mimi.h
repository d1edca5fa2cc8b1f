// Mimi on CUDA: fp32, streaming, graph-capturable; numerically the CPU reference ppx::Mimi.
//
// One CudaMimi holds the weights on the device and the streaming state of `slots` independent
// streams (sessions), laid out [slot][...]. encode/decode only enqueue kernels on the given stream:
// no allocation, no host synchronisation and no host-side state that changes between calls. Every
// streaming position (conv histories, transposed-conv carries, KV-ring positions, RoPE offsets) is
// derived from per-slot frame counters in device memory that the kernels themselves advance, so a
// sequence captured once in a CUDA graph can be replayed every frame. Calls on one slot and one
// direction must be ordered (same stream, or events); different slots, and the encoder and decoder
// of one slot, may run concurrently on different streams.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "ppx/config.h"

namespace ppx {
class WeightSource;
}

namespace ppx::cuda {

class CudaMimi {
 public:
  // Loads the same tensors as ppx::Mimi (same keys and shapes; codebooks precomputed as
  // embedding_sum / max(cluster_usage, 1e-5)) and uploads them as fp32. Allocates the state and
  // activations of `slots` streams, all reset. Uses the current CUDA device. `pdl`: the kernels
  // use programmatic dependent launch where the device supports it (compute capability 9.0+; what
  // ships: ppx::CudaOptions::mimi_pdl); false launches them plainly. Results do not depend on it.
  // `fp16` (--mimi-fp16, ppx::CudaOptions::mimi_fp16): the convolutions over long time axes and the
  // transposed ones run on tensor cores with fp16 weights and inputs and fp32 sums (kern::mimi::
  // conv_mma) in launches with enough rows to fill the device (conv_mma_fills_device), fp32
  // otherwise; launches of kDefaultMimiBlasRows rows or more (set_mimi_blas_rows, below) run the
  // transformer linears and the short convs as TF32 cuBLAS GEMMs; the rest stays fp32. Results then differ from the fp32 reference by fp16 rounding
  // (docs/QUALITY.md), and a row's result can differ by that much between batch sizes.
  CudaMimi(const MimiConfig& c, WeightSource& w, int slots, bool pdl = true, bool fp16 = false);
  ~CudaMimi();
  CudaMimi(const CudaMimi&) = delete;
  CudaMimi& operator=(const CudaMimi&) = delete;

  int frame_samples() const;
  int num_codebooks() const;
  int slots() const;
  size_t weight_bytes() const;  // device memory held by the weights
  bool fp16() const;
  // Tests: with fp16, every launch of a tensor-core conv runs on tensor cores, also those too small
  // to fill the device (which otherwise run in fp32).
  void set_mma_always(bool on);
  // The cuBLAS path's threshold (set_mimi_blas_rows) as it was when this codec was built (0: off,
  // or not fp16).
  int blas_rows() const;

  // Graph-safe resets (async on s, no host sync): the next encode/decode of the slot behaves like
  // the first after construction.
  void reset_encoder(int slot, cudaStream_t s);
  void reset_decoder(int slot, cudaStream_t s);

  // d_pcm: device [frame_samples] f32 -> d_codes: device [num_codebooks] int32.
  void encode(int slot, const float* d_pcm, int32_t* d_codes, cudaStream_t s);
  // d_codes: device [num_codebooks] int32 in [0, bins) (others are clamped) -> d_pcm: device
  // [frame_samples] f32, not clamped.
  void decode(int slot, const int32_t* d_codes, float* d_pcm, cudaStream_t s);

  // The same for n slots in one launch sequence (one kernel per layer for all of them, each slot's
  // rows computed exactly as alone): d_slots device [n] distinct slot ids; row i of d_pcm
  // ([n][frame_samples]) and d_codes ([n][num_codebooks]) belongs to d_slots[i]. The ids are read
  // on the device, so they must stay valid until the work is done. 1 <= n <= slots().
  void encode_batch(const int* d_slots, int n, const float* d_pcm, int32_t* d_codes, cudaStream_t s);
  void decode_batch(const int* d_slots, int n, const int32_t* d_codes, float* d_pcm, cudaStream_t s);

 private:
  struct Impl;
  std::unique_ptr<Impl> p_;
};

// The batched codec's rule for --mimi-fp16 (shipped 2026-12-05, docs/PERF.md v0.23): a CudaMimi
// built with fp16 runs, in every launch of at least kDefaultMimiBlasRows batch rows, each
// transformer linear as one TF32 cuBLAS GEMM over all rows' tokens (the input LayerNorm'd into a
// contiguous buffer first, the epilogue after) instead of the fp32 GEMV or conv_mma, and each short
// convolution (those the fp32 conv_gemv runs) as one TF32 cuBLAS GEMM over all rows' output
// positions (kern::mimi::conv_im2col, the GEMM, conv_gemm_epilogue). Measured on an H100 (v0.22):
// encode + decode per row 449 -> 392 us at 4 rows, 206 -> 97 at 32, 180 -> 67 at 64; at 2 rows it
// was slower (605 -> 655), so one- and two-row launches keep the fp32 kernels.
inline constexpr int kDefaultMimiBlasRows = 4;
// Benches (personaplex-bench-mimi and personaplex-bench --mimi-blas-rows) move the threshold for
// codecs built after the call: 0 turns the cuBLAS path off (the v0.20 form), other values below 2
// count as 2, so a launch of one row (the per-session codec path, whose slots run concurrently on
// their own streams) never shares the direction's buffers and handle. Batched launches of one
// direction must not run concurrently (they share those buffers and the handle); the codec
// scheduler runs them on one stream.
void set_mimi_blas_rows(int rows);
// The value set_mimi_blas_rows stored (after its rounding up to 2).
int mimi_blas_rows();

}  // namespace ppx::cuda
