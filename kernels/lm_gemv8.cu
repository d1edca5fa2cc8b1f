// The fp8 e4m3-weight instantiations of the GEMV kernel family (lm_gemv_impl.cuh), in their own
// file so that they compile beside the bf16 ones. Reached only through kern::gemv() with w8 set.
#include "lm_gemv_impl.cuh"

namespace ppx::kern::gemv_impl {

void dispatch_fp8(GemvIn in, GemvOut out, const GemvArgs& a, cudaStream_t s) {
  dispatch<__nv_fp8_e4m3>(in, out, a, s);
}

void init_fp8() { init<__nv_fp8_e4m3>(); }

}  // namespace ppx::kern::gemv_impl
