// GEMM policies 4, 5 and 8 (kern::gemm_set_policy; policy 6, the default, takes 8 from 40 rows): the
// batched int8-weight GEMM of lm_gemm.cu on Hopper's warpgroup MMA (wgmma), for up to kMaxRows batch rows
// in one launch, so the weights are read once for the whole batch (policy 0 reads them once per
// 64 rows). Built for sm_90a only (lm_gemm_sm90a.cu, its own library): elsewhere available() is
// false and lm_gemm.cu runs policy 0.
//
// The int8 weights are the MMA's A operand, converted exactly to fp16 in registers as policy 0
// does; the activations are its B operand, in shared memory, fp16 over a power of two per batch
// row and K slice (policy 0's exactness argument and scales), staged once per launch by a prologue
// kernel into GemmScratch::xstage in the order the MMA reads them. Sums are fp32; the split-K
// partials and their epilogue are lm_gemm.cu's, except that a launch of one K slice under policy 8
// applies the epilogue itself.
#pragma once

#include <cuda_runtime.h>

#include "lm_gemv.cuh"

namespace ppx::kern::gemm_wg {

constexpr int kMaxRows = 256;  // batch rows of one launch (the MMA's N)
constexpr int kMaxSlices = 16;  // K slices of one launch
// The activation scales, one a batch row and K slice, sit at the end of GemmScratch::ws.
constexpr int kScaleFloats = kMaxRows * kMaxSlices;

// Probes once whether this device runs the sm_90a kernels (called by gemv_init()).
void init();
bool available();
// The number of K slices a launch of B rows of `a`'s shape would use, or 0 when it cannot run
// here: not int8 weights, K % 64 != 0, B > kMaxRows, a staging buffer shorter than
// round_up(B, 16) x K, or partial sums that do not fit GemmScratch::ws.
// wide: policy 5's k-tiles of 128 (up to 128 rows and where K % 128 == 0; else policy 4's 64).
// out: -1 for a launch that ends at the partial sums; a GemvOut (as int) for one that would apply
// that epilogue itself (policy 8), whose tiles kGateUp pairs differently.
int plan(const GemvArgs& a, int B, int sms, bool wide = false, int out = -1);
// Stages `a`'s a.B rows (prologue `in`), then with out == -1 writes the partial sums ws[s][b][n]
// (s < S = plan(), times each row's activation scale; the weight scale is the epilogue's, which
// lm_gemm.cu runs), else (S == 1 only; std::runtime_error otherwise) writes y / yf through the
// epilogue `out` with the rounding of lm_gemm.cu's epilogue kernel: the same bits.
// prev: a chain's pending split-K epilogue (GemmChain, on a.gemm.ws) whose output a.x is; its
// epilogue then runs inside this launch's staging kernel (in kPlain or kRmsNorm, K <= 24512).
void launch(GemvIn in, const GemvArgs& a, int S, bool wide, int out, cudaStream_t s, const GemmChain* prev = nullptr);

}  // namespace ppx::kern::gemm_wg
