// The int8-weight instantiations of the GEMV kernel family (lm_gemv_impl.cuh), in their own file so
// that they compile beside the bf16 and fp8 ones. Reached only through kern::gemv() with wi8 set.
#include "lm_gemv_impl.cuh"

namespace ppx::kern::gemv_impl {

void dispatch_int8(GemvIn in, GemvOut out, const GemvArgs& a, cudaStream_t s) { dispatch<int8_t>(in, out, a, s); }

void init_int8() { init<int8_t>(); }

}  // namespace ppx::kern::gemv_impl
