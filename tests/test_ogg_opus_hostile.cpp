// Ogg Opus reader on damaged and hostile input: garbage, bit flips, truncation, foreign pages,
// oversized packets, memory caps, chained streams, random mutations (ppx/ogg_opus.h).

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
