// personaplex-bench-kernels: the ceilings and the LM's hot kernels on the GPU, for the roofline in
// docs/PERF.md. Measures device-to-device copy bandwidth (bytes read + written), and for each GEMV
// shape of the temporal transformer and the depformer: our bf16 GEMV and cuBLAS (bf16 GEMM with
// N = 1), our fp8-weight (w8a16) GEMV against our bf16 one at batch 1 and 4 (--only gemv8), the
// batched GEMM at B = 8..128 against cuBLAS (--only gemm), as CUDA graphs of many back-to-back
// launches over rotating weight buffers larger than L2; and the temporal attention alone at batch 1
// (--only attention) and at batch 16 and 64 (--only attention-batch).
#include <cublas_v2.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "apps/cli_checks.h"
#include "apps/common.h"
#include "backend/cuda/cuda_lm.h"
#include "backend/cuda/cuda_util.h"
#include "lm_attention.cuh"
#include "lm_gemv.cuh"
#include "lm_misc.cuh"
#include "lm_quant.cuh"
#include "ppx/config.h"
#include "ppx/error.h"
#include "ppx/resources.h"

namespace {

using ppx::cuda::DeviceBuffer;

#define CUBLAS_CHECK(x)                                                                   \
  do {                                                                                    \
    if ((x) != CUBLAS_STATUS_SUCCESS) throw ppx::Error("cuBLAS error in " #x);            \
  } while (0)

// Median of `reps` timings of `launches` back-to-back calls of f, captured in one graph.
template <typename F>
double time_graph_ms(cudaStream_t s, int launches, int reps, F&& f) {
  cudaGraph_t g;
  cudaGraphExec_t e;
  PPX_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < launches; ++i) f(i);
  PPX_CUDA_CHECK(cudaStreamEndCapture(s, &g));
  PPX_CUDA_CHECK(cudaGraphInstantiate(&e, g, 0));
  cudaEvent_t a, b;
  PPX_CUDA_CHECK(cudaEventCreate(&a));
  PPX_CUDA_CHECK(cudaEventCreate(&b));
  PPX_CUDA_CHECK(cudaGraphLaunch(e, s));  // warm-up
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    PPX_CUDA_CHECK(cudaEventRecord(a, s));
    PPX_CUDA_CHECK(cudaGraphLaunch(e, s));
    PPX_CUDA_CHECK(cudaEventRecord(b, s));
    PPX_CUDA_CHECK(cudaEventSynchronize(b));
    float ms;
    PPX_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms / launches);
  }
  cudaGraphExecDestroy(e);
  cudaGraphDestroy(g);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// The LM's GEMV shapes (weights [N, K]) with the prologue and epilogue each uses.
struct Shape {
  const char* name;
  int N, K;
  ppx::kern::GemvIn in;
  ppx::kern::GemvOut out = ppx::kern::GemvOut::kStore;
};
using ppx::kern::GemvIn;
using ppx::kern::GemvOut;
const Shape kShapes[] = {
    {"temporal qkv", 12288, 4096, GemvIn::kRmsNorm},
    {"temporal out", 4096, 4096, GemvIn::kPlain},
    {"temporal ffn in", 22528, 4096, GemvIn::kRmsNorm, ppx::kern::GemvOut::kGateUp},
    {"temporal ffn out", 4096, 11264, GemvIn::kPlain},
    {"temporal ffn out (silu prologue)", 4096, 11264, GemvIn::kSiluGate},
    {"text head", 32000, 4096, GemvIn::kRmsNorm},
    {"depformer in", 1024, 4096, GemvIn::kRmsNorm},
    {"depformer qkv", 3072, 1024, GemvIn::kRmsNorm},
    {"depformer out", 1024, 1024, GemvIn::kPlain},
    {"depformer ffn in", 5632, 1024, GemvIn::kRmsNorm, ppx::kern::GemvOut::kGateUp},
    {"depformer ffn out", 1024, 2816, GemvIn::kPlain},
    {"depformer head", 2048, 1024, GemvIn::kPlain},
};

