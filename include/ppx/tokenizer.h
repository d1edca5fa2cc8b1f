// Text tokenizer of the LM: a SentencePiece model (upstream `tokenizer_spm_32k_3.model`, or the
// tiny tests/data/tiny_spm_1000.model), plus upstream's system-prompt wrapping.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace ppx {

// Thin wrapper of sentencepiece::SentencePieceProcessor. Immutable after construction; the const
// methods may be called from several threads at once.
class TextTokenizer {
 public:
  // Loads a SentencePiece model file. Throws ppx::Error naming the file when it cannot be read or
  // is not a valid model.
  explicit TextTokenizer(const std::string& model_path);
  // Loads a model from its serialized bytes (the content of a .model file, e.g. one compiled into
  // the binary); `name` stands for the file in messages. Throws ppx::Error naming it if invalid.
  static TextTokenizer from_serialized(const std::string& bytes, const std::string& name);
  ~TextTokenizer();
  TextTokenizer(const TextTokenizer&) = delete;
  TextTokenizer& operator=(const TextTokenizer&) = delete;
  TextTokenizer(TextTokenizer&&) noexcept;
  TextTokenizer& operator=(TextTokenizer&&) noexcept;  // a moved-from tokenizer is unusable

  // Token ids of `text`, as upstream's `text_tokenizer.encode(text)`: the model's own normaliser,
  // no BOS/EOS added, no sampling. Throws ppx::Error on failure.
  std::vector<int> encode(const std::string& text) const;
  // The piece of `id` ("▁" marks a leading space). Throws ppx::Error when id is outside
  // [0, vocab_size()).
  std::string id_to_piece(int id) const;
  // Number of pieces, special ones included (32000 upstream, 1000 for the tiny model).
  int vocab_size() const;

 private:
  struct Impl;
  TextTokenizer(std::unique_ptr<Impl> impl, std::string name);
  std::unique_ptr<Impl> impl_;
  std::string path_;
};

// Upstream's system-prompt wrapping (server.py / offline.py `wrap_with_system_tags`, applied only
// when the prompt is non-empty): an empty `text` gives "" (upstream then sends no text prompt);
// otherwise the text is stripped of leading and trailing whitespace (Python str.strip: ASCII and
// Unicode spaces) and returned as is when it both starts and ends with "<system>", else as
// "<system> " + stripped + " <system>". A whitespace-only prompt therefore gives
// "<system>  <system>", exactly as upstream.
std::string wrap_system_prompt(const std::string& text);

}  // namespace ppx
