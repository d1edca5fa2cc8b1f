// Ogg Opus writer and reader (ppx/ogg_opus.h). The checks on our pages use routines written here
// independently of the library (a bit-by-bit CRC, a strict page parser) and libogg; the reader is
// fed streams laid out by libogg and by a test paginator as well as by our own writer.

#include <gtest/gtest.h>
#include <ogg/ogg.h>
#include <opus.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "ppx/audio.h"
#include "ppx/error.h"
#include "ppx/ogg_opus.h"
#include "test_util.h"

using namespace ppx;
using Bytes = std::vector<uint8_t>;

namespace {

constexpr int kFrame = 1920;  // 80 ms at 24 kHz

// Ogg CRC one bit at a time, straight from the definition (independent of the table version).
uint32_t crc_bitwise(const uint8_t* p, size_t n, uint32_t crc = 0) {
  for (size_t i = 0; i < n; ++i) {
    crc ^= uint32_t{p[i]} << 24;
    for (int b = 0; b < 8; ++b) crc = (crc & 0x80000000u) ? (crc << 1) ^ 0x04C11DB7u : crc << 1;
  }
  return crc;
}

uint32_t le32(const uint8_t* p) { return p[0] | p[1] << 8 | p[2] << 16 | uint32_t{p[3]} << 24; }

struct Page {
  uint8_t flags = 0;
  int64_t granule = 0;
  uint32_t serial = 0, seq = 0;
  std::vector<uint8_t> lacing;
  std::vector<Bytes> packets;  // completed on this page (a page here never continues one)
  size_t size = 0;
};

// Strict parse of the page at the start of `b`: structure, bit-by-bit CRC, whole packets.
Page parse_page(const Bytes& b, size_t at = 0) {
  Page pg;
  EXPECT_GE(b.size() - at, 27u);
  const uint8_t* p = b.data() + at;
  EXPECT_EQ(std::memcmp(p, "OggS", 4), 0);
  EXPECT_EQ(p[4], 0);
  pg.flags = p[5];
  uint64_t g = 0;
  for (int i = 7; i >= 0; --i) g = g << 8 | p[6 + i];
  pg.granule = static_cast<int64_t>(g);
  pg.serial = le32(p + 14);
  pg.seq = le32(p + 18);
  pg.lacing.assign(p + 27, p + 27 + p[26]);
  size_t body = 0;
  for (uint8_t v : pg.lacing) body += v;
  pg.size = 27 + pg.lacing.size() + body;
  EXPECT_LE(at + pg.size, b.size());
  const uint8_t zeros[4] = {0, 0, 0, 0};
  const uint32_t crc = crc_bitwise(p + 26, pg.size - 26, crc_bitwise(zeros, 4, crc_bitwise(p, 22)));
  EXPECT_EQ(crc, le32(p + 22)) << "page seq " << pg.seq;
  const uint8_t* d = p + 27 + pg.lacing.size();
  Bytes cur;
  for (uint8_t v : pg.lacing) {
    cur.insert(cur.end(), d, d + v);
    d += v;
    if (v < 255) pg.packets.push_back(std::move(cur)), cur.clear();
  }
  EXPECT_TRUE(cur.empty()) << "packet left open at the end of page " << pg.seq;
  return pg;
}

template <typename T>
void append(std::vector<T>& dst, const std::vector<T>& src) {
  dst.insert(dst.end(), src.begin(), src.end());
}

// The bundled speech sample at 24 kHz.
std::vector<float> speech_24k() {
  const Audio a = read_audio(test::data("speech_16k.wav"));
  return resample(take_channel(a, 0), a.sample_rate, 24000);
}

// Whole stream from our writer: headers, one page per frame (last frame zero-padded), finish().
// `pages_out` gets each page separately.
Bytes write_stream(const std::vector<float>& pcm, OggOpusWriter& w, bool headers = true,
                   bool finish = true, std::vector<Bytes>* pages_out = nullptr) {
  Bytes out;
  std::vector<Bytes> pages;
  if (headers) pages = {w.head_page(), w.tags_page()};
  std::vector<float> frame(kFrame);
  for (size_t at = 0; at < pcm.size(); at += kFrame) {
    std::fill(frame.begin(), frame.end(), 0.f);
    std::copy_n(pcm.begin() + static_cast<std::ptrdiff_t>(at),
                std::min<size_t>(kFrame, pcm.size() - at), frame.begin());
    pages.push_back(w.encode_frame(frame.data(), kFrame));
  }
  if (finish) pages.push_back(w.finish());
  for (const auto& p : pages) append(out, p);
  if (pages_out) *pages_out = pages;
  return out;
}

size_t frames_of(size_t samples) { return (samples + kFrame - 1) / kFrame; }

std::vector<float> read_all(const Bytes& stream, size_t* errors = nullptr) {
  OggOpusReader r;
  r.push(stream.data(), stream.size());
  std::vector<float> out;
  r.read(out);
  if (errors) *errors = r.errors();
  EXPECT_FALSE(r.failed()) << r.error();
  return out;
}

::testing::AssertionResult same_pcm(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) {
    return ::testing::AssertionFailure() << "sizes " << a.size() << " vs " << b.size();
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return ::testing::AssertionFailure() << "differ at " << i;
  }
  return ::testing::AssertionSuccess();
}