// One shape's weights for the GEMV/GEMM sections: enough rotating copies of the bf16 weights and
// of their fp8 and int8 quantizations (per-row scales) to exceed the 50 MB L2 several times, and
// the activations, norm weights and outputs of `max_b` batch rows. args(i, type) is the GemvArgs of
// launch i (it cycles through the copies) at batch B; type 0 bf16, 1 fp8, 2 int8.
struct ShapeWeights {
  enum Type { kBf16 = 0, kFp8 = 1, kInt8 = 2 };
  const Shape& sh;
  size_t wn;
  int copies16, copies8;
  DeviceBuffer<__nv_bfloat16> w, x, alpha, y;
  DeviceBuffer<__nv_fp8_e4m3> w8;
  DeviceBuffer<int8_t> wi8;
  DeviceBuffer<float> scale8, scale_i8;
  ShapeWeights(const Shape& shape, int max_b, bool with_fp8, cudaStream_t s)
      : sh(shape),
        wn(static_cast<size_t>(sh.N) * sh.K),
        copies16(static_cast<int>(std::max<size_t>(2, (size_t{400} << 20) / (wn * 2)))),
        copies8(static_cast<int>(std::max<size_t>(2, (size_t{400} << 20) / wn))),
        w(wn * copies16),
        x(static_cast<size_t>(max_b) * 2 * sh.K),
        alpha(sh.K),
        y(static_cast<size_t>(max_b) * sh.N),
        w8(with_fp8 ? wn * copies8 : 0),
        wi8(wn * copies8),
        scale8(with_fp8 ? static_cast<size_t>(sh.N) * copies8 : 0),
        scale_i8(static_cast<size_t>(sh.N) * copies8) {
    using namespace ppx;
    kern::fill_random_bf16(w.get(), static_cast<int64_t>(w.size()), 1, 0.02f, 0.f, s);
    kern::fill_random_bf16(x.get(), static_cast<int64_t>(x.size()), 2, 1.f, 0.f, s);
    kern::fill_random_bf16(alpha.get(), sh.K, 3, 0.05f, 1.f, s);
    for (int i = 0; i < copies8; ++i) {
      if (with_fp8)
        kern::quantize_fp8_rows(w.get() + (i % copies16) * wn, sh.N, sh.K, w8.get() + i * wn,
                                scale8.get() + static_cast<size_t>(i) * sh.N, s);
      kern::quantize_int8_rows(w.get() + (i % copies16) * wn, sh.N, sh.K, wi8.get() + i * wn,
                               scale_i8.get() + static_cast<size_t>(i) * sh.N, s);
    }
    PPX_CUDA_CHECK(cudaStreamSynchronize(s));
  }
  const __nv_bfloat16* bf16_copy(int i) const { return w.get() + (i % copies16) * wn; }
  ppx::kern::GemvArgs args(int i, Type type, int B) const {
    ppx::kern::GemvArgs a;
    if (type == kFp8) {
      a.w8 = w8.get() + (i % copies8) * wn;
      a.w_scale = scale8.get() + static_cast<size_t>(i % copies8) * sh.N;
    } else if (type == kInt8) {
      a.wi8 = wi8.get() + (i % copies8) * wn;
      a.w_scale = scale_i8.get() + static_cast<size_t>(i % copies8) * sh.N;
      a.wq = bf16_copy(i);  // --gemm-policy 3 multiplies this (timing only: any bf16 of the shape)
    } else {
      a.w = bf16_copy(i);
    }
    a.x = x.get();
    a.x_stride = 2 * sh.K;
    a.N = sh.N;
    a.K = sh.K;
    a.B = B;
    a.alpha = alpha.get();
    a.y = y.get();
    a.y_stride = sh.out == GemvOut::kGateUp ? sh.N / 2 : sh.N;
    return a;
  }
};

