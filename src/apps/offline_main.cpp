// personaplex-offline: the upstream offline tool. Runs the system prompts (voice + text), then
// streams a user WAV through the conversation frame by frame and writes the agent's audio (24 kHz
// mono 16-bit, exactly as long as the input) and one JSON entry per frame of text.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>

#include "apps/cli_checks.h"
#include "apps/common.h"
#include "apps/model_loading.h"
#include "apps/progress.h"
#include "ppx/audio.h"
#include "ppx/conversation.h"
#include "ppx/error.h"

namespace {

std::string resolve_voice(const std::string& voice, const std::string& dir) {
  namespace fs = std::filesystem;
  if (voice.empty()) return "";
  if (!dir.empty()) {
    const fs::path p = fs::path(dir) / voice;
    if (fs::exists(p)) return p.string();
  }
  if (fs::exists(voice)) return voice;
  throw ppx::Error("voice prompt '" + voice + "' not found" + (dir.empty() ? "" : " in '" + dir + "'"));
}

int offline(int argc, char** argv) {
  CLI::App app{"Offline PersonaPlex: user WAV in, agent WAV and text out"};
  ppx::app::ModelFlags mf;
  mf.add_to(app);
  std::string input_wav, output_wav, output_text, voice, voice_dir;
  std::string text_prompt = "You are a wise and friendly teacher. Answer questions or provide advice in a clear and engaging way.";
  double temp_audio = 0.8, temp_text = 0.7;
  int topk_audio = 250, topk_text = 25;
  bool greedy = false, quiet = false;
  int64_t seed = -1;
  app.add_option("--input-wav", input_wav, "user audio (any rate; first channel)")->required()->check(CLI::ExistingFile);
  app.add_option("--output-wav", output_wav, "agent audio out (24 kHz mono 16-bit)")->required();
  app.add_option("--output-text", output_text, "agent text out (JSON list, one entry per frame)")->required();
  app.add_option("--text-prompt", text_prompt, "role prompt (wrapped in <system> tags)")->capture_default_str();
  app.add_option("--voice-prompt", voice, "voice prompt: a .pt voice file or an audio file (name in --voice-prompt-dir, or a path)");
  app.add_option("--voice-prompt-dir", voice_dir, "directory of voice prompts (default: <hf-dir>/voices)");
  app.add_option("--temp-audio", temp_audio, "audio sampling temperature")->capture_default_str()->check(ppx::app::finite() & CLI::Range(0.0, 100.0));
  app.add_option("--temp-text", temp_text, "text sampling temperature")->capture_default_str()->check(ppx::app::finite() & CLI::Range(0.0, 100.0));
  app.add_option("--topk-audio", topk_audio, "audio top-k (0 = all)")->capture_default_str()->check(CLI::Range(0, 1 << 20));
  app.add_option("--topk-text", topk_text, "text top-k (0 = all)")->capture_default_str()->check(CLI::Range(0, 1 << 20));
  app.add_flag("--greedy", greedy, "disable sampling (argmax)");
  app.add_option("--seed", seed, "sampling seed (-1: random, printed)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{-1}, std::numeric_limits<int64_t>::max()));
  app.add_flag("--quiet", quiet, "no progress bar");
  ppx::app::check_numbers(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return ppx::app::parse_failed(app, e);
  }

  // The outputs are checked before the model loads and the conversation runs (minutes).
  ppx::app::check_outputs({{"--output-wav", output_wav}, {"--output-text", output_text}},
                          {input_wav, voice, mf.config, mf.lm, mf.mimi, mf.tokenizer});
  ppx::app::LoadedModel m = ppx::app::load_model(mf);
  if (!m.tokenizer) throw ppx::Error("a text tokenizer is needed: give --tokenizer or --hf-dir");
  std::fprintf(stderr, "model: %s on %s\n", m.description.c_str(), m.backend->device().c_str());
  if (voice_dir.empty()) voice_dir = m.voice_dir;
  const std::string voice_path = resolve_voice(voice, voice_dir);

  ppx::LmGenConfig gen = *m.cfg.lm_gen;
  gen.use_sampling = !greedy;
  gen.temp = temp_audio;
  gen.temp_text = temp_text;
  gen.top_k = topk_audio;
  gen.top_k_text = topk_text;
  const int sr = m.cfg.mimi.sample_rate, fs = m.cfg.mimi.frame_samples();

  // Read everything before the long work, so a bad input fails fast.
  const ppx::Audio in = ppx::read_audio(input_wav);
  std::vector<float> user = ppx::resample(ppx::take_channel(in, 0), in.sample_rate, sr);
  const size_t n_out = user.size();
  ppx::SystemPrompt prompt;
  if (!voice_path.empty()) ppx::load_voice_prompt(prompt, voice_path, sr, fs);
  const std::string wrapped = ppx::wrap_system_prompt(text_prompt);
  if (!wrapped.empty()) prompt.text_tokens = m.tokenizer->encode(wrapped);

  const uint64_t s = seed < 0 ? std::random_device{}() : static_cast<uint64_t>(seed);
  if (seed < 0) std::fprintf(stderr, "seed: %llu (--seed %llu repeats this run)\n", static_cast<unsigned long long>(s),
                             static_cast<unsigned long long>(s));
  auto codec = m.backend->codec_stream(0);
  auto stepper = m.backend->lm_stepper(gen, s, m.dep_steps);
  ppx::Conversation conv(*codec, *stepper, gen);
  ppx::app::Progress prompt_bar("system prompts", quiet);
  conv.run_system_prompts(prompt, [&](int64_t done, int64_t total) {
    prompt_bar.update(done, total);
    return true;
  });
  prompt_bar.finish();

  const size_t frames = (n_out + fs - 1) / fs;
  user.resize(frames * fs, 0.f);
  std::vector<float> out;
  out.reserve(frames * fs);
  nlohmann::json text = nlohmann::json::array();
  ppx::app::Progress bar("conversation", quiet);
  const double t0 = ppx::app::now_ms();
  for (size_t f = 0; f < frames; ++f) {
    const auto fr = conv.step(user.data() + f * fs);
    if (fr) {
      out.insert(out.end(), fr->pcm.begin(), fr->pcm.end());
      const int64_t tok = fr->text_token;
      if (tok == 0) text.push_back("EPAD");
      else if (tok == 3) text.push_back("PAD");
      else {
        std::string piece = m.tokenizer->id_to_piece(static_cast<int>(tok));
        for (size_t p; (p = piece.find("\xE2\x96\x81")) != std::string::npos;) piece.replace(p, 3, " ");
        text.push_back(piece);
      }
    }
    bar.update(static_cast<int64_t>(f + 1), static_cast<int64_t>(frames));
  }
  bar.finish();
  const double elapsed = ppx::app::now_ms() - t0;
  out.resize(n_out, 0.f);
  ppx::write_wav_pcm16(output_wav, sr, out);
  ppx::app::write_text_file(output_text, text.dump() + "\n");
  const double audio_ms = 1000.0 * static_cast<double>(n_out) / sr;
  std::printf("%zu frames (%.2f s of audio) in %.2f s: real-time factor %.3f (processing / audio time)\n"
              "wrote %s and %s\n",
              frames, audio_ms / 1000.0, elapsed / 1000.0, elapsed / audio_ms, output_wav.c_str(), output_text.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return ppx::app::run_main(offline, argc, argv); }
