// A SentencePiece model generated in memory, for full-size runs with random weights and no real
// tokenizer (benchmarks, load tests): `personaplex-server --random-weights` needs a tokenizer of
// exactly the config's text vocabulary (32000 for PersonaPlex 7B) to encode text prompts and to
// name the text tokens it streams, and with random weights what those tokens say is noise anyway.
//
// The model is a unigram ModelProto written directly in protobuf wire format (no training, no
// file; the same bytes for the same size on every machine). Its pieces:
//   0 <unk> (UNKNOWN), 1 <s>, 2 </s>, 3 <pad> (CONTROL), 4 <system> (USER_DEFINED): the special
//   ids of the real tokenizer_spm_32k_3.model, as scripts/train_tiny_tokenizer.sh documents;
//   5 "▁" (U+2581, SentencePiece's word marker), 6..99 the printable ASCII characters '!'..'~';
//   then filler pieces up to the size: "▁" + each printable character, the lowercase bigrams,
//   "▁" + bigram, the lowercase trigrams, "▁" + trigram, then "▁10", "▁11", ...
// So ASCII text encodes without <unk>; other characters encode as <unk>. The normalizer is the
// identity with a dummy "▁" prefix, extra whitespace removed and spaces escaped as "▁". Every
// normal piece scores about -1, so the segmentation with the fewest pieces wins.
#pragma once

#include <string>

#include "ppx/tokenizer.h"

namespace ppx {

// The fewest pieces a synthetic model can have: the 5 special pieces, "▁" and 94 characters.
inline constexpr int kSyntheticTokenizerMinPieces = 100;

// The serialized ModelProto (what a .model file holds) with exactly `vocab_size` pieces.
// Throws ppx::Error when vocab_size < kSyntheticTokenizerMinPieces.
std::string synthetic_tokenizer_model(int vocab_size);

// That model loaded; messages name it "synthetic:<vocab_size>".
TextTokenizer synthetic_tokenizer(int vocab_size);

}  // namespace ppx
