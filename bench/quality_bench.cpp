// personaplex-bench-quality: how far the w8a16 LM (int8 or fp8 e4m3 linear weights, per-row scales;
// and/or the fp8 KV cache of --kv-fp8) drifts from the bf16 LM over a long conversation, on the
// full-size model with random weights.
//
// Both models are built from the same seed (the w8a16 one quantizes the same bf16 weights). The
// bf16 stepper samples every frame (upstream sampling parameters); its tokens are the next frame's
// input for both and are forced into the w8a16 stepper (teacher forcing), so both see the same
// token history and only the quantization error differs, including what it leaves in the KV cache.
// The user's codebooks are provided (a fixed random stream), as in a conversation.
//
// Per frame: the text logits' relative L2 error and top-1 agreement, and the same for the agent's
// audio codebooks (every depformer step that runs before the tokens are ready). Reported: overall
// mean/max, the first and last 100 frames' means and their ratio (how the error grows with the
// frame index), and the per-frame series.
//
//   personaplex-bench-quality [--config personaplex-7b] [--frames 500] [--seed N] [--out FILE]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "apps/cli_checks.h"
#include "apps/common.h"
#include "backend/cuda/cuda_lm.h"
#include "ppx/backend.h"
#include "ppx/config.h"
#include "ppx/error.h"
#include "ppx/lm_gen.h"
#include "ppx/resources.h"

