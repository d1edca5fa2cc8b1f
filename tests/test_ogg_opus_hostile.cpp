// Ogg Opus reader on damaged and hostile input: garbage, bit flips, truncation, foreign pages,
// oversized packets, memory caps, chained streams, random mutations, and the work budgets that
// make hostile input fail fast (ppx/ogg_opus.h).

#include <gtest/gtest.h>
#include <ogg/ogg.h>
#include <opus.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ctime>
#include <functional>
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
    append(s, make_page(w.serial(), seq++, 0, k == 0 ? kOggBos : 0, {packets[k]}));
    if (k >= 2 && k - 2 < bad.size()) append(s, make_page(w.serial(), seq++, 0, 0, {bad[k - 2]}));
    if (k == 3) append(s, make_page(w.serial() ^ 1, 0, 0, 0, {packets[k]}));  // foreign serial
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
    EXPECT_LT(r.buffered_bytes(), 27u);  // libogg keeps up to a page header's worth to decide
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
  append(s, make_page(b.serial(), b.next_sequence(), b.granule(), kOggEos, {}));
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
  const Bytes ms = make_page(3, 0, 0, kOggBos, {head});
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
    append(gained, k == 0 ? make_page(c.serial(), 0, 0, kOggBos, {h.serialize()}) : pages[k]);
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
      if (dice <= 7) set_crc(p);
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

// ---- Reader: work budgets (cumulative per stream, see the class comment) ----

namespace {

double cpu_seconds() { return static_cast<double>(std::clock()) / CLOCKS_PER_SEC; }

// `s` as our writer's pages, with page k (k in `damage`) damaged by `how`.
Bytes with_damage(const std::vector<Bytes>& pages, const std::vector<size_t>& damage,
                  const std::function<void(Bytes&, size_t)>& how) {
  Bytes s;
  for (size_t k = 0; k < pages.size(); ++k) {
    Bytes p = pages[k];
    if (std::find(damage.begin(), damage.end(), k) != damage.end()) how(p, k);
    append(s, p);
  }
  return s;
}

}  // namespace

TEST(OggOpusReaderBudget, RepeatedFakeHeaderAttackFailsFast) {
  // "OggS" every 7 bytes: each candidate header claims 255 lacing values and ~32 KB of body, so
  // each costs a CRC over ~32 KB to advance 7 bytes. The reader must give up early, on work.
  const char unit[7] = {'O', 'g', 'g', 'S', 0, '\xff', '\xff'};
  Bytes attack(8 << 20);
  for (size_t i = 0; i < attack.size(); ++i) attack[i] = static_cast<uint8_t>(unit[i % 7]);
  {
    OggOpusReader r;
    const double t0 = cpu_seconds();
    size_t consumed = 0;
    double t_fail = 0;
    for (size_t at = 0; at < attack.size(); at += 4096) {
      r.push(attack.data() + at, std::min<size_t>(4096, attack.size() - at));
      if (r.failed() && consumed == 0) consumed = at + 4096, t_fail = cpu_seconds() - t0;
    }
    const double t_all = cpu_seconds() - t0;
    std::printf(
        "fake-header attack: failed after %zu bytes, %.2f ms CPU (all 8 MiB: %.2f ms): %s\n",
        consumed, 1e3 * t_fail, 1e3 * t_all, r.error().c_str());
    ASSERT_TRUE(r.failed());
    EXPECT_EQ(r.error().rfind("bad pages:", 0), 0u) << r.error();
    EXPECT_LE(consumed, 256u * 1024);
    // The work, counted: CRC over at most the allowance plus one candidate page.
    EXPECT_LE(r.bad_page_bytes(), OggOpusReader::kBadPageAllowance + kOggMaxPageBytes);
    EXPECT_LE(r.garbage_bytes(), consumed);
    EXPECT_LT(t_fail, 0.05);
    EXPECT_LT(t_all, 0.2);
    EXPECT_EQ(r.buffered_bytes(), 0u);
  }
  {  // all of it in one push
    OggOpusReader r;
    const double t0 = cpu_seconds();
    r.push(attack.data(), attack.size());
    const double t = cpu_seconds() - t0;
    EXPECT_TRUE(r.failed());
    EXPECT_LT(t, 0.2);
  }
}

TEST(OggOpusReaderBudget, GarbageWithAValidPageEvery900KbFails) {
  // Each run is below the fixed garbage allowance, but the allowance is for the whole stream: a
  // valid page now and then does not reset it.
  OggOpusWriter w;
  std::vector<Bytes> pages;
  write_stream(std::vector<float>(40 * kFrame, 0.1f), w, true, false, &pages);
  std::mt19937 rng(13);
  Bytes noise(900 * 1024);
  OggOpusReader r;
  size_t runs = 0;
  for (size_t k = 2; k < pages.size() && !r.failed(); ++k) {  // headers are optional
    r.push(pages[k].data(), pages[k].size());
    for (auto& b : noise) b = static_cast<uint8_t>('A' + rng() % 26);
    r.push(noise.data(), noise.size());
    ++runs;
  }
  ASSERT_TRUE(r.failed());
  EXPECT_EQ(runs, 2u);
  EXPECT_EQ(r.error().rfind("garbage:", 0), 0u) << r.error();
  EXPECT_GT(r.garbage_bytes(), OggOpusReader::kGarbageAllowance + r.valid_bytes() / 4);
  EXPECT_LE(r.garbage_bytes(), OggOpusReader::kGarbageAllowance + 64 * 1024);
  EXPECT_EQ(r.available(), 2u * kFrame);  // the two audio pages before it
}