// The w8a16 GEMV (fp8 e4m3 weights, per-row scales) against the bf16 GEMV on every LM shape at
// B = 1 and 4, each as a graph of 200 back-to-back launches over rotating weight copies larger than
// L2. Effective bandwidth counts the bytes a launch must read: weights (bf16: 2NK; fp8: NK plus 4N
// of scales) and the activations (B rows of K bf16, 2K for the SiLU-gate prologue).
nlohmann::ordered_json gemv8_bench(cudaStream_t s) {
  using namespace ppx;
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (const Shape& sh : kShapes) {
    const ShapeWeights sw(sh, 4, /*with_fp8=*/true, s);
    const size_t wn = sw.wn;
    for (int B : {1, 4}) {
      auto args = [&](int i, int type) { return sw.args(i, static_cast<ShapeWeights::Type>(type), B); };
      const int launches = 200;
      const double t16 = time_graph_ms(s, launches, 7, [&](int i) { kern::gemv(sh.in, sh.out, args(i, 0), s); });
      const double t8 = time_graph_ms(s, launches, 7, [&](int i) { kern::gemv(sh.in, sh.out, args(i, 1), s); });
      const double ti8 = time_graph_ms(s, launches, 7, [&](int i) { kern::gemv(sh.in, sh.out, args(i, 2), s); });
      const double act = static_cast<double>(B) * sh.K * 2 * (sh.in == GemvIn::kSiluGate ? 2 : 1);
      const double bytes16 = 2.0 * wn + act, bytes8 = static_cast<double>(wn) + 4.0 * sh.N + act;
      nlohmann::ordered_json r;
      r["shape"] = sh.name;
      r["N"] = sh.N;
      r["K"] = sh.K;
      r["B"] = B;
      r["bf16_us"] = t16 * 1e3;
      r["bf16_gb_s"] = bytes16 / (t16 * 1e-3) / 1e9;
      r["fp8_us"] = t8 * 1e3;
      r["fp8_gb_s"] = bytes8 / (t8 * 1e-3) / 1e9;
      r["speedup"] = t16 / t8;
      r["int8_us"] = ti8 * 1e3;
      r["int8_gb_s"] = bytes8 / (ti8 * 1e-3) / 1e9;
      r["int8_speedup"] = t16 / ti8;
      rows.push_back(r);
      std::printf("%-32s N=%5d K=%5d B=%d  bf16 %7.2f us %6.0f GB/s   fp8 %7.2f us %6.0f GB/s x%.2f   int8 %7.2f us "
                  "%6.0f GB/s x%.2f\n",
                  sh.name, sh.N, sh.K, B, t16 * 1e3, bytes16 / (t16 * 1e-3) / 1e9, t8 * 1e3,
                  bytes8 / (t8 * 1e-3) / 1e9, t16 / t8, ti8 * 1e3, bytes8 / (ti8 * 1e-3) / 1e9, t16 / ti8);
    }
  }
  return rows;
}

// The depformer's 16 steps at full size, random weights, as the LM step runs them (per-op
// kernels, the input projections of all steps in one GEMV before step 0, counted 1/16 per step):
// alone, its token sampling alone, and both.
nlohmann::ordered_json depformer_bench(cudaStream_t s) {
  using namespace ppx;
  const ModelConfig cfg = parse_config(std::string(embedded_config("personaplex-7b")), "embedded:personaplex-7b");
  const LmConfig& c = *cfg.lm;
  cuda::CudaLm lm(c, 1234);
  const int S = c.dep_q, DD = c.depformer_dim;
  DeviceBuffer<__nv_bfloat16> x(c.dim), k(static_cast<size_t>(c.depformer_num_layers) * S * DD),
      v(k.size()), z(DD), qkv(3 * DD), att(DD), gu(c.depformer_ffn_hidden()), pre(static_cast<size_t>(S) * DD);
  DeviceBuffer<float> logits(static_cast<size_t>(S) * c.card);
  DeviceBuffer<int32_t> tok(1), slot(1);
  kern::fill_random_bf16(x.get(), c.dim, 5, 1.f, 0.f, s);
  const int32_t t0 = 17, s0 = 0;
  tok.upload(&t0, 1, s);
  slot.upload(&s0, 1, s);
  k.zero(s);
  v.zero(s);
  cuda::DepformerIo io;
  io.x = x.get();
  io.token = tok.get();
  io.k_ring = k.get();
  io.v_ring = v.get();
  io.ring_layer_stride = static_cast<int64_t>(S) * DD;
  io.slot = slot.get();
  io.z = z.get();
  io.qkv = qkv.get();
  io.att = att.get();
  io.gu = gu.get();
  io.pre = pre.get();
  io.pre_stride = static_cast<int64_t>(S) * DD;
  io.logits = logits.get();
  io.logits_stride = static_cast<int64_t>(S) * c.card;
  PPX_CUDA_CHECK(cudaStreamSynchronize(s));
  auto step = [&](int st) {
    if (st == 0) cuda::enqueue_depformer_inputs(lm, io, 0, S, s);
    cuda::enqueue_depformer_kernels(lm, io, st, s);
  };
  nlohmann::ordered_json j;
  const double ops = time_graph_ms(s, S, 9, [&](int st) { step(st); });
  j["per_op_step_us"] = ops * 1e3;
  std::printf("depformer step, per-op kernels          %7.2f us\n", ops * 1e3);
  // The depformer's token sampling (2048 logits, temperature 0.8, top-k 250), alone and after each
  // step: what one step costs in the LM graph beyond its GEMVs.
  DeviceBuffer<float> temp(1);
  DeviceBuffer<int32_t> topk(1), sampled(1), next(1);
  DeviceBuffer<uint64_t> seed(1), counter(1);
  const float t08 = 0.8f;
  const int32_t k250 = 250;
  const uint64_t one = 1;
  temp.upload(&t08, 1, s);
  topk.upload(&k250, 1, s);
  seed.upload(&one, 1, s);
  counter.upload(&one, 1, s);
  auto sample = [&](int st) {
    kern::SampleArgs sa;
    sa.logits = logits.get() + static_cast<int64_t>(st) * c.card;
    sa.logits_stride = c.card;
    sa.n = c.card;
    sa.temp = temp.get();
    sa.top_k = topk.get();
    sa.seed = seed.get();
    sa.counter = counter.get();
    sa.stream_id = 1 + st;
    sa.sampled = sampled.get();
    sa.next = next.get();
    kern::sample_tokens(sa, 1, s);
  };
  const double samp = time_graph_ms(s, S, 9, [&](int st) { sample(st); });
  const double ops_samp = time_graph_ms(s, S, 9, [&](int st) {
    step(st);
    sample(st);
  });
  j["sample_us"] = samp * 1e3;
  j["per_op_step_with_sample_us"] = ops_samp * 1e3;
  std::printf("depformer sampling alone                 %7.2f us\n", samp * 1e3);
  std::printf("depformer step, per-op kernels + sample %7.2f us\n", ops_samp * 1e3);
  return j;
}

