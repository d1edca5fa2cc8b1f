// personaplex-codec: streams a WAV file through Mimi (encode then decode, frame by frame, as the
// server does) and writes the reconstruction; prints the real-time factor.
//
//   personaplex-codec --config C --mimi WEIGHTS --input in.wav --output out.wav
#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>

#include "apps/cli_checks.h"
#include "apps/common.h"
#include "apps/progress.h"
#include "ppx/audio.h"
#include "ppx/config.h"
#include "ppx/error.h"
#include "ppx/mimi.h"
#include "ppx/safetensors.h"
#include "ppx/weights.h"

namespace {

int codec(int argc, char** argv) {
  CLI::App app{"Mimi round trip: encode and decode a WAV file frame by frame, print the real-time factor"};
  std::string config, weights, input, output, device = "cpu";
  app.add_option("--config", config, "model config JSON")->required()->check(CLI::ExistingFile);
  app.add_option("--mimi", weights, "Mimi weights (.safetensors)")->required()->check(CLI::ExistingFile);
  app.add_option("--input", input, "input audio (any rate, first channel used)")->required()->check(CLI::ExistingFile);
  app.add_option("--output", output, "output WAV (24 kHz mono 16-bit)")->required();
  app.add_option("--device", device, "cpu")->capture_default_str();
  bool quiet = false;
  app.add_flag("--quiet", quiet, "no progress bar");
  ppx::app::check_numbers(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return ppx::app::parse_failed(app, e);
  }
  if (device != "cpu") throw ppx::Error("--device " + device + ": only cpu is available in this build");

  ppx::app::check_outputs({{"--output", output}}, {input, config, weights});
  const ppx::ModelConfig cfg = ppx::load_config(config);
  ppx::FileWeights w(std::make_shared<const ppx::SafeTensors>(weights));
  const ppx::Mimi mimi(cfg.mimi, w);
  const ppx::Audio a = ppx::read_audio(input);
  std::vector<float> pcm = ppx::resample(ppx::take_channel(a, 0), a.sample_rate, cfg.mimi.sample_rate);
  const size_t n = pcm.size();
  const int fs = mimi.frame_samples();
  const size_t frames = (n + fs - 1) / fs;
  pcm.resize(frames * fs, 0.f);

  ppx::MimiState st;
  std::vector<int32_t> codes(mimi.num_codebooks());
  std::vector<float> out(frames * fs);
  double enc_ms = 0, dec_ms = 0;
  ppx::app::Progress bar("codec", quiet);
  for (size_t f = 0; f < frames; ++f) {
    const double t0 = ppx::app::now_ms();
    mimi.encode(st, pcm.data() + f * fs, codes.data());
    const double t1 = ppx::app::now_ms();
    mimi.decode(st, codes.data(), out.data() + f * fs);
    dec_ms += ppx::app::now_ms() - t1;
    enc_ms += t1 - t0;
    bar.update(static_cast<int64_t>(f + 1), static_cast<int64_t>(frames));
  }
  bar.finish();
  out.resize(n);
  ppx::write_wav_pcm16(output, cfg.mimi.sample_rate, out);
  const double audio_ms = 1000.0 * static_cast<double>(n) / cfg.mimi.sample_rate;
  std::printf("%zu frames, %.2f s of audio: encode %.2f ms/frame, decode %.2f ms/frame, real-time factor %.4f "
              "(processing time / audio time; below 1 is faster than real time)\nwrote %s\n",
              frames, audio_ms / 1000.0, enc_ms / frames, dec_ms / frames, (enc_ms + dec_ms) / audio_ms,
              output.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return ppx::app::run_main(codec, argc, argv); }
