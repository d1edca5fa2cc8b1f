// SentencePiece wrapper and upstream's system-prompt wrapping.

#include "ppx/tokenizer.h"

#include <sentencepiece_processor.h>

#include <filesystem>
#include <string_view>
#include <utility>

#include "ppx/error.h"

namespace ppx {

struct TextTokenizer::Impl {
  sentencepiece::SentencePieceProcessor sp;
};

TextTokenizer::TextTokenizer(const std::string& model_path)
    : impl_(std::make_unique<Impl>()), path_(model_path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(model_path, ec)) {
    throw Error("tokenizer model '" + model_path +
                (std::filesystem::exists(model_path, ec) ? "' is not a file" : "': no such file"));
  }
  const auto status = impl_->sp.Load(model_path);
  if (!status.ok()) {
    throw Error("tokenizer model '" + model_path + "' is not a SentencePiece model (" + status.ToString() + ")");
  }
  if (impl_->sp.GetPieceSize() <= 0) {
    throw Error("tokenizer model '" + model_path + "': no pieces");
  }
}

TextTokenizer::TextTokenizer(std::unique_ptr<Impl> impl, std::string name)
    : impl_(std::move(impl)), path_(std::move(name)) {}

TextTokenizer TextTokenizer::from_serialized(const std::string& bytes, const std::string& name) {
  auto impl = std::make_unique<Impl>();
  if (bytes.empty()) throw Error("tokenizer model '" + name + "': empty");
  const auto status = impl->sp.LoadFromSerializedProto(bytes);
  if (!status.ok()) throw Error("tokenizer model '" + name + "': " + status.ToString());
  if (impl->sp.GetPieceSize() <= 0) throw Error("tokenizer model '" + name + "': no pieces");
  return TextTokenizer(std::move(impl), name);
}

TextTokenizer::~TextTokenizer() = default;
TextTokenizer::TextTokenizer(TextTokenizer&&) noexcept = default;
TextTokenizer& TextTokenizer::operator=(TextTokenizer&&) noexcept = default;

std::vector<int> TextTokenizer::encode(const std::string& text) const {
  std::vector<int> ids;
  const auto status = impl_->sp.Encode(text, &ids);
  if (!status.ok()) throw Error("tokenizer '" + path_ + "': encode failed: " + status.ToString());
  return ids;
}

std::string TextTokenizer::id_to_piece(int id) const {
  if (id < 0 || id >= vocab_size()) {
    throw Error("tokenizer '" + path_ + "': id " + std::to_string(id) + " outside [0, " +
                std::to_string(vocab_size()) + ")");
  }
  return impl_->sp.IdToPiece(id);
}

int TextTokenizer::vocab_size() const { return impl_->sp.GetPieceSize(); }

namespace {

// Decodes the UTF-8 code point starting at s[i] (length in *len); invalid bytes decode as
// themselves with length 1, which are never whitespace.
char32_t decode_at(std::string_view s, size_t i, size_t* len) {
  const auto b = static_cast<unsigned char>(s[i]);
  size_t n = b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : (b >> 3) == 0x1E ? 4 : 0;
  if (n == 0 || i + n > s.size()) {
    *len = 1;
    return 0xFFFD;
  }
  char32_t cp = n == 1 ? b : n == 2 ? (b & 0x1F) : n == 3 ? (b & 0x0F) : (b & 0x07);
  for (size_t k = 1; k < n; ++k) {
    const auto c = static_cast<unsigned char>(s[i + k]);
    if ((c >> 6) != 0x2) {
      *len = 1;
      return 0xFFFD;
    }
    cp = (cp << 6) | (c & 0x3F);
  }
  *len = n;
  return cp;
}

// Python's str.isspace() set.
bool is_py_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}

// Python's str.strip() on UTF-8 text.
std::string_view py_strip(std::string_view s) {
  size_t begin = 0;
  while (begin < s.size()) {
    size_t len = 0;
    if (!is_py_space(decode_at(s, begin, &len))) break;
    begin += len;
  }
  // Walk forward recording where the last non-space code point ends.
  size_t end = begin;
  for (size_t i = begin; i < s.size();) {
    size_t len = 0;
    const bool space = is_py_space(decode_at(s, i, &len));
    i += len;
    if (!space) end = i;
  }
  return s.substr(begin, end - begin);
}

}  // namespace

std::string wrap_system_prompt(const std::string& text) {
  if (text.empty()) return "";
  constexpr std::string_view kTag = "<system>";
  const std::string_view cleaned = py_strip(text);
  if (cleaned.starts_with(kTag) && cleaned.ends_with(kTag)) return std::string(cleaned);
  std::string out;
  out.reserve(cleaned.size() + 2 * kTag.size() + 2);
  out.append(kTag).append(" ").append(cleaned).append(" ").append(kTag);
  return out;
}

}  // namespace ppx
