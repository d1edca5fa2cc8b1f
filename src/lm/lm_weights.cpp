#include "lm/lm_weights.h"

#include <regex>

#include "ppx/error.h"
#include "ppx/safetensors.h"
#include "ppx/weights.h"

namespace ppx {

std::vector<std::pair<std::string, std::vector<int64_t>>> lm_state_dict_spec(const LmConfig& c) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> s;
  const int64_t D = c.dim, H = c.ffn_hidden(), DD = c.depformer_dim, DH = c.depformer_ffn_hidden();
  const int64_t S = c.dep_q;
  for (int i = 0; i < c.n_q; ++i) s.push_back({"emb." + std::to_string(i) + ".weight", {c.card + 1, D}});
  s.push_back({"text_emb.weight", {c.text_card + 1, D}});
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string k = "transformer.layers." + std::to_string(i) + ".";
    s.push_back({k + "self_attn.in_proj_weight", {3 * D, D}});
    s.push_back({k + "self_attn.out_proj.weight", {D, D}});
    s.push_back({k + "norm1.alpha", {1, 1, D}});
    s.push_back({k + "norm2.alpha", {1, 1, D}});
    s.push_back({k + "gating.linear_in.weight", {2 * H, D}});
    s.push_back({k + "gating.linear_out.weight", {D, H}});
  }
  s.push_back({"out_norm.alpha", {1, 1, D}});
  s.push_back({"text_linear.weight", {c.text_card, D}});
  for (int i = 0; i < S; ++i) s.push_back({"depformer_in." + std::to_string(i) + ".weight", {DD, D}});
  for (int i = 0; i < S - 1; ++i) s.push_back({"depformer_emb." + std::to_string(i) + ".weight", {c.card + 1, DD}});
  s.push_back({"depformer_text_emb.weight", {c.text_card + 1, DD}});
  for (int i = 0; i < c.depformer_num_layers; ++i) {
    const std::string k = "depformer.layers." + std::to_string(i) + ".";
    s.push_back({k + "self_attn.in_proj_weight", {S * 3 * DD, DD}});
    s.push_back({k + "self_attn.out_proj.weight", {S * DD, DD}});
    s.push_back({k + "norm1.alpha", {1, 1, DD}});
    s.push_back({k + "norm2.alpha", {1, 1, DD}});
    for (int j = 0; j < S; ++j) {
      s.push_back({k + "gating." + std::to_string(j) + ".linear_in.weight", {2 * DH, DD}});
      s.push_back({k + "gating." + std::to_string(j) + ".linear_out.weight", {DD, DH}});
    }
  }
  for (int i = 0; i < S; ++i) s.push_back({"linears." + std::to_string(i) + ".weight", {c.card, DD}});
  return s;
}

std::vector<float> load_lm_tensor(WeightSource& w, const std::string& key, const std::vector<int64_t>& shape) {
  auto* fw = dynamic_cast<FileWeights*>(&w);
  if (!fw) return w.load(key, shape);
  const SafeTensors& f = fw->file();
  // Patch 1: depformer self_attn tensors stored for half the steps are concatenated with themselves.
  if (key.rfind("depformer.", 0) == 0 && key.find("self_attn") != std::string::npos && f.has(key)) {
    const auto& stored = f.info(key).shape;
    if (stored.size() == 2 && stored[1] == shape[1] && 2 * stored[0] == shape[0]) {
      std::vector<float> half = w.load(key, stored);
      half.insert(half.end(), half.begin(), half.end());
      return half;
    }
  }
  // Patch 2: per-step entries n in 8..15 missing from the file are copied from n - 8.
  if (!f.has(key)) {
    static const std::regex kStep(R"((^|\.)(gating|linears|depformer_in|depformer_emb)\.(\d+)\.)");
    std::smatch m;
    if (std::regex_search(key, m, kStep)) {
      const int n = std::stoi(m[3].str());
      if (n >= 8 && n < 16) {
        std::string src = key;
        src.replace(m.position(3), m.length(3), std::to_string(n - 8));
        if (f.has(src)) return w.load(src, shape);
      }
    }
  }
  return w.load(key, shape);
}

}  // namespace ppx
