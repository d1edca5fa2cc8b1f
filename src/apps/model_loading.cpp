#include "apps/model_loading.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <new>

#include "ppx/error.h"
#include "ppx/lm.h"
#include "ppx/mimi.h"
#include "ppx/resources.h"
#include "ppx/safetensors.h"
#include "ppx/synthetic_tokenizer.h"
#include "ppx/weights.h"

namespace ppx::app {

void ModelFlags::add_to(CLI::App& app) {
  app.add_option(
      "--hf-dir", hf_dir,
      "downloaded nvidia/personaplex-7b-v1 snapshot (model.safetensors, "
      "tokenizer-e351c8d8-checkpoint125.safetensors, tokenizer_spm_32k_3.model, voices/)");
  app.add_option("--config", config,
                 "model config JSON (default: the PersonaPlex 7B config with --hf-dir, weights "
                 "or --random-weights, else the embedded tiny demo model)")->check(CLI::ExistingFile);
  app.add_option("--lm", lm, "LM weights (.safetensors)")->check(CLI::ExistingFile);
  app.add_option("--mimi", mimi, "Mimi weights (.safetensors)")->check(CLI::ExistingFile);
  app.add_option("--tokenizer", tokenizer, "SentencePiece text tokenizer (.model)")->check(CLI::ExistingFile);
  app.add_flag(
      "--random-weights", random_weights,
      "random weights of the config's full size (benchmarks; the LM is generated on the GPU)");
  app.add_option_function<std::string>(
         "--device",
         [this](const std::string& v) {
           parse_device(v, device, cuda_device);
           device_flag = v;
         },
         "cpu, cuda (the first visible GPU) or cuda:N (visible GPU N; CUDA_VISIBLE_DEVICES selects "
         "which are visible)")
      ->default_str("cpu")
      ->check(CLI::Validator(
          [](std::string& v) {
            std::string d;
            int n = 0;
            return parse_device(v, d, n) ? std::string()
                                         : v + " is not cpu, cuda or cuda:N (N: a GPU index, 0 for the first)";
          },
          "cpu|cuda|cuda:N"));
  app.add_flag("--fast", fast,
               "the speed flags together: --w8a16 --dep-q-exit 8 --skip-other-mimi --mimi-fp16");
  app.add_flag(
      "--w8a16", w8a16,
      "CUDA: every linear layer of the LM with 8-bit weights (--w8-format) and per-row scales, "
      "quantized at load");
  app.add_option_function<std::string>(
         "--w8-format",
         [this](const std::string& v) {
           w8_format = v;
           w8_format_given = true;
         },
         "the 8-bit weight type of --w8a16: int8 (255 uniform levels per row) or fp8 (e4m3); int8 is 4-5x "
         "more accurate and ~4% slower per frame (docs/QUALITY.md)")
      ->default_str("int8")
      ->check(CLI::IsMember({"fp8", "int8"}));
  app.add_option("--dep-q-exit", dep_q_exit,
                 "depformer steps per frame: -1 all (upstream), or n_q/2..dep_q (8..16): the steps "
                 "of the user's codebooks, which conversation always provides, are skipped");
  app.add_flag("--skip-other-mimi", skip_other_mimi,
               "do not run upstream's second, discarded Mimi stream (the server and the offline "
               "tool never run it; the bench runs it unless this is given)");
  app.add_flag("--kv-fp8", kv_fp8,
               "CUDA: keep the temporal transformer's keys and values in fp8 (e4m3, one scale per "
               "position and head): half the KV memory and attention bytes (docs/QUALITY.md)");
  app.add_flag("--mimi-fp16", mimi_fp16,
               "CUDA: Mimi's long and transposed convolutions on tensor cores with fp16 weights and "
               "inputs, fp32 sums (docs/QUALITY.md)");
  app.add_flag("--no-mimi-pdl", no_mimi_pdl,
               "CUDA: launch the Mimi kernels without programmatic dependent launch (on by default "
               "where the GPU supports it; for measurements)");
}

bool parse_device(const std::string& value, std::string& device, int& cuda_device) {
  if (value == "cpu" || value == "cuda") {
    device = value;
    cuda_device = 0;
    return true;
  }
  const std::string prefix = "cuda:";
  if (value.size() <= prefix.size() || value.size() > prefix.size() + 3 || value.compare(0, prefix.size(), prefix) != 0)
    return false;
  int n = 0;
  for (size_t i = prefix.size(); i < value.size(); ++i) {
    if (value[i] < '0' || value[i] > '9') return false;
    n = n * 10 + (value[i] - '0');
  }
  device = "cuda";
  cuda_device = n;
  return true;
}

namespace {

// --fast expanded, and every speed flag checked against the config and the device, before
// anything loads. Throws ppx::Error naming the flag.
void resolve_speed_flags(ModelFlags& f, const LmConfig& lm, LoadedModel& m) {
  if (f.fast) {
    f.w8a16 = true;
    f.skip_other_mimi = true;
    f.mimi_fp16 = true;
    if (f.dep_q_exit == -1) f.dep_q_exit = lm.n_q / 2;
  }
  const std::string via = f.fast ? " (from --fast)" : "";
  // Mimi decodes the agent's codebooks, the first n_q / 2 depformer steps: an exit before them
  // would leave the frame without audio.
  const int agent_codebooks = lm.n_q / 2;
  if (f.dep_q_exit != -1 && (f.dep_q_exit < agent_codebooks || f.dep_q_exit > lm.dep_q))
    throw Error("--dep-q-exit " + std::to_string(f.dep_q_exit) + ": must be -1 (all) or " +
                std::to_string(agent_codebooks) + ".." + std::to_string(lm.dep_q) +
                " (the agent's codebooks are needed to decode the audio)");
  // "--device cuda:1" in messages when that is what was asked for (a caller that sets `device`
  // alone leaves device_flag at its default).
  const std::string device_flag =
      "--device " + (f.device_flag.rfind(f.device, 0) == 0 ? f.device_flag : f.device);
  if (f.w8a16 && f.device != "cuda")
    throw Error("--w8a16" + via + " needs --device cuda: the 8-bit weight kernels are CUDA only");
  if (f.no_mimi_pdl && f.device != "cuda") throw Error("--no-mimi-pdl needs --device cuda");
  if (f.mimi_fp16 && f.device != "cuda")
    throw Error("--mimi-fp16" + via + " needs --device cuda: the fp16 Mimi kernels are CUDA only");
  if (f.kv_fp8 && f.device != "cuda") throw Error("--kv-fp8 needs --device cuda: the fp8 KV cache is CUDA only");
  if (f.w8_format_given && !f.w8a16)
    throw Error("--w8-format " + f.w8_format + " needs --w8a16 (or --fast): it picks the 8-bit weight type");
  if (f.device == "cuda") {
    const std::string why = cuda_device_problem(f.cuda_device);
    if (!why.empty()) throw Error((f.w8a16 ? "--w8a16" + via : device_flag) + ": " + why);
  }
  m.dep_steps = f.dep_q_exit;
  m.other_mimi = !f.skip_other_mimi;
  std::string flags;
  if (f.w8a16) flags += " --w8a16";
  if (f.w8a16) flags += " --w8-format " + f.w8_format;
  if (f.dep_q_exit != -1) flags += " --dep-q-exit " + std::to_string(f.dep_q_exit);
  if (f.skip_other_mimi) flags += " --skip-other-mimi";
  if (f.mimi_fp16) flags += " --mimi-fp16";
  if (f.kv_fp8) flags += " --kv-fp8";
  if (f.no_mimi_pdl) flags += " --no-mimi-pdl";
  m.speed_flags = flags.empty() ? "" : flags.substr(1);
}

// The CPU backend holds the LM in fp32: refused before allocating when that cannot fit the memory
// available (the full-size LM needs 33.5 GB), rather than swapping or ending in bad_alloc.
void check_cpu_memory(const LmConfig& c, const std::string& config) {
  double params = 0;
  for (const auto& [name, shape] : lm_state_dict_spec(c)) {
    double n = 1;
    for (int64_t d : shape) n *= static_cast<double>(d);
    params += n;
  }
  const double need = params * sizeof(float);
  std::ifstream mi("/proc/meminfo");  // "MemAvailable:   22940344 kB"; absent elsewhere: no check
  double kb = -1;
  for (std::string line; std::getline(mi, line);)
    if (line.rfind("MemAvailable:", 0) == 0) kb = std::strtod(line.c_str() + 13, nullptr);
  if (kb < 0 || need < kb * 1024.0) return;
  char msg[512];
  std::snprintf(msg, sizeof msg,
                "the LM of %s takes %.1f GB in fp32 on the CPU, but %.1f GB of memory is available; the "
                "full-size model runs with --device cuda (the CPU demo model: no --random-weights, or "
                "--config configs/tiny-demo.json)",
                config.c_str(), need / 1e9, kb * 1024.0 / 1e9);
  throw Error(msg);
}

}  // namespace

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
  if (files && f.random_weights)
    throw Error("--random-weights cannot be combined with weight files");
  if (files && (f.lm.empty() || f.mimi.empty()))
    throw Error("give both --lm and --mimi (or --hf-dir)");
  if (files && f.tokenizer.empty()) throw Error("give --tokenizer (or --hf-dir) with real weights");
  const bool demo = !files && !f.random_weights;
  if (!f.config.empty()) {
    m.cfg = load_config(f.config);
  } else {
    const std::string name = demo ? "tiny-demo" : "personaplex-7b";
    m.cfg = parse_config(std::string(embedded_config(name)), "embedded:" + name);
  }
  if (!m.cfg.lm || !m.cfg.lm_gen) throw Error("the config has no lm / lm_gen section");
  resolve_speed_flags(f, *m.cfg.lm, m);

