#include "ppx/config.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "ppx/error.h"

namespace ppx {
namespace {

using nlohmann::json;

// Walks one JSON object, remembers which keys were read, and rejects the rest.
class Section {
 public:
  Section(const json& j, std::string path, const std::string& source)
      : j_(j), path_(std::move(path)), source_(source) {
    if (!j_.is_object()) fail("", "must be a JSON object");
  }

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    std::string name = path_;
    if (!key.empty()) name += (name.empty() ? "" : ".") + key;
    throw Error("config '" + source_ + "': " + name + ": " + what);
  }

  const json& get(const std::string& key) {
    seen_.insert(key);
    if (!j_.contains(key)) fail(key, "missing");
    return j_.at(key);
  }
  bool has(const std::string& key) const { return j_.contains(key); }

  int integer(const std::string& key, int lo, int hi) {
    const json& v = get(key);
    if (!v.is_number_integer()) fail(key, "expected an integer, got " + v.dump());
    const int64_t x = v.get<int64_t>();
    if (x < lo || x > hi) {
      fail(key, std::to_string(x) + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    }
    return static_cast<int>(x);
  }
  int integer_or(const std::string& key, int lo, int hi, int def) {
    return has(key) ? integer(key, lo, hi) : (seen_.insert(key), def);
  }
  double number(const std::string& key, double lo, double hi) {
    const json& v = get(key);
    if (!v.is_number()) fail(key, "expected a number, got " + v.dump());
    const double x = v.get<double>();
    if (!(x >= lo && x <= hi)) fail(key, v.dump() + " is outside [" + num(lo) + ", " + num(hi) + "]");
    return x;
  }
  double number_or(const std::string& key, double lo, double hi, double def) {
    return has(key) ? number(key, lo, hi) : (seen_.insert(key), def);
  }
  bool boolean(const std::string& key) {
    const json& v = get(key);
    if (!v.is_boolean()) fail(key, "expected true or false, got " + v.dump());
    return v.get<bool>();
  }
  bool boolean_or(const std::string& key, bool def) {
    return has(key) ? boolean(key) : (seen_.insert(key), def);
  }
  std::string string(const std::string& key) {
    const json& v = get(key);
    if (!v.is_string()) fail(key, "expected a string, got " + v.dump());
    return v.get<std::string>();
  }
  std::vector<int> ints(const std::string& key, int lo, int hi) {
    const json& v = get(key);
    if (!v.is_array()) fail(key, "expected a list of integers");
    std::vector<int> out;
    for (const auto& e : v) {
      if (!e.is_number_integer() || e.get<int64_t>() < lo || e.get<int64_t>() > hi)
        fail(key, "element " + e.dump() + " is not an integer in [" + std::to_string(lo) + ", " +
                      std::to_string(hi) + "]");
      out.push_back(static_cast<int>(e.get<int64_t>()));
    }
    return out;
  }
  // Keys that carry a value this implementation only supports in one form.
  void expect(const std::string& key, const json& supported) {
    const json& v = get(key);
    if (v != supported) fail(key, "unsupported value " + v.dump() + " (supported: " + supported.dump() + ")");
  }
  Section child(const std::string& key) { return Section(get(key), qualified(key), source_); }
  void finish() const {
    for (auto it = j_.begin(); it != j_.end(); ++it) {
      if (!seen_.count(it.key())) fail(it.key(), "unknown key");
    }
  }

 private:
  static std::string num(double x) {
    std::ostringstream os;
    os << x;
    return os.str();
  }
  std::string qualified(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }
  const json& j_;
  std::string path_;
  const std::string& source_;
  std::set<std::string> seen_;
};

constexpr int kBig = 1 << 20;

SeanetConfig parse_seanet(Section s) {
  SeanetConfig c;
  c.channels = s.integer("channels", 1, 1);
  c.dimension = s.integer("dimension", 1, kBig);
  s.expect("causal", true);
  c.n_filters = s.integer("n_filters", 1, kBig);
  c.n_residual_layers = s.integer("n_residual_layers", 1, 1);
  s.expect("activation", "ELU");
  c.compress = s.integer("compress", 1, 64);
  c.dilation_base = s.integer("dilation_base", 1, 16);
  s.expect("disable_norm_outer_blocks", 0);
  c.kernel_size = s.integer("kernel_size", 1, 64);
  c.residual_kernel_size = s.integer("residual_kernel_size", 1, 64);
  c.last_kernel_size = s.integer("last_kernel_size", 1, 64);
  s.expect("norm", "none");
  s.expect("pad_mode", "constant");
  c.ratios = s.ints("ratios", 1, 64);
  if (c.ratios.empty() || c.ratios.size() > 8) s.fail("ratios", "expected 1 to 8 ratios");
  int64_t hop = 1;  // at most 64^8: no overflow in 64 bits
  for (int r : c.ratios) hop *= r;
  if (hop > 1000000) s.fail("ratios", "their product (the hop) " + std::to_string(hop) + " exceeds 1000000");
  s.expect("true_skip", true);
  if ((c.n_filters << c.ratios.size()) % c.compress != 0)
    s.fail("compress", "does not divide the residual block widths");
  s.finish();
  return c;
}

QuantizerConfig parse_quantizer(Section s) {
  QuantizerConfig c;
  c.dimension = s.integer("dimension", 1, kBig);
  c.n_q = s.integer("n_q", 1, 64);
  c.bins = s.integer("bins", 1, 65536);
  c.input_dimension = s.integer("input_dimension", 1, kBig);
  c.output_dimension = s.integer("output_dimension", 1, kBig);
  s.finish();
  return c;
}

MimiTransformerConfig parse_mimi_transformer(Section s) {
  MimiTransformerConfig c;
  c.d_model = s.integer("d_model", 1, kBig);
  c.num_heads = s.integer("num_heads", 1, 1024);
  c.num_layers = s.integer("num_layers", 0, 256);
  s.expect("causal", true);
  c.layer_scale = s.number("layer_scale", 0, 1e6);
  c.context = s.integer("context", 1, kBig);
  s.expect("conv_layout", true);
  c.max_period = s.number("max_period", 1, 1e12);
  s.expect("gating", "none");
  s.expect("norm", "layer_norm");
  s.expect("positional_embedding", "rope");
  c.dim_feedforward = s.integer("dim_feedforward", 1, kBig);
  const int in_dim = s.integer("input_dimension", 1, kBig);
  const std::vector<int> outs = s.ints("output_dimensions", 1, kBig);
  if (c.d_model % c.num_heads != 0)
    s.fail("num_heads", std::to_string(c.num_heads) + " does not divide d_model " + std::to_string(c.d_model));
  if ((c.d_model / c.num_heads) % 2 != 0) s.fail("num_heads", "head dimension must be even for RoPE");
  if (in_dim != c.d_model) s.fail("input_dimension", "must equal d_model (no input projection is supported)");
  if (outs.size() != 1 || outs[0] != c.d_model)
    s.fail("output_dimensions", "must be [d_model] (no output projection is supported)");
  s.finish();
  return c;
}

MimiConfig parse_mimi(Section s) {
  MimiConfig c;
  c.seanet = parse_seanet(s.child("seanet"));
  c.quantizer = parse_quantizer(s.child("quantizer"));
  c.transformer = parse_mimi_transformer(s.child("transformer"));
  c.num_codebooks = s.integer("num_codebooks", 1, 64);
  c.sample_rate = s.integer("sample_rate", 1, 1000000);
  c.frame_rate = s.number("frame_rate", 1e-3, 1e6);
  const double hop = c.sample_rate / c.frame_rate;
  const int seanet_hop = c.seanet.hop_length();
  if (std::fabs(hop - std::round(hop)) > 1e-9 || static_cast<int>(std::round(hop)) % seanet_hop != 0)
    s.fail("frame_rate", "sample_rate / frame_rate must be a multiple of the SEANet hop " + std::to_string(seanet_hop));
  if (c.num_codebooks > c.quantizer.n_q)
    s.fail("num_codebooks", std::to_string(c.num_codebooks) + " exceeds quantizer.n_q " + std::to_string(c.quantizer.n_q));
  if (c.num_codebooks < 2) s.fail("num_codebooks", "the split quantizer needs at least 2");
  if (c.quantizer.input_dimension != c.seanet.dimension)
    s.fail("quantizer.input_dimension", "must equal seanet.dimension " + std::to_string(c.seanet.dimension));
  if (c.quantizer.output_dimension != c.seanet.dimension)
    s.fail("quantizer.output_dimension", "must equal seanet.dimension " + std::to_string(c.seanet.dimension));
  if (c.transformer.d_model != c.seanet.dimension)
    s.fail("transformer.d_model", "must equal seanet.dimension " + std::to_string(c.seanet.dimension));
  s.finish();
  return c;
}

LmConfig parse_lm(Section s) {
  LmConfig c;
  c.dim = s.integer("dim", 1, kBig);
  c.text_card = s.integer("text_card", 4, kBig);
  c.existing_text_padding_id = s.integer("existing_text_padding_id", 0, kBig);
  c.n_q = s.integer("n_q", 1, 64);
  c.dep_q = s.integer("dep_q", 1, 64);
  c.card = s.integer("card", 1, 65536);
  c.num_heads = s.integer("num_heads", 1, 1024);
  c.num_layers = s.integer("num_layers", 0, 1024);
  c.hidden_scale = s.number("hidden_scale", 1e-3, 1e3);
  s.expect("causal", true);
  s.expect("layer_scale", nullptr);
  c.context = s.integer("context", 1, kBig);
  c.max_period = s.number("max_period", 1, 1e12);
  s.expect("gating", "silu");
  s.expect("norm", "rms_norm_f32");
  s.expect("positional_embedding", "rope");
  c.depformer_dim = s.integer("depformer_dim", 1, kBig);
  c.depformer_dim_feedforward = s.integer("depformer_dim_feedforward", 1, kBig);
  c.depformer_num_heads = s.integer("depformer_num_heads", 1, 1024);
  c.depformer_num_layers = s.integer("depformer_num_layers", 0, 256);
  s.expect("depformer_causal", true);
  s.expect("depformer_layer_scale", nullptr);
  s.expect("depformer_multi_linear", true);
  c.depformer_context = s.integer("depformer_context", 1, kBig);
  c.depformer_max_period = s.number("depformer_max_period", 1, 1e12);
  s.expect("depformer_gating", "silu");
  s.expect("depformer_pos_emb", "none");
  s.expect("depformer_weights_per_step", true);
  c.delays = s.ints("delays", 0, 64);
  if (c.dim % c.num_heads != 0 || (c.dim / c.num_heads) % 2 != 0)
    s.fail("num_heads", std::to_string(c.num_heads) + " must divide dim " + std::to_string(c.dim) + " into even heads");
  if (c.depformer_dim % c.depformer_num_heads != 0)
    s.fail("depformer_num_heads", "does not divide depformer_dim " + std::to_string(c.depformer_dim));
  if (c.n_q % 2 != 0) s.fail("n_q", "must be even (agent and user codebooks)");
  if (c.dep_q > c.n_q) s.fail("dep_q", "exceeds n_q " + std::to_string(c.n_q));
  if (c.dep_q < c.n_q / 2)
    s.fail("dep_q", "must be at least n_q / 2 = " + std::to_string(c.n_q / 2) + " (every agent codebook)");
  if (static_cast<int>(c.delays.size()) != c.n_q + 1)
    s.fail("delays", "has " + std::to_string(c.delays.size()) + " entries, expected n_q + 1 = " + std::to_string(c.n_q + 1));
  if (c.existing_text_padding_id >= c.text_card) s.fail("existing_text_padding_id", "must be below text_card");
  s.finish();
  return c;
}

LmGenConfig parse_lm_gen(Section s, const LmConfig* lm, int num_codebooks) {
  LmGenConfig c;
  c.use_sampling = s.boolean_or("use_sampling", true);
  c.temp = s.number_or("temp", 0, 100, 0.8);
  c.temp_text = s.number_or("temp_text", 0, 100, 0.7);
  c.top_k = s.integer_or("top_k", 0, kBig, 250);
  c.top_k_text = s.integer_or("top_k_text", 0, kBig, 25);
  c.audio_silence_frame_cnt = s.integer("audio_silence_frame_cnt", 0, 10000);
  c.zero_text_code = s.integer("zero_text_code", 0, kBig);
  const int card_max = lm ? lm->card - 1 : 65535;
  c.silence_tokens = s.ints("silence_tokens", 0, card_max);
  c.sine_tokens = s.ints("sine_tokens", 0, card_max);
  if (static_cast<int>(c.silence_tokens.size()) != num_codebooks)
    s.fail("silence_tokens", "expected " + std::to_string(num_codebooks) + " tokens (mimi.num_codebooks)");
  if (static_cast<int>(c.sine_tokens.size()) != num_codebooks)
    s.fail("sine_tokens", "expected " + std::to_string(num_codebooks) + " tokens (mimi.num_codebooks)");
  if (lm && c.zero_text_code >= lm->text_card) s.fail("zero_text_code", "must be below lm.text_card");
  s.finish();
  return c;
}

}  // namespace

int SeanetConfig::hop_length() const {
  int h = 1;
  for (int r : ratios) h *= r;
  return h;
}

int MimiConfig::frame_samples() const { return static_cast<int>(std::lround(sample_rate / frame_rate)); }
int MimiConfig::encoder_stride() const { return frame_samples() / seanet.hop_length(); }

namespace {
// Upstream ActivationGating: 21/8 of the model width when dim_feedforward is 4x, else 2/3 of it.
int gating_hidden(int dim, int dim_feedforward) {
  return dim_feedforward == 4 * dim ? (21 * dim) / 8 : (2 * dim_feedforward) / 3;
}
}  // namespace

int LmConfig::ffn_hidden() const { return gating_hidden(dim, static_cast<int>(hidden_scale * dim)); }
int LmConfig::depformer_ffn_hidden() const { return gating_hidden(depformer_dim, depformer_dim_feedforward); }
int LmConfig::max_delay() const {
  int m = 0;
  for (int d : delays) m = std::max(m, d);
  return m;
}

ModelConfig parse_config(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const std::exception& e) {
    throw Error("config '" + source + "': not valid JSON: " + e.what());
  }
  Section root(j, "", source);
  ModelConfig c;
  c.mimi = parse_mimi(root.child("mimi"));
  if (root.has("lm")) {
    c.lm = parse_lm(root.child("lm"));
    if (c.lm->card != c.mimi.quantizer.bins) root.fail("lm.card", "must equal mimi.quantizer.bins");
    if (c.lm->n_q != 2 * c.mimi.num_codebooks)
      root.fail("lm.n_q", "must be 2 * mimi.num_codebooks = " + std::to_string(2 * c.mimi.num_codebooks));
  }
  if (root.has("lm_gen")) {
    c.lm_gen = parse_lm_gen(root.child("lm_gen"), c.lm ? &*c.lm : nullptr, c.mimi.num_codebooks);
  }
  root.finish();
  return c;
}

ModelConfig load_config(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error("config '" + path + "': cannot open");
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_config(ss.str(), path);
}

}  // namespace ppx
