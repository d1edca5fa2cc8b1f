#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "engine/golden_replay.h"
#include "ppx/config.h"
#include "ppx/error.h"
#include "ppx/lm.h"
#include "ppx/lm_gen.h"
#include "ppx/mimi.h"
#include "ppx/pt_reader.h"
#include "ppx/safetensors.h"
#include "ppx/weights.h"
#include "test_util.h"

using namespace ppx;

namespace {

struct Tiny {
  ModelConfig cfg = load_config(test::data("tiny_config_a.json"));
  std::shared_ptr<const SafeTensors> lm_file = std::make_shared<const SafeTensors>(test::data("lm_tiny_a.safetensors"));
  FileWeights lw{lm_file};
  Lm lm{*cfg.lm, lw};
  FileWeights mw{std::make_shared<const SafeTensors>(test::data("mimi_tiny_a.safetensors"))};
  Mimi mimi{cfg.mimi, mw};
  SafeTensors session{test::data("session_tiny_a_cpu_fp32.safetensors")};
  LmGenConfig greedy_cfg = [&] { LmGenConfig g = *cfg.lm_gen; g.use_sampling = false; return g; }();
  Sampler greedy{greedy_cfg, 0};
  CpuLmStepper stepper{lm, greedy};
};

}  // namespace

// session_tiny_a_cpu_fp32.safetensors: upstream LMGen greedy session on the CPU in fp32 (6 voice
// frames, 3 silence, 6 text-prompt tokens, 3 silence, 20 user frames). See tests/data/README.md.
TEST(LmGolden, FreeRunningGreedyMatchesEveryStep) {
  Tiny t;
  const ReplayReport r = replay_golden_session(t.stepper, *t.cfg.lm_gen, &t.mimi, t.session, /*teacher_forced=*/false);
  EXPECT_EQ(r.steps, 38);
  EXPECT_EQ(r.out_token_agreement, 1.0);
  EXPECT_LE(r.text_logits_max_rel_l2, 1e-4);
  EXPECT_LE(r.audio_logits_max_rel_l2, 1e-4);
  ASSERT_TRUE(r.pcm_rel_l2.has_value());
  EXPECT_LE(*r.pcm_rel_l2, 1e-4);
  // The frames returned during the user audio are the session's output tokens.
  const auto ref = t.session.to_i64("session.out_tokens");  // [17, 20]
  ASSERT_EQ(r.out_tokens.size(), ref.size());
  for (int f = 0; f < 20; ++f) {
    for (int k = 0; k < 17; ++k) EXPECT_EQ(r.out_tokens[f * 17 + k], ref[k * 20 + f]) << f << "," << k;
  }
}

TEST(LmGolden, TeacherForcedLogits) {
  Tiny t;
  const ReplayReport r = replay_golden_session(t.stepper, *t.cfg.lm_gen, nullptr, t.session, /*teacher_forced=*/true);
  EXPECT_LE(r.text_logits_max_rel_l2, 1e-4);
  EXPECT_LE(r.audio_logits_max_rel_l2, 1e-4);
  EXPECT_EQ(r.out_token_agreement, 1.0);
}

// The full-size spec is exactly upstream's state dict (keys and shapes).
TEST(LmSpec, FullSizeKeysMatchUpstream) {
  const ModelConfig cfg = load_config(test::config_dir("personaplex-7b.json"));
  std::ifstream f(test::data("personaplex_7b_lm_keys.json"));
  const nlohmann::json expected = nlohmann::json::parse(f);
  const auto spec = lm_state_dict_spec(*cfg.lm);
  EXPECT_EQ(spec.size(), expected.size());
  EXPECT_EQ(spec.size(), 475u);
  int64_t params = 0;
  std::set<std::string> seen;
  for (const auto& [k, shape] : spec) {
    EXPECT_TRUE(seen.insert(k).second) << k;
    ASSERT_TRUE(expected.contains(k)) << "not upstream: " << k;
    EXPECT_EQ(shape, expected[k]["shape"].get<std::vector<int64_t>>()) << k;
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    params += n;
  }
  EXPECT_EQ(params, 8371408896);
}