TEST(OggOpusReaderBudget, CorruptPagesBetweenValidOnesFailCumulatively) {
  // A large page with a bad CRC after every valid one: each costs a CRC over ~64 KB for nothing.
  OggOpusWriter w;
  std::vector<Bytes> pages;
  write_stream(std::vector<float>(40 * kFrame, 0.1f), w, true, false, &pages);
  Bytes bad = make_page(w.serial() ^ 7, 0, 0, 0, {Bytes(250 * 255 - 1, 0x33)});
  bad[100] ^= 1;
  OggOpusReader r;
  size_t sent = 0;
  for (size_t k = 0; k < pages.size() && !r.failed(); ++k, ++sent) {
    r.push(pages[k].data(), pages[k].size());
    r.push(bad.data(), bad.size());
  }
  ASSERT_TRUE(r.failed());
  EXPECT_EQ(r.error().rfind("bad pages:", 0), 0u) << r.error();
  // 1 MiB of allowance (plus the valid bytes) holds 16 such pages, not 17.
  EXPECT_EQ(sent, 17u);
  EXPECT_EQ(r.available(), 15u * kFrame);  // the audio pages before (pages 0 and 1 are headers)
}

TEST(OggOpusReaderBudget, FloodOfPacketsWithoutAudioFails) {
  // Valid pages, each full of invalid Opus packets (or empty ones): CPU for no audio.
  for (const Bytes& bad : {Bytes{0x03, 0x00}, Bytes{}}) {
    OggOpusReader r;
    uint32_t seq = 0;
    for (int page = 0; page < 400 && !r.failed(); ++page) {
      const Bytes p = make_page(77, seq++, 0, 0, std::vector<Bytes>(200, bad));
      r.push(p.data(), p.size());
    }
    ASSERT_TRUE(r.failed()) << bad.size();
    EXPECT_EQ(r.error().rfind("packets without audio:", 0), 0u) << r.error();
    EXPECT_EQ(r.silent_packets(), OggOpusReader::kSilentPacketAllowance + 1);
    EXPECT_LE(seq, 2u);
  }
}

TEST(OggOpusReaderBudget, RealMinuteOfSpeechWithGlitchesDecodesToTheEnd) {
  // A minute of speech (the sample, repeated) from our writer, with a few flipped bits, truncated
  // pages, lost pages and short garbage runs: it decodes to the end.
  const std::vector<float> once = speech_24k();
  std::vector<float> speech;
  while (speech.size() < 60 * 24000) append(speech, once);
  speech.resize(60 * 24000);
  OggOpusWriter w;
  std::vector<Bytes> pages;
  write_stream(speech, w, true, true, &pages);
  ASSERT_EQ(pages.size(), 2u + 750u + 1u);
  std::mt19937 rng(21);
  const std::vector<size_t> damaged = {40, 41, 200, 333, 500, 640, 700, 749};
  const Bytes s = with_damage(pages, damaged, [&](Bytes& p, size_t k) {
    if (k % 3 == 0) p[27 + p[26] + rng() % (p.size() - 27 - p[26])] ^= 0x20;  // bad CRC
    if (k % 3 == 1) p.resize(p.size() / 3);                                   // truncated
    if (k % 3 == 2) p.clear();                                                // lost
  });
  Bytes dirty;
  for (size_t at = 0; at < s.size(); at += 3000) {  // garbage runs of up to 2000 bytes
    append(dirty, Bytes(s.begin() + static_cast<std::ptrdiff_t>(at),
                        s.begin() + static_cast<std::ptrdiff_t>(std::min(s.size(), at + 3000))));
    if (at % 90000 == 0) {
      for (size_t i = rng() % 2000; i > 0; --i) dirty.push_back(static_cast<uint8_t>(rng()));
    }
  }
  OggOpusReader r;
  std::vector<float> out;
  for (size_t at = 0; at < dirty.size(); at += 1000) {
    r.push(dirty.data() + at, std::min<size_t>(1000, dirty.size() - at));
    r.read(out);
  }
  ASSERT_FALSE(r.failed()) << r.error();
  EXPECT_GE(r.errors(), damaged.size());
  // Every page but the damaged ones, and the ones a garbage run fell into, decoded.
  EXPECT_GE(out.size(), (750u - damaged.size() - 25u) * kFrame);
  EXPECT_LE(out.size(), 750u * kFrame + 240);
  EXPECT_EQ((r.packets() - 1) * kFrame + 240, out.size());  // the last (10 ms) page is there
}