// The temporal attention of one layer (32 heads of 128, ring of 3000, batch 1) with n keys visible:
// what 32 layers cost per frame once a conversation has run that long.
nlohmann::ordered_json attention_bench(cudaStream_t s) {
  using namespace ppx;
  const int H = 32, hd = 128, C = 3000, D = H * hd;
  DeviceBuffer<__nv_bfloat16> k(static_cast<size_t>(C) * D), v(k.size()), q(D), out(D);
  DeviceBuffer<float> work(kern::attention_work_floats(1, H, hd, C));
  DeviceBuffer<int32_t> pos(1), slot(1);
  kern::fill_random_bf16(k.get(), static_cast<int64_t>(k.size()), 7, 1.f, 0.f, s);
  kern::fill_random_bf16(v.get(), static_cast<int64_t>(v.size()), 8, 1.f, 0.f, s);
  kern::fill_random_bf16(q.get(), D, 9, 1.f, 0.f, s);
  const int32_t zero = 0;
  slot.upload(&zero, 1, s);
  const kern::RingArgs r{k.get(), v.get(), pos.get(), slot.get(), C, H, hd, /*context=*/C};
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (int n : {64, 300, 1000, 3000}) {
    const int32_t p = n - 1;
    pos.upload(&p, 1, s);
    PPX_CUDA_CHECK(cudaStreamSynchronize(s));
    const double ms = time_graph_ms(s, 32, 9, [&](int) { kern::ring_attention(q.get(), r, 1, work.get(), out.get(), s); });
    rows.push_back({{"keys", n}, {"layer_us", ms * 1e3}, {"frame_ms_32_layers", ms * 32}});
    std::printf("temporal attention, %4d keys: %7.2f us per layer, %.2f ms per frame (32 layers)\n", n, ms * 1e3,
                ms * 32);
  }
  return rows;
}

