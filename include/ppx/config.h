// Model configuration in the upstream layout: the constructor arguments of Mimi (`mimi`), the LM
// (`lm`) and the generation state (`lm_gen`). Unknown keys, missing keys, values this
// implementation does not support and inconsistent values are rejected with a ppx::Error naming
// the key (e.g. "config 'x.json': mimi.transformer.num_heads: 7 does not divide d_model 512").
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace ppx {

struct SeanetConfig {
  int channels = 1;
  int dimension = 512;
  int n_filters = 64;
  int n_residual_layers = 1;
  int compress = 2;
  int dilation_base = 2;
  int kernel_size = 7;
  int residual_kernel_size = 3;
  int last_kernel_size = 3;
  std::vector<int> ratios{8, 6, 5, 4};  // decoder order; the encoder runs them reversed
  int hop_length() const;              // product of ratios
};

struct QuantizerConfig {
  int dimension = 256;  // codebook vector size
  int n_q = 32;         // codebooks stored (1 semantic + n_q-1 acoustic)
  int bins = 2048;
  int input_dimension = 512;
  int output_dimension = 512;
};

struct MimiTransformerConfig {
  int d_model = 512;
  int num_heads = 8;
  int num_layers = 8;
  double layer_scale = 0.01;
  int context = 250;
  double max_period = 10000;
  int dim_feedforward = 2048;
};

struct MimiConfig {
  SeanetConfig seanet;
  QuantizerConfig quantizer;
  MimiTransformerConfig transformer;
  int num_codebooks = 8;  // codebooks used (set_num_codebooks)
  int sample_rate = 24000;
  double frame_rate = 12.5;
  int frame_samples() const;  // samples per codec frame (1920 for the real model)
  int encoder_stride() const;  // latents per frame before downsampling (2)
};

struct LmConfig {
  int dim = 4096;
  int text_card = 32000;
  int existing_text_padding_id = 3;
  int n_q = 16;
  int dep_q = 16;
  int card = 2048;
  int num_heads = 32;
  int num_layers = 32;
  double hidden_scale = 4.125;
  int context = 3000;
  double max_period = 10000;
  int depformer_dim = 1024;
  int depformer_dim_feedforward = 4224;
  int depformer_num_heads = 16;
  int depformer_num_layers = 6;
  int depformer_context = 8;  // upstream argument; the depformer ring holds dep_q steps
  double depformer_max_period = 10000;
  bool depformer_weights_per_step = true;
  std::vector<int> delays{0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1};
  int ffn_hidden() const;            // gating hidden width of the temporal FFN (11264)
  int depformer_ffn_hidden() const;  // gating hidden width of the depformer FFN (2816)
  int max_delay() const;
};

struct LmGenConfig {
  bool use_sampling = true;
  double temp = 0.8;
  double temp_text = 0.7;
  int top_k = 250;
  int top_k_text = 25;
  int audio_silence_frame_cnt = 6;
  int zero_text_code = 3;
  std::vector<int> silence_tokens{948, 243, 1178, 546, 1736, 1030, 1978, 2008};
  std::vector<int> sine_tokens{430, 1268, 381, 1611, 1095, 1495, 56, 472};
};

struct ModelConfig {
  MimiConfig mimi;
  std::optional<LmConfig> lm;        // absent in a Mimi-only config
  std::optional<LmGenConfig> lm_gen;
};

// Parses and validates a config file. `source` names it in error messages.
ModelConfig load_config(const std::string& path);
ModelConfig parse_config(const std::string& json_text, const std::string& source);

}  // namespace ppx
