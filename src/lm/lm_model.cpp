#include <algorithm>
#include <cmath>

#include "backend/cpu_attention.h"
#include "backend/cpu_ops.h"
#include "lm/lm_weights.h"
#include "ppx/error.h"
#include "ppx/weights.h"

namespace ppx {
namespace {

// RMSNorm in fp32 as upstream: y = x * (alpha * rsqrt(mean(x^2) + eps)).
void rms_norm(const float* x, int64_t D, const float* alpha, float eps, float* y) {
  double ss = 0.0;
  for (int64_t i = 0; i < D; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float var = static_cast<float>(ss / static_cast<double>(D)) + eps;
  const float r = 1.f / std::sqrt(var);
  for (int64_t i = 0; i < D; ++i) y[i] = x[i] * (alpha[i] * r);
}

// out[i] = silu(gu[i]) * gu[hidden + i]
void silu_gate(const float* gu, int64_t hidden, float* out) {
  for (int64_t i = 0; i < hidden; ++i) {
    const float g = gu[i];
    out[i] = g / (1.f + std::exp(-g)) * gu[hidden + i];
  }
}

void add_embedding(const std::vector<float>& table, int64_t rows, int64_t D, int64_t token, float* x) {
  if (token == -1) return;  // the zero token
  const int64_t row = std::max<int64_t>(token, 0);
  if (row >= rows) throw Error("token " + std::to_string(token) + " is outside the embedding table of " + std::to_string(rows) + " rows");
  const float* e = table.data() + row * D;
  for (int64_t i = 0; i < D; ++i) x[i] += e[i];
}

constexpr float kRmsEps = 1e-8f;

}  // namespace

Lm::Lm(const LmConfig& c, WeightSource& w) : c_(c), w_(std::make_unique<Weights>()) {
  const int64_t S = c.dep_q;
  for (const auto& [key, shape] : lm_state_dict_spec(c)) {
    std::vector<float> t = load_lm_tensor(w, key, shape);
    // Route the tensor to its slot by key.
    // `k`, not `key`: clang before 16 cannot capture a structured binding.
    auto idx_after = [&k = key](const std::string& prefix) { return std::stoi(k.substr(prefix.size())); };
    if (key.rfind("emb.", 0) == 0) {
      w_->emb.push_back(std::move(t));
    } else if (key == "text_emb.weight") {
      w_->text_emb = std::move(t);
    } else if (key.rfind("transformer.layers.", 0) == 0) {
      const size_t i = static_cast<size_t>(idx_after("transformer.layers."));
      if (w_->layers.size() <= i) w_->layers.resize(i + 1);
      auto& l = w_->layers[i];
      if (key.find("in_proj_weight") != std::string::npos) l.in_proj = std::move(t);
      else if (key.find("out_proj") != std::string::npos) l.out_proj = std::move(t);
      else if (key.find("norm1") != std::string::npos) l.norm1 = std::move(t);
      else if (key.find("norm2") != std::string::npos) l.norm2 = std::move(t);
      else if (key.find("linear_in") != std::string::npos) l.lin_in = std::move(t);
      else l.lin_out = std::move(t);
    } else if (key == "out_norm.alpha") {
      w_->out_norm = std::move(t);
    } else if (key == "text_linear.weight") {
      w_->text_linear = std::move(t);
    } else if (key.rfind("depformer_in.", 0) == 0) {
      w_->depformer_in.push_back(std::move(t));
    } else if (key.rfind("depformer_emb.", 0) == 0) {
      w_->depformer_emb.push_back(std::move(t));
    } else if (key == "depformer_text_emb.weight") {
      w_->depformer_text_emb = std::move(t);
    } else if (key.rfind("depformer.layers.", 0) == 0) {
      const size_t i = static_cast<size_t>(idx_after("depformer.layers."));
      if (w_->dep_layers.size() <= i) w_->dep_layers.resize(i + 1);
      auto& l = w_->dep_layers[i];
      if (key.find("in_proj_weight") != std::string::npos) l.in_proj = std::move(t);
      else if (key.find("out_proj") != std::string::npos) l.out_proj = std::move(t);
      else if (key.find("norm1") != std::string::npos) l.norm1 = std::move(t);
      else if (key.find("norm2") != std::string::npos) l.norm2 = std::move(t);
      else if (key.find("linear_in") != std::string::npos) l.lin_in.push_back(std::move(t));
      else l.lin_out.push_back(std::move(t));
    } else if (key.rfind("linears.", 0) == 0) {
      w_->linears.push_back(std::move(t));
    }
  }
  if (static_cast<int64_t>(w_->linears.size()) != S) throw Error("internal: LM spec routing failed");
}

Lm::~Lm() = default;

void Lm::init_state(LmState& st) const {
  st.kv.resize(c_.num_layers);
  for (auto& kv : st.kv) kv.init(c_.context, c_.num_heads, c_.dim / c_.num_heads);
  st.pos = 0;
}

void Lm::embed(const int64_t* tokens, float* x) const {
  const int64_t D = c_.dim;
  std::fill_n(x, D, 0.f);
  for (int k = 0; k < c_.n_q; ++k) add_embedding(w_->emb[k], c_.card + 1, D, tokens[1 + k], x);
  add_embedding(w_->text_emb, c_.text_card + 1, D, tokens[0], x);
}

void Lm::temporal(LmState& st, const float* x_in, float* h, float* text_logits) const {
  const int64_t D = c_.dim, H = c_.ffn_hidden(), nh = c_.num_heads, hd = D / nh;
  if (static_cast<int>(st.kv.size()) != c_.num_layers) init_state(st);
  const float scale = 1.f / std::sqrt(static_cast<float>(hd));
  std::vector<float> x(x_in, x_in + D), a(D), qkv(3 * D), att(D), proj(D), gu(2 * H), g(H), scratch;
  const float pos = static_cast<float>(st.pos);
  for (int li = 0; li < c_.num_layers; ++li) {
    const auto& l = w_->layers[li];
    rms_norm(x.data(), D, l.norm1.data(), kRmsEps, a.data());
    cpu::linear(a.data(), 1, l.in_proj.data(), 3 * D, D, nullptr, qkv.data());
    for (int64_t hh = 0; hh < nh; ++hh) {
      cpu::rope_inplace(qkv.data() + hh * hd, hd, pos, static_cast<float>(c_.max_period));
      cpu::rope_inplace(qkv.data() + D + hh * hd, hd, pos, static_cast<float>(c_.max_period));
    }
    st.kv[li].append(qkv.data() + D, qkv.data() + 2 * D);
    cpu::ring_attend(st.kv[li], qkv.data(), st.pos, c_.context, scale, att.data(), scratch);
    cpu::linear(att.data(), 1, l.out_proj.data(), D, D, nullptr, proj.data());
    for (int64_t i = 0; i < D; ++i) x[i] += proj[i];
    rms_norm(x.data(), D, l.norm2.data(), kRmsEps, a.data());
    cpu::linear(a.data(), 1, l.lin_in.data(), 2 * H, D, nullptr, gu.data());
    silu_gate(gu.data(), H, g.data());
    cpu::linear(g.data(), 1, l.lin_out.data(), D, H, nullptr, proj.data());
    for (int64_t i = 0; i < D; ++i) x[i] += proj[i];
  }
  ++st.pos;
  rms_norm(x.data(), D, w_->out_norm.data(), kRmsEps, h);
  cpu::linear(h, 1, w_->text_linear.data(), c_.text_card, D, nullptr, text_logits);
}

void Lm::depformer(const float* h, int64_t text_token, const int64_t* forced, const uint8_t* provided,
                   TokenChooser& chooser, int steps, int64_t* sampled, float* logits) const {
  const int64_t D = c_.dim, DD = c_.depformer_dim, DH = c_.depformer_ffn_hidden();
  const int64_t nh = c_.depformer_num_heads, hd = DD / nh, S = c_.dep_q, card = c_.card;
  const float scale = 1.f / std::sqrt(static_cast<float>(hd));
  // Fresh per-frame ring: capacity dep_q, no context limit, no positional embedding.
  std::vector<cpu::RingKv> kv(c_.depformer_num_layers);
  for (auto& r : kv) r.init(static_cast<int>(S), static_cast<int>(nh), static_cast<int>(hd));
  std::vector<float> z(DD), a(DD), qkv(3 * DD), att(DD), proj(DD), gu(2 * DH), g(DH), lg(card), scratch;
  int64_t prev = text_token;
  for (int64_t s = 0; s < S; ++s) {
    if (s >= steps) {
      sampled[s] = -1;
      continue;
    }
    cpu::linear(h, 1, w_->depformer_in[s].data(), DD, D, nullptr, z.data());
    if (s == 0) {
      add_embedding(w_->depformer_text_emb, c_.text_card + 1, DD, prev, z.data());
    } else {
      add_embedding(w_->depformer_emb[s - 1], card + 1, DD, prev, z.data());
    }
    for (int li = 0; li < c_.depformer_num_layers; ++li) {
      const auto& l = w_->dep_layers[li];
      rms_norm(z.data(), DD, l.norm1.data(), kRmsEps, a.data());
      cpu::linear(a.data(), 1, l.in_proj.data() + s * 3 * DD * DD, 3 * DD, DD, nullptr, qkv.data());
      kv[li].append(qkv.data() + DD, qkv.data() + 2 * DD);
      cpu::ring_attend(kv[li], qkv.data(), s, 0, scale, att.data(), scratch);
      cpu::linear(att.data(), 1, l.out_proj.data() + s * DD * DD, DD, DD, nullptr, proj.data());
      for (int64_t i = 0; i < DD; ++i) z[i] += proj[i];
      rms_norm(z.data(), DD, l.norm2.data(), kRmsEps, a.data());
      cpu::linear(a.data(), 1, l.lin_in[s].data(), 2 * DH, DD, nullptr, gu.data());
      silu_gate(gu.data(), DH, g.data());
      cpu::linear(g.data(), 1, l.lin_out[s].data(), DD, DH, nullptr, proj.data());
      for (int64_t i = 0; i < DD; ++i) z[i] += proj[i];
    }
    cpu::linear(z.data(), 1, w_->linears[s].data(), card, DD, nullptr, lg.data());
    if (logits) std::copy(lg.begin(), lg.end(), logits + s * card);
    sampled[s] = chooser.audio(static_cast<int>(s), lg.data(), static_cast<int>(card));
    prev = provided[s] ? forced[s] : sampled[s];
  }
}

}  // namespace ppx
