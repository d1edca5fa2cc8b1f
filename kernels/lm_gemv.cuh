// Batch-B matrix-vector products of the LM with bf16 activations and fp32 accumulation, with the
// neighbouring elementwise work fused in. Weights are bf16 (w), or 8 bits (fp8 e4m3 in w8, or int8
// in wi8) with one fp32 scale per output row (w_scale; see lm_quant.cuh for how they are made):
// then acc = w_scale[n] * sum_k float(q[n, k]) * x[k], the scale applied in fp32 before the
// epilogue rounds. Everything else (prologues, epilogues, B, strides) is the same for all three.
//   prologue (applied to x while it is staged in shared memory, rounded to bf16 as upstream):
//     kPlain     x
//     kRmsNorm   x * (alpha * rsqrt(mean(x^2) + eps)), fp32 math
//     kSiluGate  silu(g) * u with x = [g | u] (each [K]), fp32 math, rounded once
//     kEmbRmsNorm  the depformer's first RMSNorm on z = bf16(x + table[tok]) (x: the hoisted input
//                projection of the step, tok -1 adds nothing), block 0 also stores z to x_out
//                (the residual stream). kStore only.
//   epilogue on acc = sum_k W[n, k] * x[k] (fp32), rounded to bf16 first as a bf16 GEMM is:
//     kStore     y[n] = bf16(acc)
//     kResidual  y[n] = bf16(y[n] + bf16(acc))            (the residual add of the stream)
//     kLogits    yf[n] = float(bf16(acc))                 (fp32 logits of a bf16 head)
//     kGateUp    y[n] = bf16(silu(bf16(acc_n)) * bf16(acc_{n+N/2})) for n < N/2: the gated FFN's
//                activation fused into its input projection (rows [0, N/2) gate, [N/2, N) up)
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace ppx::kern {

enum class GemvIn { kPlain, kRmsNorm, kSiluGate, kEmbRmsNorm };
enum class GemvOut { kStore, kResidual, kLogits, kGateUp };

// Batch rows one kernel launch computes; gemv() runs larger batches as chunks of this many.
constexpr int kMaxGemvBatch = 4;

// Scratch of the batched GEMM: the activations after the prologue, [B, max K] (needed unless the
// input is kPlain), and its split-K partial sums, at least gemm_ws_floats(B, max N) floats.
// Policy 4 (gemm_set_policy) stages every launch's rows, B rounded up to 16, as fp16 in xstage: it
// runs only where xstage_elems (the buffer's length) holds gemm_xstage_elems(B, K).
struct GemmChain;
struct GemmScratch {
  __nv_bfloat16* xstage = nullptr;
  float* ws = nullptr;
  size_t ws_floats = 0;
  size_t xstage_elems = 0;
  GemmChain* chain = nullptr;  // with GemvArgs::defer: where a deferred epilogue waits
};
// Runs the chain's pending epilogue, if any (gemv() does this itself wherever it cannot fuse it).
void gemm_chain_flush(const GemmScratch& g, cudaStream_t s);
size_t gemm_ws_floats(int B, int max_n);
size_t gemm_xstage_elems(int B, int max_k);

struct GemvArgs {
  const __nv_bfloat16* w = nullptr;  // [N, K] row-major (bf16 weights; unused when w8 is set)
  const __nv_fp8_e4m3* w8 = nullptr;  // [N, K] row-major fp8 weights; when set, K % 16 == 0
  const int8_t* wi8 = nullptr;         // [N, K] row-major int8 weights; when set, K % 16 == 0
  const float* w_scale = nullptr;      // with w8 or wi8: [N] dequantization scale of each weight row
  // With wi8, optionally: the same values as bf16 (exact), which gemm_set_policy(3) multiplies
  // through cuBLAS; ignored otherwise.
  const __nv_bfloat16* wq = nullptr;
  const __nv_bfloat16* x = nullptr;  // [B, x_stride]; kSiluGate reads [B, 2K] within the stride
  int64_t x_stride = 0;              // elements between batch rows of x
  int N = 0, K = 0, B = 1;           // K % 8 == 0, B >= 1 (kernels take kMaxGemvBatch rows at once)
  const __nv_bfloat16* alpha = nullptr;  // kRmsNorm: [K]
  float eps = 1e-8f;
  __nv_bfloat16* y = nullptr;        // kStore / kResidual / kGateUp: [B, y_stride]
  float* yf = nullptr;               // kLogits: [B, y_stride]
  int64_t y_stride = 0;
  const __nv_bfloat16* table = nullptr;  // kEmbRmsNorm: [rows, K]
  const int32_t* token = nullptr;        // kEmbRmsNorm: [B] device token ids
  __nv_bfloat16* x_out = nullptr;        // kEmbRmsNorm: [B, K] z before the norm
  int table_rows = 0;
  // B > kMaxGemvBatch: the scratch of the tensor-core GEMM (lm_gemm.cu). With it (and bf16 or int8
  // weights, K % 32 == 0) the batch runs as one GEMM that reads each weight once; without it, as
  // chunks of kMaxGemvBatch GEMV rows.
  GemmScratch gemm;
  // With gemm.chain: the caller's next gemv() call on this scratch reads y, and nothing reads y or
  // writes the scratch before it. The epilogue of a wgmma launch that runs several K slices is
  // then left pending (GemmChain); where that call reads y as plain rows (kPlain, the same rows,
  // K the outputs), it runs inside its staging kernel (one launch fewer, the same bits), else first.
  bool defer = false;
};

// An epilogue left for the next GEMM of a chain (GemvArgs::defer): a wgmma GEMM's (policies 4, 5
// and 8; 6 as shipped) that runs several K slices, whose partial sums
// wait in GemmScratch::ws, and the next gemv() that reads its output as plain rows runs the
// epilogue and its own activation staging as one kernel, a K slice per block (wgmma path only;
// every other call runs the epilogue first).
// Host state of one enqueue sequence (one stream, one capture), owned by the caller.
struct GemmChain {
  bool pending = false;
  int out = 0;       // the pending epilogue (a GemvOut)
  int slices = 0;    // its K slices
  GemvArgs args;     // its launch's (y, y_stride, w_scale, N, B: what the epilogue reads)
  int64_t fused = 0;  // epilogues run inside a next GEMM's staging so far (tests count them)
};

// B > kMaxGemvBatch: the tensor-core GEMM of lm_gemm.cu when a.gemm is set (see there), else one
// launch per chunk of kMaxGemvBatch rows (x, y / yf, token, x_out offset by their strides), each
// reading the weights again.
// Must be called once before the first launch (and before graph capture).
void gemv_init();
void gemv(GemvIn in, GemvOut out, const GemvArgs& a, cudaStream_t s);
// Measurement hook (personaplex-bench-kernels): 0 (default) sizes the grid to the blocks resident
// at once, each warp looping over row units; 1 launches one warp per row unit (the grid before
// 2026-12-03 v12), whatever the wave count. Not thread-safe; not for serving code.
void gemv_set_grid_policy(int policy);
// Measurement hook (personaplex-bench-kernels --gemm-policy): which batched GEMM kernel runs B >
// kMaxGemvBatch; 0 (default) the shipped one; 1 and 2 experiments (lm_gemm.cu: 16 warps a block;
// gemm_rw_kernel); 3 cuBLAS's bf16 GEMM (fp32 sums) on bf16 weights, or on int8 weights' exact
// bf16 copy (GemvArgs::wq; without one, policy 0), over all B rows at once. Setting 3 creates the
// cuBLAS handle on the current device: call it after the device is chosen and before capture. 4:
// int8 weights on Hopper's wgmma, up to 256 rows a launch (lm_gemm_sm90a.cuh; bf16 weights, or a
// scratch without room, run policy 0); setting it where gemm_wg_available() is false throws. 5:
// policy 4 with k-tiles of 128 up to 128 rows (where K % 128 == 0). 6 (kGemmPolicyAuto, the default, what
// ships): policy 8 for int8 weights from kGemmWgMinRows rows where gemm_wg_available(), else
// policy 0. 8: policy 5, but a launch that runs one K slice applies the epilogue itself (no partial
// sums written, no epilogue kernel; the same bits). 7 and 9 (v0.28), 10, 11 and 12 (v0.29), 13 and 14
// (v0.30-v0.31: a warp-specialized kernel fed by the bulk copy engine from a tiled weight copy, and
// 64-column MMAs) were experiments, not kept: they and other values throw std::invalid_argument. Not thread-safe; not for serving code.
constexpr int kGemmPolicyAuto = 6;
constexpr int kGemmWgMinRows = 40;
void gemm_set_policy(int policy);
int gemm_policy();
// true (the default, as shipped since docs/PERF.md v0.34: the 64-row step 0.1 ms shorter on an H100)
// lets GemvArgs::defer leave an epilogue to the next GEMM (GemmChain); false, a measurement hook
// (personaplex-bench --no-gemm-chain), runs every split-K epilogue as its own kernel. Set it before
// graphs are captured. Not thread-safe; not for serving code.
void gemm_set_chain(bool on);
bool gemm_chain();
// Whether this device runs policy 4 (an sm_90 device and a build with sm_90 among its
// architectures); known after gemv_init().
bool gemm_wg_available();

}  // namespace ppx::kern
