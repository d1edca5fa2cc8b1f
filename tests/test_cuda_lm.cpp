// CUDA LM against the upstream golden session (tiny model). Skipped without a GPU.
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "backend/cuda/cuda_lm.h"
#include "backend/cuda/cuda_util.h"
#include "cuda_test_util.h"
#include "ppx/backend.h"
#include "engine/golden_replay.h"
#include "engine/scheduler.h"
#include "lm_attention.cuh"
#include "lm_misc.cuh"
#include "ppx/config.h"
#include "ppx/conversation.h"
#include "ppx/error.h"
#include "ppx/lm.h"
#include "ppx/mimi.h"
#include "ppx/resources.h"
#include "ppx/safetensors.h"
#include "ppx/weights.h"
#include "prompt_cache_test_util.h"
#include "scheduler_test_util.h"
#include "test_util.h"

using namespace ppx;

namespace {


struct TinyCuda {
  explicit TinyCuda(const cuda::CudaLmOptions& opt = {}) : lm(*cfg.lm, lw, opt) {}
  ModelConfig cfg = load_config(test::data("tiny_config_a.json"));
  FileWeights lw{std::make_shared<const SafeTensors>(test::data("lm_tiny_a.safetensors"))};
  cuda::CudaLm lm;
  FileWeights mw{std::make_shared<const SafeTensors>(test::data("mimi_tiny_a.safetensors"))};
  Mimi mimi{cfg.mimi, mw};
  cuda::SamplingParams greedy = [] {
    cuda::SamplingParams p;
    p.temp_text = p.temp_audio = 0.f;
    return p;
  }();
};

// Sets kern::attention_set_fp8_by_head (read by CudaLm when it is built; true as shipped, false the
// measurement hook of v0.33's layout) for a scope, and restores it however the scope ends.
struct Fp8ByHead {
  explicit Fp8ByHead(bool on) : was(kern::attention_fp8_by_head()) { kern::attention_set_fp8_by_head(on); }
  ~Fp8ByHead() { kern::attention_set_fp8_by_head(was); }
  const bool was;
  Fp8ByHead(const Fp8ByHead&) = delete;
  Fp8ByHead& operator=(const Fp8ByHead&) = delete;
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

// w8a16 with fp8 e4m3 linear weights (--w8-format fp8), per-row scales: the same session.
TEST(CudaLmGolden, TeacherForcedW8a16AgainstFp32Reference) {
  SKIP_WITHOUT_GPU();
  cuda::CudaLmOptions opt;
  opt.w8a16 = true;
  opt.w8_int8 = false;
  TinyCuda t(opt);
  ASSERT_TRUE(t.lm.w8a16());
  ASSERT_TRUE(t.lm.text_linear.fp8());
  cuda::CudaLmStepper stepper(t.lm, t.greedy);
  const SafeTensors session(test::data("session_tiny_a_cpu_fp32.safetensors"));
  const ReplayReport r = replay_golden_session(stepper, *t.cfg.lm_gen, &t.mimi, session, /*teacher_forced=*/true);
  std::printf("teacher-forced w8a16 vs cpu fp32: text %.5f audio %.5f tokens %.4f\n", r.text_logits_max_rel_l2,
              r.audio_logits_max_rel_l2, r.out_token_agreement);
  EXPECT_LE(r.text_logits_max_rel_l2, 5e-2);
  // The fast-path issue asks for 5e-2 on both; the audio logits miss it with fp8 e4m3 per-row
  // weights (0.081 on the H200, 2026-12-03, docs/QUALITY.md), which is why int8 ships (next
  // test). This bound guards the fp8 option against a regression.
  EXPECT_LE(r.audio_logits_max_rel_l2, 0.1);
}

// w8a16 with int8 weights (what --w8a16 ships): the same session, held to the 5e-2
// (measured 0.011 text, 0.027 audio on the H200, 2026-12-03).
TEST(CudaLmGolden, TeacherForcedW8a16Int8AgainstFp32Reference) {
  SKIP_WITHOUT_GPU();
  cuda::CudaLmOptions opt;
  opt.w8a16 = true;
  TinyCuda t(opt);
  ASSERT_TRUE(t.lm.text_linear.int8());
  cuda::CudaLmStepper stepper(t.lm, t.greedy);
  const SafeTensors session(test::data("session_tiny_a_cpu_fp32.safetensors"));
  const ReplayReport r = replay_golden_session(stepper, *t.cfg.lm_gen, &t.mimi, session, /*teacher_forced=*/true);
  std::printf("teacher-forced w8a16 int8 vs cpu fp32: text %.5f audio %.5f tokens %.4f\n", r.text_logits_max_rel_l2,
              r.audio_logits_max_rel_l2, r.out_token_agreement);
  EXPECT_LE(r.text_logits_max_rel_l2, 5e-2);
  EXPECT_LE(r.audio_logits_max_rel_l2, 5e-2);
}

// --kv-fp8: the temporal KV cache in fp8 e4m3 with per-(position, head) scales, bf16 weights.
TEST(CudaLmGolden, TeacherForcedKvFp8AgainstFp32Reference) {
  SKIP_WITHOUT_GPU();
  cuda::CudaLmOptions opt;
  opt.kv_fp8 = true;
  const SafeTensors session(test::data("session_tiny_a_cpu_fp32.safetensors"));
  ReplayReport by_position;
  // The cache laid out by position (v0.33's, a measurement hook), then by head (shipped): the same
  // figures (the tiny model has one head, where the two layouts are the same bytes; with several
  // heads the layouts' equality is CudaLmAttention.Fp8ByHeadStepsAsByPosition's).
  for (const bool by_head : {false, true}) {
    std::unique_ptr<TinyCuda> tp;
    {
      Fp8ByHead g(by_head);
      tp = std::make_unique<TinyCuda>(opt);
    }
    TinyCuda& t = *tp;
    ASSERT_TRUE(t.lm.kv_fp8());
    ASSERT_EQ(t.lm.kv_fp8_by_head(), by_head);
    cuda::CudaLmStepper stepper(t.lm, t.greedy);
    const ReplayReport r = replay_golden_session(stepper, *t.cfg.lm_gen, &t.mimi, session, /*teacher_forced=*/true);
    std::printf("teacher-forced kv-fp8%s vs cpu fp32: text %.5f audio %.5f tokens %.4f\n", by_head ? " by head" : "",
                r.text_logits_max_rel_l2, r.audio_logits_max_rel_l2, r.out_token_agreement);
    EXPECT_LE(r.text_logits_max_rel_l2, 5e-2);
    EXPECT_LE(r.audio_logits_max_rel_l2, 5e-2);
    if (!by_head) {
      by_position = r;
    } else {
      EXPECT_EQ(r.text_logits_max_rel_l2, by_position.text_logits_max_rel_l2);
      EXPECT_EQ(r.audio_logits_max_rel_l2, by_position.audio_logits_max_rel_l2);
      EXPECT_EQ(r.out_token_agreement, by_position.out_token_agreement);
    }
  }
}

// w8a16 weight memory: the linear weights at 1 byte plus a float per row, the rest bf16.
TEST(CudaLmW8a16, WeightBytes) {
  SKIP_WITHOUT_GPU();
  TinyCuda b;
  cuda::CudaLmOptions opt;
  opt.w8a16 = true;
  TinyCuda q(opt);
  std::printf("tiny weights: bf16 %zu bytes, w8a16 %zu bytes\n", b.lm.weight_bytes(), q.lm.weight_bytes());
  // The tiny model is mostly embeddings (kept bf16): 21.4 -> 17.3 MB. The full-size smoke test
  // checks the 7B ratio (16.7 -> 8.7 GB).
  EXPECT_LT(q.lm.weight_bytes(), b.lm.weight_bytes());
  EXPECT_FALSE(b.lm.text_linear.fp8());
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

namespace {

double rel_l2(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = static_cast<double>(a[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

bool all_finite(const std::vector<float>& v) {
  for (float f : v)
    if (!std::isfinite(f)) return false;
  return true;
}

// A random model call: input and target tokens in range (drawn in that order per stream), the
// user's streams (1 + n_q / 2 .. n_q) provided.
struct RandomStep {
  std::vector<int64_t> input, target;
  std::vector<uint8_t> provided;
  RandomStep(const LmConfig& c, std::mt19937& rng) {
    const int K = c.n_q + 1;
    input.resize(K);
    target.resize(K);
    provided.resize(K);
    for (int k = 0; k < K; ++k) {
      const unsigned card = static_cast<unsigned>(k == 0 ? c.text_card : c.card);
      input[k] = static_cast<int64_t>(rng() % card);
      target[k] = static_cast<int64_t>(rng() % card);
      provided[k] = k > c.n_q / 2 ? 1 : 0;
    }
  }
  StepRequest request() const {
    StepRequest req;
    req.input = input.data();
    req.target = target.data();
    req.provided = provided.data();
    return req;
  }
};

// The deferred user-stream depformer steps against a serial stepper (same kernels, same counter-
// based random draws): identical tokens and logits, sampling on. Frames without logits and with
// every user stream provided return before the tail runs (its tokens are -1 then); a frame with
// logits, or with a user stream not provided, waits for it. The serial results are computed
// first, so that the deferred stepper runs its frames back to back and each tail overlaps the next
// frame.
void compare_deferred(const cuda::CudaLm& lm, int steps) {
  const LmConfig& c = lm.config();
  cuda::SamplingParams sp;
  sp.seed = 5;
  cuda::CudaLmStepper serial(lm, sp, -1, /*defer_user_steps=*/false);
  cuda::CudaLmStepper deferred(lm, sp);
  const int half = c.n_q / 2;
  ASSERT_EQ(serial.tail_begin(), c.dep_q);
  ASSERT_EQ(deferred.tail_begin(), c.dep_q > half ? half : c.dep_q);
  std::mt19937 rng(3);
  struct Frame {
    RandomStep step;
    bool with_logits = false, user_missing = false;
    StepResult r;
    StepLogits l;
  };
  std::vector<Frame> frames;
  for (int t = 0; t < steps; ++t) {
    frames.push_back({RandomStep(c, rng), t % 5 == 4, t % 7 == 5, {}, {}});
    if (frames.back().user_missing) frames.back().step.provided[c.n_q - 1] = 0;  // user codebook 6
  }
  for (Frame& f : frames) serial.run(f.step.request(), f.r, f.with_logits ? &f.l : nullptr);
  for (int t = 0; t < steps; ++t) {
    const Frame& f = frames[t];
    StepResult rd;
    StepLogits ld;
    deferred.run(f.step.request(), rd, f.with_logits ? &ld : nullptr);
    EXPECT_EQ(rd.text, f.r.text) << "step " << t;
    for (int s = 0; s < c.dep_q; ++s) {
      if (s < deferred.tail_begin()) {
        EXPECT_EQ(rd.audio[s], f.r.audio[s]) << "step " << t << " codebook " << s;
      } else if (f.with_logits || f.user_missing) {
        EXPECT_EQ(rd.audio[s], f.r.audio[s]) << "step " << t << " codebook " << s;
      } else {
        EXPECT_EQ(rd.audio[s], -1) << "step " << t << " codebook " << s;
      }
    }
    if (f.with_logits) {
      EXPECT_EQ(rel_l2(ld.text, f.l.text), 0.0) << "step " << t;
      const size_t split = static_cast<size_t>(deferred.tail_begin()) * c.card;
      const std::vector<float> head_d(ld.audio.begin(), ld.audio.begin() + split),
          head_s(f.l.audio.begin(), f.l.audio.begin() + split), tail_d(ld.audio.begin() + split, ld.audio.end()),
          tail_s(f.l.audio.begin() + split, f.l.audio.end());
      EXPECT_EQ(rel_l2(head_d, head_s), 0.0) << "step " << t;
      EXPECT_EQ(rel_l2(tail_d, tail_s), 0.0) << "step " << t;
    }
    if (t > 0 && deferred.tail_begin() < c.dep_q) {
      EXPECT_GT(deferred.deferred_ms(), 0.0) << "step " << t;
    }
  }
  EXPECT_EQ(serial.deferred_ms(), 0.0);
}

}  // namespace

TEST(CudaLmDeferred, MatchesSerialTiny) {
  SKIP_WITHOUT_GPU();
  TinyCuda t;
  compare_deferred(t.lm, 24);
}

// Full-size shapes (16 heads of 64, K = 4096 input projection) with random weights generated on
// the GPU (16.7 GB).
TEST(CudaLmDeferred, MatchesSerialFullSize) {
  SKIP_WITHOUT_GPU();
  const ModelConfig cfg = parse_config(std::string(embedded_config("personaplex-7b")), "embedded:personaplex-7b");
  cuda::CudaLm lm(*cfg.lm, 1234);
  compare_deferred(lm, 6);
}

// The fp8 cache laid out by head (shipped since v0.34) against v0.33's layout by position, end to
// end: the tiny model widened to two heads of 128 (the tensor-core kernel), random weights, sampling
// on, past the ring's length (24 positions): the same logits and tokens at every step, bit for bit.
TEST(CudaLmAttention, Fp8ByHeadStepsAsByPosition) {
  SKIP_WITHOUT_GPU();
  const ModelConfig cfg = load_config(test::data("tiny_config_a.json"));
  LmConfig c = *cfg.lm;
  c.dim = 256;
  c.num_heads = 2;
  cuda::CudaLmOptions opt;
  opt.kv_fp8 = true;
  constexpr int kSteps = 60;
  std::vector<std::vector<float>> logits[2];
  std::vector<int64_t> text[2];
  for (const int by_head : {0, 1}) {
    std::unique_ptr<cuda::CudaLm> lm;
    {
      Fp8ByHead g(by_head == 1);
      lm = std::make_unique<cuda::CudaLm>(c, 4321, opt);
    }
    ASSERT_EQ(lm->kv_fp8_by_head(), by_head == 1);
    cuda::SamplingParams sp;
    sp.seed = 5;
    cuda::CudaLmStepper st(*lm, sp);
    std::mt19937 rng(21);
    for (int t = 0; t < kSteps; ++t) {
      const RandomStep step(c, rng);
      StepResult r;
      StepLogits l;
      st.run(step.request(), r, &l);
      ASSERT_TRUE(all_finite(l.text)) << "step " << t;
      logits[by_head].push_back(l.text);
      logits[by_head].push_back(l.audio);
      text[by_head].push_back(r.text);
    }
  }
  ASSERT_EQ(logits[0].size(), logits[1].size());
  for (size_t i = 0; i < logits[0].size(); ++i) {
    ASSERT_EQ(logits[0][i].size(), logits[1][i].size());
    ASSERT_EQ(0, std::memcmp(logits[0][i].data(), logits[1][i].data(), logits[0][i].size() * sizeof(float)))
        << "step " << i / 2 << (i % 2 ? " audio" : " text");
  }
  EXPECT_EQ(text[0], text[1]);
}

// Full-size shapes with random weights (bf16 16.7 GB, then w8a16): a few sampled steps with w8a16
// give finite logits and tokens in range. The text logits (the temporal transformer and text head
// on the same inputs) are compared with the bf16 model's and printed, with the weight memory.
TEST(CudaLmW8a16, RandomWeightsFullSizeSmoke) {
  SKIP_WITHOUT_GPU();
  const ModelConfig cfg = parse_config(std::string(embedded_config("personaplex-7b")), "embedded:personaplex-7b");
  const LmConfig& c = *cfg.lm;
  const int steps = 4;
  std::vector<std::vector<float>> ref_text;
  size_t bf16_bytes = 0;
  {
    cuda::CudaLm lm(c, 1234);
    bf16_bytes = lm.weight_bytes();
    cuda::SamplingParams sp;
    sp.seed = 3;
    cuda::CudaLmStepper st(lm, sp);
    std::mt19937 rng(17);
    for (int t = 0; t < steps; ++t) {
      const RandomStep step(c, rng);
      StepResult r;
      StepLogits l;
      st.run(step.request(), r, &l);
      ref_text.push_back(l.text);
    }
  }
  cuda::CudaLmOptions opt;
  opt.w8a16 = true;
  cuda::CudaLm lm(c, 1234, opt);
  std::printf("full-size weights: bf16 %.3f GB, w8a16 %.3f GB\n", bf16_bytes / 1e9, lm.weight_bytes() / 1e9);
  EXPECT_LT(lm.weight_bytes(), bf16_bytes * 6 / 10);
  cuda::SamplingParams sp;
  sp.seed = 3;
  cuda::CudaLmStepper st(lm, sp);
  std::mt19937 rng(17);
  double worst = 0;
  for (int t = 0; t < steps; ++t) {
    const RandomStep step(c, rng);
    StepResult r;
    StepLogits l;
    st.run(step.request(), r, &l);
    ASSERT_TRUE(all_finite(l.text)) << "step " << t;
    ASSERT_TRUE(all_finite(l.audio)) << "step " << t;
    EXPECT_TRUE(r.text >= 0 && r.text < c.text_card) << "step " << t << ": " << r.text;
    ASSERT_EQ(static_cast<int>(r.audio.size()), c.dep_q);
    for (int s = 0; s < c.dep_q; ++s)
      EXPECT_TRUE(r.audio[s] >= 0 && r.audio[s] < c.card) << "step " << t << " codebook " << s << ": " << r.audio[s];
    worst = std::max(worst, rel_l2(l.text, ref_text[t]));
  }
  std::printf("full-size random weights: w8a16 vs bf16 text logits rel L2 over %d steps %.4g\n", steps, worst);
}

// The frame scheduler on CUDA (CudaLmBatch: one batched step for every session with a step ready,
// state per slot, graphs per batch-size bucket). Up to 4 rows a step runs the batch-1 stepper's
// kernels, so a session's tokens, greedy and sampled, are exactly those of a batch-1 stepper of its
// own, beside 3 others that join, leave and reuse slots mid-stream (batches of 1..4 rows).
TEST(CudaScheduler, BatchedTokensEqualAloneUpTo4) {
  SKIP_WITHOUT_GPU();
  const ModelConfig cfg = load_config(test::data("tiny_config_a.json"));
  FileWeights lw{std::make_shared<const SafeTensors>(test::data("lm_tiny_a.safetensors"))};
  FileWeights mw{std::make_shared<const SafeTensors>(test::data("mimi_tiny_a.safetensors"))};
  auto backend = make_cuda_backend(cfg, mw, &lw, 0, 4);
  const int half = cfg.lm->n_q / 2;
  for (const bool sampling : {false, true}) {
    constexpr int kSlots = 4, kSessions = 12;
    std::vector<test::Script> scripts;
    for (int i = 0; i < kSessions; ++i) scripts.push_back(test::make_script(cfg, i, sampling));
    std::vector<std::vector<int64_t>> alone(kSessions), batched(kSessions);
    for (int i = 0; i < kSessions; ++i)
      alone[i] = test::play(*backend->lm_stepper(scripts[i].gen, scripts[i].seed, -1), scripts[i], half);
    // Prompts prefilled 4 positions at a time: the GEMV path, the batch-1 order.
    LmScheduler sched(backend->lm_batch(kSlots, -1), {}, 4);
    std::vector<std::thread> threads;
    for (int slot = 0; slot < kSlots; ++slot) {
      threads.emplace_back([&, slot] {
        for (int i = slot; i < kSessions; i += kSlots) {
          auto st = sched.open(slot, scripts[i].gen, scripts[i].seed);
          batched[i] = test::play(*st, scripts[i], half);
        }
      });
    }
    for (auto& th : threads) th.join();
    for (int i = 0; i < kSessions; ++i) EXPECT_EQ(batched[i], alone[i]) << "session " << i << " sampling " << sampling;
    EXPECT_GT(sched.totals().max_batch, 1);
    EXPECT_GT(sched.totals().prefill_positions, 0);
  }
}

// Prompt prefill in one pass over the whole prompt (5 .. 14 rows: tensor-core GEMMs, fp32 sums in
// another order) against the batch-1 stepper stepping through it: the next step's logits (which
// read the prompt's whole KV cache) stay within the bf16 bound.
TEST(CudaScheduler, PrefillWithinBf16ToleranceOfStepping) {
  SKIP_WITHOUT_GPU();
  const ModelConfig cfg = load_config(test::data("tiny_config_a.json"));
  FileWeights lw{std::make_shared<const SafeTensors>(test::data("lm_tiny_a.safetensors"))};
  FileWeights mw{std::make_shared<const SafeTensors>(test::data("mimi_tiny_a.safetensors"))};
  auto backend = make_cuda_backend(cfg, mw, &lw, 0, 2);
  const int half = cfg.lm->n_q / 2, agent = half * cfg.lm->card;
  LmScheduler sched(backend->lm_batch(2, -1));
  double worst_text = 0, worst_audio = 0;
  int gemm_prompts = 0;
  for (int i = 0; i < 16; ++i) {
    test::Script s = test::make_script(cfg, i, false);
    if (s.prompt_steps == 0) continue;
    gemm_prompts += s.prompt_steps > 5 ? 1 : 0;  // 5 prompt steps: 4 model calls
    StepLogits la, lb;
    {
      auto st = backend->lm_stepper(s.gen, s.seed, -1);
      LmGen gen(*st, s.gen);
      test::play_prompt(gen, s, half);
      gen.step(s.user.data(), nullptr, std::nullopt, &la);
    }
    {
      auto st = sched.open(i % 2, s.gen, s.seed);
      LmGen gen(*st, s.gen);
      test::play_prompt(gen, s, half);
      gen.step(s.user.data(), nullptr, std::nullopt, &lb);
    }
    ASSERT_TRUE(all_finite(lb.text)) << "session " << i;
    worst_text = std::max(worst_text, rel_l2(lb.text, la.text));
    const std::vector<float> a(la.audio.begin(), la.audio.begin() + agent), b(lb.audio.begin(), lb.audio.begin() + agent);
    worst_audio = std::max(worst_audio, rel_l2(b, a));
  }
  std::printf("prefill vs stepping, next-step logits rel L2: text %.5f agent audio %.5f (%d prompts over 4 rows)\n",
              worst_text, worst_audio, gemm_prompts);
  EXPECT_GT(gemm_prompts, 0);
  EXPECT_LE(worst_text, 2e-2);
  EXPECT_LE(worst_audio, 2e-2);
  EXPECT_GT(sched.totals().prefill_positions, 0);
}

// Larger batches run the projections as tensor-core GEMMs (fp32 sums in another order): 24
// concurrent teacher-forced replays of the golden session through the scheduler, in batches of up
// to 24 rows, each held to the bf16 bound of the batch-1 stepper against the fp32 reference.
TEST(CudaScheduler, BatchedTeacherForcedWithinBf16Tolerance) {
  SKIP_WITHOUT_GPU();
  const ModelConfig cfg = load_config(test::data("tiny_config_a.json"));
  FileWeights lw{std::make_shared<const SafeTensors>(test::data("lm_tiny_a.safetensors"))};
  FileWeights mw{std::make_shared<const SafeTensors>(test::data("mimi_tiny_a.safetensors"))};
  const SafeTensors session(test::data("session_tiny_a_cpu_fp32.safetensors"));
  auto backend = make_cuda_backend(cfg, mw, &lw, 0, 24);
  constexpr int kSessions = 24;
  LmScheduler sched(backend->lm_batch(kSessions, -1));
  LmGenConfig greedy = *cfg.lm_gen;
  greedy.use_sampling = false;
  std::vector<ReplayReport> reports(kSessions);
  std::vector<std::string> errors(kSessions);
  std::vector<std::thread> threads;
  for (int i = 0; i < kSessions; ++i) {
    threads.emplace_back([&, i] {
      try {
        auto st = sched.open(i, greedy, 0);
        reports[i] = replay_golden_session(*st, *cfg.lm_gen, nullptr, session, /*teacher_forced=*/true);
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int i = 0; i < kSessions; ++i) {
    ASSERT_TRUE(errors[i].empty()) << errors[i];
    EXPECT_LE(reports[i].text_logits_max_rel_l2, 2e-2) << "session " << i;
    EXPECT_LE(reports[i].audio_logits_max_rel_l2, 2e-2) << "session " << i;
  }
  std::printf("batched teacher-forced vs cpu fp32: text %.5f audio %.5f (session 0), max batch %d\n",
              reports[0].text_logits_max_rel_l2, reports[0].audio_logits_max_rel_l2, sched.totals().max_batch);
  EXPECT_GT(sched.totals().max_batch, 4) << "the GEMM path was not reached";
}

// The prompt cache on CUDA (tests/prompt_cache_test_util.h): a session whose system prompts were
// loaded from the device store (KV rows, position, random counter) gives exactly the tokens of one
// that replayed them through prefill, greedy and sampled, with the bf16 and the fp8 KV cache.
TEST(CudaScheduler, PromptCacheGivesTheReplayedTokens) {
  SKIP_WITHOUT_GPU();
  const ModelConfig cfg = load_config(test::data("tiny_config_a.json"));
  FileWeights lw{std::make_shared<const SafeTensors>(test::data("lm_tiny_a.safetensors"))};
  FileWeights mw{std::make_shared<const SafeTensors>(test::data("mimi_tiny_a.safetensors"))};
  for (const bool fp8 : {false, true}) {
    SCOPED_TRACE(fp8 ? "kv fp8" : "kv bf16");
    CudaOptions opt;
    opt.kv_fp8 = fp8;
    auto backend = make_cuda_backend(cfg, mw, &lw, 0, 2, true, opt);
    SystemPrompt voice;
    voice.voice = load_voice_embeddings(test::data("voice_tiny_a.pt"));
    voice.text_tokens = {5, 17, 300, 42};  // with the voice and silences past 4 rows: the GEMM prefill
    SystemPrompt text_only;
    text_only.text_tokens = {9, 8, 7};
    test::check_prompt_cache(*backend, cfg, voice, text_only, 64u << 20);
  }
}

// The prompt cache with the fp8 cache laid out by head (shipped since v0.34; its copies are
// pitched per head, so the model needs several heads): the tiny model widened to two heads of 128,
// random weights, text prompts (the voice file is 128 wide), both layouts.
TEST(CudaScheduler, PromptCacheFp8TwoHeadsBothLayouts) {
  SKIP_WITHOUT_GPU();
  ModelConfig cfg = load_config(test::data("tiny_config_a.json"));
  cfg.lm->dim = 256;
  cfg.lm->num_heads = 2;
  FileWeights mw{std::make_shared<const SafeTensors>(test::data("mimi_tiny_a.safetensors"))};
  for (const bool by_head : {false, true}) {
    SCOPED_TRACE(by_head ? "by head" : "by position");
    CudaOptions opt;
    opt.kv_fp8 = true;
    std::unique_ptr<ModelBackend> backend;
    {
      Fp8ByHead g(by_head);
      backend = make_cuda_backend(cfg, mw, nullptr, 4321, 2, true, opt);
    }
    SystemPrompt longer;
    longer.text_tokens = {5, 17, 300, 42, 11, 12, 13};  // with the silences past 4 rows: the GEMM prefill
    SystemPrompt shorter;
    shorter.text_tokens = {9, 8, 7};
    test::check_prompt_cache(*backend, cfg, longer, shorter, 64u << 20);
  }
}
