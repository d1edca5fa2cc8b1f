// The temporal ring attention kernels (kernels/lm_attention.cu) against references: the fp8 cache
// against the bf16 one (both layouts), and ring_attention over bf16 and fp8 caches against an fp64
// reference of upstream's visibility rule, for every split policy. Kernel-level tests on raw device
// buffers; the LM-level ones (CudaLmAttention.Fp8ByHeadStepsAsByPosition) are in test_cuda_lm.cpp.
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "backend/cuda/cuda_util.h"
#include "cuda_test_util.h"
#include "lm_attention.cuh"
#include "lm_misc.cuh"

using namespace ppx;

namespace {

// An fp8 buffer's codes as bytes.
std::vector<uint8_t> codes(const cuda::DeviceBuffer<__nv_fp8_e4m3>& d) {
  const std::vector<__nv_fp8_e4m3> h = d.download();
  std::vector<uint8_t> b(h.size());
  for (size_t i = 0; i < h.size(); ++i) b[i] = h[i].__x;
  return b;
}

// One (row, head) of the temporal ring attention in double precision: the query of position qp
// over a ring of C entries with upstream's visibility rule (see lm_attention.cuh) and a context
// limit (0: none). q(j) is the query's dim j, key(idx, j) and val(idx, j) entry idx's stored key
// and value (their scales applied). Returns the hd outputs.
std::vector<double> ring_attention_reference(int C, int hd, int qp, int context,
                                                    const std::function<double(int)>& q,
                                                    const std::function<double(int, int)>& key,
                                                    const std::function<double(int, int)>& val) {
  const int E = qp + 1;
  std::vector<double> w(C, 0.0);
  std::vector<char> vis(C, 0);
  double mx = -1e300;
  for (int idx = 0; idx < std::min(C, E); ++idx) {
    const int delta = idx - E % C;
    const int label = delta <= 0 ? E + delta : E + delta - C;
    if (label < 0 || qp - label < 0 || (context > 0 && qp - label >= context)) continue;
    double d = 0;
    for (int j = 0; j < hd; ++j) d += q(j) * key(idx, j);
    w[idx] = d / std::sqrt(static_cast<double>(hd));
    vis[idx] = 1;
    mx = std::max(mx, w[idx]);
  }
  double l = 0;
  std::vector<double> acc(hd, 0.0);
  for (int idx = 0; idx < C; ++idx) {
    if (!vis[idx]) continue;
    const double e = std::exp(w[idx] - mx);
    l += e;
    for (int j = 0; j < hd; ++j) acc[j] += e * val(idx, j);
  }
  for (double& a : acc) a /= l;
  return acc;
}

}  // namespace

