#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "codec/conv.h"
#include "ppx/config.h"
#include "ppx/error.h"
#include "ppx/mimi.h"
#include "ppx/safetensors.h"
#include "ppx/weights.h"
#include "test_util.h"

using namespace ppx;

namespace {

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

struct Golden {
  ModelConfig cfg = load_config(test::data("tiny_config_a.json"));
  FileWeights w{std::make_shared<const SafeTensors>(test::data("mimi_tiny_a.safetensors"))};
  Mimi mimi{cfg.mimi, w};
  SafeTensors io{test::data("mimi_tiny_a_io.safetensors")};
};

}  // namespace

// mimi_tiny_a_io.safetensors: upstream streaming encode of pcm_in one 1920-sample frame at a time
// (codes [8, 24]) and streaming decode of those codes (pcm_out), CPU fp32. See tests/data/README.md.
TEST(MimiGolden, StreamingEncodeMatchesAllCodes) {
  Golden g;
  const auto pcm = g.io.to_f32("pcm_in");
  const auto ref = g.io.to_i64("codes");
  const int frames = 24, fs = 1920, nq = 8;
  ASSERT_EQ(pcm.size(), static_cast<size_t>(frames * fs));
  MimiState st;
  int mismatches = 0;
  for (int f = 0; f < frames; ++f) {
    int32_t codes[8];
    g.mimi.encode(st, pcm.data() + f * fs, codes);
    for (int q = 0; q < nq; ++q) {
      EXPECT_EQ(codes[q], ref[q * frames + f]) << "frame " << f << " codebook " << q;
      mismatches += codes[q] != ref[q * frames + f];
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(MimiGolden, StreamingDecodeMatchesPcm) {
  Golden g;
  const auto ref_codes = g.io.to_i64("codes");
  const auto ref_pcm = g.io.to_f32("pcm_out");
  const int frames = 24, fs = 1920;
  MimiState st;
  std::vector<float> out(frames * fs);
  for (int f = 0; f < frames; ++f) {
    int32_t codes[8];
    for (int q = 0; q < 8; ++q) codes[q] = static_cast<int32_t>(ref_codes[q * frames + f]);
    g.mimi.decode(st, codes, out.data() + f * fs);
  }
  const double err = rel_l2(out, ref_pcm);
  EXPECT_LE(err, 1e-4);
  RecordProperty("pcm_rel_l2", std::to_string(err));
}

TEST(MimiGolden, ResetRestartsTheStream) {
  Golden g;
  const auto pcm = g.io.to_f32("pcm_in");
  MimiState st;
  int32_t a[8], b[8];
  for (int f = 0; f < 5; ++f) g.mimi.encode(st, pcm.data() + f * 1920, a);
  st.reset();
  g.mimi.encode(st, pcm.data(), a);
  MimiState fresh;
  g.mimi.encode(fresh, pcm.data(), b);
  EXPECT_TRUE(std::equal(a, a + 8, b));
  int32_t bad[8] = {0, 0, 0, 0, 0, 0, 0, 2048};
  std::vector<float> out(1920);
  EXPECT_THROW(g.mimi.decode(st, bad, out.data()), Error);
}

TEST(MimiGolden, WrongConfigForWeightsIsAClearError) {
  ModelConfig cfg = load_config(test::config_dir("personaplex-7b.json"));
  FileWeights w(std::make_shared<const SafeTensors>(test::data("mimi_tiny_a.safetensors")));
  try {
    Mimi m(cfg.mimi, w);
    FAIL();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("encoder.model.0.conv.conv.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("mimi_tiny_a.safetensors"), std::string::npos) << msg;
  }
}

// The full-size model built from the shipped config asks for exactly the upstream state dict.
TEST(MimiFullSize, KeysAndShapesMatchUpstreamList) {
  const ModelConfig cfg = load_config(test::config_dir("personaplex-7b.json"));
  RandomWeights w(1);
  Mimi mimi(cfg.mimi, w);
  std::ifstream f(test::data("mimi_keys.json"));
  const nlohmann::json expected = nlohmann::json::parse(f);
  std::map<std::string, std::vector<int64_t>> got;
  for (const auto& [k, s] : w.requested()) EXPECT_TRUE(got.emplace(k, s).second) << "requested twice: " << k;
  EXPECT_EQ(got.size(), expected.size());
  for (auto it = expected.begin(); it != expected.end(); ++it) {
    auto g = got.find(it.key());
    ASSERT_NE(g, got.end()) << "not requested: " << it.key();
    EXPECT_EQ(g->second, it.value()["shape"].get<std::vector<int64_t>>()) << it.key();
  }
  // And it runs: one frame of noise in, codes in range, finite audio out.
  MimiState st;
  std::vector<float> pcm(1920), out(1920);
  for (size_t i = 0; i < pcm.size(); ++i) pcm[i] = 0.1f * std::sin(0.05f * i);
  int32_t codes[8];
  mimi.encode(st, pcm.data(), codes);
  for (int q = 0; q < 8; ++q) EXPECT_TRUE(codes[q] >= 0 && codes[q] < 2048);
  mimi.decode(st, codes, out.data());
  for (float v : out) ASSERT_TRUE(std::isfinite(v));
}

// Streaming invariant: a conv fed in chunks equals the conv fed everything at once.
TEST(StreamingConv, ChunkedEqualsWhole) {
  RandomWeights w(7);
  for (PadMode pad : {PadMode::kConstant, PadMode::kReplicate}) {
    StreamConv1d conv(w, pad == PadMode::kConstant ? "c" : "r", 3, 5, 7, 3, true, pad);
    StreamConvTr1d convtr(w, "t", 3, 5, 6, 3, 1, true);
    const int T = 3 * 11;  // odd, not a multiple of the vector width
    std::vector<float> x(3 * T);
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * i) + 0.5f;
    Conv1dState whole_st;
    std::vector<float> whole, part, cat(5 * (T / 3));
    conv.forward(whole_st, x.data(), T, whole);
    Conv1dState st;
    int done = 0;
    for (int chunk : {3, 12, 6, 12}) {
      std::vector<float> xc(3 * chunk);
      for (int c = 0; c < 3; ++c) std::copy_n(x.begin() + c * T + done, chunk, xc.begin() + c * chunk);
      conv.forward(st, xc.data(), chunk, part);
      for (int o = 0; o < 5; ++o)
        std::copy_n(part.begin() + o * (chunk / 3), chunk / 3, cat.begin() + o * (T / 3) + done / 3);
      done += chunk;
    }
    for (size_t i = 0; i < whole.size(); ++i) EXPECT_NEAR(cat[i], whole[i], 1e-5f) << i;

    // Transposed conv: chunked output equals the whole output (first S*T samples).
    const int Tin = 11;
    std::vector<float> xi(3 * Tin);
    for (size_t i = 0; i < xi.size(); ++i) xi[i] = std::cos(0.21f * i);
    ConvTr1dState ws, cs;
    std::vector<float> wy, cy, cat2(5 * 3 * Tin);
    convtr.forward(ws, xi.data(), Tin, wy);
    int d2 = 0;
    for (int chunk : {1, 4, 6}) {
      std::vector<float> xc(3 * chunk);
      for (int c = 0; c < 3; ++c) std::copy_n(xi.begin() + c * Tin + d2, chunk, xc.begin() + c * chunk);
      convtr.forward(cs, xc.data(), chunk, cy);
      for (int o = 0; o < 5; ++o) std::copy_n(cy.begin() + o * 3 * chunk, 3 * chunk, cat2.begin() + o * 3 * Tin + 3 * d2);
      d2 += chunk;
    }
    for (size_t i = 0; i < wy.size(); ++i) EXPECT_NEAR(cat2[i], wy[i], 1e-5f) << i;
  }
}
