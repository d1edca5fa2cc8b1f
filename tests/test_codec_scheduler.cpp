// The codec scheduler (src/engine/codec_scheduler.h) on the CPU tiny Mimi: batched sessions equal
// sessions alone, bad codes and slots are clear errors that leave the others running.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "codec_test_util.h"
#include "ppx/backend.h"
#include "engine/codec_scheduler.h"
#include "ppx/config.h"
#include "ppx/error.h"
#include "ppx/mimi.h"
#include "ppx/safetensors.h"
#include "ppx/weights.h"
#include "test_util.h"

using namespace ppx;

namespace {

struct TinyMimi {
  ModelConfig cfg = load_config(test::data("tiny_config_a.json"));
  FileWeights mw{std::make_shared<const SafeTensors>(test::data("mimi_tiny_a.safetensors"))};
  std::unique_ptr<ModelBackend> backend = make_cpu_backend(std::make_unique<Mimi>(cfg.mimi, mw), nullptr);
};

TEST(CodecScheduler, BatchedEqualsAloneOnCpu) {
  TinyMimi t;
  test::codec_batched_equals_alone(*t.backend, 6);
}

TEST(CodecScheduler, BadCodesAndSlotsAreClearErrors) {
  TinyMimi t;
  CodecScheduler sched(t.backend->codec_batch(2));
  EXPECT_THROW(sched.open(2), Error);
  EXPECT_THROW(sched.open(-1), Error);
  auto a = sched.open(0);
  const int fs = a->frame_samples(), nq = a->num_codebooks();
  std::vector<int32_t> bad(nq, t.cfg.mimi.quantizer.bins);  // one past the last code
  std::vector<float> pcm(fs, 0.1f);
  std::vector<int32_t> codes(nq);
  EXPECT_THROW(a->decode(bad.data(), pcm.data()), Error);
  // The stream and the scheduler go on.
  a->encode(pcm.data(), codes.data());
  for (int32_t c : codes) EXPECT_TRUE(c >= 0 && c < t.cfg.mimi.quantizer.bins);
  a->decode(codes.data(), pcm.data());
  EXPECT_EQ(sched.totals().encodes, 1);
}

}  // namespace
