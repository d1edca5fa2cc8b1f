// Resolves the model flags shared by the tools (offline, server, bench): a Hugging Face snapshot
// directory (--hf-dir), explicit weight and tokenizer paths, full-size random weights
// (--random-weights, for benchmarks), or the embedded tiny demo model that the project generates
// deterministically (random weights, no file needed); on the CPU or the CUDA backend.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <memory>
#include <string>

#include "ppx/backend.h"
#include "ppx/config.h"
#include "ppx/tokenizer.h"

namespace ppx::app {

struct ModelFlags {
  std::string hf_dir, config, lm, mimi, tokenizer;
  // --device cpu|cuda|cuda:N: `device` is "cpu" or "cuda", `cuda_device` the N (0 for plain cuda),
  // an index among the devices CUDA_VISIBLE_DEVICES leaves visible; `device_flag` the text given,
  // for messages.
  std::string device = "cpu", device_flag = "cpu";
  int cuda_device = 0;
  bool random_weights = false;
  uint64_t demo_seed = 20261202;
  int codec_slots = 2;  // codec streams the CUDA backend preallocates; 0: its computed capacity
  // The opt-in speed flags (docs/CLI.md); --fast sets the others. Checked by load_model() before
  // anything loads.
  bool fast = false, w8a16 = false, skip_other_mimi = false;
  int dep_q_exit = -1;  // depformer steps per frame; -1: all (upstream)
  std::string w8_format = "int8";  // --w8-format: the 8-bit weight type of --w8a16 (int8 or fp8)
  bool w8_format_given = false;    // --w8-format was on the command line (it needs --w8a16)
  bool kv_fp8 = false;       // --kv-fp8 (CUDA): the temporal KV cache in fp8 with per-head scales
  bool mimi_fp16 = false;  // --mimi-fp16 (CUDA): CudaOptions::mimi_fp16
  bool no_mimi_pdl = false;  // --no-mimi-pdl (CUDA): CudaOptions::mimi_pdl off, for measurements
  size_t prompt_cache_bytes = 0;  // the server's prompt cache store (CudaOptions::prompt_cache_bytes)
  // Where load_model's remarks go (the synthetic tokenizer); default: a line on stderr. The server
  // sends them to its log.
  std::function<void(const std::string&)> note;
  void add_to(CLI::App& app);
};

// Parses a --device value: "cpu", "cuda" or "cuda:N" (N a decimal index below 1000). False on
// anything else.
bool parse_device(const std::string& value, std::string& device, int& cuda_device);

struct LoadedModel {
  ModelConfig cfg;
  std::string description;  // what was loaded, for logs and /health
  int device_index = -1;    // the CUDA device (cuda:N) the backend runs on; -1 on the CPU
  std::unique_ptr<ModelBackend> backend;
  std::unique_ptr<TextTokenizer> tokenizer;
  std::string voice_dir;    // <hf-dir>/voices when a snapshot was given
  int dep_steps = -1;       // --dep-q-exit, validated: for lm_stepper()
  bool other_mimi = false;  // run upstream's second, discarded Mimi stream (the bench's stock mode)
  std::string speed_flags;  // the speed flags in effect, for logs, /health and bench JSON
};

// Loads everything; throws ppx::Error with a clear message on any missing or bad file.
LoadedModel load_model(const ModelFlags& f);

// File names inside a `nvidia/personaplex-7b-v1` snapshot.
inline constexpr const char* kHfLmFile = "model.safetensors";
inline constexpr const char* kHfMimiFile = "tokenizer-e351c8d8-checkpoint125.safetensors";
inline constexpr const char* kHfTokenizerFile = "tokenizer_spm_32k_3.model";
inline constexpr const char* kHfVoiceDir = "voices";

}  // namespace ppx::app