// Upstream's 8-step (Kyutai Moshi) layout: derived from lm_tiny_a by dropping per-step entries
// 8..15 and halving the depformer self_attn tensors, as the reference notes describe.
TEST(LmLoad, EightStepLayoutExpandsAsUpstream) {
  Tiny t;
  std::map<std::string, TensorBlob> blobs;
  const std::string kStep[] = {"gating.", "linears.", "depformer_in.", "depformer_emb."};
  for (const auto& [key, info] : t.lm_file->tensors()) {
    bool drop = false;
    for (int n = 8; n < 16; ++n)
      for (const auto& p : kStep) drop |= key.find(p + std::to_string(n) + ".") != std::string::npos;
    if (drop) continue;
    std::vector<float> v = t.lm_file->to_f32(key);
    std::vector<int64_t> shape = info.shape;
    if (key.rfind("depformer.", 0) == 0 && key.find("self_attn") != std::string::npos) {
      shape[0] /= 2;
      v.resize(v.size() / 2);
    }
    blobs[key] = blob_bf16(shape, v);
  }
  const std::string path = test::scratch("lm_tiny_a_dep8.safetensors");
  write_safetensors(path, blobs);
  FileWeights w8(std::make_shared<const SafeTensors>(path));
  const Lm lm8(*t.cfg.lm, w8);
  // Steps 8..15 behave exactly as steps 0..7: same logits for the same inputs.
  std::vector<float> h(128);
  for (int i = 0; i < 128; ++i) h[i] = std::sin(0.1f * i);
  struct Argmax : TokenChooser {
    int text(const float* l, int n) override { return Sampler::argmax(l, n); }
    int audio(int, const float* l, int n) override { return Sampler::argmax(l, n); }
  } chooser;
  std::vector<int64_t> forced(16, 5), sampled(16);
  std::vector<uint8_t> prov(16, 1);
  std::vector<float> logits(16 * 2048);
  lm8.depformer(h.data(), 7, forced.data(), prov.data(), chooser, 16, sampled.data(), logits.data());
  // Steps 8..15 were filled from 0..7 (patch 2), self_attn from the half-size tensors (patch 1).
  std::map<std::string, int> asked;
  for (const auto& [k, shape] : w8.requested()) {
    ++asked[k];
    if (k == "depformer.layers.0.self_attn.in_proj_weight") {
      EXPECT_EQ(shape, (std::vector<int64_t>{8 * 3 * 64, 64}));
    }
  }
  for (const std::string k : {"linears.3.weight", "depformer_in.0.weight", "depformer_emb.6.weight",
                              "depformer.layers.1.gating.7.linear_out.weight"}) {
    EXPECT_EQ(asked[k], 2) << k;
  }
  EXPECT_EQ(asked["depformer_emb.7.weight"], 1);  // 15 entries: 0..14, of which 8..14 come from 0..6
  EXPECT_EQ(asked.count("linears.8.weight"), 0u);
  // Steps 0..7 are unchanged: the depformer logits of step 0 equal those of the 16-step model.
  std::vector<float> logits16(16 * 2048);
  t.lm.depformer(h.data(), 7, forced.data(), prov.data(), chooser, 16, sampled.data(), logits16.data());
  for (int i = 0; i < 8 * 2048; ++i) ASSERT_FLOAT_EQ(logits[i], logits16[i]) << i;
}

TEST(LmLoad, WrongConfigNamesTheTensor) {
  const ModelConfig cfg = load_config(test::config_dir("personaplex-7b.json"));
  FileWeights w(std::make_shared<const SafeTensors>(test::data("lm_tiny_a.safetensors")));
  try {
    Lm lm(*cfg.lm, w);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("emb.0.weight"), std::string::npos) << e.what();
  }
}

