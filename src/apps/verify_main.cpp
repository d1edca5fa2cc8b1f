// personaplex-verify: replays golden reference vectors and prints one JSON line of agreement
// figures. It exits non-zero only when an input is unusable, never because figures are poor.
//
//   personaplex-verify mimi --config C --mimi WEIGHTS --io IO [--device cpu]
//   personaplex-verify session --config C --mimi W --lm W --session S [--device cpu] [--teacher-forced]
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "apps/cli_checks.h"
#include "apps/common.h"
#include "ppx/backend.h"
#include "engine/golden_replay.h"
#include "ppx/config.h"
#include "ppx/error.h"
#include "ppx/lm.h"
#include "ppx/mimi.h"
#include "ppx/safetensors.h"
#include "ppx/weights.h"

namespace {


// Streams io's pcm_in through the encoder frame by frame and io's codes through the decoder.
nlohmann::ordered_json verify_mimi(const std::string& config_path, const std::string& weights_path,
                                   const std::string& io_path, const std::string& device) {
  const ppx::ModelConfig cfg = ppx::load_config(config_path);
  auto file = std::make_shared<const ppx::SafeTensors>(weights_path);
  ppx::FileWeights w(file);
  std::unique_ptr<ppx::ModelBackend> backend;
  if (device == "cuda") {
    backend = ppx::make_cuda_backend(cfg, w, nullptr, 0, 1, /*with_lm=*/false);
  } else {
    backend = ppx::make_cpu_backend(std::make_unique<ppx::Mimi>(cfg.mimi, w), nullptr);
  }
  auto codec = backend->codec_stream(0);
  const ppx::SafeTensors io(io_path);

  const int fs = codec->frame_samples(), nq = codec->num_codebooks();
  const std::vector<float> pcm_in = io.to_f32("pcm_in");
  const std::vector<int64_t> codes_ref = io.to_i64("codes");
  const std::vector<float> pcm_ref = io.to_f32("pcm_out");
  const int frames = static_cast<int>(pcm_in.size() / fs);
  if (frames == 0) throw ppx::Error("'" + io_path + "': pcm_in is shorter than one frame");
  if (io.info("codes").shape != std::vector<int64_t>{nq, frames})
    throw ppx::Error("'" + io_path + "': codes has shape " + ppx::shape_str(io.info("codes").shape) +
                     ", expected [" + std::to_string(nq) + ", " + std::to_string(frames) + "]");
  if (pcm_ref.size() != static_cast<size_t>(frames) * fs)
    throw ppx::Error("'" + io_path + "': pcm_out length differs from frames * frame_samples");

  std::vector<int32_t> codes(nq);
  int64_t agree = 0;
  for (int f = 0; f < frames; ++f) {
    codec->encode(pcm_in.data() + static_cast<size_t>(f) * fs, codes.data());
    for (int q = 0; q < nq; ++q) agree += codes[q] == codes_ref[static_cast<size_t>(q) * frames + f];
  }
  std::vector<float> pcm_out(static_cast<size_t>(frames) * fs);
  for (int f = 0; f < frames; ++f) {
    for (int q = 0; q < nq; ++q) {
      const int64_t c = codes_ref[static_cast<size_t>(q) * frames + f];
      if (c < 0 || c >= cfg.mimi.quantizer.bins) throw ppx::Error("'" + io_path + "': code out of range");
      codes[q] = static_cast<int32_t>(c);
    }
    codec->decode(codes.data(), pcm_out.data() + static_cast<size_t>(f) * fs);
  }
  nlohmann::ordered_json j;
  j["frames"] = frames;
  j["codes_agreement"] = static_cast<double>(agree) / (static_cast<double>(frames) * nq);
  j["pcm_rel_l2"] = ppx::app::rel_l2(pcm_out, pcm_ref);
  return j;
}

nlohmann::ordered_json verify_session(const std::string& config_path, const std::string& mimi_path,
                                      const std::string& lm_path, const std::string& session_path, bool teacher_forced,
                                      const std::string& device) {
  const ppx::ModelConfig cfg = ppx::load_config(config_path);
  if (!cfg.lm || !cfg.lm_gen) throw ppx::Error("config '" + config_path + "' has no lm / lm_gen section");
  ppx::FileWeights mw(std::make_shared<const ppx::SafeTensors>(mimi_path));
  const ppx::Mimi mimi(cfg.mimi, mw);  // decodes the output frames (the audio check) on the CPU
  ppx::FileWeights lw(std::make_shared<const ppx::SafeTensors>(lm_path));
  ppx::LmGenConfig greedy_cfg = *cfg.lm_gen;
  greedy_cfg.use_sampling = false;
  std::unique_ptr<ppx::ModelBackend> backend;
  if (device == "cuda") {
    ppx::FileWeights mw2(std::make_shared<const ppx::SafeTensors>(mimi_path));
    backend = ppx::make_cuda_backend(cfg, mw2, &lw, 0, 1);
  } else {
    backend = ppx::make_cpu_backend(nullptr, std::make_unique<ppx::Lm>(*cfg.lm, lw));
  }
  auto stepper = backend->lm_stepper(greedy_cfg, 0, -1);
  const ppx::SafeTensors session(session_path);
  const ppx::ReplayReport r = ppx::replay_golden_session(*stepper, *cfg.lm_gen, &mimi, session, teacher_forced);
  nlohmann::ordered_json j;
  j["steps"] = r.steps;
  j["text_logits_max_rel_l2"] = r.text_logits_max_rel_l2;
  j["audio_logits_max_rel_l2"] = r.audio_logits_max_rel_l2;
  j["out_token_agreement"] = r.out_token_agreement;
  j["pcm_rel_l2"] = r.pcm_rel_l2 ? nlohmann::ordered_json(*r.pcm_rel_l2) : nlohmann::ordered_json(nullptr);
  return j;
}

int verify(int argc, char** argv) {
  CLI::App app{"Replays golden reference vectors and prints agreement figures as one JSON line"};
  app.require_subcommand(1);
  std::string config, mimi_w, io, device = "cpu";
  auto* mimi = app.add_subcommand("mimi", "Mimi streaming encode/decode against a golden io file");
  mimi->add_option("--config", config, "model config JSON")->required()->check(CLI::ExistingFile);
  mimi->add_option("--mimi", mimi_w, "Mimi weights (.safetensors)")->required()->check(CLI::ExistingFile);
  mimi->add_option("--io", io, "golden io file (.safetensors with pcm_in, codes, pcm_out)")
      ->required()->check(CLI::ExistingFile);
  mimi->add_option("--device", device, "cpu or cuda")->capture_default_str()->check(CLI::IsMember({"cpu", "cuda"}));
  std::string lm_w, session_path;
  bool teacher_forced = false;
  auto* session = app.add_subcommand("session", "Replay a golden LM session (greedy) and compare logits, tokens, audio");
  session->add_option("--config", config, "model config JSON")->required()->check(CLI::ExistingFile);
  session->add_option("--mimi", mimi_w, "Mimi weights (.safetensors)")->required()->check(CLI::ExistingFile);
  session->add_option("--lm", lm_w, "LM weights (.safetensors)")->required()->check(CLI::ExistingFile);
  session->add_option("--session", session_path, "golden session (.safetensors)")->required()->check(CLI::ExistingFile);
  session->add_option("--device", device, "cpu or cuda")->capture_default_str()->check(CLI::IsMember({"cpu", "cuda"}));
  session->add_flag("--teacher-forced", teacher_forced,
                    "take each sampled token from the golden logits' argmax, so the token history cannot diverge");
  // A word that names no command ("A subcommand is required" would not say which word was wrong).
  if (argc > 1 && argv[1][0] != '-') {
    std::string names;
    bool known = false;
    for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
      known = known || sub->check_name(argv[1]);
      names += (names.empty() ? "" : ", ") + sub->get_name();
    }
    if (!known) {
      std::fprintf(stderr, "error: unknown command '%s' (the commands: %s)\nRun with --help for more information.\n",
                   argv[1], names.c_str());
      return 2;
    }
  }
  ppx::app::check_numbers(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return ppx::app::parse_failed(app, e);
  }
  nlohmann::ordered_json out;
  if (*mimi) out = verify_mimi(config, mimi_w, io, device);
  if (*session) out = verify_session(config, mimi_w, lm_w, session_path, teacher_forced, device);
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return ppx::app::run_main(verify, argc, argv); }