// The fp8 cache (--kv-fp8): rope_append into an fp8 ring and a bf16 ring from the same q/k/v rows
// at every position of a short history, then ring attention over each. The fp8 entries must be
// the bf16 ones within e4m3's rounding at a per-(position, head) power-of-two scale, and each
// cache's attention output its fp64 reference's within the bf16 output rounding.
TEST(CudaLmAttention, Fp8CacheMatchesBf16Cache) {
  SKIP_WITHOUT_GPU();
  const int H = 4, hd = 128, C = 300, D = H * hd, steps = 200;
  cuda::DeviceBuffer<__nv_bfloat16> k(static_cast<size_t>(C) * D), v(k.size()), qkv(3 * D), q(D), q8(D), out(D),
      out8(D);
  cuda::DeviceBuffer<__nv_fp8_e4m3> k8(k.size()), v8(k.size());
  const int SP = kern::fp8_scale_pitch(C);
  cuda::DeviceBuffer<uint8_t> ks(static_cast<size_t>(SP) * H), vs(ks.size());
  ks.zero();  // positions never written are compared below too
  vs.zero();
  cuda::DeviceBuffer<float> work(kern::attention_work_floats(1, H, hd, C));
  cuda::DeviceBuffer<int32_t> pos(1), slot(1);
  const int32_t zero = 0;
  slot.upload(&zero, 1);
  kern::RingArgs rb{k.get(), v.get(), pos.get(), slot.get(), C, H, hd, 0};
  const kern::RingArgs r8 = rb.over_fp8(k8.get(), v8.get(), ks.get(), vs.get(), false);
  // The same fp8 cache laid out by head (RingArgs::fp8_by_head, shipped since v0.34): the same
  // codes and scales at other addresses, the same attention output bit for bit.
  cuda::DeviceBuffer<__nv_fp8_e4m3> k8h(k.size()), v8h(k.size());
  cuda::DeviceBuffer<uint8_t> ksh(ks.size()), vsh(ks.size());
  ksh.zero();
  vsh.zero();
  cuda::DeviceBuffer<__nv_bfloat16> outh(D);
  const kern::RingArgs rh = rb.over_fp8(k8h.get(), v8h.get(), ksh.get(), vsh.get(), true);
  // The attention outputs and queries of the checked positions, compared after the loop with fp64
  // references over what the caches then hold (no position is overwritten: C > steps).
  struct Check {
    int t;
    std::vector<__nv_bfloat16> q, q8, out, out8;
  };
  std::vector<Check> checks;
  for (int t = 0; t < steps; ++t) {
    pos.upload(&t, 1);
    kern::fill_random_bf16(qkv.get(), 3 * D, 100 + t, t % 7 == 0 ? 20.f : 1.f, 0.f, nullptr);
    kern::rope_append(qkv.get(), q.get(), rb, 1, 10000.f, nullptr);
    kern::rope_append(qkv.get(), q8.get(), r8, 1, 10000.f, nullptr);
    kern::rope_append(qkv.get(), q8.get(), rh, 1, 10000.f, nullptr);
    if (t % 50 == 49) {
      kern::ring_attention(q.get(), rb, 1, work.get(), out.get(), nullptr);
      kern::ring_attention(q8.get(), r8, 1, work.get(), out8.get(), nullptr);
      kern::ring_attention(q8.get(), rh, 1, work.get(), outh.get(), nullptr);
      PPX_CUDA_CHECK(cudaDeviceSynchronize());
      const std::vector<__nv_bfloat16> a = out.download(), b = out8.download(), bh = outh.download();
      ASSERT_EQ(0, std::memcmp(b.data(), bh.data(), D * sizeof(__nv_bfloat16))) << "by head, position " << t;
      checks.push_back({t, q.download(), q8.download(), a, b});
    }
  }
  PPX_CUDA_CHECK(cudaDeviceSynchronize());
  PPX_CUDA_CHECK(cudaGetLastError());
  const std::vector<__nv_bfloat16> hk = k.download(), hv = v.download();
  const std::vector<uint8_t> hk8 = codes(k8), hv8 = codes(v8);
  const std::vector<uint8_t> hks = ks.download(), hvs = vs.download();
  {
    const std::vector<uint8_t> hk8h = codes(k8h), hv8h = codes(v8h);
    const std::vector<uint8_t> hksh = ksh.download(), hvsh = vsh.download();
    EXPECT_EQ(hks, hksh);
    EXPECT_EQ(hvs, hvsh);
    for (int t = 0; t < steps; ++t)
      for (int h = 0; h < H; ++h)
        for (int j = 0; j < hd; ++j) {
          const size_t by_pos = static_cast<size_t>(t) * D + h * hd + j;
          const size_t by_head = (static_cast<size_t>(h) * C + t) * hd + j;
          ASSERT_EQ(hk8[by_pos], hk8h[by_head]) << "key, position " << t << " head " << h << " dim " << j;
          ASSERT_EQ(hv8[by_pos], hv8h[by_head]) << "value, position " << t << " head " << h << " dim " << j;
        }
  }
  auto fp8v = [](uint8_t code) {
    return __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), __NV_E4M3)));
  };
  for (int t = 0; t < steps; ++t) {
    for (int h = 0; h < H; ++h) {
      for (int which = 0; which < 2; ++which) {
        const std::vector<__nv_bfloat16>& ref = which ? hv : hk;
        const std::vector<uint8_t>& q8h = which ? hv8 : hk8;
        // [slots, H, fp8_scale_pitch(C)]: the smallest power of two that brings the largest
        // magnitude to at most 448 (so above 224), 1 for zeros.
        const float sc = kern::fp8_scale_value((which ? hvs : hks)[static_cast<size_t>(h) * SP + t]);
        float mx = 0.f;
        for (int j = 0; j < hd; ++j) mx = std::max(mx, std::fabs(__bfloat162float(ref[static_cast<size_t>(t) * D + h * hd + j])));
        if (mx > 0.f) {
          ASSERT_LE(mx / sc, 448.f) << "position " << t << " head " << h;
          ASSERT_GT(mx / sc, 224.f) << "position " << t << " head " << h;
        } else {
          ASSERT_EQ(sc, 1.f) << "position " << t << " head " << h;
        }
        for (int j = 0; j < hd; ++j) {
          const size_t i = static_cast<size_t>(t) * D + h * hd + j;
          const float want = __bfloat162float(ref[i]), got = fp8v(q8h[i]) * sc;
          ASSERT_LE(std::fabs(got - want), std::fabs(want) / 16.f + sc / 512.f) << "position " << t << " head " << h;
        }
      }
    }
  }
  // Each cache's attention against an fp64 reference over its own contents (the kernels' own error:
  // bf16 output rounding), and the quantization's effect (fp64 over the fp8 contents against fp64
  // over the bf16 ones), which is reported, not bounded: random q, k and v average to a small
  // output whose relative error is heavy-tailed (the same data with other seeds: 0.024 to 0.71 with
  // fp32 scales, 0.027 to 0.76 with powers of two, from the few keys that dominate rows of 20x
  // scores). The entries' rounding is bounded above; the model-level effect is docs/QUALITY.md's
  // (personaplex-bench-quality).
  auto rel = [](const std::vector<double>& ref, const std::function<double(int)>& got) {
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      num += (got(static_cast<int>(i)) - ref[i]) * (got(static_cast<int>(i)) - ref[i]);
      den += ref[i] * ref[i];
    }
    return std::sqrt(num / den);
  };
  double worst_bf16 = 0, worst_fp8 = 0, worst_quant = 0, worst_gpu = 0;
  for (const Check& c : checks) {
    std::vector<double> refb(D), ref8(D);
    for (int h = 0; h < H; ++h) {
      const int o = h * hd;
      auto bf = [](const std::vector<__nv_bfloat16>& x, size_t i) { return static_cast<double>(__bfloat162float(x[i])); };
      const std::vector<double> rb_h = ring_attention_reference(
          C, hd, c.t, 0, [&](int j) { return bf(c.q, o + j); },
          [&](int idx, int j) { return bf(hk, static_cast<size_t>(idx) * D + o + j); },
          [&](int idx, int j) { return bf(hv, static_cast<size_t>(idx) * D + o + j); });
      const std::vector<double> r8_h = ring_attention_reference(
          C, hd, c.t, 0, [&](int j) { return bf(c.q8, o + j); },
          [&](int idx, int j) {
            return fp8v(hk8[static_cast<size_t>(idx) * D + o + j]) * static_cast<double>(kern::fp8_scale_value(hks[static_cast<size_t>(h) * SP + idx]));
          },
          [&](int idx, int j) {
            return fp8v(hv8[static_cast<size_t>(idx) * D + o + j]) * static_cast<double>(kern::fp8_scale_value(hvs[static_cast<size_t>(h) * SP + idx]));
          });
      std::copy(rb_h.begin(), rb_h.end(), refb.begin() + o);
      std::copy(r8_h.begin(), r8_h.end(), ref8.begin() + o);
    }
    const double eb = rel(refb, [&](int i) { return static_cast<double>(__bfloat162float(c.out[i])); });
    const double e8 = rel(ref8, [&](int i) { return static_cast<double>(__bfloat162float(c.out8[i])); });
    EXPECT_LE(eb, 5e-3) << "bf16 cache, position " << c.t;
    EXPECT_LE(e8, 5e-3) << "fp8 cache, position " << c.t;
    worst_bf16 = std::max(worst_bf16, eb);
    worst_fp8 = std::max(worst_fp8, e8);
    worst_quant = std::max(worst_quant, rel(refb, [&](int i) { return ref8[i]; }));
    std::vector<double> gb(D);
    for (int i = 0; i < D; ++i) gb[i] = __bfloat162float(c.out[i]);
    worst_gpu = std::max(worst_gpu, rel(gb, [&](int i) { return static_cast<double>(__bfloat162float(c.out8[i])); }));
  }
  std::printf("fp8 KV cache: kernels vs fp64 over their cache, worst rel L2 bf16 %.5f fp8 %.5f; fp8 vs bf16 output "
              "%.4f (fp64: %.4f)\n",
              worst_bf16, worst_fp8, worst_gpu, worst_quant);
}

