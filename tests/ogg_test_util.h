// Helpers of the Ogg Opus tests: independent CRC and page parser, stream builders (our writer,
// a test paginator, libogg, a browser-like encoder).
#pragma once

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

namespace ppx::ogg_test {

using Bytes = std::vector<uint8_t>;

inline constexpr int kFrame = 1920;  // 80 ms at 24 kHz

// Ogg CRC one bit at a time, straight from the definition (independent of the table version).
inline uint32_t crc_bitwise(const uint8_t* p, size_t n, uint32_t crc = 0) {
  for (size_t i = 0; i < n; ++i) {
    crc ^= uint32_t{p[i]} << 24;
    for (int b = 0; b < 8; ++b) crc = (crc & 0x80000000u) ? (crc << 1) ^ 0x04C11DB7u : crc << 1;
  }
  return crc;
}

inline uint32_t le32(const uint8_t* p) {
  return p[0] | p[1] << 8 | p[2] << 16 | uint32_t{p[3]} << 24;
}

struct Page {
  uint8_t flags = 0;
  int64_t granule = 0;
  uint32_t serial = 0, seq = 0;
  std::vector<uint8_t> lacing;
  std::vector<Bytes> packets;  // completed on this page (a page here never continues one)
  size_t size = 0;
};

// Strict parse of the page at the start of `b`: structure, bit-by-bit CRC, whole packets.
inline Page parse_page(const Bytes& b, size_t at = 0) {
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

// Sets the CRC of the complete page `p` (header and body contiguous) with libogg.
inline void set_crc(Bytes& p) {
  ogg_page og{p.data(), 27 + p[26], p.data() + 27 + p[26],
              static_cast<long>(p.size() - 27 - p[26])};
  ogg_page_checksum_set(&og);
}

// One Ogg page holding `packets`, each whole and laced (a packet whose size is a multiple of 255
// gets a terminating 0 lacing value), with any flags: for pages our writer does not make (foreign
// serials, empty EOS pages, bad Opus). The CRC is libogg's.
inline Bytes make_page(uint32_t serial, uint32_t seq, int64_t granule, uint8_t flags,
                       const std::vector<Bytes>& packets) {
  Bytes lacing, body;
  for (const auto& p : packets) {
    for (size_t left = p.size(); left >= 255; left -= 255) lacing.push_back(255);
    lacing.push_back(static_cast<uint8_t>(p.size() % 255));
    body.insert(body.end(), p.begin(), p.end());
  }
  EXPECT_LE(lacing.size(), 255u);
  Bytes page = {'O', 'g', 'g', 'S', 0, flags};
  for (int i = 0; i < 8; ++i)
    page.push_back(static_cast<uint8_t>(static_cast<uint64_t>(granule) >> (8 * i)));
  for (uint32_t x : {serial, seq, 0u}) {
    for (int i = 0; i < 4; ++i) page.push_back(static_cast<uint8_t>(x >> (8 * i)));
  }
  page.push_back(static_cast<uint8_t>(lacing.size()));
  page.insert(page.end(), lacing.begin(), lacing.end());
  page.insert(page.end(), body.begin(), body.end());
  set_crc(page);
  return page;
}

template <typename T>
inline void append(std::vector<T>& dst, const std::vector<T>& src) {
  dst.insert(dst.end(), src.begin(), src.end());
}

// The bundled speech sample at 24 kHz.
inline std::vector<float> speech_24k() {
  const Audio a = read_audio(test::data("speech_16k.wav"));
  return resample(take_channel(a, 0), a.sample_rate, 24000);
}

// Whole stream from our writer: headers, one page per frame (last frame zero-padded), finish().
// `pages_out` gets each page separately.
inline Bytes write_stream(const std::vector<float>& pcm, OggOpusWriter& w, bool headers = true,
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

inline size_t frames_of(size_t samples) { return (samples + kFrame - 1) / kFrame; }

inline std::vector<float> read_all(const Bytes& stream, size_t* errors = nullptr) {
  OggOpusReader r;
  r.push(stream.data(), stream.size());
  std::vector<float> out;
  r.read(out);
  if (errors) *errors = r.errors();
  EXPECT_FALSE(r.failed()) << r.error();
  return out;
}

inline ::testing::AssertionResult same_pcm(const std::vector<float>& a,
                                           const std::vector<float>& b) {
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
inline Bytes paginate(const std::vector<Bytes>& packets, const std::vector<int64_t>& granules,
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
inline std::vector<Bytes> libogg_packets(const Bytes& b, std::vector<ogg_int64_t>* granules,
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
inline Bytes browser_stream(const std::vector<float>& pcm, bool headers, size_t* packet_count,
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

}  // namespace ppx::ogg_test
