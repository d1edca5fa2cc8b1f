#include "server/http_util.h"

#include <algorithm>
#include <filesystem>
#include <system_error>

namespace ppx::server {

namespace fs = std::filesystem;

namespace {
int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

std::string url_decode(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '+') {
      out += ' ';
    } else if (s[i] == '%' && i + 2 < s.size() && hex_value(s[i + 1]) >= 0 &&
               hex_value(s[i + 2]) >= 0) {
      out += static_cast<char>(hex_value(s[i + 1]) * 16 + hex_value(s[i + 2]));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

std::map<std::string, std::string> parse_query(const std::string& query) {
  std::map<std::string, std::string> out;
  size_t pos = 0;
  while (pos <= query.size()) {
    size_t amp = query.find('&', pos);
    if (amp == std::string::npos) amp = query.size();
    const std::string part = query.substr(pos, amp - pos);
    if (!part.empty()) {
      const size_t eq = part.find('=');
      if (eq == std::string::npos)
        out[url_decode(part)] = "";
      else
        out[url_decode(part.substr(0, eq))] = url_decode(part.substr(eq + 1));
    }
    pos = amp + 1;
  }
  return out;
}

bool is_valid_utf8(const std::string& s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    int len = 0;
    uint32_t cp = 0, min = 0;
    if ((c & 0xE0) == 0xC0)
      len = 2, cp = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0)
      len = 3, cp = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0)
      len = 4, cp = c & 0x07, min = 0x10000;
    else
      return false;
    if (i + static_cast<size_t>(len) > n) return false;
    for (int k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += static_cast<size_t>(len);
  }
  return true;
}

std::vector<std::string> list_voices(const std::string& dir) {
  std::vector<std::string> out;
  if (dir.empty()) return out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::file_status st = it->symlink_status(ec);
    if (ec || !fs::is_regular_file(st)) continue;
    const std::string name = it->path().filename().string();
    // A name that is not UTF-8 cannot be listed in JSON nor asked for by a client: skipped.
    if ((ends_with(name, ".pt") || ends_with(name, ".wav")) && is_valid_utf8(name))
      out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::optional<std::string> resolve_voice(const std::string& dir, const std::string& name) {
  if (name.empty() || name.find('/') != std::string::npos || name.find('\\') != std::string::npos ||
      name == "." || name == "..")
    return std::nullopt;
  const auto voices = list_voices(dir);
  if (!std::binary_search(voices.begin(), voices.end(), name)) return std::nullopt;
  return (fs::path(dir) / name).string();
}

std::optional<std::string> resolve_static(const std::string& root, const std::string& target) {
  if (root.empty()) return std::nullopt;
  std::string path = url_decode(target.substr(0, target.find('?')));
  if (path.empty() || path[0] != '/' || path.find('\0') != std::string::npos) return std::nullopt;
  if (path.back() == '/') path += "index.html";
  // Refuse any ".." segment outright, then check the resolved file is still under root.
  for (size_t pos = 0; pos < path.size();) {
    size_t next = path.find('/', pos);
    if (next == std::string::npos) next = path.size();
    const std::string seg = path.substr(pos, next - pos);
    if (seg == ".." || seg.find('\\') != std::string::npos) return std::nullopt;
    pos = next + 1;
  }
  std::error_code ec;
  const fs::path base = fs::canonical(root, ec);
  if (ec) return std::nullopt;
  const fs::path file = fs::canonical(base / path.substr(1), ec);
  if (ec || !fs::is_regular_file(file, ec)) return std::nullopt;
  const std::string b = base.string() + "/", f = file.string();
  if (f.compare(0, b.size(), b) != 0) return std::nullopt;
  return f;
}

std::string content_type(const std::string& path) {
  static const std::pair<const char*, const char*> types[] = {{".html", "text/html; charset=utf-8"},
                                                              {".js", "text/javascript"},
                                                              {".mjs", "text/javascript"},
                                                              {".css", "text/css"},
                                                              {".json", "application/json"},
                                                              {".wasm", "application/wasm"},
                                                              {".svg", "image/svg+xml"},
                                                              {".png", "image/png"},
                                                              {".ico", "image/x-icon"},
                                                              {".txt", "text/plain; charset=utf-8"},
                                                              {".wav", "audio/wav"},
                                                              {".jpg", "image/jpeg"}};
  for (const auto& [ext, type] : types)
    if (ends_with(path, ext)) return type;
  return "application/octet-stream";
}

bool valid_websocket_key(std::string_view key) {
  static constexpr std::string_view kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  if (key.size() != 24 || key.substr(22) != "==") return false;
  for (size_t i = 0; i < 22; ++i) {
    const size_t v = kAlphabet.find(key[i]);
    if (v == std::string_view::npos) return false;
    if (i == 21 && (v & 0xf) != 0) return false;  // 16 bytes = 128 bits: the last character holds 2
  }
  return true;
}

std::vector<std::string> websocket_protocols(std::string_view header) {
  std::vector<std::string> out;
  while (!header.empty()) {
    const size_t comma = header.find(',');
    std::string_view t = header.substr(0, comma);
    header = comma == std::string_view::npos ? std::string_view() : header.substr(comma + 1);
    while (!t.empty() && (t.front() == ' ' || t.front() == '\t')) t.remove_prefix(1);
    while (!t.empty() && (t.back() == ' ' || t.back() == '\t')) t.remove_suffix(1);
    if (!t.empty()) out.emplace_back(t);
  }
  return out;
}

}  // namespace ppx::server
