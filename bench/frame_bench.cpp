// personaplex-bench: the server's per-frame path, timed stage by stage (PCM in -> Mimi encode ->
// LM step -> Mimi decode -> PCM out), after the system prompts and a warm-up that is excluded.
// Writes JSON with total and per-stage p50/p90/p99/p99.9/max in ms, frames over the 80 ms budget,
// the machine, commit and command.
//
//   personaplex-bench [model flags] [--frames N] [--warmup N] [--soak MINUTES] [--out FILE]
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "apps/common.h"
#include "apps/model_loading.h"
#include "engine/backend.h"
#include "ppx/conversation.h"
#include "ppx/error.h"

namespace {

int bench(int argc, char** argv) {
  CLI::App app{"Per-frame latency of the full conversation step (encode, LM, decode)"};
  ppx::app::ModelFlags mf;
  mf.add_to(app);
  int frames = 500, warmup = 20;
  double soak_minutes = 0;
  std::string out;
  app.add_option("--frames", frames, "timed frames")->capture_default_str()->check(CLI::Range(1, 100000000));
  app.add_option("--warmup", warmup, "untimed frames first")->capture_default_str()->check(CLI::Range(0, 1000000));
  app.add_option("--soak", soak_minutes, "run for this many minutes instead of --frames")->check(CLI::Range(0.0, 1e6));
  app.add_option("--out", out, "write the JSON result here too");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  ppx::app::LoadedModel m = ppx::app::load_model(mf);
  const int dep_steps = m.dep_steps;
  ppx::LmGenConfig gen = *m.cfg.lm_gen;
  std::unique_ptr<ppx::CodecStream> codec = m.backend->codec_stream(0);
  if (m.other_mimi) codec = std::make_unique<ppx::MirroredCodecStream>(std::move(codec), m.backend->codec_stream(1));
  auto stepper = m.backend->lm_stepper(gen, 42424242, dep_steps);
  ppx::Conversation conv(*codec, *stepper, gen);
  ppx::SystemPrompt prompt;
  if (m.tokenizer) {
    prompt.text_tokens = m.tokenizer->encode(ppx::wrap_system_prompt("You are a wise and friendly teacher."));
  } else {
    for (int i = 0; i < 20; ++i) prompt.text_tokens.push_back(100 + i);  // no tokenizer with random weights
  }
  conv.run_system_prompts(prompt);

  const int fs = m.cfg.mimi.frame_samples();
  const double budget_ms = 1000.0 / m.cfg.mimi.frame_rate;
  std::vector<float> pcm(fs);
  std::vector<double> enc, lm, dec, total, deferred;
  const double soak_end = ppx::app::now_ms() + soak_minutes * 60000.0;
  int64_t over_budget = 0;
  for (int64_t f = 0;; ++f) {
    if (soak_minutes > 0 ? (f >= warmup && ppx::app::now_ms() >= soak_end) : f >= warmup + frames) break;
    for (int i = 0; i < fs; ++i) pcm[i] = 0.2f * std::sin(0.031f * static_cast<float>(f * fs + i));
    ppx::Conversation::StageTimes t;
    const double t0 = ppx::app::now_ms();
    const auto fr = conv.step(pcm.data(), &t);
    const double el = ppx::app::now_ms() - t0;
    if (!fr) throw ppx::Error("no frame produced after the system prompts");
    if (f < warmup) continue;
    // The previous frame's deferred depformer steps (device time; they overlapped this frame).
    if (f > warmup && stepper->deferred_ms() > 0) deferred.push_back(stepper->deferred_ms());
    enc.push_back(t.encode);
    lm.push_back(t.lm);
    dec.push_back(t.decode);
    total.push_back(el);
    over_budget += el > budget_ms;
  }
  nlohmann::ordered_json j;
  j["bench"] = "frame";
  j["model"] = m.description;
  j["device"] = m.backend->device();
  j["flags"] = {{"dep_steps", dep_steps < 0 ? m.cfg.lm->dep_q : dep_steps},
                {"other_mimi", m.other_mimi},
                {"w8a16", mf.w8a16 || mf.fast},
                {"speed_flags", m.speed_flags}};
  j["frames"] = total.size();
  j["warmup"] = warmup;
  j["budget_ms"] = budget_ms;
  j["frames_over_budget"] = over_budget;
  j["total_ms"] = ppx::app::latency_stats(total);
  j["stages_ms"] = {{"mimi_encode", ppx::app::latency_stats(enc)},
                    {"lm_step", ppx::app::latency_stats(lm)},
                    {"mimi_decode", ppx::app::latency_stats(dec)}};
  // lm_step ends when the frame's tokens are ready; the depformer steps of the user's (provided)
  // codebooks run after that, overlapping Mimi decode and the next frame (docs/ARCHITECTURE.md).
  if (!deferred.empty()) j["stages_ms"]["lm_deferred_depformer_device"] = ppx::app::latency_stats(deferred);
  j["machine"] = ppx::app::machine_info();
  j["command"] = ppx::app::command_line(argc, argv);
  ppx::app::emit_json(j, out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return ppx::app::run_main(bench, argc, argv); }