  // Weight sources.
  std::unique_ptr<WeightSource> mw, lw;
  if (files) {
    mw = std::make_unique<FileWeights>(std::make_shared<const SafeTensors>(f.mimi));
    lw = std::make_unique<FileWeights>(std::make_shared<const SafeTensors>(f.lm));
    m.description = "lm " + f.lm + ", mimi " + f.mimi;
  } else {
    mw = std::make_unique<RandomWeights>(f.demo_seed);
    lw = std::make_unique<RandomWeights>(f.demo_seed);
    // The config named, when one is (--random-weights --config tiny.json is not the full-size model).
    const std::string what = !f.config.empty() ? "model of " + f.config
                             : demo            ? std::string("embedded tiny demo model")
                                               : std::string("full-size model");
    m.description = what + " (random weights, seed " + std::to_string(f.demo_seed) + ")";
  }
  try {
    if (f.device == "cuda") {
      // Full-size random LM weights are generated on the GPU; small ones go through the host.
      const bool device_random = !files && f.random_weights;
      CudaOptions cuda;
      cuda.w8a16 = f.w8a16;
      cuda.w8_int8 = f.w8_format == "int8";
      cuda.kv_fp8 = f.kv_fp8;
      cuda.prompt_cache_bytes = f.prompt_cache_bytes;
      cuda.mimi_pdl = !f.no_mimi_pdl;
      cuda.mimi_fp16 = f.mimi_fp16;
      cuda.device = f.cuda_device;
      m.device_index = f.cuda_device;
      m.backend = make_cuda_backend(m.cfg, *mw, device_random ? nullptr : lw.get(), f.demo_seed,
                                    f.codec_slots, true, cuda);
    } else {
      // Random weights fill every tensor: checked first. From files a shape mismatch, found at the
      // first tensor, says more; a full load that does not fit ends in the bad_alloc below.
      if (!files) check_cpu_memory(*m.cfg.lm, f.config.empty() ? "the embedded full-size config" : f.config);
      try {
        auto mimi = std::make_unique<Mimi>(m.cfg.mimi, *mw);
        auto lm = std::make_unique<Lm>(*m.cfg.lm, *lw);
        m.backend = make_cpu_backend(std::move(mimi), std::move(lm));
      } catch (const std::bad_alloc&) {
        throw Error("out of memory building the model on the CPU (fp32 weights)");
      }
    }
  } catch (const Error& e) {
    // Weights of another size than the config: say which config was taken when none was given.
    if (files && f.config.empty() && std::string(e.what()).find("has shape") != std::string::npos)
      throw Error(std::string(e.what()) +
                  " (no --config given: the PersonaPlex 7B config was assumed; give the weights' own config)");
    throw;
  }
  if (!f.tokenizer.empty()) {
    m.tokenizer = std::make_unique<TextTokenizer>(f.tokenizer);
  } else if (m.cfg.lm->text_card == 1000) {
    m.tokenizer = std::make_unique<TextTokenizer>(TextTokenizer::from_serialized(
        std::string(embedded_tiny_tokenizer()), "embedded:tiny_spm_1000"));
  } else if (f.random_weights) {
    // Random weights need no real vocabulary: a generated one of the right size lets the tools
    // run at full size without the checkpoint's tokenizer (text prompts encode, text tokens name).
    m.tokenizer = std::make_unique<TextTokenizer>(synthetic_tokenizer(m.cfg.lm->text_card));
    m.description += ", synthetic " + std::to_string(m.cfg.lm->text_card) + "-piece tokenizer";
    const std::string note = "text tokenizer: synthetic (" + std::to_string(m.cfg.lm->text_card) +
                             " generated pieces; no --tokenizer or --hf-dir given): with random weights "
                             "the text output is meaningless anyway";
    if (f.note)
      f.note(note);
    else
      std::fprintf(stderr, "%s\n", note.c_str());
  }
  if (m.tokenizer && m.tokenizer->vocab_size() != m.cfg.lm->text_card) {
    throw Error("the tokenizer has " + std::to_string(m.tokenizer->vocab_size()) +
                " pieces but the LM has text_card " + std::to_string(m.cfg.lm->text_card));
  }
  return m;
}

}  // namespace ppx::app
