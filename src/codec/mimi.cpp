#include "ppx/mimi.h"

#include <string>
#include <vector>

#include "codec/conv.h"
#include "codec/mimi_transformer.h"
#include "codec/quantizer.h"
#include "codec/seanet.h"
#include "ppx/error.h"
#include "ppx/weights.h"

namespace ppx {

struct MimiStateImpl {
  SeanetState enc, dec;
  MimiTransformerState enc_tr, dec_tr;
  Conv1dState down;
  ConvTr1dState up;
};

MimiState::MimiState() : impl_(std::make_unique<MimiStateImpl>()) {}
MimiState::~MimiState() = default;
MimiState::MimiState(MimiState&&) noexcept = default;
MimiState& MimiState::operator=(MimiState&&) noexcept = default;

void MimiState::reset_encoder() {
  impl_->enc = SeanetState{};
  impl_->enc_tr = MimiTransformerState{};
  impl_->down = Conv1dState{};
}

void MimiState::reset_decoder() {
  impl_->dec = SeanetState{};
  impl_->dec_tr = MimiTransformerState{};
  impl_->up = ConvTr1dState{};
}

void MimiState::reset() {
  reset_encoder();
  reset_decoder();
}

struct Mimi::Parts {
  Seanet encoder, decoder;
  MimiTransformer enc_tr, dec_tr;
  StreamConv1d down;
  StreamConvTr1d up;
  SplitRvq rvq;
  Parts(const MimiConfig& c, WeightSource& w)
      : encoder(c.seanet, w, false),
        decoder(c.seanet, w, true),
        enc_tr(c.transformer, w, "encoder_transformer.transformer."),
        dec_tr(c.transformer, w, "decoder_transformer.transformer."),
        down(w, "downsample.conv.conv.conv", c.seanet.dimension, c.seanet.dimension, 2 * c.encoder_stride(),
             c.encoder_stride(), false, PadMode::kReplicate),
        up(w, "upsample.convtr.convtr.convtr", c.seanet.dimension, c.seanet.dimension, 2 * c.encoder_stride(),
           c.encoder_stride(), c.seanet.dimension, false),
        rvq(c, w) {}
};

Mimi::Mimi(const MimiConfig& c, WeightSource& w) : c_(c) {
  // Same construction order as the upstream state dict listing (encoder first).
  p_ = std::make_unique<Parts>(c, w);
}

Mimi::~Mimi() = default;

void Mimi::encode(MimiState& st, const float* pcm, int32_t* codes) const {
  MimiStateImpl& s = st.impl();
  const int n = frame_samples();
  std::vector<float> x(pcm, pcm + n), lat;
  int T = 0;
  p_->encoder.forward(s.enc, x, n, lat, &T);  // [D, encoder_stride]
  p_->enc_tr.forward(s.enc_tr, lat, T);
  std::vector<float> z;
  p_->down.forward(s.down, lat.data(), T, z);  // [D, 1]
  p_->rvq.encode(z.data(), codes);
}

void Mimi::decode(MimiState& st, const int32_t* codes, float* pcm) const {
  for (int q = 0; q < c_.num_codebooks; ++q) {
    if (codes[q] < 0 || codes[q] >= c_.quantizer.bins) {
      throw Error("mimi decode: code " + std::to_string(codes[q]) + " of codebook " + std::to_string(q) +
                  " is outside [0, " + std::to_string(c_.quantizer.bins) + ")");
    }
  }
  MimiStateImpl& s = st.impl();
  const int D = c_.seanet.dimension;
  std::vector<float> z(D), lat, out;
  p_->rvq.decode(codes, z.data());
  p_->up.forward(s.up, z.data(), 1, lat);  // [D, encoder_stride]
  const int T = static_cast<int>(lat.size() / D);
  p_->dec_tr.forward(s.dec_tr, lat, T);
  int T_out = 0;
  p_->decoder.forward(s.dec, lat, T, out, &T_out);
  std::copy(out.begin(), out.end(), pcm);
}

}  // namespace ppx