// Lays `packets` out on pages of at most `max_segments` lacing values each, splitting packets
// across pages (continued flag), granule -1 on pages where no packet ends, as RFC 3533 says.
// `granules[i]` is the granule after packet i.
Bytes paginate(const std::vector<Bytes>& packets, const std::vector<int64_t>& granules,
               size_t max_segments, uint32_t serial, uint32_t first_seq) {
  Bytes out;
  uint32_t seq = first_seq;
  std::vector<uint8_t> lacing;
  Bytes body;
  bool continued = false, next_continued = false;
  int64_t granule = -1;
  auto flush = [&] {
    Bytes page = {'O', 'g', 'g', 'S', 0, static_cast<uint8_t>(continued ? 1 : 0)};
    for (int i = 0; i < 8; ++i)
      page.push_back(static_cast<uint8_t>(static_cast<uint64_t>(granule) >> (8 * i)));
    for (uint32_t x : {serial, seq++, 0u}) {
      for (int i = 0; i < 4; ++i) page.push_back(static_cast<uint8_t>(x >> (8 * i)));
    }
    page.push_back(static_cast<uint8_t>(lacing.size()));
    append(page, lacing);
    append(page, body);
    const uint32_t crc = crc_bitwise(page.data(), page.size());
    for (int i = 0; i < 4; ++i) page[22 + i] = static_cast<uint8_t>(crc >> (8 * i));
    append(out, page);
    lacing.clear();
    body.clear();
    granule = -1;
    continued = next_continued;
  };
  for (size_t k = 0; k < packets.size(); ++k) {
    const Bytes& p = packets[k];
    size_t at = 0;
    while (true) {
      const size_t len = std::min<size_t>(255, p.size() - at);
      lacing.push_back(static_cast<uint8_t>(len));
      body.insert(body.end(), p.begin() + static_cast<std::ptrdiff_t>(at),
                  p.begin() + static_cast<std::ptrdiff_t>(at + len));
      at += len;
      const bool done = len < 255;
      if (done) granule = granules[k];
      next_continued = !done;
      if (lacing.size() == max_segments) flush();
      if (done) break;
    }
  }
  if (!lacing.empty()) flush();
  return out;
}

// Packets and page granules as libogg reads them (it checks CRCs itself); `skipped` counts the
// times libogg had to skip bytes to find a page.
std::vector<Bytes> libogg_packets(const Bytes& b, std::vector<ogg_int64_t>* granules,
                                  std::vector<bool>* eos, int* skipped) {
  ogg_sync_state oy;
  ogg_sync_init(&oy);
  char* buf = ogg_sync_buffer(&oy, static_cast<long>(b.size()));
  std::memcpy(buf, b.data(), b.size());
  ogg_sync_wrote(&oy, static_cast<long>(b.size()));
  ogg_stream_state os;
  bool init = false;
  std::vector<Bytes> packets;
  *skipped = 0;
  ogg_page og;
  while (true) {
    const int r = ogg_sync_pageout(&oy, &og);
    if (r == 0) break;
    if (r < 0) {
      ++*skipped;
      continue;
    }
    if (!init) ogg_stream_init(&os, ogg_page_serialno(&og)), init = true;
    EXPECT_EQ(ogg_stream_pagein(&os, &og), 0);
    granules->push_back(ogg_page_granulepos(&og));
    eos->push_back(ogg_page_eos(&og) != 0);
    ogg_packet op;
    while (ogg_stream_packetout(&os, &op) == 1)
      packets.emplace_back(op.packet, op.packet + op.bytes);
  }
  if (init) ogg_stream_clear(&os);
  ogg_sync_clear(&oy);
  return packets;
}

// A browser-like (opus-recorder) stream: OPUS_APPLICATION_AUDIO at 24 kHz, 20 ms packets, two
// per page, laid out by libogg; OpusHead with opus-recorder's fixed pre-skip 3840 and rate 48000.
Bytes browser_stream(const std::vector<float>& pcm, bool headers, size_t* packet_count,
                     std::vector<Bytes>* packets_out = nullptr) {
  opus::Encoder enc(24000, 1, opus::Application::kAudio);
  ogg_stream_state os;
  ogg_stream_init(&os, 0x1234abcd);
  Bytes out;
  ogg_page og;
  auto drain = [&](bool flush) {
    while (flush ? ogg_stream_flush(&os, &og) : ogg_stream_pageout(&os, &og)) {
      out.insert(out.end(), og.header, og.header + og.header_len);
      out.insert(out.end(), og.body, og.body + og.body_len);
    }
  };
  OpusHead head;
  head.pre_skip = 3840;
  head.input_sample_rate = 48000;
  Bytes h = head.serialize(), t = make_opus_tags("RecorderJS");
  ogg_int64_t packetno = 0, granule = 0;
  auto put = [&](Bytes& p, bool bos, bool eos, ogg_int64_t gp) {
    ogg_packet op{};
    op.packet = p.data();
    op.bytes = static_cast<long>(p.size());
    op.b_o_s = bos;
    op.e_o_s = eos;
    op.granulepos = gp;
    op.packetno = packetno++;
    ogg_stream_packetin(&os, &op);
  };
  if (headers) {
    put(h, true, false, 0);
    drain(true);
    put(t, false, false, 0);
    drain(true);
  }
  const size_t n = pcm.size() / 480;
  for (size_t k = 0; k < n; ++k) {
    Bytes p = enc.encode(pcm.data() + k * 480, 480);
    if (packets_out) packets_out->push_back(p);
    granule += 960;
    put(p, !headers && k == 0, k + 1 == n, granule);
    if (k % 2 == 1 || k + 1 == n) drain(true);
  }
  ogg_stream_clear(&os);
  *packet_count = n;
  return out;
}

}  // namespace

// ---- CRC and pages ----

