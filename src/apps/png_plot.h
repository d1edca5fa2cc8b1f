// A minimal raster line plot written as a PNG, for personaplex-bench --sweep: no image library
// (the dependency set is fixed and has no zlib), so the PNG's zlib stream holds stored
// (uncompressed) deflate blocks, with our own CRC-32 and Adler-32. Text is a built-in 5x7 bitmap
// font: digits, lower-case letters (upper case draws as lower case) and a few signs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ppx::app {

struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
  bool operator==(const Rgb& o) const { return r == o.r && g == o.g && b == o.b; }
};

// An 8-bit RGB raster; drawing clips at the edges.
class Image {
 public:
  Image(int width, int height, Rgb background = {255, 255, 255});
  int width() const { return w_; }
  int height() const { return h_; }
  Rgb at(int x, int y) const;
  void set(int x, int y, Rgb c);
  void fill_rect(int x0, int y0, int x1, int y1, Rgb c);  // inclusive corners
  // A line `thickness` pixels wide; dash > 0 draws `dash` pixels on, `dash` off.
  void line(int x0, int y0, int x1, int y1, Rgb c, int thickness = 1, int dash = 0);
  // Text with its top-left corner at (x, y), each font pixel `scale` x `scale`.
  void text(int x, int y, const std::string& s, Rgb c, int scale = 1);
  static int text_width(const std::string& s, int scale = 1);
  static int text_height(int scale = 1) { return 7 * scale; }
  const std::vector<uint8_t>& rgb() const { return px_; }  // row-major, 3 bytes a pixel

 private:
  int w_, h_;
  std::vector<uint8_t> px_;
};

uint32_t crc32(const uint8_t* data, size_t n, uint32_t crc = 0);
uint32_t adler32(const uint8_t* data, size_t n, uint32_t adler = 1);

// The PNG file's bytes (8-bit RGB, no interlace, filter 0 on every row, stored deflate blocks).
std::string encode_png(const Image& img);
// Writes encode_png(img) to `path`; throws ppx::Error when it cannot.
void write_png(const Image& img, const std::string& path);

struct PlotSeries {
  std::string label;
  Rgb color;
  std::vector<double> x, y;  // same length; drawn as a polyline with square markers
};

struct PlotLine {  // a dashed horizontal reference line
  std::string label;
  Rgb color;
  double y = 0;
};

struct PlotSpec {
  std::string title, x_label, y_label;
  std::vector<PlotSeries> series;
  std::vector<PlotLine> lines;
  int width = 900, height = 560;
};

// Axes with ticks and numeric labels (x over the series' range, y from 0 over the series and the
// reference lines), the series, the reference lines, a legend, the title and the axis labels.
Image plot(const PlotSpec& spec);

}  // namespace ppx::app
