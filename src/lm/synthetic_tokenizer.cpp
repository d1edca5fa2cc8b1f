// The synthetic SentencePiece model (include/ppx/synthetic_tokenizer.h), serialized by hand.
//
// Protobuf wire format: each field is a varint key (field_number << 3 | wire_type) followed by a
// varint (wire type 0: ints, enums, bools), 4 little-endian bytes (5: float) or a varint length
// and the bytes (2: strings, sub-messages). Field numbers are sentencepiece_model.proto's:
//   ModelProto:      pieces = 1 (repeated SentencePiece), trainer_spec = 2, normalizer_spec = 3
//   SentencePiece:   piece = 1, score = 2, type = 3 (NORMAL 1, UNKNOWN 2, CONTROL 3,
//                    USER_DEFINED 4)
//   TrainerSpec:     model_type = 3 (UNIGRAM 1), vocab_size = 4, user_defined_symbols = 31,
//                    byte_fallback = 35, unk_id = 40, bos_id = 41, eos_id = 42, pad_id = 43,
//                    unk_surface = 44, unk_piece = 45, bos_piece = 46, eos_piece = 47,
//                    pad_piece = 48
//   NormalizerSpec:  name = 1, add_dummy_prefix = 3, remove_extra_whitespaces = 4,
//                    escape_whitespaces = 5
#include "ppx/synthetic_tokenizer.h"

#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

#include "ppx/error.h"

namespace ppx {

namespace {

constexpr std::string_view kWordMarker = "\xE2\x96\x81";  // U+2581

enum PieceType : uint64_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4 };

class ProtoWriter {
 public:
  void varint(uint64_t v) {
    while (v >= 0x80) {
      out_.push_back(static_cast<char>((v & 0x7F) | 0x80));
      v >>= 7;
    }
    out_.push_back(static_cast<char>(v));
  }
  void key(int field, int wire_type) { varint(static_cast<uint64_t>(field) << 3 | wire_type); }
  void int_field(int field, uint64_t v) {
    key(field, 0);
    varint(v);
  }
  void float_field(int field, float v) {
    key(field, 5);
    uint32_t bits = 0;
    std::memcpy(&bits, &v, sizeof bits);
    for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>((bits >> (8 * i)) & 0xFF));
  }
  void bytes_field(int field, std::string_view s) {
    key(field, 2);
    varint(s.size());
    out_.append(s);
  }
  const std::string& str() const { return out_; }

 private:
  std::string out_;
};

// The normal pieces after the specials, in id order, until `n` of them are listed.
std::vector<std::string> normal_pieces(size_t n) {
  std::vector<std::string> p;
  p.reserve(n);
  auto add = [&](std::string s) {
    if (p.size() < n) p.push_back(std::move(s));
    return p.size() < n;
  };
  const std::string marker(kWordMarker);
  add(marker);
  for (char c = '!'; c <= '~'; ++c) add(std::string(1, c));
  for (char c = '!'; c <= '~'; ++c) add(marker + c);
  std::vector<std::string> bigrams, trigrams;
  for (char a = 'a'; a <= 'z'; ++a)
    for (char b = 'a'; b <= 'z'; ++b) bigrams.push_back({a, b});
  for (const auto& s : bigrams) add(s);
  for (const auto& s : bigrams) add(marker + s);
  for (const auto& s : bigrams)
    for (char c = 'a'; c <= 'z'; ++c) trigrams.push_back(s + c);
  for (const auto& s : trigrams) add(s);
  for (const auto& s : trigrams) add(marker + s);
  for (uint64_t k = 10; p.size() < n; ++k) add(marker + std::to_string(k));
  return p;
}

void add_piece(ProtoWriter& model, std::string_view piece, float score, PieceType type) {
  ProtoWriter sp;
  sp.bytes_field(1, piece);
  sp.float_field(2, score);
  if (type != kNormal) sp.int_field(3, type);  // NORMAL is the default
  model.bytes_field(1, sp.str());
}

}  // namespace

std::string synthetic_tokenizer_model(int vocab_size) {
  if (vocab_size < kSyntheticTokenizerMinPieces)
    throw Error("synthetic tokenizer: " + std::to_string(vocab_size) + " pieces asked, at least " +
                std::to_string(kSyntheticTokenizerMinPieces) + " needed");
  ProtoWriter model;
  add_piece(model, "<unk>", 0.f, kUnknown);
  add_piece(model, "<s>", 0.f, kControl);
  add_piece(model, "</s>", 0.f, kControl);
  add_piece(model, "<pad>", 0.f, kControl);
  add_piece(model, "<system>", 0.f, kUserDefined);
  constexpr int kSpecial = 5;
  const std::vector<std::string> pieces = normal_pieces(static_cast<size_t>(vocab_size - kSpecial));
  // About -1 each, decreasing with the id: a segmentation with fewer pieces always wins (the
  // spread over all ids, < 0.33, is below one piece's score), ties go to the lower ids.
  for (size_t i = 0; i < pieces.size(); ++i)
    add_piece(model, pieces[i], -1.f - 1e-5f * static_cast<float>(i), kNormal);

  ProtoWriter trainer;
  trainer.int_field(3, 1);  // UNIGRAM
  trainer.int_field(4, static_cast<uint64_t>(vocab_size));
  trainer.bytes_field(31, "<system>");
  trainer.int_field(35, 0);  // no byte fallback
  trainer.int_field(40, 0);
  trainer.int_field(41, 1);
  trainer.int_field(42, 2);
  trainer.int_field(43, 3);
  trainer.bytes_field(44, " \xE2\x81\x87 ");  // what <unk> decodes to (SentencePiece's default)
  trainer.bytes_field(45, "<unk>");
  trainer.bytes_field(46, "<s>");
  trainer.bytes_field(47, "</s>");
  trainer.bytes_field(48, "<pad>");
  model.bytes_field(2, trainer.str());

  ProtoWriter normalizer;
  normalizer.bytes_field(1, "identity");
  normalizer.int_field(3, 1);
  normalizer.int_field(4, 1);
  normalizer.int_field(5, 1);
  model.bytes_field(3, normalizer.str());
  return model.str();
}

TextTokenizer synthetic_tokenizer(int vocab_size) {
  return TextTokenizer::from_serialized(synthetic_tokenizer_model(vocab_size),
                                        "synthetic:" + std::to_string(vocab_size));
}

}  // namespace ppx