namespace {

double rel_l2(const float* a, const float* ref, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(a[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

int argmax(const float* x, int n) { return static_cast<int>(std::max_element(x, x + n) - x); }

struct Series {
  std::vector<double> v;
  double mean(size_t b, size_t e) const {
    e = std::min(e, v.size());
    if (b >= e) return 0;
    double s = 0;
    for (size_t i = b; i < e; ++i) s += v[i];
    return s / static_cast<double>(e - b);
  }
  double max() const { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); }
  nlohmann::ordered_json summary(size_t window) const {
    const size_t n = v.size(), w = std::min(window, n);
    const double first = mean(0, w), last = mean(n - w, n);
    return {{"mean", mean(0, n)},
            {"max", max()},
            {"first_window_mean", first},
            {"last_window_mean", last},
            {"last_over_first", first > 0 ? last / first : 0.0}};
  }
};

int quality(int argc, char** argv) {
  CLI::App app{"w8a16 (and/or --kv-fp8) against bf16 on the full-size LM with random weights, teacher-forced"};
  std::string config = "personaplex-7b", out;
  int frames = 500, window = 100, dep_steps = -1;
  uint64_t seed = 1234, sample_seed = 42424242;
  app.add_option("--config", config, "embedded config name")->capture_default_str();
  app.add_option("--frames", frames, "frames stepped")->capture_default_str()->check(CLI::Range(1, 100000));
  app.add_option("--window", window, "frames in the first/last window")->capture_default_str()->check(CLI::Range(1, 100000));
  app.add_option("--seed", seed, "random weight seed")->capture_default_str();
  app.add_option("--sample-seed", sample_seed, "sampling seed")->capture_default_str();
  app.add_option("--dep-q-exit", dep_steps, "depformer steps run (default all)")->check(CLI::Range(1, 64));
  std::string w8_format = "int8";
  app.add_option("--w8-format", w8_format, "the 8-bit weight type compared: int8 (what --w8a16 ships) or fp8")
      ->capture_default_str()
      ->check(CLI::IsMember({"fp8", "int8"}));
  bool no_w8 = false, kv_fp8 = false;
  app.add_flag("--no-w8", no_w8, "the candidate keeps bf16 weights (to study --kv-fp8 alone)");
  app.add_flag("--kv-fp8", kv_fp8, "the candidate keeps its KV cache in fp8 (--kv-fp8)");
  app.add_option("--out", out, "write the JSON result here too");
  ppx::app::check_numbers(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return ppx::app::parse_failed(app, e);
  }
  if (const std::string p = ppx::cuda_device_problem(); !p.empty())
    throw ppx::Error("personaplex-bench-quality needs CUDA: " + p);
  const ppx::ModelConfig cfg = ppx::parse_config(std::string(ppx::embedded_config(config)), "embedded:" + config);
  const ppx::LmConfig& c = *cfg.lm;
  if (dep_steps > c.dep_q) throw ppx::Error("--dep-q-exit " + std::to_string(dep_steps) + ": the model has " +
                                            std::to_string(c.dep_q) + " depformer steps");
  const int K = c.n_q + 1, n_agent = c.n_q / 2;
  const int agent_steps = std::min(dep_steps < 0 ? c.dep_q : dep_steps, n_agent);

  std::fprintf(stderr, "building the bf16 LM (seed %llu)...\n", static_cast<unsigned long long>(seed));
  ppx::cuda::CudaLm ref_lm(c, seed);
  const std::string candidate = (no_w8 ? std::string("bf16 weights") : "w8a16 " + w8_format) + (kv_fp8 ? ", fp8 KV" : "");
  std::fprintf(stderr, "building the candidate LM (%s) from the same weights...\n", candidate.c_str());
  ppx::cuda::CudaLmOptions opt;
  opt.w8a16 = !no_w8;
  opt.w8_int8 = w8_format == "int8";
  opt.kv_fp8 = kv_fp8;
  ppx::cuda::CudaLm q_lm(c, seed, opt);
  ppx::cuda::SamplingParams sp = ppx::cuda::SamplingParams::from(*cfg.lm_gen, sample_seed);
  ppx::cuda::CudaLmStepper ref(ref_lm, sp, dep_steps);
  ppx::cuda::CudaLmStepper q(q_lm, sp, dep_steps);

  std::mt19937 rng(static_cast<uint32_t>(seed * 7 + 1));
  std::vector<int64_t> input(K, 0), target(K, 0);
  std::vector<uint8_t> provided(K, 0);
  for (int k = n_agent + 1; k < K; ++k) provided[k] = 1;
  for (int k = 0; k < K; ++k) input[k] = static_cast<int64_t>(rng() % static_cast<unsigned>(k == 0 ? c.text_card : c.card));
  std::vector<int64_t> force(1 + c.dep_q, -1);
  Series text_err, audio_err, text_agree, audio_agree;
  for (int f = 0; f < frames; ++f) {
    for (int k = n_agent + 1; k < K; ++k) target[k] = static_cast<int64_t>(rng() % static_cast<unsigned>(c.card));
    ppx::StepRequest req;
    req.input = input.data();
    req.target = target.data();
    req.provided = provided.data();
    ppx::StepResult rr, rq;
    ppx::StepLogits lr, lq;
    ref.run(req, rr, &lr);
    force[0] = rr.text;
    for (int s = 0; s < c.dep_q; ++s) force[1 + s] = rr.audio[s];
    ppx::StepRequest fq = req;
    fq.force = force.data();
    q.run(fq, rq, &lq);
    if (lq.text.size() != lr.text.size() || lq.audio.size() != lr.audio.size())
      throw ppx::Error("the two steppers returned logits of different sizes");
    text_err.v.push_back(rel_l2(lq.text.data(), lr.text.data(), lr.text.size()));
    text_agree.v.push_back(argmax(lq.text.data(), c.text_card) == argmax(lr.text.data(), c.text_card) ? 1.0 : 0.0);
    const size_t na = static_cast<size_t>(agent_steps) * c.card;
    audio_err.v.push_back(rel_l2(lq.audio.data(), lr.audio.data(), na));
    int agree = 0;
    for (int s = 0; s < agent_steps; ++s)
      agree += argmax(lq.audio.data() + s * c.card, c.card) == argmax(lr.audio.data() + s * c.card, c.card);
    audio_agree.v.push_back(static_cast<double>(agree) / agent_steps);
    // Next frame's input: the bf16 model's tokens and this frame's user codes.
    input[0] = rr.text;
    for (int s = 0; s < n_agent; ++s) input[1 + s] = rr.audio[s] >= 0 ? rr.audio[s] : input[1 + s];
    for (int k = n_agent + 1; k < K; ++k) input[k] = target[k];
    if ((f + 1) % 100 == 0)
      std::fprintf(stderr, "frame %d: text rel L2 %.4f (first-window mean %.4f), audio %.4f, top-1 text %.3f audio %.3f\n",
                   f + 1, text_err.v.back(), text_err.mean(0, static_cast<size_t>(window)), audio_err.v.back(),
                   text_agree.mean(0, text_agree.v.size()), audio_agree.mean(0, audio_agree.v.size()));
  }
  nlohmann::ordered_json j;
  j["bench"] = "quality_vs_bf16";
  j["candidate"] = candidate;
  j["model"] = "embedded:" + config + " random weights seed " + std::to_string(seed);
  j["frames"] = frames;
  j["window"] = window;
  j["agent_codebooks_compared"] = agent_steps;
  j["teacher_forced"] = true;
  j["w8_format"] = w8_format;
  j["sampling"] = {{"temp_text", sp.temp_text}, {"temp_audio", sp.temp_audio}, {"seed", sample_seed}};
  j["weight_bytes"] = {{"bf16", ref_lm.weight_bytes()}, {"candidate", q_lm.weight_bytes()}};
  const size_t w = static_cast<size_t>(window);
  j["text_logits_rel_l2"] = text_err.summary(w);
  j["audio_logits_rel_l2"] = audio_err.summary(w);
  j["text_top1_agreement"] = text_agree.summary(w);
  j["audio_top1_agreement"] = audio_agree.summary(w);
  j["series"] = {{"text_rel_l2", text_err.v}, {"audio_rel_l2", audio_err.v}};
  j["machine"] = ppx::app::machine_info();
  j["command"] = ppx::app::command_line(argc, argv);
  ppx::app::emit_json(j, out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return ppx::app::run_main(quality, argc, argv); }
