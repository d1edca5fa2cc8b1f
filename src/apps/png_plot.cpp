#include "apps/png_plot.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "ppx/error.h"

namespace ppx::app {
namespace {

// 5x7 glyphs, one byte a row from the top, bit 4 the leftmost pixel.
using Glyph = std::array<uint8_t, 7>;

const Glyph* glyph(char ch) {
  static const Glyph kDigits[10] = {
      {0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E}, {0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E},
      {0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F}, {0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E},
      {0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02}, {0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E},
      {0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E}, {0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08},
      {0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E}, {0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C}};
  static const Glyph kLetters[26] = {
      {0x00, 0x00, 0x0E, 0x01, 0x0F, 0x11, 0x0F},  // a
      {0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x1E},  // b
      {0x00, 0x00, 0x0E, 0x10, 0x10, 0x11, 0x0E},  // c
      {0x01, 0x01, 0x0D, 0x13, 0x11, 0x11, 0x0F},  // d
      {0x00, 0x00, 0x0E, 0x11, 0x1F, 0x10, 0x0E},  // e
      {0x06, 0x09, 0x08, 0x1C, 0x08, 0x08, 0x08},  // f
      {0x00, 0x0F, 0x11, 0x11, 0x0F, 0x01, 0x0E},  // g
      {0x10, 0x10, 0x16, 0x19, 0x11, 0x11, 0x11},  // h
      {0x04, 0x00, 0x0C, 0x04, 0x04, 0x04, 0x0E},  // i
      {0x02, 0x00, 0x06, 0x02, 0x02, 0x12, 0x0C},  // j
      {0x10, 0x10, 0x12, 0x14, 0x18, 0x14, 0x12},  // k
      {0x0C, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E},  // l
      {0x00, 0x00, 0x1A, 0x15, 0x15, 0x11, 0x11},  // m
      {0x00, 0x00, 0x16, 0x19, 0x11, 0x11, 0x11},  // n
      {0x00, 0x00, 0x0E, 0x11, 0x11, 0x11, 0x0E},  // o
      {0x00, 0x00, 0x1E, 0x11, 0x1E, 0x10, 0x10},  // p
      {0x00, 0x00, 0x0D, 0x13, 0x0F, 0x01, 0x01},  // q
      {0x00, 0x00, 0x16, 0x19, 0x10, 0x10, 0x10},  // r
      {0x00, 0x00, 0x0E, 0x10, 0x0E, 0x01, 0x1E},  // s
      {0x08, 0x08, 0x1C, 0x08, 0x08, 0x09, 0x06},  // t
      {0x00, 0x00, 0x11, 0x11, 0x11, 0x13, 0x0D},  // u
      {0x00, 0x00, 0x11, 0x11, 0x11, 0x0A, 0x04},  // v
      {0x00, 0x00, 0x11, 0x11, 0x15, 0x15, 0x0A},  // w
      {0x00, 0x00, 0x11, 0x0A, 0x04, 0x0A, 0x11},  // x
      {0x00, 0x00, 0x11, 0x11, 0x0F, 0x01, 0x0E},  // y
      {0x00, 0x00, 0x1F, 0x02, 0x04, 0x08, 0x1F}};  // z
  static const Glyph kSpace = {0, 0, 0, 0, 0, 0, 0};
  static const Glyph kDot = {0, 0, 0, 0, 0, 0x0C, 0x0C};
  static const Glyph kMinus = {0, 0, 0, 0x1F, 0, 0, 0};
  static const Glyph kPlus = {0, 0x04, 0x04, 0x1F, 0x04, 0x04, 0};
  static const Glyph kColon = {0, 0x0C, 0x0C, 0, 0x0C, 0x0C, 0};
  static const Glyph kOpen = {0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02};
  static const Glyph kClose = {0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08};
  static const Glyph kSlash = {0, 0x01, 0x02, 0x04, 0x08, 0x10, 0};
  static const Glyph kComma = {0, 0, 0, 0, 0x0C, 0x04, 0x08};
  static const Glyph kEquals = {0, 0, 0x1F, 0, 0x1F, 0, 0};
  static const Glyph kUnknown = {0x1F, 0x11, 0x11, 0x11, 0x11, 0x11, 0x1F};
  if (ch >= '0' && ch <= '9') return &kDigits[ch - '0'];
  if (ch >= 'a' && ch <= 'z') return &kLetters[ch - 'a'];
  if (ch >= 'A' && ch <= 'Z') return &kLetters[ch - 'A'];
  switch (ch) {
    case ' ': return &kSpace;
    case '.': return &kDot;
    case '-': return &kMinus;
    case '+': return &kPlus;
    case ':': return &kColon;
    case '(': return &kOpen;
    case ')': return &kClose;
    case '/': return &kSlash;
    case ',': return &kComma;
    case '=': return &kEquals;
    default: return &kUnknown;
  }
}

void put_u32(std::string& s, uint32_t v) {
  for (int sh = 24; sh >= 0; sh -= 8) s.push_back(static_cast<char>((v >> sh) & 0xFF));
}

void put_chunk(std::string& png, const char* type, const std::string& data) {
  put_u32(png, static_cast<uint32_t>(data.size()));
  std::string body(type, 4);
  body += data;
  png += body;
  put_u32(png, crc32(reinterpret_cast<const uint8_t*>(body.data()), body.size()));
}

// A "nice" tick step (1, 2 or 5 times a power of ten) giving about `target` ticks over `span`.
double nice_step(double span, int target) {
  const double raw = span / target;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  const double m = raw / p;
  return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

std::string tick_label(double v, double step) {
  char buf[32];
  const int decimals = step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
  std::snprintf(buf, sizeof buf, "%.*f", decimals, std::abs(v) < step * 1e-6 ? 0.0 : v);
  return buf;
}

}  // namespace

Image::Image(int width, int height, Rgb bg) : w_(width), h_(height) {
  if (width < 1 || height < 1 || width > 16384 || height > 16384) throw Error("image size out of range");
  px_.resize(static_cast<size_t>(w_) * h_ * 3);
  for (size_t i = 0; i < px_.size(); i += 3) {
    px_[i] = bg.r;
    px_[i + 1] = bg.g;
    px_[i + 2] = bg.b;
  }
}

Rgb Image::at(int x, int y) const {
  if (x < 0 || y < 0 || x >= w_ || y >= h_) throw Error("pixel outside the image");
  const size_t i = (static_cast<size_t>(y) * w_ + x) * 3;
  return {px_[i], px_[i + 1], px_[i + 2]};
}

void Image::set(int x, int y, Rgb c) {
  if (x < 0 || y < 0 || x >= w_ || y >= h_) return;
  const size_t i = (static_cast<size_t>(y) * w_ + x) * 3;
  px_[i] = c.r;
  px_[i + 1] = c.g;
  px_[i + 2] = c.b;
}

void Image::fill_rect(int x0, int y0, int x1, int y1, Rgb c) {
  if (x0 > x1) std::swap(x0, x1);
  if (y0 > y1) std::swap(y0, y1);
  for (int y = std::max(y0, 0); y <= std::min(y1, h_ - 1); ++y)
    for (int x = std::max(x0, 0); x <= std::min(x1, w_ - 1); ++x) set(x, y, c);
}

void Image::line(int x0, int y0, int x1, int y1, Rgb c, int thickness, int dash) {
  // Bresenham; each point a square of `thickness` pixels, so that steep and shallow segments look
  // equally wide.
  const int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0);
  const int sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
  const int lo = -(thickness - 1) / 2, hi = thickness / 2;
  int err = dx + dy;
  for (int n = 0;; ++n) {
    if (dash <= 0 || (n / dash) % 2 == 0) fill_rect(x0 + lo, y0 + lo, x0 + hi, y0 + hi, c);
    if (x0 == x1 && y0 == y1) break;
    const int e2 = 2 * err;
    if (e2 >= dy) {
      err += dy;
      x0 += sx;
    }
    if (e2 <= dx) {
      err += dx;
      y0 += sy;
    }
  }
}

int Image::text_width(const std::string& s, int scale) {
  return s.empty() ? 0 : static_cast<int>(s.size()) * 6 * scale - scale;
}

void Image::text(int x, int y, const std::string& s, Rgb c, int scale) {
  for (size_t k = 0; k < s.size(); ++k) {
    const Glyph& g = *glyph(s[k]);
    const int gx = x + static_cast<int>(k) * 6 * scale;
    for (int row = 0; row < 7; ++row)
      for (int col = 0; col < 5; ++col)
        if (g[row] & (0x10 >> col))
          fill_rect(gx + col * scale, y + row * scale, gx + col * scale + scale - 1, y + row * scale + scale - 1, c);
  }
}

uint32_t crc32(const uint8_t* data, size_t n, uint32_t crc) {
  // The PNG/zlib CRC (reflected polynomial 0xEDB88320), one table built on first use.
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ data[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

uint32_t adler32(const uint8_t* data, size_t n, uint32_t adler) {
  uint32_t a = adler & 0xFFFF, b = adler >> 16;
  for (size_t i = 0; i < n; ++i) {
    a = (a + data[i]) % 65521;
    b = (b + a) % 65521;
  }
  return (b << 16) | a;
}

std::string encode_png(const Image& img) {
  const int w = img.width(), h = img.height();
  // The filtered scanlines: filter type 0 (none) and the row's RGB bytes.
  std::vector<uint8_t> raw;
  raw.reserve(static_cast<size_t>(h) * (1 + 3 * static_cast<size_t>(w)));
  for (int y = 0; y < h; ++y) {
    raw.push_back(0);
    const auto row = img.rgb().begin() + static_cast<ptrdiff_t>(y) * w * 3;
    raw.insert(raw.end(), row, row + static_cast<ptrdiff_t>(w) * 3);
  }
  // zlib: CMF 0x78 (deflate, 32K window) and FLG 0x01 (check bits: 0x7801 % 31 == 0), stored
  // blocks of at most 65535 bytes (header BFINAL + BTYPE 00, LEN and its complement, little
  // endian), the Adler-32 of the data (big endian).
  std::string z = {'\x78', '\x01'};
  size_t at = 0;
  do {
    const size_t n = std::min<size_t>(65535, raw.size() - at);
    const bool last = at + n == raw.size();
    z.push_back(last ? 1 : 0);
    z.push_back(static_cast<char>(n & 0xFF));
    z.push_back(static_cast<char>(n >> 8));
    z.push_back(static_cast<char>(~n & 0xFF));
    z.push_back(static_cast<char>((~n >> 8) & 0xFF));
    z.append(reinterpret_cast<const char*>(raw.data()) + at, n);
    at += n;
  } while (at < raw.size());
  put_u32(z, adler32(raw.data(), raw.size()));

  std::string png = "\x89PNG\r\n\x1a\n";
  std::string ihdr;
  put_u32(ihdr, static_cast<uint32_t>(w));
  put_u32(ihdr, static_cast<uint32_t>(h));
  ihdr += {'\x08', '\x02', '\x00', '\x00', '\x00'};  // 8 bits, RGB, deflate, filter 0, no interlace
  put_chunk(png, "IHDR", ihdr);
  put_chunk(png, "IDAT", z);
  put_chunk(png, "IEND", "");
  return png;
}

void write_png(const Image& img, const std::string& path) {
  const std::string bytes = encode_png(img);
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw Error("cannot write '" + path + "'");
}

Image plot(const PlotSpec& spec) {
  Image img(spec.width, spec.height);
  const Rgb ink{0, 0, 0}, grid{225, 225, 225};
  const int scale = 2, th = Image::text_height(scale);
  const int left = 90, right = 24, top = 50, bottom = 70;
  const int x0 = left, x1 = spec.width - right, y0 = spec.height - bottom, y1 = top;  // plot area
  if (x1 - x0 < 50 || y0 - y1 < 50) throw Error("plot: image too small");

  double xmin = INFINITY, xmax = -INFINITY, ymax = 0;
  for (const PlotSeries& s : spec.series) {
    for (double v : s.x) {
      xmin = std::min(xmin, v);
      xmax = std::max(xmax, v);
    }
    for (double v : s.y)
      if (std::isfinite(v)) ymax = std::max(ymax, v);
  }
  for (const PlotLine& l : spec.lines) ymax = std::max(ymax, l.y);
  if (!std::isfinite(xmin)) xmin = 0, xmax = 1;
  if (xmax <= xmin) xmin -= 1, xmax += 1;
  if (ymax <= 0) ymax = 1;
  const double ystep = nice_step(ymax * 1.08, 6);
  const double ytop = std::ceil(ymax * 1.08 / ystep) * ystep;
  const double xstep = std::max(nice_step(xmax - xmin, 8), xmax - xmin >= 1 ? 1.0 : 0.0);
  auto px = [&](double v) { return x0 + static_cast<int>(std::lround((v - xmin) / (xmax - xmin) * (x1 - x0))); };
  auto py = [&](double v) { return y0 - static_cast<int>(std::lround(v / ytop * (y0 - y1))); };

  // Grid and ticks with their labels.
  for (double v = 0; v <= ytop + ystep * 1e-6; v += ystep) {
    const int y = py(v);
    img.line(x0, y, x1, y, grid);
    img.line(x0 - 6, y, x0, y, ink);
    const std::string t = tick_label(v, ystep);
    img.text(x0 - 10 - Image::text_width(t, scale), y - th / 2, t, ink, scale);
  }
  for (double v = std::ceil(xmin / xstep) * xstep; v <= xmax + xstep * 1e-6; v += xstep) {
    const int x = px(v);
    img.line(x, y0, x, y1, grid);
    img.line(x, y0, x, y0 + 6, ink);
    const std::string t = tick_label(v, xstep);
    img.text(x - Image::text_width(t, scale) / 2, y0 + 12, t, ink, scale);
  }
  img.line(x0, y0, x1, y0, ink, 2);
  img.line(x0, y0, x0, y1, ink, 2);

  for (const PlotLine& l : spec.lines) img.line(x0, py(l.y), x1, py(l.y), l.color, 2, 8);
  for (const PlotSeries& s : spec.series) {
    const size_t n = std::min(s.x.size(), s.y.size());
    for (size_t i = 0; i + 1 < n; ++i) img.line(px(s.x[i]), py(s.y[i]), px(s.x[i + 1]), py(s.y[i + 1]), s.color, 3);
    for (size_t i = 0; i < n; ++i) img.fill_rect(px(s.x[i]) - 4, py(s.y[i]) - 4, px(s.x[i]) + 4, py(s.y[i]) + 4, s.color);
  }

  // Legend at the plot's top left, on white so that grid lines do not cross it.
  int ly = y1 + 10, lw = 0, entries = 0;
  for (const PlotSeries& s : spec.series) lw = std::max(lw, Image::text_width(s.label, scale)), ++entries;
  for (const PlotLine& l : spec.lines) lw = std::max(lw, Image::text_width(l.label, scale)), ++entries;
  if (entries > 0) {
    img.fill_rect(x0 + 8, ly - 6, x0 + 8 + 48 + lw + 12, ly - 6 + entries * (th + 8) + 4, {255, 255, 255});
    auto entry = [&](const std::string& label, Rgb c, int dash) {
      img.line(x0 + 16, ly + th / 2, x0 + 48, ly + th / 2, c, 3, dash);
      if (dash == 0) img.fill_rect(x0 + 28, ly + th / 2 - 4, x0 + 36, ly + th / 2 + 4, c);
      img.text(x0 + 56, ly, label, ink, scale);
      ly += th + 8;
    };
    for (const PlotSeries& s : spec.series) entry(s.label, s.color, 0);
    for (const PlotLine& l : spec.lines) entry(l.label, l.color, 8);
  }

  img.text((spec.width - Image::text_width(spec.title, scale)) / 2, 14, spec.title, ink, scale);
  img.text((x0 + x1 - Image::text_width(spec.x_label, scale)) / 2, spec.height - 8 - th, spec.x_label, ink, scale);
  img.text(8, y1 - th - 6, spec.y_label, ink, scale);  // above the y axis, read horizontally
  return img;
}

}  // namespace ppx::app
