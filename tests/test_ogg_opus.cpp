// Ogg Opus writer and reader (ppx/ogg_opus.h). The checks on our pages use routines written here
// independently of the library (a bit-by-bit CRC, a strict page parser) and libogg; the reader is
// fed streams laid out by libogg and by a test paginator as well as by our own writer.

#include <gtest/gtest.h>
#include <ogg/ogg.h>
#include <opus.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ogg_test_util.h"
#include "ppx/audio.h"
#include "ppx/error.h"
#include "ppx/ogg_opus.h"
#include "test_util.h"

using namespace ppx;
using namespace ppx::ogg_test;

// ---- CRC and pages ----

TEST(OggCrc, LiboggChecksumMatchesDefinitionAndCheckValue) {
  // Ogg's CRC-32: poly 0x04C11DB7, init 0, no reflection, no xor-out; check value of "123456789".
  const char* check = "123456789";
  EXPECT_EQ(crc_bitwise(reinterpret_cast<const uint8_t*>(check), 9), 0x89A1897Fu);
  // libogg's checksum (which the reader and writer rely on) is that CRC over the page with the
  // CRC field zeroed, for pages of any size.
  std::mt19937 rng(3);
  for (size_t n : {0u, 1u, 7u, 255u, 1000u, 60000u}) {
    Bytes body(n);
    for (auto& x : body) x = static_cast<uint8_t>(rng());
    const Bytes page = make_page(rng(), rng(), static_cast<int64_t>(rng()), 0, {body});
    Bytes zeroed = page;
    for (size_t i = 22; i < 26; ++i) zeroed[i] = 0;
    EXPECT_EQ(le32(page.data() + 22), crc_bitwise(zeroed.data(), zeroed.size())) << n;
  }
}

TEST(OggPages, TestPageBuilderLacesLikeLibogg) {
  // make_page (the tests' builder for pages our writer does not make) lays packets out exactly as
  // libogg's ogg_stream_flush does, 255-multiples terminated by a 0 lacing value.
  const std::vector<Bytes> packets = {Bytes(10, 1), Bytes(255, 2), Bytes(0), Bytes(600, 3)};
  const Bytes page = make_page(77, 0, 123456789012, 0, packets);
  const Page pg = parse_page(page);
  EXPECT_EQ(pg.size, page.size());
  EXPECT_EQ(pg.lacing, (std::vector<uint8_t>{10, 255, 0, 0, 255, 255, 90}));
  EXPECT_EQ(pg.packets, packets);
  EXPECT_EQ(pg.granule, 123456789012);
  EXPECT_EQ(pg.serial, 77u);
  EXPECT_EQ(pg.seq, 0u);
  ogg_stream_state os;
  ogg_stream_init(&os, 77);
  for (size_t k = 0; k < packets.size(); ++k) {
    ogg_packet op{};
    op.packet = const_cast<unsigned char*>(packets[k].data());
    op.bytes = static_cast<long>(packets[k].size());
    op.granulepos = 123456789012;
    op.packetno = static_cast<ogg_int64_t>(k);
    ogg_stream_packetin(&os, &op);
  }
  ogg_page og;
  os.b_o_s = 1;  // not a first page: no BOS flag and libogg does not cut after the first packet
  ASSERT_EQ(ogg_stream_flush(&os, &og), 1);
  Bytes libogg(og.header, og.header + og.header_len);
  libogg.insert(libogg.end(), og.body, og.body + og.body_len);
  EXPECT_EQ(libogg, page);
  ogg_stream_clear(&os);
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

  // The same packets on pages made by the tests' make_page decode to the same samples.
  Bytes ours = make_page(5, 0, 0, kOggBos, {OpusHead{}.serialize()});
  for (size_t k = 0; k < raw.size(); k += 2) {
    std::vector<Bytes> two(raw.begin() + static_cast<std::ptrdiff_t>(k),
                           raw.begin() + static_cast<std::ptrdiff_t>(std::min(k + 2, raw.size())));
    append(ours, make_page(5, static_cast<uint32_t>(1 + k / 2), int64_t{960} * (k + 2), 0, two));
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
