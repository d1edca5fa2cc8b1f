// The w8a16 GEMV (kern::gemv with fp8 e4m3 or int8 weights and per-row scales) and the row
// quantizers (kern::quantize_fp8_rows, quantize_int8_rows) against host references. The GEMV is held tightly to a double-precision
// host GEMV over the dequantized weights (same prologue and epilogue roundings) and loosely to the
// one over the original bf16 weights (the quantization error itself). GPU cases skip without a GPU.
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "backend/cuda/cuda_util.h"
#include "cuda_test_util.h"
#include "lm_gemm_sm90a.cuh"
#include "lm_gemv.cuh"
#include "lm_misc.cuh"
#include "lm_quant.cuh"

using namespace ppx;
using kern::GemvIn;
using kern::GemvOut;

namespace {


// e4m3 (OCP FP8, bias 7, no infinities, 0x7f / 0xff are NaN) to float, written from the format's
// definition (independent of cuda_fp8.h).
double fp8_e4m3_value(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return (b & 0x80) ? -mag : mag;
}

// Round to bf16 (nearest even) and back, for finite x.
float bf16r(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}

using test::to_host;
template <typename T>
std::vector<T> to_host_raw(const T* d, size_t n) {
  std::vector<T> h(n);
  PPX_CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

// f(begin, end) over [0, n) on all cores.
void parallel_rows(int n, const std::function<void(int, int)>& f) {
  const int t = std::max(1, std::min<int>(static_cast<int>(std::thread::hardware_concurrency()), 32));
  std::vector<std::thread> th;
  const int per = (n + t - 1) / t;
  for (int i = 0; i < t; ++i) {
    const int b = i * per, e = std::min(n, b + per);
    if (b < e) th.emplace_back(f, b, e);
  }
  for (auto& x : th) x.join();
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

// The prologue of `in` on the host, as the kernel computes it: x [B, 2K] -> staged [B, K], bf16-rounded.
std::vector<float> host_prologue(GemvIn in, const std::vector<float>& x, const std::vector<float>& alpha, int B,
                                 int K, float eps) {
  std::vector<float> xs(static_cast<size_t>(B) * K);
  for (int b = 0; b < B; ++b) {
    const float* xb = x.data() + static_cast<size_t>(b) * 2 * K;
    float* d = xs.data() + static_cast<size_t>(b) * K;
    if (in == GemvIn::kPlain) {
      for (int k = 0; k < K; ++k) d[k] = xb[k];
    } else if (in == GemvIn::kRmsNorm) {
      double ss = 0;
      for (int k = 0; k < K; ++k) ss += static_cast<double>(xb[k]) * xb[k];
      const float r = static_cast<float>(1.0 / std::sqrt(ss / K + eps));
      for (int k = 0; k < K; ++k) d[k] = bf16r(xb[k] * (alpha[k] * r));
    } else if (in == GemvIn::kSiluGate) {
      for (int k = 0; k < K; ++k) d[k] = bf16r(xb[k] / (1.f + std::exp(-xb[k])) * xb[K + k]);
    } else {
      throw std::logic_error("host_prologue: unsupported prologue");
    }
  }
  return xs;
}

// The GEMV and epilogue `out` on the host: acc[b, n] = scale[n] * sum_k wq[n, k] * xs[b, k] in
// double (scale = 1 for unquantized weights), then the epilogue's roundings. y0 is the residual
// stream for kResidual. Returns [B, N] (kGateUp: [B, N/2]).
std::vector<float> host_gemv(GemvOut out, const std::vector<float>& w, const std::vector<float>& scale,
                             const std::vector<float>& xs, const std::vector<float>& y0, int B, int N, int K) {
  std::vector<double> acc(static_cast<size_t>(B) * N);
  parallel_rows(N, [&](int n0, int n1) {
    for (int n = n0; n < n1; ++n) {
      const float* wr = w.data() + static_cast<size_t>(n) * K;
      for (int b = 0; b < B; ++b) {
        const float* xb = xs.data() + static_cast<size_t>(b) * K;
        double s = 0;
        for (int k = 0; k < K; ++k) s += static_cast<double>(wr[k]) * xb[k];
        acc[static_cast<size_t>(b) * N + n] = s * (scale.empty() ? 1.0 : scale[n]);
      }
    }
  });
  const int NO = out == GemvOut::kGateUp ? N / 2 : N;
  std::vector<float> y(static_cast<size_t>(B) * NO);
  for (int b = 0; b < B; ++b) {
    for (int n = 0; n < NO; ++n) {
      const float r = bf16r(static_cast<float>(acc[static_cast<size_t>(b) * N + n]));
      float& o = y[static_cast<size_t>(b) * NO + n];
      if (out == GemvOut::kGateUp) {
        const float u = bf16r(static_cast<float>(acc[static_cast<size_t>(b) * N + n + NO]));
        o = bf16r(r / (1.f + std::exp(-r)) * u);
      } else if (out == GemvOut::kResidual) {
        o = bf16r(y0[static_cast<size_t>(b) * N + n] + r);
      } else {
        o = r;  // kStore (bf16) and kLogits (float of the bf16-rounded value)
      }
    }
  }
  return y;
}

const char* name(GemvIn in) {
  switch (in) {
    case GemvIn::kPlain: return "plain";
    case GemvIn::kRmsNorm: return "rmsnorm";
    case GemvIn::kSiluGate: return "silugate";
    default: return "?";
  }
}
const char* name(GemvOut out) {
  switch (out) {
    case GemvOut::kStore: return "store";
    case GemvOut::kResidual: return "residual";
    case GemvOut::kLogits: return "logits";
    case GemvOut::kGateUp: return "gateup";
    default: return "?";
  }
}

struct Case {
  GemvIn in;
  GemvOut out;
  int N, K;
};

// The shape, inputs and outputs of a test GEMV: x rows of 2K (kSiluGate reads both halves), y / yf
// rows of the output width (kGateUp: N / 2), or of N where the epilogue adds to y.
void set_io(kern::GemvArgs& a, const Case& c, const __nv_bfloat16* x, int B, const __nv_bfloat16* alpha,
            __nv_bfloat16* y, float* yf) {
  a.x = x;
  a.x_stride = 2 * c.K;
  a.N = c.N;
  a.K = c.K;
  a.B = B;
  a.alpha = alpha;
  a.y = y;
  a.yf = yf;
  a.y_stride = c.out == GemvOut::kResidual ? c.N : c.out == GemvOut::kGateUp ? c.N / 2 : c.N;
}

// Quantizes random bf16 weights [N, K] on the device (fp8 e4m3, or int8), then for each batch size
// (B > 4: the tensor-core GEMM of lm_gemm.cu, given a staging buffer) runs the 8-bit GEMV and
// compares with the host references. bf16_weights: the bf16 weights themselves instead (held to
// the reference over them).
void check_case(const Case& c, bool int8 = false, const std::vector<int>& batches = {1, 2, 3, 4},
                bool bf16_weights = false) {
  const int N = c.N, K = c.K;
  const float eps = 1e-5f;
  const size_t wn = static_cast<size_t>(N) * K;
  const size_t mb = static_cast<size_t>(*std::max_element(batches.begin(), batches.end()));
  cuda::DeviceBuffer<__nv_bfloat16> w(wn), x(mb * 2 * K), alpha(K), y0(mb * N), y(mb * N),
      xstage(kern::gemm_xstage_elems(static_cast<int>(mb), K));
  cuda::DeviceBuffer<__nv_fp8_e4m3> q(wn);
  cuda::DeviceBuffer<__nv_bfloat16> wq(int8 ? wn : 0);  // the int8 values as bf16 (gemm policy 3)
  cuda::DeviceBuffer<float> scale(N), yf(mb * N), ws(kern::gemm_ws_floats(static_cast<int>(mb), N));
  const uint64_t seed = static_cast<uint64_t>(N) * 131 + K;
  kern::fill_random_bf16(w.get(), static_cast<int64_t>(wn), seed, 0.02f, 0.f, nullptr);
  // Rows of different magnitudes (scales) and, where there are enough rows, a row of zeros.
  for (int n = 0; n < std::min(N, 8); ++n) {
    kern::fill_random_bf16(w.get() + static_cast<size_t>(n) * K, K, seed + 7 + n, std::ldexp(0.02f, n - 4), 0.f, nullptr);
  }
  if (N > 3) PPX_CUDA_CHECK(cudaMemset(w.get() + static_cast<size_t>(3) * K, 0, K * sizeof(__nv_bfloat16)));
  kern::fill_random_bf16(x.get(), static_cast<int64_t>(x.size()), seed + 1, 1.f, 0.f, nullptr);
  kern::fill_random_bf16(alpha.get(), K, seed + 2, 0.05f, 1.f, nullptr);
  kern::fill_random_bf16(y0.get(), static_cast<int64_t>(y0.size()), seed + 3, 0.01f, 0.f, nullptr);
  if (int8) {
    kern::quantize_int8_rows(w.get(), N, K, reinterpret_cast<int8_t*>(q.get()), scale.get(), nullptr);
    kern::int8_to_bf16(reinterpret_cast<const int8_t*>(q.get()), wq.get(), static_cast<int64_t>(wn), nullptr);
  } else {
    kern::quantize_fp8_rows(w.get(), N, K, q.get(), scale.get(), nullptr);
  }
  PPX_CUDA_CHECK(cudaDeviceSynchronize());
  PPX_CUDA_CHECK(cudaGetLastError());

  const std::vector<float> hw = to_host(w), hx = to_host(x), ha = to_host(alpha), hy0 = to_host(y0);
  const std::vector<float> hs = to_host_raw(scale.get(), N);
  const std::vector<uint8_t> hq = to_host_raw(reinterpret_cast<const uint8_t*>(q.get()), wn);
  std::vector<float> hdq(wn);  // float(q): the scale is applied to the dot product, as in the kernel
  parallel_rows(N, [&](int n0, int n1) {
    for (size_t i = static_cast<size_t>(n0) * K; i < static_cast<size_t>(n1) * K; ++i) {
      hdq[i] = int8 ? static_cast<float>(static_cast<int8_t>(hq[i])) : static_cast<float>(fp8_e4m3_value(hq[i]));
    }
  });

  const char* wname = bf16_weights ? "bf16 " : int8 ? "int8 " : "fp8 ";
  for (const int B : batches) {
    SCOPED_TRACE(testing::Message() << wname << name(c.in) << "/" << name(c.out) << " N=" << N
                                     << " K=" << K << " B=" << B);
    const int NO = c.out == GemvOut::kGateUp ? N / 2 : N;
    PPX_CUDA_CHECK(cudaMemcpy(y.get(), y0.get(), y0.bytes(), cudaMemcpyDeviceToDevice));
    kern::GemvArgs a;
    if (bf16_weights) {
      a.w = w.get();
    } else if (int8) {
      a.wi8 = reinterpret_cast<const int8_t*>(q.get());
      a.w_scale = scale.get();
      a.wq = wq.get();
    } else {
      a.w8 = q.get();
      a.w_scale = scale.get();
    }
    if (B > kern::kMaxGemvBatch) a.gemm = kern::GemmScratch{xstage.get(), ws.get(), ws.size(), xstage.size()};
    set_io(a, c, x.get(), B, alpha.get(), y.get(), yf.get());
    a.eps = eps;
    kern::gemv(c.in, c.out, a, nullptr);
    PPX_CUDA_CHECK(cudaGetLastError());
    PPX_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> got;
    if (c.out == GemvOut::kLogits) {
      const std::vector<float> f = to_host_raw(yf.get(), static_cast<size_t>(B) * NO);
      got = f;
    } else {
      got = to_host(y);
      got.resize(static_cast<size_t>(B) * NO);
    }
    // y0 in the layout the kernel reads (stride N, the first B rows).
    const std::vector<float> xs = host_prologue(c.in, hx, ha, B, K, eps);
    const std::vector<float> ref_q = host_gemv(c.out, hdq, hs, xs, hy0, B, N, K);
    const std::vector<float> ref_w = host_gemv(c.out, hw, {}, xs, hy0, B, N, K);
    bool finite = true;
    for (float v : got) finite = finite && std::isfinite(v);
    ASSERT_TRUE(finite);
    const double eq = rel_l2(got, ref_q), ew = rel_l2(got, ref_w);
    std::printf("gemv8 %s%-8s/%-8s N=%5d K=%5d B=%2d: rel L2 vs dequantized %.2e, vs bf16 weights %.2e\n", wname,
                name(c.in), name(c.out), N, K, B, eq, ew);
    if (bf16_weights) {
      EXPECT_LE(ew, 1e-3);
    } else {
      EXPECT_LE(eq, 1e-3);
      EXPECT_LE(ew, int8 ? 2e-2 : 5e-2);
    }
  }
}

}  // namespace

// The quantizer on crafted rows: zeros, mixed signs and magnitudes over many binades (subnormal
// e4m3 codes included), one large outlier. scale = max|w| / 448 exactly (1 for zeros) and every
// code is a nearest finite e4m3 value to w / scale.
TEST(CudaGemv8, QuantizeRowsIsNearestWithMaxScale) {
  SKIP_WITHOUT_GPU();
  const int N = 5, K = 200;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> wf(static_cast<size_t>(N) * K);
  for (int k = 0; k < K; ++k) {
    wf[0 * K + k] = 0.f;
    wf[1 * K + k] = u(rng);
    wf[2 * K + k] = std::ldexp(u(rng), -(k % 24));  // down to 2^-24 of the max: e4m3 subnormals and 0
    wf[3 * K + k] = k == 17 ? -300.f : u(rng) * 1e-2f;
    wf[4 * K + k] = std::ldexp(1.f + (k % 8) / 8.f + 1.f / 32.f, -(k % 12));  // ties and near-ties
  }
  std::vector<__nv_bfloat16> wb(wf.size());
  for (size_t i = 0; i < wf.size(); ++i) {
    wb[i] = __float2bfloat16(wf[i]);
    wf[i] = __bfloat162float(wb[i]);
  }
  cuda::DeviceBuffer<__nv_bfloat16> w(wb.size());
  cuda::DeviceBuffer<__nv_fp8_e4m3> q(wb.size());
  cuda::DeviceBuffer<float> scale(N);
  w.upload(wb.data(), wb.size());
  kern::quantize_fp8_rows(w.get(), N, K, q.get(), scale.get(), nullptr);
  PPX_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> hs = to_host_raw(scale.get(), N);
  const std::vector<uint8_t> hq = to_host_raw(reinterpret_cast<const uint8_t*>(q.get()), wb.size());
  for (int n = 0; n < N; ++n) {
    float mx = 0.f;
    for (int k = 0; k < K; ++k) mx = std::max(mx, std::fabs(wf[static_cast<size_t>(n) * K + k]));
    const float want = mx > 0.f ? mx / 448.f : 1.f;
    EXPECT_EQ(hs[n], want) << "row " << n;
    for (int k = 0; k < K; ++k) {
      const size_t i = static_cast<size_t>(n) * K + k;
      const double v = wf[i] / hs[n];  // fp32 division, as the kernel
      const double v32 = static_cast<float>(wf[i] / hs[n]);
      const double got = fp8_e4m3_value(hq[i]);
      ASSERT_FALSE(std::isnan(got)) << "row " << n << " k " << k;
      double best = std::numeric_limits<double>::infinity();
      for (int code = 0; code < 256; ++code) {
        const double c = fp8_e4m3_value(static_cast<uint8_t>(code));
        if (!std::isnan(c)) best = std::min(best, std::fabs(c - v32));
      }
      EXPECT_EQ(std::fabs(got - v32), best) << "row " << n << " k " << k << " w/scale " << v;
      if (std::fabs(wf[i]) == mx && mx > 0.f) {
        EXPECT_EQ(std::fabs(got), 448.0) << "row " << n << " k " << k;
      }
    }
  }
}

// Model shapes (temporal out / QKV-like, FFN gate-up, FFN out, text head, depformer) and a small
// odd one, each with the prologue/epilogue pairs the LM uses on it.
TEST(CudaGemv8, MatchesHostReferenceOnModelShapes) {
  SKIP_WITHOUT_GPU();
  kern::gemv_init();
  const Case cases[] = {
      {GemvIn::kPlain, GemvOut::kStore, 40, 96},        {GemvIn::kRmsNorm, GemvOut::kStore, 40, 96},
      {GemvIn::kSiluGate, GemvOut::kResidual, 40, 96},  {GemvIn::kPlain, GemvOut::kGateUp, 40, 96},
      {GemvIn::kRmsNorm, GemvOut::kLogits, 40, 96},     {GemvIn::kPlain, GemvOut::kStore, 1024, 1024},
      {GemvIn::kRmsNorm, GemvOut::kLogits, 1024, 1024}, {GemvIn::kPlain, GemvOut::kStore, 4096, 4096},
      {GemvIn::kRmsNorm, GemvOut::kStore, 4096, 4096},  {GemvIn::kPlain, GemvOut::kGateUp, 11264 * 2, 4096},
      {GemvIn::kSiluGate, GemvOut::kResidual, 4096, 11264}, {GemvIn::kRmsNorm, GemvOut::kLogits, 32000, 4096},
      {GemvIn::kPlain, GemvOut::kStore, 8200, 1040},    // the two-rows-per-warp path with a partial last warp
  };
  for (const Case& c : cases) check_case(c);
}

// The same shapes with int8 weights (the same kernel family, the other 8-bit type).
TEST(CudaGemv8, Int8MatchesHostReferenceOnModelShapes) {
  SKIP_WITHOUT_GPU();
  kern::gemv_init();
  const Case cases[] = {
      {GemvIn::kPlain, GemvOut::kStore, 40, 96},         {GemvIn::kRmsNorm, GemvOut::kLogits, 40, 96},
      {GemvIn::kSiluGate, GemvOut::kResidual, 40, 96},   {GemvIn::kPlain, GemvOut::kGateUp, 40, 96},
      {GemvIn::kRmsNorm, GemvOut::kStore, 4096, 4096},   {GemvIn::kPlain, GemvOut::kGateUp, 11264 * 2, 4096},
      {GemvIn::kSiluGate, GemvOut::kResidual, 4096, 11264}, {GemvIn::kRmsNorm, GemvOut::kLogits, 32000, 4096},
      {GemvIn::kPlain, GemvOut::kStore, 8200, 1040},
  };
  for (const Case& c : cases) check_case(c, /*int8=*/true);
}

// Batches above 4 with a staging buffer run as the tensor-core GEMM (lm_gemm.cu), int8 and bf16
// weights, every prologue and epilogue, partial row tiles (N = 40) and batch tiles (B = 5, 13), more
// than 64 rows (two launches), a last K slice that ends inside a 64-wide chunk (K = 4128), and
// K % 32 != 0 (the chunked GEMV instead): held to the same host references as the GEMV.
TEST(CudaGemv8, BatchedGemmMatchesHostReference) {
  SKIP_WITHOUT_GPU();
  kern::gemv_init();
  const Case cases[] = {
      {GemvIn::kPlain, GemvOut::kStore, 40, 96},         {GemvIn::kRmsNorm, GemvOut::kLogits, 40, 96},
      {GemvIn::kSiluGate, GemvOut::kResidual, 40, 96},   {GemvIn::kPlain, GemvOut::kGateUp, 40, 96},
      {GemvIn::kRmsNorm, GemvOut::kStore, 4096, 4096},   {GemvIn::kRmsNorm, GemvOut::kGateUp, 11264 * 2, 4096},
      {GemvIn::kPlain, GemvOut::kResidual, 4096, 11264}, {GemvIn::kRmsNorm, GemvOut::kLogits, 2048, 1024},
      {GemvIn::kPlain, GemvOut::kStore, 200, 1040},      {GemvIn::kRmsNorm, GemvOut::kStore, 300, 4128},
  };
  // Every kernel variant (personaplex-bench-kernels --gemm-policy) against the same references;
  // policy 3 (cuBLAS) on the bf16 weights and on the int8 weights' bf16 copy.
  for (int policy : {0, 1, 2, 3}) {
    SCOPED_TRACE(testing::Message() << "gemm policy " << policy);
    kern::gemm_set_policy(policy);
    for (const Case& c : cases) check_case(c, /*int8=*/true, {5, 8, 13, 64, 70});
    for (const Case& c : cases) check_case(c, /*int8=*/false, {5, 16, 64}, /*bf16_weights=*/true);
  }
  kern::gemm_set_policy(kern::kGemmPolicyAuto);  // as shipped
}

// The wgmma GEMM's test shapes: a partial last row tile (N = 200), one k-tile (K = 64), every
// prologue and epilogue, and the LM's large shapes.
const Case kWgmmaCases[] = {
    {GemvIn::kPlain, GemvOut::kStore, 40, 64},          {GemvIn::kRmsNorm, GemvOut::kLogits, 200, 1088},
    {GemvIn::kSiluGate, GemvOut::kResidual, 136, 128},  {GemvIn::kPlain, GemvOut::kGateUp, 264, 256},
    {GemvIn::kRmsNorm, GemvOut::kStore, 4096, 4096},    {GemvIn::kRmsNorm, GemvOut::kGateUp, 11264 * 2, 4096},
    {GemvIn::kPlain, GemvOut::kResidual, 4096, 11264},  {GemvIn::kRmsNorm, GemvOut::kLogits, 32000, 4096},
    {GemvIn::kRmsNorm, GemvOut::kStore, 3 * 1024, 1024},
};

// Policy 4 (int8 weights on wgmma, lm_gemm_sm90a.cu; H100 / H200 only): the same references at
// batches that fill one launch partly (5, 13, 70, 100, 160), exactly (256) and over it (300: two
// launches), on shapes with K % 64 == 0 (the others, and bf16 weights, run policy 0) including a
// partial last row tile (N = 200) and one k-tile (K = 64). Each shape the LM has must plan a launch.
TEST(CudaGemv8, WgmmaGemmMatchesHostReference) {
  SKIP_WITHOUT_GPU();
  kern::gemv_init();
  if (!kern::gemm_wg_available()) GTEST_SKIP() << "no sm_90a kernels for this device (policy 4 runs on H100 / H200)";
  const auto& cases = kWgmmaCases;
  for (const Case& c : cases) {
    for (int B : {5, 160, 256}) {
      kern::GemvArgs a;
      a.wi8 = reinterpret_cast<const int8_t*>(&c);  // any non-null pointer: plan() reads shapes only
      a.N = c.N;
      a.K = c.K;
      a.B = B;
      cuda::DeviceBuffer<float> ws(kern::gemm_ws_floats(B, c.N));
      a.gemm = kern::GemmScratch{reinterpret_cast<__nv_bfloat16*>(ws.get()), ws.get(), ws.size(),
                                 kern::gemm_xstage_elems(B, c.K)};
      EXPECT_GT(kern::gemm_wg::plan(a, B, 132, true), 0) << "N=" << c.N << " K=" << c.K << " B=" << B;
      EXPECT_GT(kern::gemm_wg::plan(a, B, 132, false), 0) << "N=" << c.N << " K=" << c.K << " B=" << B;
    }
  }
  for (int policy : {4, 5, 8}) {
  SCOPED_TRACE(testing::Message() << "gemm policy " << policy);
  kern::gemm_set_policy(policy);
  for (const Case& c : cases) {  // every batch on the small shapes; the model's at fewer (host reference time)
    if (static_cast<int64_t>(c.N) * c.K < 4 << 20)
      check_case(c, /*int8=*/true, {5, 13, 70, 100, 160, 256, 300});
    else
      check_case(c, /*int8=*/true, {13, 64, 160, 300});
  }
  check_case({GemvIn::kRmsNorm, GemvOut::kStore, 300, 4128}, /*int8=*/true, {70});  // K % 64 != 0: policy 0
  check_case({GemvIn::kPlain, GemvOut::kStore, 4096, 4096}, /*int8=*/false, {70}, /*bf16_weights=*/true);
  }
  kern::gemm_set_policy(kern::kGemmPolicyAuto);  // as shipped
}

// Policy 8 (policy 5, but a launch of one K slice applies the epilogue itself) writes the same bits
// as policy 5 (the epilogue kernel's sum and rounding), on shapes and batches where it runs one K
// slice and several (there it is policy 5), every epilogue, partial tiles and a kGateUp whose half
// is not a multiple of 64.
TEST(CudaGemv8, WgmmaFusedEpilogueEqualsPolicy5) {
  SKIP_WITHOUT_GPU();
  kern::gemv_init();
  if (!kern::gemm_wg_available()) GTEST_SKIP() << "no sm_90a kernels for this device (policy 8 runs on H100 / H200)";
  // The reference test's shapes, and the temporal QKV and two depformer shapes.
  std::vector<Case> cases(std::begin(kWgmmaCases), std::end(kWgmmaCases));
  cases.push_back({GemvIn::kRmsNorm, GemvOut::kStore, 3 * 4096, 4096});
  cases.push_back({GemvIn::kPlain, GemvOut::kResidual, 1024, 1024});
  cases.push_back({GemvIn::kPlain, GemvOut::kGateUp, 2 * 2816, 1024});
  const std::vector<int> batches{5, 64, 100, 300};
  const int mb = 300;
  int dev = 0, sms = 0;
  PPX_CUDA_CHECK(cudaGetDevice(&dev));
  PPX_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  bool one_slice = false, several = false;
  for (const Case& c : cases) {
    const int N = c.N, K = c.K, NO = c.out == GemvOut::kGateUp ? N / 2 : N;
    const size_t wn = static_cast<size_t>(N) * K;
    cuda::DeviceBuffer<__nv_bfloat16> w(wn), x(static_cast<size_t>(mb) * 2 * K), alpha(K), y0(static_cast<size_t>(mb) * N),
        y(static_cast<size_t>(mb) * N), xstage(kern::gemm_xstage_elems(mb, K));
    cuda::DeviceBuffer<int8_t> q(wn);
    cuda::DeviceBuffer<float> scale(N), yf(static_cast<size_t>(mb) * N), ws(kern::gemm_ws_floats(mb, N));
    const uint64_t seed = static_cast<uint64_t>(N) * 17 + K;
    kern::fill_random_bf16(w.get(), static_cast<int64_t>(wn), seed, 0.02f, 0.f, nullptr);
    kern::fill_random_bf16(x.get(), static_cast<int64_t>(x.size()), seed + 1, 1.f, 0.f, nullptr);
    kern::fill_random_bf16(alpha.get(), K, seed + 2, 0.05f, 1.f, nullptr);
    kern::fill_random_bf16(y0.get(), static_cast<int64_t>(y0.size()), seed + 3, 0.01f, 0.f, nullptr);
    kern::quantize_int8_rows(w.get(), N, K, q.get(), scale.get(), nullptr);
    for (const int B : batches) {
      SCOPED_TRACE(testing::Message() << name(c.in) << "/" << name(c.out) << " N=" << N << " K=" << K << " B=" << B);
      kern::GemvArgs a;
      a.wi8 = q.get();
      a.w_scale = scale.get();
      a.gemm = kern::GemmScratch{xstage.get(), ws.get(), ws.size(), xstage.size()};
      set_io(a, c, x.get(), B, alpha.get(), y.get(), yf.get());
      // The K slices of the first launch (policy 8 fuses where this is 1).
      const int S = kern::gemm_wg::plan(a, std::min(B, kern::gemm_wg::kMaxRows), sms, true);
      ASSERT_GT(S, 0);
      (S == 1 ? one_slice : several) = true;
      const int policies[] = {5, 8};
      std::vector<uint16_t> out_y[2];
      std::vector<uint32_t> out_f[2];
      for (int i = 0; i < 2; ++i) {
        kern::gemm_set_policy(policies[i]);
        PPX_CUDA_CHECK(cudaMemcpy(y.get(), y0.get(), y0.bytes(), cudaMemcpyDeviceToDevice));
        PPX_CUDA_CHECK(cudaMemset(yf.get(), 0xff, yf.bytes()));
        kern::gemv(c.in, c.out, a, nullptr);
        PPX_CUDA_CHECK(cudaGetLastError());
        PPX_CUDA_CHECK(cudaDeviceSynchronize());
        out_y[i] = to_host_raw(reinterpret_cast<const uint16_t*>(y.get()), static_cast<size_t>(B) * a.y_stride);
        out_f[i] = to_host_raw(reinterpret_cast<const uint32_t*>(yf.get()), static_cast<size_t>(B) * NO);
      }
      size_t diff = 0;
      for (size_t k = 0; k < out_y[0].size(); ++k) diff += out_y[0][k] != out_y[1][k];
      for (size_t k = 0; k < out_f[0].size(); ++k) diff += out_f[0][k] != out_f[1][k];
      EXPECT_EQ(diff, 0u) << "outputs that differ in any bit (K slices: " << S << ")";
    }
  }
  EXPECT_TRUE(one_slice) << "no case ran one K slice";
  EXPECT_TRUE(several) << "no case ran several K slices";
  kern::gemm_set_policy(kern::kGemmPolicyAuto);  // as shipped
}

// A GEMM chain (GemvArgs::defer, GemmChain): FFN in leaves its split-K epilogue to FFN out's
// staging kernel, as the batched LM runs it, and (deferred too here) the out projection's and FFN
// out's run before the norms that read them; the outputs (the residual stream, the gate-up output
// and the next QKV) are bit for bit those of the same calls without the chain. Depformer and temporal shapes; 40-256 rows (one wgmma launch:
// every epilogue of several K slices deferred), 20
// (the mma.sync kernel: nothing deferred) and 300 (two launches: nothing deferred).
TEST(CudaGemv8, GemmChainEqualsUnchained) {
  SKIP_WITHOUT_GPU();
  kern::gemv_init();
  if (!kern::gemm_wg_available()) GTEST_SKIP() << "no sm_90a kernels for this device (policy 8 runs on H100 / H200)";
  kern::gemm_set_policy(kern::kGemmPolicyAuto);
  kern::gemm_set_chain(true);  // as shipped; the unchained pass gives no GemmChain
  struct Shape {
    int D, H;
  };
  const Shape shapes[] = {{1024, 2816}, {4096, 11264}};
  const std::vector<int> batches{20, 40, 64, 100, 256, 300};
  const int mb = 300;
  int64_t deferred_all = 0;
  for (const Shape& sh : shapes) {
    const int D = sh.D, H = sh.H;
    // Weights: out [D, D], FFN in [2H, D], FFN out [D, H], QKV [3D, D].
    const int Ns[4] = {D, 2 * H, D, 3 * D}, Ks[4] = {D, D, H, D};
    std::vector<cuda::DeviceBuffer<int8_t>> q;
    std::vector<cuda::DeviceBuffer<float>> sc;
    for (int i = 0; i < 4; ++i) {
      const size_t wn = static_cast<size_t>(Ns[i]) * Ks[i];
      cuda::DeviceBuffer<__nv_bfloat16> w(wn);
      kern::fill_random_bf16(w.get(), static_cast<int64_t>(wn), 900 + 10 * i + D, 0.02f, 0.f, nullptr);
      q.emplace_back(wn);
      sc.emplace_back(Ns[i]);
      kern::quantize_int8_rows(w.get(), Ns[i], Ks[i], q.back().get(), sc.back().get(), nullptr);
    }
    cuda::DeviceBuffer<__nv_bfloat16> att(static_cast<size_t>(mb) * D), x0(static_cast<size_t>(mb) * D),
        x(static_cast<size_t>(mb) * D), gu(static_cast<size_t>(mb) * H), qkv(static_cast<size_t>(mb) * 3 * D),
        a1(D), a2(D), xstage(kern::gemm_xstage_elems(mb, H));
    cuda::DeviceBuffer<float> ws(kern::gemm_ws_floats(mb, 2 * H));
    kern::fill_random_bf16(att.get(), static_cast<int64_t>(att.size()), 31 + D, 1.f, 0.f, nullptr);
    kern::fill_random_bf16(x0.get(), static_cast<int64_t>(x0.size()), 32 + D, 1.f, 0.f, nullptr);
    kern::fill_random_bf16(a1.get(), D, 33 + D, 0.05f, 1.f, nullptr);
    kern::fill_random_bf16(a2.get(), D, 34 + D, 0.05f, 1.f, nullptr);
    for (const int B : batches) {
      SCOPED_TRACE(testing::Message() << "D=" << D << " H=" << H << " B=" << B);
      std::vector<uint16_t> got[2][3];
      for (int chained = 0; chained < 2; ++chained) {
        kern::GemmChain chain;
        kern::GemmScratch g{xstage.get(), ws.get(), ws.size(), xstage.size()};
        if (chained) g.chain = &chain;
        auto call = [&](int i, GemvIn in, GemvOut out, const __nv_bfloat16* xin, __nv_bfloat16* y,
                        const __nv_bfloat16* alpha, bool defer) {
          kern::GemvArgs a;
          a.wi8 = q[i].get();
          a.w_scale = sc[i].get();
          a.x = xin;
          a.x_stride = Ks[i];
          a.N = Ns[i];
          a.K = Ks[i];
          a.B = B;
          a.alpha = alpha;
          a.y = y;
          a.y_stride = out == GemvOut::kGateUp ? Ns[i] / 2 : Ns[i];
          a.gemm = g;
          a.defer = defer;
          kern::gemv(in, out, a, nullptr);
          PPX_CUDA_CHECK(cudaGetLastError());
        };
        PPX_CUDA_CHECK(cudaMemcpy(x.get(), x0.get(), x0.bytes(), cudaMemcpyDeviceToDevice));
        // Every call defers: FFN out (plain rows) takes FFN in's epilogue into its staging; FFN in
        // and QKV (normed rows) run the epilogue before them.
        int64_t deferred = 0, taken = 0;
        call(0, GemvIn::kPlain, GemvOut::kResidual, att.get(), x.get(), nullptr, true);
        deferred += chain.pending;
        call(1, GemvIn::kRmsNorm, GemvOut::kGateUp, x.get(), gu.get(), a2.get(), true);
        deferred += chain.pending;
        taken += chain.pending;
        call(2, GemvIn::kPlain, GemvOut::kResidual, gu.get(), x.get(), nullptr, true);
        deferred += chain.pending;
        call(3, GemvIn::kRmsNorm, GemvOut::kStore, x.get(), qkv.get(), a1.get(), false);
        EXPECT_FALSE(chain.pending) << "the QKV call took or ran the FFN out's epilogue";
        EXPECT_EQ(chain.fused, taken) << "FFN in's deferred epilogue ran inside FFN out's staging";
        if (B < 40 || B > kern::gemm_wg::kMaxRows) {
          EXPECT_EQ(deferred, 0) << "deferred outside one wgmma launch";
        }
        deferred_all += deferred;
        PPX_CUDA_CHECK(cudaDeviceSynchronize());
        got[chained][0] = to_host_raw(reinterpret_cast<const uint16_t*>(x.get()), static_cast<size_t>(B) * D);
        got[chained][1] = to_host_raw(reinterpret_cast<const uint16_t*>(gu.get()), static_cast<size_t>(B) * H);
        got[chained][2] = to_host_raw(reinterpret_cast<const uint16_t*>(qkv.get()), static_cast<size_t>(B) * 3 * D);
      }
      const char* what[3] = {"residual stream", "gate-up output", "QKV"};
      for (int k = 0; k < 3; ++k) {
        size_t diff = 0;
        for (size_t i = 0; i < got[0][k].size(); ++i) diff += got[0][k][i] != got[1][k][i];
        EXPECT_EQ(diff, 0u) << what[k] << ": values that differ in any bit";
      }
    }
  }
  EXPECT_GT(deferred_all, 0) << "no case left an epilogue pending (every launch ran one K slice)";
  kern::gemm_set_chain(true);  // as shipped
}

// The GEMM policy hook takes 0-6 and 8 (7 and 9-14 were experiments that left the code); the
// check comes before any CUDA call, so this runs without a GPU.
TEST(CudaGemv8, GemmPolicyOutsideTheListThrows) {
  const int before = kern::gemm_policy();
  for (int p : {-1, 7, 9, 10, 11, 12, 13, 14, 15}) EXPECT_THROW(kern::gemm_set_policy(p), std::invalid_argument) << p;
  EXPECT_EQ(kern::gemm_policy(), before);
}

// The int8 quantizer: scale = max|w| / 127 exactly (1 for zeros), every code is rint(w / scale)
// (fp32 division) within [-127, 127], and the row's largest entry maps to +-127.
TEST(CudaGemv8, QuantizeInt8RowsIsNearestWithMaxScale) {
  SKIP_WITHOUT_GPU();
  const int N = 4, K = 300;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<__nv_bfloat16> wb(static_cast<size_t>(N) * K);
  std::vector<float> wf(wb.size());
  for (int k = 0; k < K; ++k) {
    const float v[4] = {0.f, u(rng), k == 17 ? -300.f : u(rng) * 1e-2f, std::ldexp(u(rng), -(k % 20))};
    for (int n = 0; n < N; ++n) {
      wb[static_cast<size_t>(n) * K + k] = __float2bfloat16(v[n]);
      wf[static_cast<size_t>(n) * K + k] = __bfloat162float(wb[static_cast<size_t>(n) * K + k]);
    }
  }
  cuda::DeviceBuffer<__nv_bfloat16> w(wb.size());
  cuda::DeviceBuffer<int8_t> q(wb.size());
  cuda::DeviceBuffer<float> scale(N);
  w.upload(wb.data(), wb.size());
  kern::quantize_int8_rows(w.get(), N, K, q.get(), scale.get(), nullptr);
  PPX_CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> hs = to_host_raw(scale.get(), N);
  const std::vector<int8_t> hq = to_host_raw(q.get(), wb.size());
  for (int n = 0; n < N; ++n) {
    float mx = 0.f;
    for (int k = 0; k < K; ++k) mx = std::max(mx, std::fabs(wf[static_cast<size_t>(n) * K + k]));
    EXPECT_EQ(hs[n], mx > 0.f ? mx / 127.f : 1.f) << "row " << n;
    for (int k = 0; k < K; ++k) {
      const size_t i = static_cast<size_t>(n) * K + k;
      const float want = std::min(127.f, std::max(-127.f, std::rint(wf[i] / hs[n])));
      EXPECT_EQ(static_cast<float>(hq[i]), want) << "row " << n << " k " << k;
      if (std::fabs(wf[i]) == mx && mx > 0.f) {
        EXPECT_EQ(std::abs(static_cast<int>(hq[i])), 127);
      }
    }
  }
}

// The argument checks of the fp8 path (host only: they throw before anything is launched).
TEST(CudaGemv8, RejectsBadArguments) {
  kern::GemvArgs a;
  a.w8 = reinterpret_cast<const __nv_fp8_e4m3*>(16);
  a.w_scale = reinterpret_cast<const float*>(16);
  a.N = 64;
  a.K = 104;  // a multiple of 8, not of 16
  EXPECT_THROW(kern::gemv(GemvIn::kPlain, GemvOut::kStore, a, nullptr), std::runtime_error);
  a.K = 96;
  a.w_scale = nullptr;
  EXPECT_THROW(kern::gemv(GemvIn::kPlain, GemvOut::kStore, a, nullptr), std::runtime_error);
  EXPECT_THROW(kern::quantize_fp8_rows(nullptr, 4, 0, nullptr, nullptr, nullptr), std::runtime_error);
  EXPECT_THROW(kern::quantize_int8_rows(nullptr, 4, 0, nullptr, nullptr, nullptr), std::runtime_error);
  a.w_scale = reinterpret_cast<const float*>(16);
  a.wi8 = reinterpret_cast<const int8_t*>(16);  // both 8-bit types at once
  EXPECT_THROW(kern::gemv(GemvIn::kPlain, GemvOut::kStore, a, nullptr), std::runtime_error);
}
