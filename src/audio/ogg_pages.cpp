// Ogg pages (RFC 3533) and the Opus header packets (RFC 7845 §5): CRC, page building, OpusHead
// and OpusTags.

#include <algorithm>
#include <array>
#include <cstring>

#include "ppx/error.h"
#include "ppx/ogg_opus.h"

namespace ppx {

namespace {

constexpr std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t r = i << 24;
    for (int b = 0; b < 8; ++b) r = (r & 0x80000000u) ? (r << 1) ^ 0x04C11DB7u : r << 1;
    t[i] = r;
  }
  return t;
}

constexpr std::array<uint32_t, 256> kCrcTable = make_crc_table();

void put_u16(std::vector<uint8_t>& v, uint32_t x) {
  v.push_back(static_cast<uint8_t>(x));
  v.push_back(static_cast<uint8_t>(x >> 8));
}

void put_u32(std::vector<uint8_t>& v, uint32_t x) {
  put_u16(v, x & 0xFFFF);
  put_u16(v, x >> 16);
}

uint32_t get_u32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

}  // namespace

uint32_t ogg_crc32(const uint8_t* data, size_t n, uint32_t crc) {
  for (size_t i = 0; i < n; ++i) crc = (crc << 8) ^ kCrcTable[((crc >> 24) ^ data[i]) & 0xFF];
  return crc;
}

std::vector<uint8_t> make_ogg_page(uint32_t serial, uint32_t sequence, int64_t granule,
                                   uint8_t header_type,
                                   const std::vector<std::vector<uint8_t>>& packets) {
  std::vector<uint8_t> lacing;
  size_t body = 0;
  for (const auto& p : packets) {
    for (size_t left = p.size(); left >= 255; left -= 255) lacing.push_back(255);
    lacing.push_back(static_cast<uint8_t>(p.size() % 255));
    body += p.size();
  }
  if (lacing.size() > 255) {
    throw Error("Ogg page: packets of " + std::to_string(body) + " bytes need " +
                std::to_string(lacing.size()) + " lacing values (at most 255)");
  }
  std::vector<uint8_t> page(27 + lacing.size() + body);
  uint8_t* h = page.data();
  std::memcpy(h, "OggS", 4);
  h[4] = 0;  // stream structure version
  h[5] = header_type;
  const auto g = static_cast<uint64_t>(granule);
  for (int i = 0; i < 8; ++i) h[6 + i] = static_cast<uint8_t>(g >> (8 * i));
  for (int i = 0; i < 4; ++i) h[14 + i] = static_cast<uint8_t>(serial >> (8 * i));
  for (int i = 0; i < 4; ++i) h[18 + i] = static_cast<uint8_t>(sequence >> (8 * i));
  // h[22..25]: CRC, computed over the page with this field zero
  h[26] = static_cast<uint8_t>(lacing.size());
  uint8_t* d = std::copy(lacing.begin(), lacing.end(), h + 27);
  for (const auto& p : packets) d = std::copy(p.begin(), p.end(), d);
  const uint32_t crc = ogg_crc32(page.data(), page.size());
  for (int i = 0; i < 4; ++i) page[22 + i] = static_cast<uint8_t>(crc >> (8 * i));
  return page;
}

std::vector<uint8_t> OpusHead::serialize() const {
  if (mapping_family != 0) throw Error("OpusHead: only channel mapping family 0 is written");
  std::vector<uint8_t> v = {'O', 'p', 'u', 's', 'H', 'e', 'a', 'd'};
  v.push_back(static_cast<uint8_t>(version));
  v.push_back(static_cast<uint8_t>(channels));
  put_u16(v, static_cast<uint32_t>(pre_skip));
  put_u32(v, input_sample_rate);
  put_u16(v, static_cast<uint16_t>(static_cast<int16_t>(output_gain_q8)));
  v.push_back(0);  // mapping family 0: no mapping table
  return v;
}

std::optional<OpusHead> OpusHead::parse(const uint8_t* data, size_t n) {
  if (n < 19 || std::memcmp(data, "OpusHead", 8) != 0) return std::nullopt;
  OpusHead h;
  h.version = data[8];
  if (h.version >> 4 != 0) return std::nullopt;  // incompatible major version
  h.channels = data[9];
  h.pre_skip = data[10] | data[11] << 8;
  h.input_sample_rate = get_u32(data + 12);
  h.output_gain_q8 = static_cast<int16_t>(static_cast<uint16_t>(data[16] | data[17] << 8));
  h.mapping_family = data[18];
  h.stream_count = 1;
  if (h.mapping_family != 0) {
    // Mapping table: stream count, coupled count, one byte per channel.
    if (n < 21 + static_cast<size_t>(h.channels)) return std::nullopt;
    h.stream_count = data[19];
  }
  return h;
}

std::vector<uint8_t> make_opus_tags(const std::string& vendor) {
  std::vector<uint8_t> v = {'O', 'p', 'u', 's', 'T', 'a', 'g', 's'};
  put_u32(v, static_cast<uint32_t>(vendor.size()));
  v.insert(v.end(), vendor.begin(), vendor.end());
  put_u32(v, 0);  // no user comments
  return v;
}

}  // namespace ppx