TEST(OggCrc, MatchesDefinitionAndCheckValue) {
  // CRC-32 with poly 0x04C11DB7, init 0, no reflection, no xor-out: check value of "123456789".
  const char* check = "123456789";
  EXPECT_EQ(ogg_crc32(reinterpret_cast<const uint8_t*>(check), 9), 0x89A1897Fu);
  std::mt19937 rng(3);
  for (size_t n : {0u, 1u, 7u, 255u, 1000u}) {
    Bytes b(n);
    for (auto& x : b) x = static_cast<uint8_t>(rng());
    EXPECT_EQ(ogg_crc32(b.data(), n), crc_bitwise(b.data(), n)) << n;
    if (n > 1) {  // running CRC over two pieces equals the CRC of the whole
      EXPECT_EQ(ogg_crc32(b.data() + n / 2, n - n / 2, ogg_crc32(b.data(), n / 2)),
                ogg_crc32(b.data(), n));
    }
  }
}

TEST(OggPages, MakeOggPageLacesPacketsAndMatchesLibogg) {
  const std::vector<Bytes> packets = {Bytes(10, 1), Bytes(255, 2), Bytes(0), Bytes(600, 3)};
  const Bytes page = make_ogg_page(77, 5, 123456789012, kOggEos, packets);
  const Page pg = parse_page(page);
  EXPECT_EQ(pg.size, page.size());
  EXPECT_EQ(pg.lacing, (std::vector<uint8_t>{10, 255, 0, 0, 255, 255, 90}));
  EXPECT_EQ(pg.packets, packets);
  EXPECT_EQ(pg.flags, kOggEos);
  EXPECT_EQ(pg.granule, 123456789012);
  EXPECT_EQ(pg.serial, 77u);
  EXPECT_EQ(pg.seq, 5u);
  // libogg computes the same checksum for the same page.
  Bytes copy = page;
  ogg_page og{copy.data(), 27 + 7, copy.data() + 27 + 7, static_cast<long>(copy.size() - 34)};
  for (size_t i = 22; i < 26; ++i) copy[i] = 0;
  ogg_page_checksum_set(&og);
  EXPECT_EQ(copy, page);
  EXPECT_THROW(make_ogg_page(1, 0, 0, 0, {Bytes(255 * 255)}), Error);
}

// ---- Writer ----

TEST(OggOpusWriter, HeaderPages) {
  OggOpusWriter w;
  EXPECT_EQ(w.frame_samples(), kFrame);
  EXPECT_EQ(w.pre_skip(), opus::Encoder(24000, 1, opus::Application::kVoip).lookahead() * 2);
  EXPECT_EQ(w.pre_skip(), 312);  // 6.5 ms
  const Page head = parse_page(w.head_page());
  EXPECT_EQ(w.head_page().size(), 47u);  // as upstream's and the browser's
  EXPECT_EQ(head.flags, kOggBos);
  EXPECT_EQ(head.seq, 0u);
  EXPECT_EQ(head.granule, 0);
  EXPECT_EQ(head.serial, w.serial());
  ASSERT_EQ(head.packets.size(), 1u);
  const Bytes& h = head.packets[0];
  ASSERT_EQ(h.size(), 19u);
  EXPECT_EQ(std::string(h.begin(), h.begin() + 8), "OpusHead");
  EXPECT_EQ(h[8], 1);                      // version
  EXPECT_EQ(h[9], 1);                      // channels
  EXPECT_EQ(h[10] | h[11] << 8, 312);      // pre-skip
  EXPECT_EQ(le32(h.data() + 12), 24000u);  // input rate
  EXPECT_EQ(h[16] | h[17] << 8, 0);        // gain
  EXPECT_EQ(h[18], 0);                     // mapping family
  const auto parsed = OpusHead::parse(h.data(), h.size());
  ASSERT_TRUE(parsed);
  EXPECT_EQ(parsed->pre_skip, 312);
  EXPECT_EQ(parsed->serialize(), h);

  const Page tags = parse_page(w.tags_page());
  EXPECT_EQ(tags.flags, 0);
  EXPECT_EQ(tags.seq, 1u);
  EXPECT_EQ(tags.granule, 0);
  EXPECT_EQ(tags.serial, w.serial());
  ASSERT_EQ(tags.packets.size(), 1u);
  const Bytes& t = tags.packets[0];
  EXPECT_EQ(std::string(t.begin(), t.begin() + 8), "OpusTags");
  ASSERT_EQ(le32(t.data() + 8), 15u);
  EXPECT_EQ(std::string(t.begin() + 12, t.begin() + 27), "personaplex-cpp");
  EXPECT_EQ(le32(t.data() + 27), 0u);
  EXPECT_EQ(t.size(), 31u);

  Bytes both = w.head_page();
  append(both, w.tags_page());
  EXPECT_EQ(w.headers(), both);
  EXPECT_NE(OggOpusWriter().serial(), w.serial());  // random per stream (fails 1 in 2^32)

  OggOpusWriter stereo(48000, 2);
  const Page sh = parse_page(stereo.head_page());
  EXPECT_EQ(sh.packets[0][9], 2);
  EXPECT_EQ(le32(sh.packets[0].data() + 12), 48000u);
}

