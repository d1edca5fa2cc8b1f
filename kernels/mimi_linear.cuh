// Host launchers of the Mimi transformer's linear layers: y = W x for a few tokens (fp32 GEMV), with
// an optional LayerNorm of the input first and a fused epilogue. Batched over stream slots.
#pragma once

#include <cuda_runtime.h>

#include "mimi_types.cuh"

namespace ppx::kern::mimi {

enum LinearEpilogue : int {
  kLinearStore = 0,          // y = W x
  kLinearGelu = 1,           // y = gelu(W x), exact erf
  kLinearScaledResidual = 2  // y = y + ls * (W x)   (LayerScale + residual, y read and written)
};

struct LinearParams {
  const float* w = nullptr;  // [dout][din] row-major, 16-byte aligned
  int din = 0, dout = 0;
  int tokens = 0;                // 1 or 2
  const float* ln_w = nullptr;   // [din] LayerNorm weight; null: no norm
  const float* ln_b = nullptr;   // [din] LayerNorm bias
  float ln_eps = 1e-5f;
  int epilogue = kLinearStore;
  const float* ls = nullptr;     // [dout] LayerScale for kLinearScaledResidual
  Act x;                         // input [tokens][din], token-major and contiguous (sc 1, st din), 16-byte aligned
  Act y;                         // output, element (o, t), o < dout
};

// din must be a multiple of 128 and at most 2048 (a power-of-two multiple); tokens 1 or 2.
bool linear_supported(int din, int tokens);
// Warp per output row (4 per block of 128 threads); the row is loaded into registers with float4
// loads before the (optional) LayerNorm of the input, so the weight stream overlaps the norm.
void linear(const LinearParams& p, const Batch& batch, cudaStream_t s);
// The input of `linear` alone, LayerNorm'd when p.ln_w (exactly as linear normalises it), written
// to `out` (token-major [tokens][din], contiguous, 16-byte aligned): the prologue of a linear that
// runs as conv_mma (--mimi-fp16). One block per batch row.
void layer_norm(const LinearParams& p, const Act& out, const Batch& batch, cudaStream_t s);
// The output side of a linear whose product was computed elsewhere (a cuBLAS GEMM over the batch):
// c holds row b's W x contiguously, [B][tokens][dout]; each element goes through p.epilogue into p.y
// exactly as `linear` stores its sums (p.w and p.x are not read).
void linear_epilogue(const LinearParams& p, const float* c, const Batch& batch, cudaStream_t s);

}  // namespace ppx::kern::mimi
