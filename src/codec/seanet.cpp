#include "codec/seanet.h"

#include <string>

#include "backend/cpu_ops.h"

namespace ppx {

void SeanetState::reset(size_t n_layers) {
  conv.assign(n_layers, Conv1dState{});
  conv2.assign(n_layers, Conv1dState{});
  convtr.assign(n_layers, ConvTr1dState{});
}

Seanet::Seanet(const SeanetConfig& c, WeightSource& w, bool decoder) {
  const std::string prefix = decoder ? "decoder.model." : "encoder.model.";
  auto key = [&](size_t idx) { return prefix + std::to_string(idx); };
  auto add_conv = [&](int in, int out, int k, int s) {
    SeanetLayer l(SeanetLayer::Kind::kConv);
    l.conv = std::make_unique<StreamConv1d>(w, key(layers_.size()) + ".conv.conv", in, out, k, s, true,
                                            PadMode::kConstant);
    layers_.push_back(std::move(l));
  };
  auto add_elu = [&](int ch) {
    SeanetLayer l(SeanetLayer::Kind::kElu);
    l.channels = ch;
    layers_.push_back(std::move(l));
  };
  auto add_res = [&](int dim) {
    SeanetLayer l(SeanetLayer::Kind::kResBlock);
    const int hidden = dim / c.compress;
    const std::string k = key(layers_.size());
    l.conv = std::make_unique<StreamConv1d>(w, k + ".block.1.conv.conv", dim, hidden, c.residual_kernel_size, 1,
                                            true, PadMode::kConstant);
    l.conv2 = std::make_unique<StreamConv1d>(w, k + ".block.3.conv.conv", hidden, dim, 1, 1, true,
                                             PadMode::kConstant);
    l.channels = dim;
    layers_.push_back(std::move(l));
  };
  const int n = static_cast<int>(c.ratios.size());
  if (!decoder) {
    int mult = 1;
    add_conv(c.channels, c.n_filters, c.kernel_size, 1);
    for (int i = n - 1; i >= 0; --i) {
      const int r = c.ratios[i];
      add_res(mult * c.n_filters);
      add_elu(mult * c.n_filters);
      add_conv(mult * c.n_filters, 2 * mult * c.n_filters, 2 * r, r);
      mult *= 2;
    }
    add_elu(mult * c.n_filters);
    add_conv(mult * c.n_filters, c.dimension, c.last_kernel_size, 1);
  } else {
    int mult = 1 << n;
    add_conv(c.dimension, mult * c.n_filters, c.kernel_size, 1);
    for (int i = 0; i < n; ++i) {
      const int r = c.ratios[i];
      add_elu(mult * c.n_filters);
      SeanetLayer l(SeanetLayer::Kind::kConvTr);
      l.convtr = std::make_unique<StreamConvTr1d>(w, key(layers_.size()) + ".convtr.convtr", mult * c.n_filters,
                                                  mult * c.n_filters / 2, 2 * r, r, 1, true);
      layers_.push_back(std::move(l));
      add_res(mult * c.n_filters / 2);
      mult /= 2;
    }
    add_elu(c.n_filters);
    add_conv(c.n_filters, c.channels, c.last_kernel_size, 1);
  }
}

void Seanet::forward(SeanetState& st, const std::vector<float>& x, int T, std::vector<float>& y, int* T_out) const {
  if (st.conv.size() != layers_.size()) st.reset(layers_.size());
  std::vector<float> cur = x, tmp, tmp2;
  for (size_t i = 0; i < layers_.size(); ++i) {
    const SeanetLayer& l = layers_[i];
    switch (l.kind) {
      case SeanetLayer::Kind::kConv:
        l.conv->forward(st.conv[i], cur.data(), T, tmp);
        T /= l.conv->stride();
        cur.swap(tmp);
        break;
      case SeanetLayer::Kind::kConvTr:
        l.convtr->forward(st.convtr[i], cur.data(), T, tmp);
        T = static_cast<int>(tmp.size() / l.convtr->out());
        cur.swap(tmp);
        break;
      case SeanetLayer::Kind::kElu:
        cpu::elu(cur.data(), static_cast<int64_t>(cur.size()), cur.data());
        break;
      case SeanetLayer::Kind::kResBlock: {
        // y = x + conv2(elu(conv1(elu(x))))
        tmp.resize(cur.size());
        cpu::elu(cur.data(), static_cast<int64_t>(cur.size()), tmp.data());
        l.conv->forward(st.conv[i], tmp.data(), T, tmp2);
        cpu::elu(tmp2.data(), static_cast<int64_t>(tmp2.size()), tmp2.data());
        l.conv2->forward(st.conv2[i], tmp2.data(), T, tmp);
        for (size_t j = 0; j < cur.size(); ++j) cur[j] += tmp[j];
        break;
      }
    }
  }
  y.swap(cur);
  *T_out = T;
}

}  // namespace ppx
