// The Opus header packets (RFC 7845 §5): OpusHead and OpusTags. Ogg pages themselves (framing,
// CRC) are libogg's: see ogg_opus_reader.cpp and the writer in opus_codec.cpp.

#include <algorithm>
#include <cstring>

#include "ppx/error.h"
#include "ppx/ogg_opus.h"

namespace ppx {

namespace {

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
