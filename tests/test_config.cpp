#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ppx/config.h"
#include "ppx/error.h"
#include "test_util.h"

using namespace ppx;

namespace {

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}

void expect_config_error(const nlohmann::json& j, const std::string& needle) {
  try {
    parse_config(j.dump(), "test.json");
    FAIL() << "accepted: " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(Config, TinyGoldenConfig) {
  const ModelConfig c = load_config(test::data("tiny_config_a.json"));
  EXPECT_EQ(c.mimi.seanet.dimension, 128);
  EXPECT_EQ(c.mimi.frame_samples(), 1920);
  EXPECT_EQ(c.mimi.encoder_stride(), 2);
  EXPECT_EQ(c.mimi.quantizer.n_q, 16);
  EXPECT_EQ(c.mimi.transformer.context, 16);
  ASSERT_TRUE(c.lm.has_value());
  EXPECT_EQ(c.lm->ffn_hidden(), 352);
  EXPECT_EQ(c.lm->depformer_ffn_hidden(), 176);
  EXPECT_EQ(c.lm->context, 24);
  ASSERT_TRUE(c.lm_gen.has_value());
  EXPECT_FALSE(c.lm_gen->use_sampling);
  EXPECT_EQ(c.lm_gen->audio_silence_frame_cnt, 3);
}

TEST(Config, ShippedConfigs) {
  const ModelConfig real = load_config(test::config_dir("personaplex-7b.json"));
  EXPECT_EQ(real.mimi.seanet.dimension, 512);
  EXPECT_EQ(real.mimi.quantizer.n_q, 32);
  EXPECT_EQ(real.mimi.transformer.context, 250);
  EXPECT_EQ(real.lm->dim, 4096);
  EXPECT_EQ(real.lm->ffn_hidden(), 11264);
  EXPECT_EQ(real.lm->depformer_ffn_hidden(), 2816);
  EXPECT_EQ(real.lm->context, 3000);
  EXPECT_EQ(real.lm->dep_q, 16);
  EXPECT_EQ(real.lm_gen->audio_silence_frame_cnt, 6);
  EXPECT_EQ(real.lm_gen->top_k, 250);
  const ModelConfig tiny = load_config(test::config_dir("tiny.json"));
  EXPECT_EQ(tiny.mimi.seanet.n_filters, 8);
}

TEST(Config, RejectsBadValuesNamingTheKey) {
  const nlohmann::json good = read_json(test::data("tiny_config_a.json"));
  auto with = [&](const nlohmann::json::json_pointer& p, const nlohmann::json& v) {
    nlohmann::json j = good;
    j[p] = v;
    return j;
  };
  using P = nlohmann::json::json_pointer;
  expect_config_error(with(P("/mimi/seanet/bogus"), 1), "mimi.seanet.bogus: unknown key");
  expect_config_error(with(P("/mimi/transformer/num_heads"), 3), "mimi.transformer.num_heads");
  expect_config_error(with(P("/mimi/transformer/norm"), "rms_norm"), "mimi.transformer.norm: unsupported value");
  expect_config_error(with(P("/mimi/num_codebooks"), 17), "mimi.num_codebooks");
  expect_config_error(with(P("/mimi/frame_rate"), 13.0), "mimi.frame_rate");
  expect_config_error(with(P("/mimi/seanet/ratios"), nlohmann::json::array({8, "x"})), "mimi.seanet.ratios");
  // 64^8 overflowed an int to 0: a division by zero (SIGFPE) before this check.
  expect_config_error(with(P("/mimi/seanet/ratios"), nlohmann::json::array({64, 64, 64, 64, 64, 64, 64, 64})),
                      "mimi.seanet.ratios: their product");
  expect_config_error(with(P("/lm/dep_q"), good["lm"]["n_q"].get<int>() / 2 - 1), "lm.dep_q: must be at least");
  expect_config_error(with(P("/lm/dim"), "128"), "lm.dim: expected an integer");
  expect_config_error(with(P("/lm/delays"), nlohmann::json::array({0, 1})), "lm.delays");
  expect_config_error(with(P("/lm/card"), 1024), "lm.card");
  expect_config_error(with(P("/lm_gen/sine_tokens"), nlohmann::json::array({1, 2})), "lm_gen.sine_tokens");
  nlohmann::json missing = good;
  missing["mimi"]["quantizer"].erase("bins");
  expect_config_error(missing, "mimi.quantizer.bins: missing");
  expect_config_error(nlohmann::json::array(), "must be a JSON object");
  EXPECT_THROW(parse_config("{not json", "x"), Error);
  EXPECT_THROW(load_config(test::scratch("no-such-config.json")), Error);
}
