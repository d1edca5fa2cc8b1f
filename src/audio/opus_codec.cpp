// libopus RAII wrappers and the Ogg Opus writer (server -> client audio). The writer lays out its
// pages with libogg: each packet goes in with ogg_stream_packetin and out on a page of its own
// with ogg_stream_flush, which sets BOS on the first page, EOS on the page of a packet marked e_o_s
// and the page's granule from the packet's.

#include <ogg/ogg.h>
#include <opus.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "ppx/error.h"
#include "ppx/ogg_opus.h"

namespace ppx {
namespace opus {

namespace {

void check_format(const char* what, int sample_rate, int channels) {
  if (!is_opus_sample_rate(sample_rate)) {
    throw Error(std::string(what) + ": Opus sample rate must be 8000, 12000, 16000, 24000 or " +
                "48000 Hz, got " + std::to_string(sample_rate));
  }
  if (channels < 1 || channels > 2) {
    throw Error(std::string(what) + ": channels must be 1 or 2, got " + std::to_string(channels));
  }
}

}  // namespace

bool is_opus_sample_rate(int hz) {
  return hz == 8000 || hz == 12000 || hz == 16000 || hz == 24000 || hz == 48000;
}

void Encoder::Free::operator()(OpusEncoder* e) const { opus_encoder_destroy(e); }
void Decoder::Free::operator()(OpusDecoder* d) const { opus_decoder_destroy(d); }

Encoder::Encoder(int sample_rate, int channels, Application app, int bitrate_bps)
    : sample_rate_(sample_rate), channels_(channels) {
  check_format("Opus encoder", sample_rate, channels);
  int err = OPUS_OK;
  const int application =
      app == Application::kVoip ? OPUS_APPLICATION_VOIP : OPUS_APPLICATION_AUDIO;
  enc_.reset(opus_encoder_create(sample_rate, channels, application, &err));
  if (err != OPUS_OK || !enc_) {
    enc_.reset();
    throw Error(std::string("Opus encoder: ") + opus_strerror(err));
  }
  if (bitrate_bps != 0) {
    err = opus_encoder_ctl(enc_.get(), OPUS_SET_BITRATE(bitrate_bps));
    if (err != OPUS_OK) {
      throw Error("Opus encoder: bitrate " + std::to_string(bitrate_bps) + ": " +
                  opus_strerror(err));
    }
  }
}

Encoder::~Encoder() = default;
Encoder::Encoder(Encoder&&) noexcept = default;
Encoder& Encoder::operator=(Encoder&&) noexcept = default;

std::vector<uint8_t> Encoder::encode(const float* pcm, int frame_samples) {
  std::vector<uint8_t> packet(kMaxPacketBytes);
  const opus_int32 n =
      opus_encode_float(enc_.get(), pcm, frame_samples, packet.data(), kMaxPacketBytes);
  if (n < 0) {
    throw Error("Opus encode of " + std::to_string(frame_samples) + " samples at " +
                std::to_string(sample_rate_) + " Hz: " + opus_strerror(n));
  }
  packet.resize(static_cast<size_t>(n));
  return packet;
}

int Encoder::lookahead() const {
  opus_int32 samples = 0;
  opus_encoder_ctl(enc_.get(), OPUS_GET_LOOKAHEAD(&samples));
  return samples;
}

Decoder::Decoder(int sample_rate, int channels) : sample_rate_(sample_rate), channels_(channels) {
  check_format("Opus decoder", sample_rate, channels);
  int err = OPUS_OK;
  dec_.reset(opus_decoder_create(sample_rate, channels, &err));
  if (err != OPUS_OK || !dec_) {
    dec_.reset();
    throw Error(std::string("Opus decoder: ") + opus_strerror(err));
  }
}

Decoder::~Decoder() = default;
Decoder::Decoder(Decoder&&) noexcept = default;
Decoder& Decoder::operator=(Decoder&&) noexcept = default;

int Decoder::decode(const uint8_t* packet, size_t n, float* out) {
  // A null/empty packet would ask libopus for packet-loss concealment; refuse it instead.
  if (packet == nullptr || n == 0) return OPUS_INVALID_PACKET;
  if (n > static_cast<size_t>(INT32_MAX)) return OPUS_INVALID_PACKET;
  return opus_decode_float(dec_.get(), packet, static_cast<opus_int32>(n), out, max_frame_samples(),
                           0);
}

void Decoder::set_gain_q8(int gain_q8) {
  opus_decoder_ctl(dec_.get(), OPUS_SET_GAIN(std::clamp(gain_q8, -32768, 32767)));
}

void Decoder::reset() { opus_decoder_ctl(dec_.get(), OPUS_RESET_STATE); }

}  // namespace opus

// ---- OggOpusWriter ----

struct OggOpusWriter::Stream {
  ogg_stream_state os;
};

void OggOpusWriter::StreamFree::operator()(Stream* s) const {
  ogg_stream_clear(&s->os);
  delete s;
}

OggOpusWriter::OggOpusWriter(int sample_rate, int channels, int bitrate_bps)
    : sample_rate_(sample_rate),
      channels_(channels),
      enc_(sample_rate, channels, opus::Application::kVoip, bitrate_bps),
      os_(new Stream{}) {
  std::random_device rd;
  serial_ = rd();
  pre_skip_ = enc_.lookahead() * (48000 / sample_rate_);
  if (ogg_stream_init(&os_->os, static_cast<int>(serial_)) != 0) {
    throw Error("Ogg Opus writer: libogg stream init failed");
  }

  OpusHead head;
  head.channels = channels_;
  head.pre_skip = pre_skip_;
  head.input_sample_rate = static_cast<uint32_t>(sample_rate_);
  std::vector<uint8_t> head_packet = head.serialize(), tags = make_opus_tags("personaplex-cpp");
  head_page_ = page_of(head_packet, 0, false);  // seq 0, BOS (libogg flags the first page)
  tags_page_ = page_of(tags, 0, false);         // seq 1
}

std::vector<uint8_t> OggOpusWriter::headers() const {
  std::vector<uint8_t> out = head_page_;
  out.insert(out.end(), tags_page_.begin(), tags_page_.end());
  return out;
}

std::vector<uint8_t> OggOpusWriter::page_of(std::vector<uint8_t>& packet, int64_t granule,
                                            bool eos) {
  ogg_packet op{};
  op.packet = packet.data();
  op.bytes = static_cast<long>(packet.size());
  op.b_o_s = packetno_ == 0;
  op.e_o_s = eos;
  op.granulepos = granule;
  op.packetno = packetno_++;
  if (ogg_stream_packetin(&os_->os, &op) != 0)
    throw Error("Ogg Opus writer: libogg packetin failed");
  // Our packets (at most opus::kMaxPacketBytes, 16 lacing values) always fit one page.
  std::vector<uint8_t> page;
  ogg_page og;
  while (ogg_stream_flush(&os_->os, &og) != 0) {
    page.insert(page.end(), og.header, og.header + og.header_len);
    page.insert(page.end(), og.body, og.body + og.body_len);
    ++next_seq_;
  }
  return page;
}

std::vector<uint8_t> OggOpusWriter::page_for(const float* pcm, int n, bool eos, bool end_trim) {
  if (finished_) throw Error("Ogg Opus writer: encode_frame after finish");
  if (n <= 0 || n > sample_rate_ * 120 / 1000) {
    throw Error("Ogg Opus writer: frame of " + std::to_string(n) + " samples at " +
                std::to_string(sample_rate_) + " Hz is not an Opus frame size");
  }
  const size_t count = static_cast<size_t>(n) * channels_;
  scratch_.resize(count);
  for (size_t i = 0; i < count; ++i) {
    const float v = pcm ? pcm[i] : 0.f;
    scratch_[i] = std::isfinite(v) ? std::clamp(v, -1.f, 1.f) : 0.f;
  }
  std::vector<uint8_t> packet = enc_.encode(scratch_.data(), n);
  const int64_t samples_48 = int64_t{n} * (48000 / sample_rate_);
  granule_ += samples_48;
  int64_t page_granule = granule_;
  if (end_trim) {
    page_granule = pre_skip_ + input_samples_48_;
  } else {
    input_samples_48_ += samples_48;
  }
  return page_of(packet, page_granule, eos);
}

std::vector<uint8_t> OggOpusWriter::encode_frame(const float* pcm, int n) {
  if (!pcm) throw Error("Ogg Opus writer: null PCM");
  return page_for(pcm, n, false, false);
}

std::vector<uint8_t> OggOpusWriter::finish() {
  if (finished_) return {};
  // The flush packet must cover the codec delay (pre-skip) so that the end-trimmed granule,
  // pre_skip + input, lies between the previous page's granule (input) and the decoded total.
  int flush_ms = 10;
  while (flush_ms < 80 && flush_ms * 48 < pre_skip_) flush_ms *= 2;
  std::vector<uint8_t> page = page_for(nullptr, sample_rate_ * flush_ms / 1000, true, true);
  granule_ = pre_skip_ + input_samples_48_;
  finished_ = true;
  return page;
}

}  // namespace ppx