TEST(OggOpusWriter, AudioPagesOnePacketOf80MsEach) {
  const std::vector<float> speech = speech_24k();
  const std::vector<float> pcm(speech.begin(), speech.begin() + 20 * kFrame);
  OggOpusWriter w;
  std::vector<Bytes> pages;
  const Bytes stream = write_stream(pcm, w, true, true, &pages);
  ASSERT_EQ(pages.size(), 2u + 20u + 1u);
  for (size_t k = 2; k < 22; ++k) {
    const Page pg = parse_page(pages[k]);
    EXPECT_EQ(pg.size, pages[k].size());  // exactly one page
    EXPECT_EQ(pg.seq, k);                 // the browser decodes only seq > 1
    EXPECT_EQ(pg.serial, w.serial());
    EXPECT_EQ(pg.flags, 0);
    EXPECT_EQ(pg.granule, static_cast<int64_t>(3840 * (k - 1)));
    ASSERT_EQ(pg.packets.size(), 1u);
    const Bytes& p = pg.packets[0];
    EXPECT_LT(p.size(), 4000u);
    EXPECT_EQ(opus_packet_get_nb_samples(p.data(), static_cast<opus_int32>(p.size()), 48000), 3840);
  }
  const Page last = parse_page(pages.back());
  EXPECT_EQ(last.flags, kOggEos);
  EXPECT_EQ(last.seq, 22u);
  ASSERT_EQ(last.packets.size(), 1u);
  EXPECT_EQ(opus_packet_get_nb_samples(last.packets[0].data(),
                                       static_cast<opus_int32>(last.packets[0].size()), 48000),
            480);  // the 10 ms flush
  // End trimming: the granule says exactly the input survives after the pre-skip.
  EXPECT_EQ(last.granule - w.pre_skip(), 20 * 3840);
  EXPECT_GE(last.granule, static_cast<int64_t>(20 * 3840));
  EXPECT_TRUE(w.finish().empty());
  EXPECT_THROW(w.encode_frame(pcm.data(), kFrame), Error);

  // libogg reads the same stream: every CRC valid, same packets, same granules, EOS last.
  std::vector<ogg_int64_t> granules;
  std::vector<bool> eos;
  int skipped = 0;
  const std::vector<Bytes> packets = libogg_packets(stream, &granules, &eos, &skipped);
  EXPECT_EQ(skipped, 0);
  ASSERT_EQ(packets.size(), 23u);
  ASSERT_EQ(granules.size(), 23u);
  for (size_t k = 0; k < 23; ++k) {
    EXPECT_EQ(packets[k], parse_page(pages[k]).packets[0]);
    EXPECT_EQ(granules[k], parse_page(pages[k]).granule);
    EXPECT_EQ(eos[k], k == 22);
  }
}

TEST(OggOpusWriter, RejectsBadArguments) {
  OggOpusWriter w;
  std::vector<float> x(4000);
  EXPECT_THROW(w.encode_frame(x.data(), 1000), Error);
  EXPECT_THROW(w.encode_frame(x.data(), 0), Error);
  EXPECT_THROW(w.encode_frame(x.data(), 3000), Error);  // above 120 ms
  EXPECT_THROW(w.encode_frame(nullptr, kFrame), Error);
  EXPECT_NO_THROW(w.encode_frame(x.data(), 960));  // 40 ms works too
  EXPECT_THROW(OggOpusWriter(44100), Error);
  EXPECT_THROW(OggOpusWriter(24000, 3), Error);
  EXPECT_THROW(OggOpusReader(22050), Error);
}

TEST(OggOpusWriter, ClampsOutOfRangeAndNonFiniteSamples) {
  // Opus is deterministic: two writers given inputs that are equal after clamping produce the
  // same packets (page bytes differ only in serial and CRC).
  std::vector<float> loud(kFrame), clamped(kFrame);
  for (int i = 0; i < kFrame; ++i) {
    const float v = 3.f * std::sin(0.05f * static_cast<float>(i));
    loud[i] = i % 97 == 0   ? std::numeric_limits<float>::quiet_NaN()
              : i % 89 == 0 ? std::numeric_limits<float>::infinity()
                            : v;
    clamped[i] = i % 97 == 0 || i % 89 == 0 ? 0.f : std::clamp(v, -1.f, 1.f);
  }
  OggOpusWriter a, b;
  for (int k = 0; k < 3; ++k) {
    const Page pa = parse_page(a.encode_frame(loud.data(), kFrame));
    const Page pb = parse_page(b.encode_frame(clamped.data(), kFrame));
    EXPECT_EQ(pa.packets, pb.packets);
  }
}

// ---- Round trip ----

TEST(OggOpusRoundTrip, SpeechKeepsDurationAndWaveform) {
  const std::vector<float> speech = speech_24k();
  OggOpusWriter w;
  const Bytes stream = write_stream(speech, w);
  const std::vector<float> out = read_all(stream);
  const size_t padded = frames_of(speech.size()) * kFrame;  // the writer takes whole frames
  // Every decoded sample is returned: the whole frames given, plus finish()'s 10 ms flush.
  EXPECT_EQ(out.size(), padded + 240);
  EXPECT_LE(out.size() - padded, static_cast<size_t>(kFrame));

  // The decoded signal is the input delayed by the codec delay: the encoder's lookahead, 6.5 ms
  // (156 samples at 24 kHz), of which the best whole-sample alignment is 155 (the true delay is
  // fractional at 24 kHz, which alone costs ~0.07 of correlation between lags 155 and 156).
  auto compare = [&](size_t d, double* corr) {
    double sxy = 0, sxx = 0, syy = 0, see = 0;
    for (size_t i = 0; i < std::min(speech.size(), out.size() - d); ++i) {
      const double x = speech[i], y = out[i + d];
      sxy += x * y, sxx += x * x, syy += y * y, see += (y - x) * (y - x);
    }
    *corr = sxy / std::sqrt(sxx * syy);
    return std::sqrt(see / sxx);  // relative L2 error
  };
  size_t best = 0;
  double corr = 0, best_err = compare(0, &corr);
  for (size_t d = 1; d < 400; ++d) {
    const double e = compare(d, &corr);
    if (e < best_err) best = d, best_err = e;
  }
  EXPECT_NEAR(static_cast<double>(best), w.pre_skip() / 2.0, 2.0);
  const double err = compare(best, &corr);
  std::printf("round trip: %zu bytes for %.2f s (%.1f kbps), delay %zu, corr %.4f, rel L2 %.4f\n",
              stream.size(), speech.size() / 24000.0,
              stream.size() * 8 / (speech.size() / 24000.0) / 1000, best, corr, err);
  // Measured with Debian's libopus 1.3.1 (VOIP, auto bitrate, ~25 kbps): corr 0.954, rel L2 0.30.
  EXPECT_GT(corr, 0.92);
  EXPECT_LT(err, 0.40);
  // And the check tells signals apart: one frame off, the same speech does not match.
  double off_corr = 0;
  compare(best + kFrame, &off_corr);
  EXPECT_LT(std::abs(off_corr), 0.5);
}