// The temporal ring attention against a plain fp32 reference of upstream's visibility rule, with
// several splits, a wrapped ring and a context limit: random q, K, V (values as stored, bf16).
// Rows alternate between two slots. 2 rows: a block per chunk of the ring. 64 rows: fewer blocks
// than chunks, each block carrying its softmax across chunks (attention_parts). With row_pos:
// every row at its own position (prompt prefill), as the query of that position.
TEST(CudaLmAttention, RingAttentionMatchesReference) {
  SKIP_WITHOUT_GPU();
  const int H = 4, hd = 128, C = 700, D = H * hd, Bmax = 64;
  ASSERT_LT(kern::attention_parts(Bmax, H, C), (C + 63) / 64) << "64 rows must exercise blocks of several chunks";
  cuda::DeviceBuffer<__nv_bfloat16> k(static_cast<size_t>(2) * C * D), v(k.size()), q(static_cast<size_t>(Bmax) * D),
      out(static_cast<size_t>(Bmax) * D);
  cuda::DeviceBuffer<float> work(kern::attention_work_floats(Bmax, H, hd, C));
  kern::fill_random_bf16(k.get(), static_cast<int64_t>(k.size()), 1, 1.f, 0.f, nullptr);
  kern::fill_random_bf16(v.get(), static_cast<int64_t>(v.size()), 2, 1.f, 0.f, nullptr);
  kern::fill_random_bf16(q.get(), static_cast<int64_t>(q.size()), 3, 2.f, 0.f, nullptr);
  const std::vector<float> hk = test::to_host(k), hv = test::to_host(v), hq = test::to_host(q);
  cuda::DeviceBuffer<int32_t> pos(2), slot(Bmax), row_pos(Bmax);
  std::vector<int32_t> slots(Bmax);
  for (int b = 0; b < Bmax; ++b) slots[b] = (b + 1) % 2;
  slot.upload(slots.data(), Bmax);
  for (const int B : {2, 64}) {
    for (const bool per_row : {false, true}) {
      for (int context : {0, 250}) {
        for (int p : {0, 5, 63, 64, 699, 1500}) {
          const int32_t positions[2] = {p / 2, p};  // slot 0 at p / 2, slot 1 at p (batch row 0)
          pos.upload(positions, 2);
          std::vector<int32_t> rp(Bmax);
          for (int b = 0; b < Bmax; ++b) rp[b] = std::max(0, p - b);
          row_pos.upload(rp.data(), Bmax);
          kern::RingArgs r{k.get(), v.get(), pos.get(), slot.get(), C, H, hd, context};
          if (per_row) r.row_pos = row_pos.get();
          kern::ring_attention(q.get(), r, B, work.get(), out.get(), nullptr);
          PPX_CUDA_CHECK(cudaDeviceSynchronize());
          const std::vector<float> got = test::to_host(out);
          double num = 0, den = 0;
          for (int b = 0; b < B; ++b) {
            const int s = slots[b], qp = per_row ? rp[b] : positions[s];
            for (int h = 0; h < H; ++h) {
              const size_t row0 = static_cast<size_t>(s) * C * D + h * hd;
              const std::vector<double> ref = ring_attention_reference(
                  C, hd, qp, context, [&](int j) { return static_cast<double>(hq[b * D + h * hd + j]); },
                  [&](int idx, int j) { return static_cast<double>(hk[row0 + static_cast<size_t>(idx) * D + j]); },
                  [&](int idx, int j) { return static_cast<double>(hv[row0 + static_cast<size_t>(idx) * D + j]); });
              for (int j = 0; j < hd; ++j) {
                const double g = got[b * D + h * hd + j];
                num += (g - ref[j]) * (g - ref[j]);
                den += ref[j] * ref[j];
              }
            }
          }
          const double rel = std::sqrt(num / den);
          EXPECT_LE(rel, 4e-3) << B << " rows, per-row positions " << per_row << ", context " << context
                               << ", position " << p;  // bf16 output rounding
        }
      }
    }
  }
}


