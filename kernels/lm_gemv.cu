// The public GEMV entry points (lm_gemv.cuh) and the bf16-weight instantiations of the kernel
// family in lm_gemv_impl.cuh; the fp8-weight instantiations live in lm_gemv8.cu.
#include "lm_gemv.cuh"

#include <stdexcept>

#include "lm_gemv_impl.cuh"

namespace ppx::kern {

void gemv_init() {
  gemv_impl::init<__nv_bfloat16>();
  gemv_impl::init_fp8();
}

void gemv(GemvIn in, GemvOut out, const GemvArgs& a, cudaStream_t s) {
  // The one place the weight format is chosen: fp8 when w8 is set.
  const bool fp8 = a.w8 != nullptr;
  if (fp8) {
    if (a.w_scale == nullptr) throw std::runtime_error("gemv: fp8 weights need w_scale");
    if (a.K % 16 != 0) throw std::runtime_error("gemv: fp8 weights need K % 16 == 0");
  } else if (a.K % 8 != 0) {
    throw std::runtime_error("gemv: K must be a multiple of 8");
  }
  if (out == GemvOut::kGateUp && a.N % 2 != 0) throw std::runtime_error("gemv: gate/up rows must be even");
  if (static_cast<int64_t>(a.K) * a.B * 2 > gemv_impl::kMaxSmemBytes) throw std::runtime_error("gemv: K * B too large");
  if (fp8) {
    gemv_impl::dispatch_fp8(in, out, a, s);
  } else {
    gemv_impl::dispatch<__nv_bfloat16>(in, out, a, s);
  }
}

}  // namespace ppx::kern
