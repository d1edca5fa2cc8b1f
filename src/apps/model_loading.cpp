#include "apps/model_loading.h"

#include <filesystem>

#include "ppx/error.h"
#include "ppx/lm.h"
#include "ppx/mimi.h"
#include "ppx/resources.h"
#include "ppx/safetensors.h"
#include "ppx/weights.h"

namespace ppx::app {

void ModelFlags::add_to(CLI::App& app) {
  app.add_option("--hf-dir", hf_dir,
                 "downloaded nvidia/personaplex-7b-v1 snapshot (model.safetensors, "
                 "tokenizer-e351c8d8-checkpoint125.safetensors, tokenizer_spm_32k_3.model, voices/)");
  app.add_option("--config", config, "model config JSON (default: the PersonaPlex 7B config with --hf-dir, weights "
                                     "or --random-weights, else the embedded tiny demo model)");
  app.add_option("--lm", lm, "LM weights (.safetensors)");
  app.add_option("--mimi", mimi, "Mimi weights (.safetensors)");
  app.add_option("--tokenizer", tokenizer, "SentencePiece text tokenizer (.model)");
  app.add_flag("--random-weights", random_weights,
               "random weights of the config's full size (benchmarks; the LM is generated on the GPU)");
  app.add_option("--device", device, "cpu or cuda")->capture_default_str()->check(CLI::IsMember({"cpu", "cuda"}));
}

LoadedModel load_model(const ModelFlags& f_in) {
  ModelFlags f = f_in;
  LoadedModel m;
  namespace fs = std::filesystem;
  if (!f.hf_dir.empty()) {
    if (!fs::is_directory(f.hf_dir)) throw Error("--hf-dir '" + f.hf_dir + "' is not a directory");
    auto in_dir = [&](std::string& flag, const char* name) {
      if (flag.empty()) flag = (fs::path(f.hf_dir) / name).string();
    };
    in_dir(f.lm, kHfLmFile);
    in_dir(f.mimi, kHfMimiFile);
    in_dir(f.tokenizer, kHfTokenizerFile);
    const fs::path voices = fs::path(f.hf_dir) / kHfVoiceDir;
    if (fs::is_directory(voices)) m.voice_dir = voices.string();
  }
  const bool files = !f.lm.empty() || !f.mimi.empty();
  if (files && f.random_weights) throw Error("--random-weights cannot be combined with weight files");
  if (files && (f.lm.empty() || f.mimi.empty())) throw Error("give both --lm and --mimi (or --hf-dir)");
  if (files && f.tokenizer.empty()) throw Error("give --tokenizer (or --hf-dir) with real weights");
  const bool demo = !files && !f.random_weights;
  if (!f.config.empty()) {
    m.cfg = load_config(f.config);
  } else {
    const std::string name = demo ? "tiny-demo" : "personaplex-7b";
    m.cfg = parse_config(std::string(embedded_config(name)), "embedded:" + name);
  }
  if (!m.cfg.lm || !m.cfg.lm_gen) throw Error("the config has no lm / lm_gen section");

  // Weight sources.
  std::unique_ptr<WeightSource> mw, lw;
  if (files) {
    mw = std::make_unique<FileWeights>(std::make_shared<const SafeTensors>(f.mimi));
    lw = std::make_unique<FileWeights>(std::make_shared<const SafeTensors>(f.lm));
    m.description = "lm " + f.lm + ", mimi " + f.mimi;
  } else {
    mw = std::make_unique<RandomWeights>(f.demo_seed);
    lw = std::make_unique<RandomWeights>(f.demo_seed);
    m.description = std::string(demo ? "embedded tiny demo model" : "full-size model") + " (random weights, seed " +
                    std::to_string(f.demo_seed) + ")";
  }
  if (f.device == "cuda") {
    // Full-size random LM weights are generated on the GPU; small ones go through the host.
    const bool device_random = !files && f.random_weights;
    m.backend = make_cuda_backend(m.cfg, *mw, device_random ? nullptr : lw.get(), f.demo_seed, f.codec_slots);
  } else {
    auto mimi = std::make_unique<Mimi>(m.cfg.mimi, *mw);
    auto lm = std::make_unique<Lm>(*m.cfg.lm, *lw);
    m.backend = make_cpu_backend(std::move(mimi), std::move(lm));
  }
  if (!f.tokenizer.empty()) {
    m.tokenizer = std::make_unique<TextTokenizer>(f.tokenizer);
  } else if (m.cfg.lm->text_card == 1000) {
    m.tokenizer = std::make_unique<TextTokenizer>(
        TextTokenizer::from_serialized(std::string(embedded_tiny_tokenizer()), "embedded:tiny_spm_1000"));
  }
  if (m.tokenizer && m.tokenizer->vocab_size() != m.cfg.lm->text_card) {
    throw Error("the tokenizer has " + std::to_string(m.tokenizer->vocab_size()) + " pieces but the LM has text_card " +
                std::to_string(m.cfg.lm->text_card));
  }
  return m;
}

}  // namespace ppx::app
