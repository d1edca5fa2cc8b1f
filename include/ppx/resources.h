// Files compiled into the binaries: the model configs and the tiny demo tokenizer.
#pragma once

#include <string>
#include <string_view>

namespace ppx {

// Contents of configs/<name>.json for name in {"personaplex-7b", "tiny-demo"}; throws otherwise.
std::string_view embedded_config(const std::string& name);
// The SentencePiece model of the tiny demo model (vocabulary 1000), serialized.
std::string_view embedded_tiny_tokenizer();

}  // namespace ppx