TEST(OggOpusRoundTrip, WithoutFinishDurationIsWholeFrames) {
  const std::vector<float> speech = speech_24k();
  OggOpusWriter w;
  const std::vector<float> out = read_all(write_stream(speech, w, true, false));
  EXPECT_EQ(out.size(), frames_of(speech.size()) * kFrame);
}

// ---- Reader: chunking ----

TEST(OggOpusReader, ChunkingDoesNotChangeOutput) {
  const std::vector<float> speech = speech_24k();
  OggOpusWriter w;
  const Bytes stream =
      write_stream(std::vector<float>(speech.begin(), speech.begin() + 30 * kFrame), w);
  const std::vector<float> blob = read_all(stream);
  ASSERT_EQ(blob.size(), 30u * kFrame + 240);

  {  // one byte at a time, draining the way the server does: whole frames as they come
    OggOpusReader r;
    std::vector<float> out;
    for (uint8_t byte : stream) {
      r.push(&byte, 1);
      for (auto f = r.take(kFrame); !f.empty(); f = r.take(kFrame)) append(out, f);
    }
    r.read(out);
    EXPECT_EQ(r.errors(), 0u);
    EXPECT_TRUE(same_pcm(out, blob));
  }
  std::mt19937 rng(11);
  for (int trial = 0; trial < 5; ++trial) {  // random chunk sizes, 1 byte to 3 pages
    OggOpusReader r;
    std::vector<float> out;
    for (size_t at = 0; at < stream.size();) {
      const size_t n = std::min<size_t>(stream.size() - at, 1 + rng() % 700);
      r.push(stream.data() + at, n);
      at += n;
      if (rng() % 3 == 0) r.read(out);
    }
    r.read(out);
    EXPECT_EQ(r.errors(), 0u);
    EXPECT_TRUE(same_pcm(out, blob)) << "trial " << trial;
  }
}

TEST(OggOpusReader, PacketsSpanningPages) {
  // 80 ms packets at 64 kbps are ~640 bytes (3 lacing values); pages of 1, 2 and 5 lacing values
  // split nearly every packet across pages.
  const std::vector<float> speech = speech_24k();
  OggOpusWriter w(24000, 1, 64000);
  std::vector<Bytes> pages;
  const Bytes stream = write_stream(
      std::vector<float>(speech.begin(), speech.begin() + 20 * kFrame), w, true, true, &pages);
  const std::vector<float> ref = read_all(stream);
  std::vector<Bytes> packets;
  std::vector<int64_t> granules;
  for (const auto& p : pages) {
    const Page pg = parse_page(p);
    packets.push_back(pg.packets.at(0));
    granules.push_back(pg.granule);
  }
  ASSERT_GT(packets[5].size(), 255u);
  for (size_t segs : {1u, 2u, 5u}) {
    size_t errors = 0;
    const Bytes relaid = paginate(packets, granules, segs, 99, 0);
    EXPECT_TRUE(same_pcm(read_all(relaid, &errors), ref)) << segs;
    EXPECT_EQ(errors, 0u);
  }
}

TEST(OggOpusReader, BrowserLikeStream20MsPacketsTwoPerPage) {
  const std::vector<float> speech = speech_24k();
  size_t packets = 0;
  std::vector<Bytes> raw;
  const Bytes stream = browser_stream(speech, true, &packets, &raw);
  // libogg put two packets on each page.
  std::vector<ogg_int64_t> granules;
  std::vector<bool> eos;
  int skipped = 0;
  EXPECT_EQ(libogg_packets(stream, &granules, &eos, &skipped).size(), packets + 2);
  EXPECT_EQ(granules.size(), 2 + (packets + 1) / 2);

  OggOpusReader r;
  r.push(stream.data(), stream.size());
  EXPECT_EQ(r.errors(), 0u);
  EXPECT_EQ(r.packets(), packets);
  ASSERT_TRUE(r.head());
  EXPECT_EQ(r.head()->pre_skip, 3840);
  EXPECT_EQ(r.head()->input_sample_rate, 48000u);
  EXPECT_EQ(r.pre_skip(), 1920);  // reported, not applied
  std::vector<float> out;
  r.read(out);
  EXPECT_EQ(out.size(), packets * 480);
  EXPECT_LT(speech.size() - out.size(), 480u);

  // The same packets on pages made by make_ogg_page decode to the same samples.
  Bytes ours = make_ogg_page(5, 0, 0, kOggBos, {OpusHead{}.serialize()});
  for (size_t k = 0; k < raw.size(); k += 2) {
    std::vector<Bytes> two(raw.begin() + static_cast<std::ptrdiff_t>(k),
                           raw.begin() + static_cast<std::ptrdiff_t>(std::min(k + 2, raw.size())));
    append(ours,
           make_ogg_page(5, static_cast<uint32_t>(1 + k / 2), int64_t{960} * (k + 2), 0, two));
  }
  EXPECT_TRUE(same_pcm(read_all(ours), out));
}