TEST(Sampling, GreedyTopKAndSeeds) {
  LmGenConfig c;
  c.use_sampling = false;
  Sampler greedy(c, 1);
  const float l[5] = {0.f, 3.f, 3.f, -1.f, 2.f};
  EXPECT_EQ(greedy.audio(0, l, 5), 1);  // first index wins ties
  c.use_sampling = true;
  c.top_k = 2;
  c.temp = 1.0;
  Sampler a(c, 42), b(c, 42);
  std::vector<int> counts(5);
  for (int i = 0; i < 2000; ++i) {
    const int x = a.audio(0, l, 5);
    EXPECT_EQ(x, b.audio(0, l, 5));  // same seed, same draws
    ++counts[x];
  }
  EXPECT_EQ(counts[0] + counts[3] + counts[4], 0);  // outside the top 2
  EXPECT_NEAR(counts[1] / 2000.0, 0.5, 0.05);
  // Temperatures that are 0 as a float, or small enough that logits / t overflow, sample
  // greedily (they gave NaN probabilities and a constant token).
  const float m[5] = {0.f, 1.f, 5.f, -1.f, 2.f};
  for (const double t : {1e-300, 4.9e-324, 1e-45, 1e-38}) {
    c.temp = t;
    c.top_k = 0;
    Sampler tiny(c, 7);
    for (int i = 0; i < 20; ++i) EXPECT_EQ(tiny.audio(0, m, 5), 2) << t;
  }
}

// voice_tiny_a.pt holds the session's voice prompt the upstream way (embeddings of the 5 model
// calls of the voice phase, and the token cache after it). Replaying it reproduces steps 6..37.
TEST(LmGolden, PtVoiceReplayReproducesTheSession) {
  Tiny t;
  for (const char* name : {"voice_tiny_a.pt", "voice_tiny_a_cuda.pt"}) {
    SCOPED_TRACE(name);
    const VoiceEmbeddings v = load_voice_embeddings(test::data(name));
    EXPECT_EQ(v.n, 5);
    EXPECT_EQ(v.dim, 128);
    const ReplayReport r = replay_golden_session(t.stepper, *t.cfg.lm_gen, &t.mimi, t.session, false, &v);
    EXPECT_EQ(r.first_step, 6);
    EXPECT_EQ(r.out_token_agreement, 1.0);
    // The fp32 file matches to fp32 precision; the bf16 one (made by the CUDA bf16 model) is a
    // different prompt state, so only the fp32 file must reproduce the logits.
    if (std::string(name) == "voice_tiny_a.pt") {
      EXPECT_LE(r.text_logits_max_rel_l2, 1e-4);
      EXPECT_LE(r.audio_logits_max_rel_l2, 1e-4);
      ASSERT_TRUE(r.pcm_rel_l2.has_value());
      EXPECT_LE(*r.pcm_rel_l2, 1e-4);
    }
  }
}

// --dep-q-exit 8 skips the depformer steps of the user's codebooks, which conversation always
// provides: the text and agent tokens of the golden greedy session are exactly those of all 16.
TEST(LmDepQExit, EightStepsKeepTextAndAgentTokens) {
  Tiny t;
  CpuLmStepper eight(t.lm, t.greedy, 8);
  EXPECT_EQ(eight.depformer_steps(), 8);
  const ReplayReport r = replay_golden_session(eight, *t.cfg.lm_gen, nullptr, t.session, false);
  const auto ref = t.session.to_i64("session.out_tokens");  // [17, 20]
  ASSERT_EQ(r.out_tokens.size(), ref.size());
  for (int f = 0; f < 20; ++f) {
    for (int k = 0; k <= 8; ++k) EXPECT_EQ(r.out_tokens[f * 17 + k], ref[k * 20 + f]) << f << "," << k;
  }
}

// The precondition is enforced: a step whose skipped streams are not provided fails clearly
// instead of returning tokens nobody computed.
TEST(LmDepQExit, GuardRefusesAStepWithoutTheUserStreams) {
  Tiny t;
  CpuLmStepper eight(t.lm, t.greedy, 8);
  LmGen gen(eight, t.greedy_cfg);
  const std::vector<int64_t> user(8, 5), agent(8, 7);
  for (int i = 0; i < 4; ++i) EXPECT_NO_THROW(gen.step(user.data(), agent.data(), 3));
  try {
    gen.step(nullptr, agent.data(), 3);
    FAIL() << "a step without the user's codebooks ran with --dep-q-exit 8";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--dep-q-exit 8"), std::string::npos) << e.what();
  }
  CpuLmStepper all(t.lm, t.greedy);
  LmGen gen_all(all, t.greedy_cfg);
  for (int i = 0; i < 4; ++i) EXPECT_NO_THROW(gen_all.step(nullptr, agent.data(), 3));
}