// The batched path of kern::gemv (B > 4: the tensor-core GEMM of lm_gemm.cu) on every LM shape at
// B = 8 .. 128, bf16 and int8 weights, against cuBLAS's bf16 GEMM on the same shapes: time per
// launch, TFLOP/s (2 N K B) and the weight bytes per second. The batched LM step is these GEMMs plus
// attention and sampling, so this says whether the GEMM or the rest holds a large batch back.
nlohmann::ordered_json gemm_bench(cudaStream_t s, cublasHandle_t h, const std::vector<int>& batches,
                                  const std::string& shape_filter) {
  using namespace ppx;
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  const int kMaxB = *std::max_element(batches.begin(), batches.end());
  for (const Shape& sh : kShapes) {
    if (!shape_filter.empty() && std::string(sh.name).find(shape_filter) == std::string::npos) continue;
    const ShapeWeights sw(sh, kMaxB, /*with_fp8=*/false, s);
    const size_t wn = sw.wn;
    DeviceBuffer<__nv_bfloat16> xstage(kern::gemm_xstage_elems(kMaxB, sh.K));
    DeviceBuffer<float> yf(static_cast<size_t>(kMaxB) * sh.N), ws(kern::gemm_ws_floats(kMaxB, sh.N));
    for (int B : batches) {
      auto args = [&](int i, bool i8) {
        kern::GemvArgs a = sw.args(i, i8 ? ShapeWeights::kInt8 : ShapeWeights::kBf16, B);
        a.gemm = kern::GemmScratch{xstage.get(), ws.get(), ws.size(), xstage.size()};
        return a;
      };
      const int launches = 50;
      const double t16 = time_graph_ms(s, launches, 5, [&](int i) { kern::gemv(sh.in, sh.out, args(i, false), s); });
      const double ti8 = time_graph_ms(s, launches, 5, [&](int i) { kern::gemv(sh.in, sh.out, args(i, true), s); });
      const float one = 1.f, zero = 0.f;
      const double tcb = time_graph_ms(s, launches, 5, [&](int i) {
        // Y[N, B] = W[N, K] X[K, B] in column-major terms: W^T is [K, N] with ld K.
        CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, sh.N, B, sh.K, &one, sw.bf16_copy(i),
                                  CUDA_R_16BF, sh.K, sw.x.get(), CUDA_R_16BF, 2 * sh.K, &zero, yf.get(), CUDA_R_32F,
                                  sh.N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      });
      const double flop = 2.0 * static_cast<double>(wn) * B;
      nlohmann::ordered_json r;
      r["shape"] = sh.name;
      r["N"] = sh.N;
      r["K"] = sh.K;
      r["B"] = B;
      r["bf16_us"] = t16 * 1e3;
      r["bf16_tflops"] = flop / (t16 * 1e-3) / 1e12;
      r["int8_us"] = ti8 * 1e3;
      r["int8_tflops"] = flop / (ti8 * 1e-3) / 1e12;
      r["int8_weight_tb_s"] = static_cast<double>(wn) / (ti8 * 1e-3) / 1e12;
      r["cublas_bf16_us"] = tcb * 1e3;
      r["cublas_tflops"] = flop / (tcb * 1e-3) / 1e12;
      rows.push_back(r);
      std::printf("gemm %-32s N=%5d K=%5d B=%3d  bf16 %8.2f us %6.1f TF/s  int8 %8.2f us %6.1f TF/s  cublas %8.2f us "
                  "%6.1f TF/s\n",
                  sh.name, sh.N, sh.K, B, t16 * 1e3, flop / (t16 * 1e-3) / 1e12, ti8 * 1e3,
                  flop / (ti8 * 1e-3) / 1e12, tcb * 1e3, flop / (tcb * 1e-3) / 1e12);
      std::fflush(stdout);
    }
  }
  return rows;
}