TEST(OggOpusReader, HeadersAreOptional) {
  const std::vector<float> speech = speech_24k();
  OggOpusWriter w;
  std::vector<Bytes> pages;
  const Bytes stream = write_stream(
      std::vector<float>(speech.begin(), speech.begin() + 10 * kFrame), w, true, true, &pages);
  const std::vector<float> ref = read_all(stream);
  Bytes headless;
  for (size_t k = 2; k < pages.size(); ++k) append(headless, pages[k]);
  OggOpusReader r;
  r.push(headless.data(), headless.size());
  std::vector<float> out;
  r.read(out);
  EXPECT_EQ(r.errors(), 0u);
  EXPECT_FALSE(r.head());
  EXPECT_EQ(r.pre_skip(), 0);
  EXPECT_TRUE(same_pcm(out, ref));

  size_t packets = 0;
  const Bytes browser =
      browser_stream(std::vector<float>(speech.begin(), speech.begin() + 24000), false, &packets);
  size_t errors = 0;
  EXPECT_EQ(read_all(browser, &errors).size(), packets * 480);
  EXPECT_EQ(errors, 0u);
}

// ---- Reader: bad input ----

TEST(OggOpusReader, GarbageBetweenPagesIsSkippedAndCounted) {
  const std::vector<float> speech = speech_24k();
  OggOpusWriter w;
  std::vector<Bytes> pages;
  write_stream(std::vector<float>(speech.begin(), speech.begin() + 10 * kFrame), w, true, true,
               &pages);
  Bytes clean, dirty;
  std::mt19937 rng(5);
  size_t runs = 0;
  for (const auto& p : pages) {
    append(clean, p);
    if (rng() % 2) {
      ++runs;
      for (size_t i = 1 + rng() % 300; i > 0; --i)
        dirty.push_back(static_cast<uint8_t>('A' + rng() % 26));
    }
    append(dirty, p);
  }
  size_t errors = 0;
  EXPECT_TRUE(same_pcm(read_all(dirty, &errors), read_all(clean)));
  EXPECT_EQ(errors, runs);
}

TEST(OggOpusReader, FlippedBitTruncatedPageAndSequenceGapLoseOnlyTheirPage) {
  const std::vector<float> speech = speech_24k();
  OggOpusWriter w;
  std::vector<Bytes> pages;
  write_stream(std::vector<float>(speech.begin(), speech.begin() + 10 * kFrame), w, true, false,
               &pages);
  const size_t good_samples = (pages.size() - 3) * kFrame;  // headers and one audio page lost
  for (int mode = 0; mode < 3; ++mode) {
    Bytes s;
    for (size_t k = 0; k < pages.size(); ++k) {
      Bytes p = pages[k];
      if (k == 5) {
        if (mode == 0) p[p.size() / 2] ^= 0x10;  // flipped bit in the packet
        if (mode == 1) p.resize(p.size() / 2);   // truncated
        if (mode == 2) continue;                 // missing: sequence gap
      }
      append(s, p);
    }
    OggOpusReader r;
    r.push(s.data(), s.size());
    EXPECT_EQ(r.available(), good_samples) << mode;
    EXPECT_GE(r.errors(), 1u) << mode;
    EXPECT_LE(r.errors(), 3u) << mode;
    EXPECT_FALSE(r.failed());
  }
}

TEST(OggOpusReader, InvalidOpusPacketsAndForeignPagesAreSkipped) {
  const std::vector<float> speech = speech_24k();
  OggOpusWriter w;
  std::vector<Bytes> pages;
  write_stream(std::vector<float>(speech.begin(), speech.begin() + 6 * kFrame), w, true, false,
               &pages);
  std::vector<Bytes> packets;
  for (const auto& p : pages) packets.push_back(parse_page(p).packets.at(0));
  // Valid pages carrying bad Opus: code 3 with 0 frames, a 1275+ byte frame claim, a bare TOC
  // for 120 ms of code-3 frames.
  const std::vector<Bytes> bad = {{0x03, 0x00}, {0x01, 0xFF, 0xFF, 0xFF}, {0xFB, 0xFF, 0x00}};
  Bytes s;
  uint32_t seq = 0;
  for (size_t k = 0; k < packets.size(); ++k) {
    append(s, make_ogg_page(w.serial(), seq++, 0, k == 0 ? kOggBos : 0, {packets[k]}));
    if (k >= 2 && k - 2 < bad.size())
      append(s, make_ogg_page(w.serial(), seq++, 0, 0, {bad[k - 2]}));
    if (k == 3) append(s, make_ogg_page(w.serial() ^ 1, 0, 0, 0, {packets[k]}));  // foreign serial
  }
  OggOpusReader r;
  r.push(s.data(), s.size());
  EXPECT_EQ(r.available(), 6u * kFrame);
  EXPECT_EQ(r.errors(), bad.size() + 1);
}

