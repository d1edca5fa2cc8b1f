// The PNG writer of personaplex-bench --sweep (src/apps/png_plot.h), read back by a decoder written
// here: the signature, every chunk's CRC, the zlib stream's stored blocks and Adler-32, the image
// size, and the colour of pixels that were drawn.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "apps/png_plot.h"
#include "test_util.h"

namespace {

using ppx::app::Image;
using ppx::app::Rgb;

uint32_t be32(const std::string& s, size_t at) {
  return (uint32_t(uint8_t(s[at])) << 24) | (uint32_t(uint8_t(s[at + 1])) << 16) |
         (uint32_t(uint8_t(s[at + 2])) << 8) | uint32_t(uint8_t(s[at + 3]));
}

struct Decoded {
  uint32_t width = 0, height = 0;
  std::vector<uint8_t> raw;  // the inflated scanlines (filter byte + RGB per row)
  Rgb pixel(int x, int y) const {
    const size_t i = static_cast<size_t>(y) * (1 + 3 * width) + 1 + 3 * static_cast<size_t>(x);
    return {raw[i], raw[i + 1], raw[i + 2]};
  }
};

// Parses the file; every check a failure of the test. Only stored deflate blocks are accepted.
Decoded decode(const std::string& png) {
  Decoded d;
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  std::string idat;
  std::vector<std::string> types;
  for (size_t at = 8; at + 12 <= png.size();) {
    const uint32_t len = be32(png, at);
    const std::string type = png.substr(at + 4, 4);
    types.push_back(type);
    EXPECT_LE(at + 12 + len, png.size());
    const uint32_t crc = ppx::app::crc32(reinterpret_cast<const uint8_t*>(png.data()) + at + 4, 4 + len);
    EXPECT_EQ(crc, be32(png, at + 8 + len)) << "chunk " << type;
    const std::string data = png.substr(at + 8, len);
    if (type == "IHDR") {
      d.width = be32(data, 0);
      d.height = be32(data, 4);
      EXPECT_EQ(data.substr(8), std::string("\x08\x02\x00\x00\x00", 5));
    }
    if (type == "IDAT") idat += data;
    at += 12 + len;
  }
  EXPECT_EQ(types, (std::vector<std::string>{"IHDR", "IDAT", "IEND"}));
  // zlib header, then stored blocks until BFINAL, then the Adler-32.
  EXPECT_EQ((uint8_t(idat[0]) * 256 + uint8_t(idat[1])) % 31, 0);
  EXPECT_EQ(uint8_t(idat[0]) & 0x0F, 8);  // deflate
  size_t at = 2;
  for (bool last = false; !last;) {
    const uint8_t head = uint8_t(idat[at]);
    last = head & 1;
    EXPECT_EQ(head >> 1, 0) << "not a stored block";
    const uint16_t len = uint16_t(uint8_t(idat[at + 1]) | uint8_t(idat[at + 2]) << 8);
    const uint16_t nlen = uint16_t(uint8_t(idat[at + 3]) | uint8_t(idat[at + 4]) << 8);
    EXPECT_EQ(uint16_t(~len), nlen);
    d.raw.insert(d.raw.end(), idat.begin() + at + 5, idat.begin() + at + 5 + len);
    at += 5 + len;
  }
  EXPECT_EQ(be32(idat, at), ppx::app::adler32(d.raw.data(), d.raw.size()));
  EXPECT_EQ(at + 4, idat.size());
  return d;
}

TEST(PngPlot, ChecksumsMatchTheirReferences) {
  const std::string s = "123456789";
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  EXPECT_EQ(ppx::app::crc32(p, s.size()), 0xCBF43926u);  // the standard check value
  EXPECT_EQ(ppx::app::adler32(reinterpret_cast<const uint8_t*>("Wikipedia"), 9), 0x11E60398u);
  // Incremental use gives the same result.
  EXPECT_EQ(ppx::app::crc32(p + 4, 5, ppx::app::crc32(p, 4)), 0xCBF43926u);
}

TEST(PngPlot, EncodesAnImageThatDecodesToItsPixels) {
  // Wide enough that the scanlines span several stored blocks (300 x 3 + 1 bytes a row, 120 rows).
  Image img(300, 120, {10, 20, 30});
  img.fill_rect(5, 6, 9, 8, {200, 100, 50});
  img.set(299, 119, {1, 2, 3});
  img.line(0, 100, 299, 100, {0, 255, 0}, 1);
  const Decoded d = decode(ppx::app::encode_png(img));
  EXPECT_EQ(d.width, 300u);
  EXPECT_EQ(d.height, 120u);
  ASSERT_EQ(d.raw.size(), 120u * (1 + 3 * 300));
  for (uint32_t y = 0; y < d.height; ++y) EXPECT_EQ(d.raw[y * (1 + 3 * 300)], 0) << "filter of row " << y;
  EXPECT_EQ(d.pixel(7, 7), (Rgb{200, 100, 50}));
  EXPECT_EQ(d.pixel(4, 7), (Rgb{10, 20, 30}));
  EXPECT_EQ(d.pixel(299, 119), (Rgb{1, 2, 3}));
  EXPECT_EQ(d.pixel(150, 100), (Rgb{0, 255, 0}));
}

TEST(PngPlot, TextUsesTheBitmapFont) {
  Image img(40, 20);
  img.text(2, 3, "1", {0, 0, 0}, 1);
  // '1': rows 0x04, 0x0C, 0x04, ..., 0x0E: its stem is column 2, its foot spans columns 1..3.
  EXPECT_EQ(img.at(2 + 2, 3), (Rgb{0, 0, 0}));
  EXPECT_EQ(img.at(2 + 0, 3), (Rgb{255, 255, 255}));
  EXPECT_EQ(img.at(2 + 1, 3 + 6), (Rgb{0, 0, 0}));
  EXPECT_EQ(img.at(2 + 3, 3 + 6), (Rgb{0, 0, 0}));
  EXPECT_EQ(Image::text_width("12.5", 2), 4 * 12 - 2);
}

TEST(PngPlot, PlotDrawsSeriesAndReferenceLinesIntoAFile) {
  ppx::app::PlotSpec spec;
  spec.title = "p99 against sessions";
  spec.x_label = "sessions";
  spec.y_label = "ms";
  const Rgb red{220, 40, 40}, blue{40, 80, 220}, grey{120, 120, 120};
  spec.series = {{"added latency p99", red, {1, 2, 4, 8}, {10, 12, 20, 45}},
                 {"step p99", blue, {1, 2, 4, 8}, {5, 6, 9, 20}}};
  spec.lines = {{"80 ms frame", grey, 80}, {"160 ms budget", grey, 160}};
  const Image img = ppx::app::plot(spec);
  const std::string path = ppx::test::scratch("png_plot_test.png");
  ppx::app::write_png(img, path);
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  const Decoded d = decode(ss.str());
  ASSERT_EQ(d.width, static_cast<uint32_t>(spec.width));
  ASSERT_EQ(d.height, static_cast<uint32_t>(spec.height));
  size_t reds = 0, blues = 0, greys = 0;
  for (uint32_t y = 0; y < d.height; ++y)
    for (uint32_t x = 0; x < d.width; ++x) {
      const Rgb c = d.pixel(static_cast<int>(x), static_cast<int>(y));
      reds += c == red;
      blues += c == blue;
      greys += c == grey;
      EXPECT_EQ(c, img.at(static_cast<int>(x), static_cast<int>(y)));
    }
  // Three segments and four markers each, two dashed lines across the plot.
  EXPECT_GT(reds, 500u);
  EXPECT_GT(blues, 500u);
  EXPECT_GT(greys, 500u);
}

}  // namespace