// The fp8 cache's attention (the tensor-core kernel and the scalar one) against an fp64
// reference over the stored values: random e4m3 codes with per-(position, head) scales (the value
// scales over 2^-30 .. 2^6: they ride on the scores as a bias), queries of very different magnitudes per
// row, a wrapped ring, a context limit, 2 and 64 rows, per-row positions, heads of 128 and 64.
TEST(CudaLmAttention, Fp8RingAttentionMatchesReference) {
  SKIP_WITHOUT_GPU();
  for (const int hd : {128, 64}) {
    const int H = 3, C = 700, D = H * hd, Bmax = 64;
    std::mt19937 rng(hd);
    std::vector<uint8_t> hk(static_cast<size_t>(2) * C * D), hv(hk.size());
    for (auto* vec : {&hk, &hv})
      for (auto& x : *vec) {
        x = static_cast<uint8_t>(rng() & 0xff);
        if ((x & 0x7f) == 0x7f) x &= 0xfe;  // no NaN codes (rope_append never writes them)
      }
    // Scale bytes [slots, H, fp8_scale_pitch(C)]: 2^(byte - 127).
    const int SP = kern::fp8_scale_pitch(C);
    std::vector<uint8_t> hks(static_cast<size_t>(2) * SP * H), hvs(hks.size());
    std::uniform_int_distribution<int> ex(127 - 30, 127 + 6), kex(127 - 14, 127 - 4);
    for (auto& x : hks) x = static_cast<uint8_t>(kex(rng));
    for (auto& x : hvs) x = static_cast<uint8_t>(ex(rng));
    // The padding past C holds 255 (an infinite scale): read by the 16-byte copies, never used.
    for (size_t row = 0; row < static_cast<size_t>(2) * H; ++row)
      for (int i = C; i < SP; ++i) hks[row * SP + i] = hvs[row * SP + i] = 255;
    std::vector<__nv_bfloat16> hq(static_cast<size_t>(Bmax) * D);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (int b = 0; b < Bmax; ++b) {
      const float mag = b % 3 == 0 ? 1e-3f : (b % 3 == 1 ? 1.f : 30.f);
      for (int i = 0; i < D; ++i) hq[static_cast<size_t>(b) * D + i] = __float2bfloat16(nd(rng) * mag);
    }
    cuda::DeviceBuffer<__nv_fp8_e4m3> k8(hk.size()), v8(hv.size());
    cuda::DeviceBuffer<uint8_t> ks(hks.size()), vs(hvs.size());
    cuda::DeviceBuffer<float> work(kern::attention_work_floats(Bmax, H, hd, C));
    cuda::DeviceBuffer<__nv_bfloat16> q(hq.size()), out(hq.size());
    PPX_CUDA_CHECK(cudaMemcpy(k8.get(), hk.data(), hk.size(), cudaMemcpyHostToDevice));
    PPX_CUDA_CHECK(cudaMemcpy(v8.get(), hv.data(), hv.size(), cudaMemcpyHostToDevice));
    // The same codes laid out [slots, H, C, hd] (by head, shipped since v0.34).
    std::vector<uint8_t> hkh(hk.size()), hvh(hv.size());
    for (int sl = 0; sl < 2; ++sl)
      for (int i = 0; i < C; ++i)
        for (int h = 0; h < H; ++h)
          for (int j = 0; j < hd; ++j) {
            const size_t from = (static_cast<size_t>(sl) * C + i) * D + h * hd + j;
            const size_t to = ((static_cast<size_t>(sl) * H + h) * C + i) * hd + j;
            hkh[to] = hk[from];
            hvh[to] = hv[from];
          }
    cuda::DeviceBuffer<__nv_fp8_e4m3> k8h(hk.size()), v8h(hv.size());
    PPX_CUDA_CHECK(cudaMemcpy(k8h.get(), hkh.data(), hkh.size(), cudaMemcpyHostToDevice));
    PPX_CUDA_CHECK(cudaMemcpy(v8h.get(), hvh.data(), hvh.size(), cudaMemcpyHostToDevice));
    ks.upload(hks.data(), hks.size());
    vs.upload(hvs.data(), hvs.size());
    q.upload(hq.data(), hq.size());
    auto fp8v = [](uint8_t code) {
      return static_cast<double>(
          __half2float(__half(__nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), __NV_E4M3))));
    };
    cuda::DeviceBuffer<int32_t> pos(2), slot(Bmax), row_pos(Bmax);
    std::vector<int32_t> slots(Bmax);
    for (int b = 0; b < Bmax; ++b) slots[b] = (b + 1) % 2;
    slot.upload(slots.data(), Bmax);
    // Policy 0: the tensor-core kernel for hd 128 (the scalar one for 64); 2: the scalar kernel;
    // 3 and 5: the lean tensor-core kernel with 3 and 4 stages (policy 0 takes 4 from 64 rows, 3
    // below); 4: v0.18's tensor-core kernel.
    for (const int policy : {0, 2, 3, 4, 5}) {
      kern::attention_set_policy(policy);
      if (hd == 128 && policy != 2) {
        ASSERT_LT(kern::attention_parts(Bmax, H, C, true), (C + 63) / 64) << "64 rows must stream several chunks";
      }
      for (const int B : {2, 64}) {
        for (const bool per_row : {false, true}) {
          for (int context : {0, 250}) {
            for (int p : {0, 17, 64, 699, 1500}) {
              const int32_t positions[2] = {p / 2, p};
              pos.upload(positions, 2);
              std::vector<int32_t> rp(Bmax);
              for (int b = 0; b < Bmax; ++b) rp[b] = std::max(0, p - 3 * b);
              row_pos.upload(rp.data(), Bmax);
              kern::RingArgs r = kern::RingArgs{nullptr, nullptr, pos.get(), slot.get(), C, H, hd, context}.over_fp8(
                  k8.get(), v8.get(), ks.get(), vs.get(), false);
              if (per_row) r.row_pos = row_pos.get();
              kern::ring_attention(q.get(), r, B, work.get(), out.get(), nullptr);
              PPX_CUDA_CHECK(cudaDeviceSynchronize());
              const std::vector<__nv_bfloat16> got = out.download();
              {
                // The by-head layout (shipped since v0.34): the same sums in the same order.
                const kern::RingArgs rh = r.over_fp8(k8h.get(), v8h.get(), ks.get(), vs.get(), true);
                kern::ring_attention(q.get(), rh, B, work.get(), out.get(), nullptr);
                PPX_CUDA_CHECK(cudaDeviceSynchronize());
                const std::vector<__nv_bfloat16> goth = out.download();
                ASSERT_EQ(0, std::memcmp(got.data(), goth.data(), static_cast<size_t>(B) * D * sizeof(__nv_bfloat16)))
                    << "by-head layout, policy " << policy << ", " << B << " rows, position " << p;
              }
              double worst = 0;
              for (int b = 0; b < B; ++b) {
                const int s = slots[b], qp = per_row ? rp[b] : positions[s];
                for (int h = 0; h < H; ++h) {
                  const size_t row0 = static_cast<size_t>(s) * C * D + h * hd;
                  const size_t sc0 = (static_cast<size_t>(s) * H + h) * SP;  // [slots, H, fp8_scale_pitch(C)]
                  const std::vector<double> ref = ring_attention_reference(
                      C, hd, qp, context,
                      [&](int j) {
                        return static_cast<double>(__bfloat162float(hq[static_cast<size_t>(b) * D + h * hd + j]));
                      },
                      [&](int idx, int j) {
                        const size_t i = static_cast<size_t>(idx);
                        return fp8v(hk[row0 + i * D + j]) * kern::fp8_scale_value(hks[sc0 + i]);
                      },
                      [&](int idx, int j) {
                        const size_t i = static_cast<size_t>(idx);
                        return fp8v(hv[row0 + i * D + j]) * kern::fp8_scale_value(hvs[sc0 + i]);
                      });
                  double num = 0, den = 0;
                  for (int j = 0; j < hd; ++j) {
                    const double g = __bfloat162float(got[static_cast<size_t>(b) * D + h * hd + j]);
                    num += (g - ref[j]) * (g - ref[j]);
                    den += ref[j] * ref[j];
                  }
                  ASSERT_GT(den, 0.0);
                  worst = std::max(worst, std::sqrt(num / den));
                }
              }
              // bf16 output rounding (~2e-3 rms at most) plus the half weights' (2^-11 each).
              EXPECT_LE(worst, 4e-3) << "hd " << hd << ", policy " << policy << ", " << B
                                     << " rows, per-row positions " << per_row << ", context " << context
                                     << ", position " << p;
            }
          }
        }
      }
    }
    kern::attention_set_policy(0);
  }
}
