#include "codec/mimi_transformer.h"

#include <cmath>

#include "backend/cpu_ops.h"
#include "ppx/weights.h"

namespace ppx {

MimiTransformer::MimiTransformer(const MimiTransformerConfig& c, WeightSource& w, const std::string& prefix)
    : c_(c) {
  const int D = c.d_model, F = c.dim_feedforward;
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string k = prefix + "layers." + std::to_string(i) + ".";
    Layer l;
    l.in_proj = w.load(k + "self_attn.in_proj_weight", {3 * D, D});
    l.out_proj = w.load(k + "self_attn.out_proj.weight", {D, D});
    l.norm1_w = w.load(k + "norm1.weight", {D});
    l.norm1_b = w.load(k + "norm1.bias", {D});
    l.norm2_w = w.load(k + "norm2.weight", {D});
    l.norm2_b = w.load(k + "norm2.bias", {D});
    l.linear1 = w.load(k + "linear1.weight", {F, D});
    l.linear2 = w.load(k + "linear2.weight", {D, F});
    l.ls1 = w.load(k + "layer_scale_1.scale", {D});
    l.ls2 = w.load(k + "layer_scale_2.scale", {D});
    layers_.push_back(std::move(l));
  }
}

void MimiTransformer::init_state(MimiTransformerState& st) const {
  st.kv.resize(layers_.size());
  for (auto& kv : st.kv) kv.init(c_.context, c_.num_heads, c_.d_model / c_.num_heads);
  st.offset = 0;
}

void MimiTransformer::forward(MimiTransformerState& st, std::vector<float>& x_cm, int T) const {
  const int D = c_.d_model, F = c_.dim_feedforward, H = c_.num_heads, hd = D / H;
  const float scale = 1.f / std::sqrt(static_cast<float>(hd));
  if (st.kv.size() != layers_.size()) init_state(st);
  // To token-major [T, D].
  std::vector<float> x(static_cast<size_t>(T) * D);
  for (int d = 0; d < D; ++d)
    for (int t = 0; t < T; ++t) x[static_cast<size_t>(t) * D + d] = x_cm[static_cast<size_t>(d) * T + t];

  std::vector<float> h(x.size()), qkv(static_cast<size_t>(T) * 3 * D), att(x.size()), proj(x.size()),
      ff(static_cast<size_t>(T) * F), scratch;
  for (size_t li = 0; li < layers_.size(); ++li) {
    const Layer& l = layers_[li];
    cpu::RingKv& kv = st.kv[li];
    cpu::layer_norm(x.data(), T, D, l.norm1_w.data(), l.norm1_b.data(), 1e-5f, h.data());
    cpu::linear(h.data(), T, l.in_proj.data(), 3 * D, D, nullptr, qkv.data());
    for (int t = 0; t < T; ++t) {
      float* q = qkv.data() + static_cast<size_t>(t) * 3 * D;
      float* k = q + D;
      const float pos = static_cast<float>(st.offset + t);
      for (int hh = 0; hh < H; ++hh) {
        cpu::rope_inplace(q + hh * hd, hd, pos, static_cast<float>(c_.max_period));
        cpu::rope_inplace(k + hh * hd, hd, pos, static_cast<float>(c_.max_period));
      }
      kv.append(k, k + D);
    }
    for (int t = 0; t < T; ++t) {
      cpu::ring_attend(kv, qkv.data() + static_cast<size_t>(t) * 3 * D, st.offset + t, c_.context, scale,
                       att.data() + static_cast<size_t>(t) * D, scratch);
    }
    cpu::linear(att.data(), T, l.out_proj.data(), D, D, nullptr, proj.data());
    for (size_t j = 0; j < x.size(); ++j) x[j] += l.ls1[j % D] * proj[j];
    cpu::layer_norm(x.data(), T, D, l.norm2_w.data(), l.norm2_b.data(), 1e-5f, h.data());
    cpu::linear(h.data(), T, l.linear1.data(), F, D, nullptr, ff.data());
    cpu::gelu_inplace(ff.data(), static_cast<int64_t>(ff.size()));
    cpu::linear(ff.data(), T, l.linear2.data(), D, F, nullptr, proj.data());
    for (size_t j = 0; j < x.size(); ++j) x[j] += l.ls2[j % D] * proj[j];
  }
  st.offset += T;
  for (int d = 0; d < D; ++d)
    for (int t = 0; t < T; ++t) x_cm[static_cast<size_t>(d) * T + t] = x[static_cast<size_t>(t) * D + d];
}

}  // namespace ppx
