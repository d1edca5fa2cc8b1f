// The public GEMV entry points (lm_gemv.cuh) and the bf16-weight instantiations of the kernel
// family in lm_gemv_impl.cuh; the fp8-weight instantiations live in lm_gemv8.cu.
#include "lm_gemv.cuh"

#include <stdexcept>

#include "lm_gemv_impl.cuh"

namespace ppx::kern {

namespace {
int g_grid_policy = 0;
}

void gemv_set_grid_policy(int policy) { g_grid_policy = policy; }

namespace gemv_impl {
int grid_blocks(int units, int resident_blocks) {
  const int needed = (units + kWarps - 1) / kWarps;
  if (g_grid_policy == 1 || resident_blocks <= 0 || needed <= resident_blocks) return needed;
  const int per_warp = (units + resident_blocks * kWarps - 1) / (resident_blocks * kWarps);
  const int warps = (units + per_warp - 1) / per_warp;
  return (warps + kWarps - 1) / kWarps;
}
}  // namespace gemv_impl

namespace gemm_impl {
void init();  // lm_gemm.cu
}  // namespace gemm_impl

void gemv_init() {
  gemm_impl::init();
  gemv_impl::init<__nv_bfloat16>();
  gemv_impl::init_fp8();
  gemv_impl::init_int8();
}

namespace {
void gemv_chunk(GemvIn in, GemvOut out, const GemvArgs& a, cudaStream_t s);
}  // namespace

namespace gemm_impl {
// lm_gemm.cu: false when the batch cannot run as the GEMM (then the chunked GEMV runs it).
bool gemm_batched(GemvIn in, GemvOut out, const GemvArgs& a, cudaStream_t s);
}  // namespace gemm_impl

void gemv(GemvIn in, GemvOut out, const GemvArgs& a, cudaStream_t s) {
  if (a.B < 1) throw std::runtime_error("gemv: B must be at least 1");
  if (a.B > kMaxGemvBatch && gemm_impl::gemm_batched(in, out, a, s)) return;
  // Otherwise batches past kMaxGemvBatch run as chunks of it, each reading the weights again (from
  // HBM: a layer's weights do not stay in L2). A chain's pending epilogue runs first.
  gemm_chain_flush(a.gemm, s);
  for (int b0 = 0; b0 < a.B; b0 += kMaxGemvBatch) {
    GemvArgs c = a;
    c.B = a.B - b0 < kMaxGemvBatch ? a.B - b0 : kMaxGemvBatch;
    c.x = a.x + static_cast<int64_t>(b0) * a.x_stride;
    if (a.y) c.y = a.y + static_cast<int64_t>(b0) * a.y_stride;
    if (a.yf) c.yf = a.yf + static_cast<int64_t>(b0) * a.y_stride;
    if (a.token) c.token = a.token + b0;
    if (a.x_out) c.x_out = a.x_out + static_cast<int64_t>(b0) * a.K;
    gemv_chunk(in, out, c, s);
  }
}

namespace {

void gemv_chunk(GemvIn in, GemvOut out, const GemvArgs& a, cudaStream_t s) {
  // The one place the weight format is chosen: fp8 when w8 is set, int8 when wi8 is, else bf16.
  const bool fp8 = a.w8 != nullptr, int8 = a.wi8 != nullptr;
  if (fp8 && int8) throw std::runtime_error("gemv: both fp8 and int8 weights given");
  if (fp8 || int8) {
    if (a.w_scale == nullptr) throw std::runtime_error("gemv: 8-bit weights need w_scale");
    if (a.K % 16 != 0) throw std::runtime_error("gemv: 8-bit weights need K % 16 == 0");
  } else if (a.K % 8 != 0) {
    throw std::runtime_error("gemv: K must be a multiple of 8");
  }
  if (out == GemvOut::kGateUp && a.N % 2 != 0) throw std::runtime_error("gemv: gate/up rows must be even");
  if (static_cast<int64_t>(a.K) * a.B * 2 > gemv_impl::kMaxSmemBytes) throw std::runtime_error("gemv: K * B too large");
  if (fp8) {
    gemv_impl::dispatch_fp8(in, out, a, s);
  } else if (int8) {
    gemv_impl::dispatch_int8(in, out, a, s);
  } else {
    gemv_impl::dispatch<__nv_bfloat16>(in, out, a, s);
  }
}

}  // namespace

}  // namespace ppx::kern