// The temporal attention of one layer at batch B (every row its own slot, all with n keys visible),
// bf16 and fp8 caches: the bytes of keys and values read per second.
// With `parts` (--attention-parts): only the fp8 cache, policies 0 and 3, each with every parts
// count listed (0: the plan's).
nlohmann::ordered_json attention_batch_bench(cudaStream_t s, const std::vector<int>& batches,
                                            const std::vector<int>& keys, const std::vector<int>& parts) {
  using namespace ppx;
  const int H = 32, hd = 128, C = 3000, D = H * hd, Bmax = 64;
  const size_t cache = static_cast<size_t>(Bmax) * C * D;
  DeviceBuffer<__nv_bfloat16> k(cache), v(cache), q(static_cast<size_t>(Bmax) * D), out(static_cast<size_t>(Bmax) * D);
  DeviceBuffer<__nv_fp8_e4m3> k8(cache), v8(cache);
  DeviceBuffer<uint8_t> ks(static_cast<size_t>(Bmax) * kern::fp8_scale_pitch(C) * H), vs(ks.size());
  DeviceBuffer<float> work(kern::attention_work_floats(Bmax, H, hd, C));
  DeviceBuffer<int32_t> pos(Bmax), slot(Bmax);
  kern::fill_random_bf16(k.get(), static_cast<int64_t>(k.size()), 7, 1.f, 0.f, s);
  kern::fill_random_bf16(v.get(), static_cast<int64_t>(v.size()), 8, 1.f, 0.f, s);
  kern::fill_random_bf16(q.get(), static_cast<int64_t>(q.size()), 9, 1.f, 0.f, s);
  PPX_CUDA_CHECK(cudaMemset(k8.get(), 0x30, cache));
  PPX_CUDA_CHECK(cudaMemset(v8.get(), 0x30, cache));
  std::vector<uint8_t> small(ks.size(), 127 - 7);  // scales of 2^-7
  ks.upload(small.data(), small.size(), s);
  vs.upload(small.data(), small.size(), s);
  std::vector<int32_t> sl(Bmax);
  for (int b = 0; b < Bmax; ++b) sl[b] = b;
  slot.upload(sl.data(), Bmax, s);
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (int B : batches) {
    for (int n : keys) {
      std::vector<int32_t> p(Bmax, n - 1);
      pos.upload(p.data(), Bmax, s);
      PPX_CUDA_CHECK(cudaStreamSynchronize(s));
      kern::RingArgs r{k.get(), v.get(), pos.get(), slot.get(), C, H, hd, /*context=*/C};
      // as CudaLm lays it out
      kern::RingArgs r8 = r.over_fp8(k8.get(), v8.get(), ks.get(), vs.get(), kern::attention_fp8_by_head());
      const double b16 = 2.0 * B * n * D * 2, b8 = 2.0 * B * n * (D + 1.0 * H);
      if (!parts.empty()) {
        for (int policy : {0, 3}) {
          kern::attention_set_policy(policy);
          for (int np : parts) {
            kern::attention_set_parts(np);
            const int ran = kern::attention_parts(B, H, C, true);
            const double t8 =
                time_graph_ms(s, 16, 5, [&](int) { kern::ring_attention(q.get(), r8, B, work.get(), out.get(), s); });
            rows.push_back({{"B", B}, {"keys", n}, {"policy", policy}, {"fp8_by_head", r8.fp8_by_head},
                            {"parts_asked", np}, {"parts", ran}, {"fp8_us", t8 * 1e3},
                            {"fp8_tb_s", b8 / (t8 * 1e-3) / 1e12}});
            std::printf("attention policy %d parts %2d%s B=%2d keys=%4d  fp8 %8.1f us %5.2f TB/s\n", policy, ran,
                        np == 0 ? " (plan)" : "", B, n, t8 * 1e3, b8 / (t8 * 1e-3) / 1e12);
            std::fflush(stdout);
          }
          kern::attention_set_parts(0);
        }
        kern::attention_set_policy(0);
        continue;
      }
      // Policy 2: the fp8 cache through the scalar kernel (before v0.18); 4: v0.18's tensor-core
      // kernel; 3 and 5: the lean tensor-core kernel with 3 and 4 stages; 0: shipped (the lean kernel,
      // 4 stages from 64 rows). The bf16 cache runs the same kernel under all of them.
      for (int policy : {2, 3, 0, 4, 5}) {
        kern::attention_set_policy(policy);
        const double t16 =
            time_graph_ms(s, 16, 5, [&](int) { kern::ring_attention(q.get(), r, B, work.get(), out.get(), s); });
        const double t8 =
            time_graph_ms(s, 16, 5, [&](int) { kern::ring_attention(q.get(), r8, B, work.get(), out.get(), s); });
        rows.push_back({{"B", B}, {"keys", n}, {"policy", policy}, {"fp8_by_head", r8.fp8_by_head},
                        {"bf16_us", t16 * 1e3}, {"bf16_tb_s", b16 / (t16 * 1e-3) / 1e12}, {"fp8_us", t8 * 1e3},
                        {"fp8_tb_s", b8 / (t8 * 1e-3) / 1e12}});
        std::printf("attention policy %d B=%2d keys=%4d  bf16 %8.1f us %5.2f TB/s   fp8 (%s) %8.1f us %5.2f TB/s\n",
                    policy, B, n, t16 * 1e3, b16 / (t16 * 1e-3) / 1e12, r8.fp8_by_head ? "by head" : "by position",
                    t8 * 1e3, b8 / (t8 * 1e-3) / 1e12);
        std::fflush(stdout);
      }
      // Policies 0 and 3 over the other fp8 layout (by position, before v0.34, when the shipped
      // one is by head; the bench's cache is constant, so only the addresses change).
      for (int policy : {0, 3}) {
        kern::attention_set_policy(policy);
        kern::RingArgs rh = r8;
        rh.fp8_by_head = !r8.fp8_by_head;
        const double t8 =
            time_graph_ms(s, 16, 5, [&](int) { kern::ring_attention(q.get(), rh, B, work.get(), out.get(), s); });
        rows.push_back({{"B", B}, {"keys", n}, {"policy", policy}, {"fp8_by_head", rh.fp8_by_head},
                        {"fp8_us", t8 * 1e3}, {"fp8_tb_s", b8 / (t8 * 1e-3) / 1e12}});
        std::printf("attention policy %d %s B=%2d keys=%4d  fp8 %8.1f us %5.2f TB/s\n", policy,
                    rh.fp8_by_head ? "by head" : "by position", B, n, t8 * 1e3, b8 / (t8 * 1e-3) / 1e12);
        std::fflush(stdout);
      }
      kern::attention_set_policy(0);
    }
  }
  return rows;
}

