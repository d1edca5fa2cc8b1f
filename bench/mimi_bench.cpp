// personaplex-bench-mimi: per-frame streaming encode and decode time of Mimi on the CPU (fp32
// reference path), with random full-size weights by default. Writes JSON with machine, commit,
// command. Warm-up frames are excluded.
//
//   personaplex-bench-mimi [--config configs/personaplex-7b.json] [--mimi W] [--frames N]
//                          [--warmup N] [--out bench/results/x.json]
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>

#include "apps/common.h"
#include "ppx/error.h"
#include "ppx/config.h"
#include "ppx/mimi.h"
#include "ppx/safetensors.h"
#include "ppx/weights.h"

namespace {

int bench(int argc, char** argv) {
  CLI::App app{"Per-frame Mimi encode/decode timing on the CPU"};
  std::string config = "configs/personaplex-7b.json", weights, out;
  int frames = 50, warmup = 5;
  uint64_t seed = 1234;
  app.add_option("--config", config, "model config JSON")->capture_default_str()->check(CLI::ExistingFile);
  app.add_option("--mimi", weights, "Mimi weights; random weights of the config's size when absent");
  app.add_option("--frames", frames, "timed frames")->capture_default_str()->check(CLI::Range(1, 1000000));
  app.add_option("--warmup", warmup, "untimed frames first")->capture_default_str()->check(CLI::Range(0, 1000000));
  app.add_option("--seed", seed, "random weight seed")->capture_default_str();
  app.add_option("--out", out, "write the JSON result here too");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  const ppx::ModelConfig cfg = ppx::load_config(config);
  std::unique_ptr<ppx::WeightSource> w;
  if (weights.empty()) {
    w = std::make_unique<ppx::RandomWeights>(seed);
  } else {
    w = std::make_unique<ppx::FileWeights>(std::make_shared<const ppx::SafeTensors>(weights));
  }
  const double t_load = ppx::app::now_ms();
  const ppx::Mimi mimi(cfg.mimi, *w);
  const double load_ms = ppx::app::now_ms() - t_load;
  const int fs = mimi.frame_samples();
  ppx::MimiState st;
  std::vector<float> pcm(fs), out_pcm(fs);
  std::vector<int32_t> codes(mimi.num_codebooks());
  std::vector<double> enc, dec;
  for (int f = 0; f < warmup + frames; ++f) {
    for (int i = 0; i < fs; ++i) pcm[i] = 0.3f * std::sin(0.03f * (f * fs + i)) * std::sin(0.0007f * (f * fs + i));
    const double t0 = ppx::app::now_ms();
    mimi.encode(st, pcm.data(), codes.data());
    const double t1 = ppx::app::now_ms();
    mimi.decode(st, codes.data(), out_pcm.data());
    const double t2 = ppx::app::now_ms();
    if (f >= warmup) {
      enc.push_back(t1 - t0);
      dec.push_back(t2 - t1);
    }
    std::fprintf(stderr, "\rframe %d/%d", f + 1, warmup + frames);
  }
  std::fprintf(stderr, "\n");
  std::vector<double> total(enc.size());
  for (size_t i = 0; i < enc.size(); ++i) total[i] = enc[i] + dec[i];
  nlohmann::ordered_json j;
  j["bench"] = "mimi_cpu_fp32";
  j["config"] = config;
  j["weights"] = weights.empty() ? "random" : weights;
  j["device"] = "cpu";
  j["frames"] = frames;
  j["warmup"] = warmup;
  j["load_ms"] = load_ms;
  j["encode_ms"] = ppx::app::latency_stats(enc);
  j["decode_ms"] = ppx::app::latency_stats(dec);
  j["total_ms"] = ppx::app::latency_stats(total);
  const double frame_ms = 1000.0 / cfg.mimi.frame_rate;
  j["real_time_factor_p50"] = j["total_ms"]["p50"].get<double>() / frame_ms;
  j["machine"] = ppx::app::machine_info();
  j["command"] = ppx::app::command_line(argc, argv);
  const std::string s = j.dump(2);
  std::printf("%s\n", s.c_str());
  if (!out.empty()) {
    std::ofstream f(out);
    f << s << "\n";
    if (!f) throw ppx::Error("cannot write '" + out + "'");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return ppx::app::run_main(bench, argc, argv); }