TEST(OggOpusReader, RandomDataNeverCrashesAndStaysBounded) {
  std::mt19937 rng(7);
  Bytes noise(100 * 1024);
  for (auto& b : noise) b = static_cast<uint8_t>(rng());
  {
    OggOpusReader r;
    r.push(noise.data(), noise.size());
    EXPECT_GT(r.errors(), 0u);
    EXPECT_EQ(r.available(), 0u);
    EXPECT_FALSE(r.failed());
    EXPECT_LE(r.buffered_bytes(), 3u);
    // A good stream after the noise still decodes.
    OggOpusWriter w;
    const Bytes stream = write_stream(std::vector<float>(3 * kFrame, 0.1f), w);
    r.push(stream.data(), stream.size());
    EXPECT_EQ(r.available(), 3u * kFrame + 240);
  }
  {  // noise dense with capture patterns and page headers claiming the largest body
    Bytes fake = {'O', 'g', 'g', 'S', 0, 0, 0, 0, 0, 0, 0, 0, 0,  0,
                  1,   2,   3,   4,   0, 0, 0, 0, 9, 9, 9, 9, 255};
    fake.resize(27 + 255, 255);
    Bytes s;
    for (int i = 0; i < 5; ++i) {
      append(s, fake);
      s.insert(s.end(), noise.begin(), noise.begin() + 1000);
    }
    OggOpusWriter w;
    const Bytes stream = write_stream(std::vector<float>(3 * kFrame, 0.1f), w);
    append(s, stream);  // inside the fake pages' claimed bodies: must still be found
    OggOpusReader r;
    for (size_t at = 0; at < s.size(); at += 4096) {
      r.push(s.data() + at, std::min<size_t>(4096, s.size() - at));
      EXPECT_LE(r.buffered_bytes(), kOggMaxPageBytes);
    }
    // A fake page whose claimed size is not yet all there is waited for; the end of the stream
    // releases nothing until more bytes arrive, so add filler past the longest claim.
    const Bytes filler(kOggMaxPageBytes, 0);
    r.push(filler.data(), filler.size());
    EXPECT_EQ(r.available(), 3u * kFrame + 240);
    EXPECT_GE(r.errors(), 5u);
    EXPECT_FALSE(r.failed());
  }
}

TEST(OggOpusReader, EndlessGarbageFailsTheStream) {
  std::mt19937 rng(9);
  Bytes noise(64 * 1024);
  OggOpusReader r;
  for (int i = 0; i < 40 && !r.failed(); ++i) {
    for (auto& b : noise) b = static_cast<uint8_t>(rng());
    r.push(noise.data(), noise.size());
    EXPECT_LE(r.buffered_bytes(), kOggMaxPageBytes);
  }
  EXPECT_TRUE(r.failed());
  EXPECT_NE(r.error().find("no valid Ogg page"), std::string::npos) << r.error();
  // Once failed, input is ignored.
  OggOpusWriter w;
  const Bytes stream = write_stream(std::vector<float>(kFrame, 0.1f), w);
  r.push(stream.data(), stream.size());
  EXPECT_EQ(r.available(), 0u);
}

TEST(OggOpusReader, OversizedPacketIsDroppedAndMemoryCapped) {
  // libogg lays a 76 500-byte packet (above any Opus packet) over two pages; then real audio.
  OggOpusWriter w;
  std::vector<Bytes> pages;
  write_stream(std::vector<float>(4 * kFrame, 0.1f), w, true, false, &pages);
  ogg_stream_state os;
  ogg_stream_init(&os, 42);
  Bytes s, huge(300 * 255, 0x5A);
  ogg_int64_t no = 0;
  auto put = [&](const Bytes& p) {
    ogg_packet op{};
    op.packet = const_cast<unsigned char*>(p.data());
    op.bytes = static_cast<long>(p.size());
    op.b_o_s = no == 0;
    op.packetno = no++;
    ogg_stream_packetin(&os, &op);
    ogg_page og;
    while (ogg_stream_flush(&os, &og)) {
      s.insert(s.end(), og.header, og.header + og.header_len);
      s.insert(s.end(), og.body, og.body + og.body_len);
    }
  };
  put(parse_page(pages[0]).packets[0]);
  put(huge);
  for (size_t k = 2; k < pages.size(); ++k) put(parse_page(pages[k]).packets[0]);
  ogg_stream_clear(&os);
  OggOpusReader r;
  r.push(s.data(), s.size());
  EXPECT_EQ(r.available(), 4u * kFrame);
  EXPECT_EQ(r.errors(), 1u);
  EXPECT_FALSE(r.failed());
}

TEST(OggOpusReader, PcmBacklogCapFailsTheStream) {
  OggOpusWriter w;
  const Bytes stream = write_stream(std::vector<float>(10 * kFrame, 0.1f), w);
  {  // drained as it goes: never fails
    OggOpusReader r(24000, 2 * kFrame);
    std::vector<float> out;
    for (size_t at = 0; at < stream.size(); at += 100) {
      r.push(stream.data() + at, std::min<size_t>(100, stream.size() - at));
      r.read(out);
    }
    EXPECT_FALSE(r.failed());
    EXPECT_EQ(out.size(), 10u * kFrame + 240);
  }
  OggOpusReader r(24000, 5 * kFrame);
  r.push(stream.data(), stream.size());
  EXPECT_TRUE(r.failed());
  EXPECT_NE(r.error().find("decoded samples"), std::string::npos) << r.error();
  EXPECT_EQ(r.available(), 5u * kFrame);
  EXPECT_EQ(r.take(kFrame).size(), static_cast<size_t>(kFrame));
  r.push(stream.data(), stream.size());  // ignored now
  EXPECT_EQ(r.available(), 4u * kFrame);
}