int bench(int argc, char** argv) {
  CLI::App app{"GPU ceilings and LM kernel throughput"};
  std::string out, only;
  app.add_option("--out", out, "write the JSON result here too");
  app.add_option("--only", only, "run one section: copy, gemv, gemv8, gemm, attention, attention-batch or depformer")
      ->check(CLI::IsMember({"copy", "gemv", "gemv8", "gemm", "attention", "attention-batch", "depformer"}));
  int grid_policy = 0;
  app.add_option("--gemv-grid", grid_policy,
                 "GEMV grid: 0 the shipped one (one wave of resident blocks, warps loop over rows), 1 one warp "
                 "per row unit (the grid before v12), for comparison")
      ->capture_default_str()
      ->check(CLI::Range(0, 1));
  std::vector<int> gemm_batches{8, 16, 32, 64, 128};
  app.add_option("--gemm-batches", gemm_batches, "batch sizes of the gemm section")
      ->capture_default_str()
      ->check(CLI::Range(5, 1024));
  int gemm_policy = ppx::kern::kGemmPolicyAuto;
  app.add_option("--gemm-policy", gemm_policy,
                 "batched GEMM kernel: 0 the mma.sync kernel, 1 16 warps a block (two per row group), 2 row warps "
                 "(gemm_rw_kernel), 3 cuBLAS's bf16 GEMM on a bf16 copy of the int8 weights, 4 int8 weights on wgmma "
                 "(H100 / H200; 5 the same with k-tiles of 128 up to 128 rows), 6 as shipped (8 from 40 rows "
                 "where it runs, else 0), 8 policy 5 with the epilogue in the GEMM kernel where one K slice runs")
      ->capture_default_str()
      ->check(CLI::IsMember({0, 1, 2, 3, 4, 5, 6, 8}));
  std::string gemm_shapes;
  app.add_option("--gemm-shapes", gemm_shapes, "gemm section: only the shapes whose name contains this");
  std::vector<int> attention_batches{1, 16, 64}, attention_keys{300, 3000};
  app.add_option("--attention-batches", attention_batches, "batch sizes of the attention-batch section")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app.add_option("--attention-keys", attention_keys, "visible keys of the attention-batch section")
      ->capture_default_str()
      ->check(CLI::Range(1, 3000));
  std::vector<int> attention_parts;
  app.add_option("--attention-parts", attention_parts,
                 "attention-batch section: time only the fp8 cache's tensor-core kernel (policies 0 and 3) with each "
                 "of these parts counts (0: its plan's; measurement hook, v0.37)")
      ->check(CLI::Range(0, 1000));
  ppx::app::check_numbers(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return ppx::app::parse_failed(app, e);
  }
  if (ppx::cuda::device_count() == 0) throw ppx::Error("no CUDA device");
  ppx::kern::gemv_init();
  ppx::kern::attention_init();
  ppx::kern::gemv_set_grid_policy(grid_policy);
  ppx::kern::gemm_set_policy(gemm_policy);
  cudaStream_t s;
  PPX_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  nlohmann::ordered_json j;
  j["bench"] = "kernels";
  j["gpu"] = ppx::cuda::device_description();
  j["gemv_grid"] = grid_policy;
  j["gemm_policy"] = gemm_policy;

  auto want = [&](const char* section) { return only.empty() || only == section; };
  // Copy bandwidth: 2 GiB device to device.
  if (want("copy")) {
    const size_t n = size_t{1} << 31;
    DeviceBuffer<uint8_t> a(n), b(n);
    PPX_CUDA_CHECK(cudaMemset(a.get(), 1, n));
    const double ms = time_graph_ms(s, 4, 10, [&](int) {
      PPX_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), n, cudaMemcpyDeviceToDevice, s));
    });
    j["copy_tb_s"] = 2.0 * n / (ms * 1e-3) / 1e12;
  }

  cublasHandle_t h;
  CUBLAS_CHECK(cublasCreate(&h));
  CUBLAS_CHECK(cublasSetStream(h, s));
  using ppx::kern::GemvOut;
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (const Shape& sh : kShapes) {
    if (!want("gemv")) break;
    const size_t wn = static_cast<size_t>(sh.N) * sh.K;
    // Enough copies to exceed the 50 MB L2 several times over.
    const int copies = static_cast<int>(std::max<size_t>(2, (400u << 20) / (wn * 2)));
    DeviceBuffer<__nv_bfloat16> w(wn * copies), x(2 * static_cast<size_t>(sh.K)), alpha(sh.K), y(sh.N);
    DeviceBuffer<float> yf(sh.N);
    ppx::kern::fill_random_bf16(w.get(), static_cast<int64_t>(w.size()), 1, 0.02f, 0.f, s);
    ppx::kern::fill_random_bf16(x.get(), static_cast<int64_t>(x.size()), 2, 1.f, 0.f, s);
    ppx::kern::fill_random_bf16(alpha.get(), sh.K, 3, 0.05f, 1.f, s);
    const int launches = 200;
    const double ours = time_graph_ms(s, launches, 7, [&](int i) {
      ppx::kern::GemvArgs a;
      a.w = w.get() + (i % copies) * wn;
      a.x = x.get();
      a.x_stride = 2 * sh.K;
      a.N = sh.N;
      a.K = sh.K;
      a.alpha = alpha.get();
      a.y = y.get();
      a.y_stride = sh.out == GemvOut::kGateUp ? sh.N / 2 : sh.N;
      ppx::kern::gemv(sh.in, sh.out, a, s);
    });
    const float one = 1.f, zero = 0.f;
    const double cublas = time_graph_ms(s, launches, 7, [&](int i) {
      // y[N] = W[N, K] x[K]: column-major view W^T [K, N].
      CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, sh.N, 1, sh.K, &one, w.get() + (i % copies) * wn,
                                CUDA_R_16BF, sh.K, x.get(), CUDA_R_16BF, sh.K, &zero, yf.get(), CUDA_R_32F, sh.N,
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    });
    const double bytes = static_cast<double>(wn) * 2;
    nlohmann::ordered_json r;
    r["shape"] = sh.name;
    r["N"] = sh.N;
    r["K"] = sh.K;
    r["weight_mb"] = bytes / 1e6;
    r["ours_us"] = ours * 1e3;
    r["ours_tb_s"] = bytes / (ours * 1e-3) / 1e12;
    r["cublas_us"] = cublas * 1e3;
    r["cublas_tb_s"] = bytes / (cublas * 1e-3) / 1e12;
    rows.push_back(r);
    std::printf("%-32s N=%5d K=%5d  ours %7.2f us %5.2f TB/s   cublas %7.2f us %5.2f TB/s\n", sh.name, sh.N, sh.K,
                ours * 1e3, bytes / (ours * 1e-3) / 1e12, cublas * 1e3, bytes / (cublas * 1e-3) / 1e12);
  }
  if (want("gemm")) j["gemm"] = gemm_bench(s, h, gemm_batches, gemm_shapes);
  cublasDestroy(h);
  if (want("gemv")) j["gemv"] = rows;
  if (want("gemv8")) j["gemv8"] = gemv8_bench(s);
  if (want("attention")) j["temporal_attention"] = attention_bench(s);
  if (want("attention-batch"))
    j["temporal_attention_batch"] = attention_batch_bench(s, attention_batches, attention_keys, attention_parts);
  if (want("depformer")) j["depformer"] = depformer_bench(s);
  j["machine"] = ppx::app::machine_info();
  j["command"] = ppx::app::command_line(argc, argv);
  if (j.contains("copy_tb_s")) std::printf("copy bandwidth %.2f TB/s\n", j["copy_tb_s"].get<double>());
  if (!out.empty()) {
    std::ofstream f(out);
    f << j.dump(2) << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return ppx::app::run_main(bench, argc, argv); }
