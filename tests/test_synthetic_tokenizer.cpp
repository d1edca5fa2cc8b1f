// The synthetic SentencePiece model for random-weight runs: its size, special ids, what it encodes
// and decodes, its determinism, and load_model() handing it out only for --random-weights.
#include <gtest/gtest.h>
#include <sentencepiece_processor.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "apps/model_loading.h"
#include "ppx/error.h"
#include "ppx/synthetic_tokenizer.h"
#include "test_util.h"

namespace {

std::unique_ptr<sentencepiece::SentencePieceProcessor> load_sp(int n) {
  auto sp = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto status = sp->LoadFromSerializedProto(ppx::synthetic_tokenizer_model(n));
  EXPECT_TRUE(status.ok()) << status.ToString();
  return sp;
}

class SyntheticTokenizerSize : public ::testing::TestWithParam<int> {};

TEST_P(SyntheticTokenizerSize, HasExactlyNDistinctPiecesAndTheRealSpecialIds) {
  const int n = GetParam();
  const ppx::TextTokenizer tok = ppx::synthetic_tokenizer(n);
  EXPECT_EQ(tok.vocab_size(), n);
  EXPECT_EQ(tok.id_to_piece(0), "<unk>");
  EXPECT_EQ(tok.id_to_piece(1), "<s>");
  EXPECT_EQ(tok.id_to_piece(2), "</s>");
  EXPECT_EQ(tok.id_to_piece(3), "<pad>");
  EXPECT_EQ(tok.id_to_piece(4), "<system>");
  EXPECT_EQ(tok.id_to_piece(5), "\xE2\x96\x81");
  EXPECT_EQ(tok.id_to_piece(6), "!");
  std::set<std::string> seen;
  for (int id = 0; id < n; ++id) seen.insert(tok.id_to_piece(id));
  EXPECT_EQ(seen.size(), static_cast<size_t>(n)) << "pieces are not distinct";

  auto sp = load_sp(n);
  EXPECT_EQ(sp->unk_id(), 0);
  EXPECT_EQ(sp->bos_id(), 1);
  EXPECT_EQ(sp->eos_id(), 2);
  EXPECT_EQ(sp->pad_id(), 3);
  EXPECT_TRUE(sp->IsUnknown(0));
  EXPECT_TRUE(sp->IsControl(1) && sp->IsControl(2) && sp->IsControl(3));
}

INSTANTIATE_TEST_SUITE_P(Sizes, SyntheticTokenizerSize, ::testing::Values(100, 1000, 1201, 32000));

TEST(SyntheticTokenizer, AsciiRoundTripsWithoutUnknownPieces) {
  auto sp = load_sp(32000);
  const std::string texts[] = {
      "Hello, world! The quick brown fox jumps over the lazy dog.",
      "You are a wise and friendly teacher. Answer questions or provide advice in a clear and "
      "engaging way.",
      "x=42; y = {a: [1, 2, 3]} ~ `code` & \"quotes\" 'single' #hash @at $5 ^ | \\ <tag>",
  };
  for (const std::string& text : texts) {
    std::vector<int> ids;
    ASSERT_TRUE(sp->Encode(text, &ids).ok());
    ASSERT_FALSE(ids.empty());
    for (int id : ids) EXPECT_NE(id, 0) << "an <unk> in: " << text;
    // Fewer pieces than characters: the bigram/trigram pieces are used.
    EXPECT_LT(ids.size(), text.size()) << text;
    std::string back;
    ASSERT_TRUE(sp->Decode(ids, &back).ok());
    EXPECT_EQ(back, text);
  }
}

TEST(SyntheticTokenizer, SystemTagsEncodeAsOnePieceEach) {
  const ppx::TextTokenizer tok = ppx::synthetic_tokenizer(32000);
  const std::vector<int> ids = tok.encode(ppx::wrap_system_prompt("You are a tester."));
  ASSERT_GE(ids.size(), 4u);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 4), 2) << "two <system> pieces expected";
  auto sp = load_sp(32000);
  std::string back;
  ASSERT_TRUE(sp->Decode(ids, &back).ok());
  EXPECT_EQ(back, "<system> You are a tester. <system>");
}

TEST(SyntheticTokenizer, OtherCharactersAreUnknownNotErrors) {
  const ppx::TextTokenizer tok = ppx::synthetic_tokenizer(1000);
  const std::vector<int> ids = tok.encode("caf\xC3\xA9 \xE2\x82\xAC");  // "café €"
  EXPECT_NE(std::find(ids.begin(), ids.end(), 0), ids.end());
}

TEST(SyntheticTokenizer, SameBytesEveryTime) {
  const std::string a = ppx::synthetic_tokenizer_model(32000);
  EXPECT_EQ(a, ppx::synthetic_tokenizer_model(32000));
  EXPECT_NE(a, ppx::synthetic_tokenizer_model(31999));
  // The first pieces of a larger model are the whole of a smaller one.
  const ppx::TextTokenizer small = ppx::synthetic_tokenizer(1000),
                           big = ppx::synthetic_tokenizer(32000);
  for (int id = 0; id < 1000; ++id) ASSERT_EQ(small.id_to_piece(id), big.id_to_piece(id));
}

TEST(SyntheticTokenizer, RefusesTooFewPieces) {
  try {
    (void)ppx::synthetic_tokenizer_model(99);
    FAIL() << "no error";
  } catch (const ppx::Error& e) {
    EXPECT_NE(std::string(e.what()).find("at least 100"), std::string::npos) << e.what();
  }
}

// The tiny demo config with another text vocabulary, so that no bundled tokenizer fits it.
std::string config_with_text_card(int text_card) {
  std::ifstream f(ppx::test::config_dir("tiny-demo.json"));
  nlohmann::json j = nlohmann::json::parse(f);
  j["lm"]["text_card"] = text_card;
  const std::string path =
      ppx::test::scratch("tiny_text_card_" + std::to_string(text_card) + ".json");
  std::ofstream(path) << j.dump(1);
  return path;
}

TEST(SyntheticTokenizer, LoadModelUsesItForRandomWeightsOnly) {
  ppx::app::ModelFlags f;
  f.config = config_with_text_card(1200);
  f.random_weights = true;
  const ppx::app::LoadedModel m = ppx::app::load_model(f);
  ASSERT_TRUE(m.tokenizer);
  EXPECT_EQ(m.tokenizer->vocab_size(), 1200);
  EXPECT_NE(m.description.find("synthetic 1200-piece tokenizer"), std::string::npos)
      << m.description;
  // The embedded demo model (no weights) keeps needing a real tokenizer for another vocabulary.
  f.random_weights = false;
  EXPECT_FALSE(ppx::app::load_model(f).tokenizer);
  // And the tiny vocabulary keeps its trained tokenizer.
  ppx::app::ModelFlags tiny;
  tiny.config = ppx::test::config_dir("tiny-demo.json");
  tiny.random_weights = true;
  const ppx::app::LoadedModel t = ppx::app::load_model(tiny);
  ASSERT_TRUE(t.tokenizer);
  EXPECT_EQ(t.description.find("synthetic"), std::string::npos) << t.description;
}

}  // namespace