TEST(OggOpusReader, ChainedStreamAndHeaderEdgeCases) {
  OggOpusWriter a, b;
  Bytes s = write_stream(std::vector<float>(3 * kFrame, 0.1f), a);
  append(s, write_stream(std::vector<float>(2 * kFrame, -0.1f), b));
  // An empty EOS page (no segments) is valid and holds nothing.
  append(s, make_ogg_page(b.serial(), b.next_sequence(), b.granule(), kOggEos, {}));
  size_t errors = 0;
  EXPECT_EQ(read_all(s, &errors).size(), 5u * kFrame + 2 * 240);
  EXPECT_EQ(errors, 0u);
  // After our EOS, a new serial is taken even without headers or a BOS flag; before it, not.
  OggOpusWriter d, e;
  std::vector<Bytes> dp;
  write_stream(std::vector<float>(2 * kFrame, 0.2f), d, false, false, &dp);
  Bytes after_eos = s, before_eos = write_stream(std::vector<float>(kFrame, 0.1f), e, false, false);
  for (const auto& p : dp) append(after_eos, p), append(before_eos, p);
  EXPECT_EQ(read_all(after_eos, &errors).size(), 7u * kFrame + 2 * 240);
  EXPECT_EQ(errors, 0u);
  EXPECT_EQ(read_all(before_eos, &errors).size(), 1u * kFrame);
  EXPECT_EQ(errors, 2u);

  // Multistream (mapping family 1, two streams) cannot be decoded here: the stream fails.
  Bytes head = {'O',  'p',  'u', 's', 'H', 'e', 'a', 'd', 1, 3, 0, 0,
                0x80, 0xBB, 0,   0,   0,   0,   1,   2,   1, 0, 1, 2};
  const Bytes ms = make_ogg_page(3, 0, 0, kOggBos, {head});
  OggOpusReader r;
  r.push(ms.data(), ms.size());
  EXPECT_TRUE(r.failed());
  EXPECT_NE(r.error().find("multistream"), std::string::npos);

  // OpusHead with an output gain: applied (-6.02 dB halves the amplitude).
  OggOpusWriter c;
  std::vector<Bytes> pages;
  const std::vector<float> tone = [] {
    std::vector<float> t(4 * kFrame);
    for (size_t i = 0; i < t.size(); ++i) t[i] = 0.5f * std::sin(0.1f * static_cast<float>(i));
    return t;
  }();
  write_stream(tone, c, true, false, &pages);
  OpusHead h = *OpusHead::parse(parse_page(pages[0]).packets[0].data(), 19);
  h.output_gain_q8 = -1541;  // 20 log10(0.5) * 256
  Bytes plain, gained;
  for (size_t k = 0; k < pages.size(); ++k) {
    append(plain, pages[k]);
    append(gained, k == 0 ? make_ogg_page(c.serial(), 0, 0, kOggBos, {h.serialize()}) : pages[k]);
  }
  const std::vector<float> x = read_all(plain), y = read_all(gained);
  ASSERT_EQ(x.size(), y.size());
  for (size_t i = 0; i < x.size(); i += 97) EXPECT_NEAR(y[i], 0.5f * x[i], 1e-3f);
}

TEST(OggOpusReader, MutatedStreamsNeverCrash) {
  // Random damage with CRCs fixed up afterwards, so it reaches packet reassembly and the Opus
  // decoder: flipped flags, sequence numbers, serials and body bytes, dropped and duplicated
  // pages, random chunking. Invariants: bounded buffers, bounded output, no failure.
  const std::vector<float> speech = speech_24k();
  OggOpusWriter w;
  std::vector<Bytes> pages;
  write_stream(std::vector<float>(speech.begin(), speech.begin() + 12 * kFrame), w, true, true,
               &pages);
  std::mt19937 rng(2024);
  for (int trial = 0; trial < 300; ++trial) {
    Bytes s;
    size_t packets = 0;
    for (const Bytes& orig : pages) {
      Bytes p = orig;
      const unsigned dice = rng() % 16;
      if (dice == 0) continue;                                        // dropped
      if (dice == 1) p[5] = static_cast<uint8_t>(rng() % 8);          // flags
      if (dice == 2) p[18] ^= static_cast<uint8_t>(1 + rng() % 255);  // sequence
      if (dice == 3) p[14] ^= 1;                                      // serial
      if (dice >= 4 && dice <= 7) {                                   // body bytes
        const size_t body = 27 + p[26];
        for (int k = 0; k < 1 + static_cast<int>(rng() % 8) && body < p.size(); ++k) {
          p[body + rng() % (p.size() - body)] = static_cast<uint8_t>(rng());
        }
      }
      if (dice <= 7) {
        for (size_t i = 22; i < 26; ++i) p[i] = 0;
        const uint32_t crc = ogg_crc32(p.data(), p.size());
        for (int i = 0; i < 4; ++i) p[22 + i] = static_cast<uint8_t>(crc >> (8 * i));
      }
      if (dice == 8) p.resize(rng() % p.size());  // truncated
      append(s, p);
      ++packets;
      if (dice == 9) append(s, p), ++packets;  // duplicated
    }
    OggOpusReader r;
    for (size_t at = 0; at < s.size();) {
      const size_t n = std::min<size_t>(s.size() - at, 1 + rng() % 500);
      r.push(s.data() + at, n);
      at += n;
      ASSERT_LE(r.buffered_bytes(), kOggMaxPageBytes);
    }
    EXPECT_FALSE(r.failed()) << r.error();
    EXPECT_LE(r.available(), packets * 2880);  // at most 120 ms per packet
  }
}
