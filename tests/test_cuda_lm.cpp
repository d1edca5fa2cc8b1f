// CUDA LM against the upstream golden session (tiny model). Skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>

#include "backend/cuda/cuda_lm.h"
#include "backend/cuda/cuda_util.h"
#include "engine/golden_replay.h"
#include "ppx/config.h"
#include "ppx/conversation.h"
#include "ppx/lm.h"
#include "ppx/mimi.h"
#include "ppx/safetensors.h"
#include "ppx/weights.h"
#include "test_util.h"

using namespace ppx;

namespace {

#define SKIP_WITHOUT_GPU() \
  if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device"

struct TinyCuda {
  ModelConfig cfg = load_config(test::data("tiny_config_a.json"));
  FileWeights lw{std::make_shared<const SafeTensors>(test::data("lm_tiny_a.safetensors"))};
  cuda::CudaLm lm{*cfg.lm, lw};
  FileWeights mw{std::make_shared<const SafeTensors>(test::data("mimi_tiny_a.safetensors"))};
  Mimi mimi{cfg.mimi, mw};
  cuda::SamplingParams greedy = [] {
    cuda::SamplingParams p;
    p.temp_text = p.temp_audio = 0.f;
    return p;
  }();
};

}  // namespace

// Upstream's own bf16 CUDA run is 0.6-0.9% from fp32 with the same token history; a bf16 port is
// held to 2e-2 teacher-forced against the fp32 reference.
TEST(CudaLmGolden, TeacherForcedAgainstFp32Reference) {
  SKIP_WITHOUT_GPU();
  TinyCuda t;
  cuda::CudaLmStepper stepper(t.lm, t.greedy);
  const SafeTensors session(test::data("session_tiny_a_cpu_fp32.safetensors"));
  const ReplayReport r = replay_golden_session(stepper, *t.cfg.lm_gen, &t.mimi, session, /*teacher_forced=*/true);
  std::printf("teacher-forced vs cpu fp32: text %.5f audio %.5f tokens %.4f\n", r.text_logits_max_rel_l2,
              r.audio_logits_max_rel_l2, r.out_token_agreement);
  EXPECT_LE(r.text_logits_max_rel_l2, 2e-2);
  EXPECT_LE(r.audio_logits_max_rel_l2, 2e-2);
  EXPECT_EQ(r.out_token_agreement, 1.0);
}

TEST(CudaLmGolden, TeacherForcedAgainstUpstreamBf16) {
  SKIP_WITHOUT_GPU();
  TinyCuda t;
  cuda::CudaLmStepper stepper(t.lm, t.greedy);
  const SafeTensors session(test::data("session_tiny_a_cuda_bf16.safetensors"));
  const ReplayReport r = replay_golden_session(stepper, *t.cfg.lm_gen, nullptr, session, /*teacher_forced=*/true);
  std::printf("teacher-forced vs upstream cuda bf16: text %.5f audio %.5f\n", r.text_logits_max_rel_l2,
              r.audio_logits_max_rel_l2);
  EXPECT_LE(r.text_logits_max_rel_l2, 2e-2);
  EXPECT_LE(r.audio_logits_max_rel_l2, 2e-2);
}

// The .pt voice replay path (external embeddings) on CUDA.
TEST(CudaLmGolden, PtVoiceReplay) {
  SKIP_WITHOUT_GPU();
  TinyCuda t;
  cuda::CudaLmStepper stepper(t.lm, t.greedy);
  const SafeTensors session(test::data("session_tiny_a_cpu_fp32.safetensors"));
  const VoiceEmbeddings v = load_voice_embeddings(test::data("voice_tiny_a.pt"));
  const ReplayReport r = replay_golden_session(stepper, *t.cfg.lm_gen, nullptr, session, true, &v);
  EXPECT_EQ(r.first_step, 6);
  EXPECT_LE(r.text_logits_max_rel_l2, 2e-2);
  EXPECT_LE(r.audio_logits_max_rel_l2, 2e-2);
}

// Sampling on the GPU: reproducible for a seed, different for another, tokens in range.
TEST(CudaLmSampling, SeededAndInRange) {
  SKIP_WITHOUT_GPU();
  TinyCuda t;
  LmGenConfig g = *t.cfg.lm_gen;
  g.use_sampling = true;
  auto run = [&](uint64_t seed) {
    cuda::CudaLmStepper st(t.lm, cuda::SamplingParams::from(g, seed));
    LmGen gen(st, g);
    std::vector<int64_t> all;
    const std::vector<int64_t> user(8, 5);
    for (int i = 0; i < 12; ++i) {
      auto out = gen.step(user.data(), nullptr, std::nullopt);
      if (out) all.insert(all.end(), out->begin(), out->end());
    }
    return all;
  };
  const auto a = run(1), b = run(1), c = run(2);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  for (size_t i = 0; i < a.size(); ++i) {
    const int64_t limit = i % 17 == 0 ? 1000 : 2048;
    EXPECT_TRUE(a[i] >= 0 && a[i] < limit) << i << ": " << a[i];
  }
}
