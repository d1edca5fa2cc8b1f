// The capacity model (src/engine/capacity.h) on the full-size config with an H200's and a GB10's
// numbers: per-slot bytes as CudaLmBatch allocates them, the memory and bandwidth limits, and the
// chosen default.
#include <gtest/gtest.h>

#include <string>

#include "ppx/capacity.h"
#include "ppx/config.h"
#include "ppx/error.h"
#include "ppx/resources.h"

namespace {

using ppx::Capacity;
using ppx::CapacityInputs;
using ppx::KvDtype;

ppx::ModelConfig full_size() {
  return ppx::parse_config(std::string(ppx::embedded_config("personaplex-7b")), "embedded:personaplex-7b");
}

constexpr double kW8Weights = 7.5e9;  // the LM's weight bytes with --w8a16

// H200: 141 GB, of which the LM's ~7.5 GB and the context take ~9 GB; copy rate 4.3 TB/s.
CapacityInputs h200(KvDtype kv) {
  CapacityInputs in;
  in.lm = *full_size().lm;
  in.kv = kv;
  in.weight_bytes = kW8Weights;
  in.free_bytes = 132e9;
  in.bandwidth = 4.3e12;
  in.codec_bytes_per_session = static_cast<double>(ppx::codec_slot_bytes_estimate(full_size().mimi));
  return in;
}

// GB10: 128 GB of unified memory (~110 GB free after the model and the OS), 273 GB/s.
CapacityInputs gb10(KvDtype kv) {
  CapacityInputs in = h200(kv);
  in.free_bytes = 110e9;
  in.bandwidth = 273e9;
  return in;
}

TEST(Capacity, SlotBytesMatchTheBatchAllocation) {
  const ppx::LmConfig c = *full_size().lm;
  // 32 layers x 3000 positions x 4096 values, keys and values; the depformer ring: 6 layers x 16
  // steps x 1024, keys and values, bf16.
  const size_t kv = size_t{32} * 3000 * 4096;
  const size_t dep = size_t{2} * 6 * 16 * 1024 * 2;
  EXPECT_EQ(ppx::lm_slot_bytes(c, KvDtype::kBf16), 2 * kv * 2 + dep);
  // fp8: one byte a value, plus one scale byte per (layer, head, position) for keys and values, a
  // head's 3000 positions padded to 3008 (kern::fp8_scale_pitch).
  EXPECT_EQ(ppx::lm_slot_bytes(c, KvDtype::kFp8), 2 * kv + 2 * size_t{32} * 32 * 3008 + dep);
  // The figures: 1.57 GB per full-context session in bf16, 0.79 GB (plus scales) in fp8.
  EXPECT_NEAR(ppx::lm_slot_bytes(c, KvDtype::kBf16) / 1e9, 1.57, 0.01);
  EXPECT_NEAR(ppx::lm_slot_bytes(c, KvDtype::kFp8) / 1e9, 0.79, 0.01);
  EXPECT_EQ(ppx::lm_slot_read_bytes(c, KvDtype::kFp8), ppx::lm_slot_bytes(c, KvDtype::kFp8));
  // The codec estimate: two transformers' fp32 rings (8 layers x 250 x 512, k and v) and half again.
  EXPECT_EQ(ppx::codec_slot_bytes_estimate(full_size().mimi), size_t{2} * 2 * 8 * 250 * 512 * 4 * 3 / 2);
}

TEST(Capacity, H200Bf16IsMemoryBound) {
  const Capacity cap = ppx::compute_capacity(h200(KvDtype::kBf16));
  // Memory: (132 GB x 0.98 - 1 GiB reserve - one scratch slot) / 1.6 GB = 79.
  EXPECT_EQ(cap.memory_sessions, 79);
  // Bandwidth: 72 ms less 7.5 GB at 2.58 TB/s (2.9 ms), over 1.57 GB at 3.01 TB/s (0.52 ms) plus
  // the fixed 0.12 ms (the session's codec and rows) = 107.
  ASSERT_TRUE(cap.bandwidth_sessions);
  EXPECT_EQ(*cap.bandwidth_sessions, 107);
  EXPECT_NEAR(cap.weight_step_ms, 2.91, 0.01);
  EXPECT_NEAR(cap.session_step_ms, 0.52 + ppx::kSessionFixedMs, 0.01);
  EXPECT_EQ(cap.sessions, 79);
  EXPECT_NEAR(cap.bytes_per_session / 1e9, 1.57 + 0.0246, 0.01);
}

// The calibration (capacity.h, kSessionFixedMs): at the copy rate the server measured on the H200
// (3.74-3.75 TB/s), the full-context counts that held there for two minutes bound the model
// (docs/PERF.md v0.26): 160 `--kv-fp8` sessions held real time with the GPU ~99% busy, when the fp8
// cache's scales were fp32 (0.811 GB a slot; the server's 8.7 GB of weights: the model gave 158).
// Since v0.35 a scale is one byte (0.793 GB a slot): the model gives 161 there (162 with this
// fixture's 7.5 GB), a prediction from the 2.3% fewer bytes, not measured. The bf16 count that
// held, 80 (v0.24), is what memory allows there (82); the model's 94 is not measured.
TEST(Capacity, CalibratedOnWhatHeldOnTheH200) {
  CapacityInputs in = h200(KvDtype::kFp8);
  in.bandwidth = 3.75e12;
  EXPECT_EQ(*ppx::compute_capacity(in).bandwidth_sessions, 162);
  in.weight_bytes = 8.7e9;
  EXPECT_EQ(*ppx::compute_capacity(in).bandwidth_sessions, 161);
  in.kv = KvDtype::kBf16;
  EXPECT_EQ(*ppx::compute_capacity(in).bandwidth_sessions, 94);
}

TEST(Capacity, Fp8KvDoublesMemoryAndRaisesBandwidth) {
  const Capacity bf = ppx::compute_capacity(h200(KvDtype::kBf16));
  const Capacity f8 = ppx::compute_capacity(h200(KvDtype::kFp8));
  EXPECT_EQ(f8.memory_sessions, 155);
  ASSERT_TRUE(f8.bandwidth_sessions);
  EXPECT_EQ(*f8.bandwidth_sessions, 180);  // (72 - 2.9) / (0.26 + 0.12) ms
  EXPECT_EQ(f8.sessions, 155);             // memory binds
  EXPECT_GT(f8.memory_sessions, 1.8 * bf.memory_sessions);
  EXPECT_GT(*f8.bandwidth_sessions, 1.25 * *bf.bandwidth_sessions);
  EXPECT_LT(f8.bytes_per_session, 0.55 * bf.bytes_per_session);
}

TEST(Capacity, Gb10IsBandwidthBound) {
  for (const KvDtype kv : {KvDtype::kBf16, KvDtype::kFp8}) {
    const Capacity cap = ppx::compute_capacity(gb10(kv));
    ASSERT_TRUE(cap.bandwidth_sessions);
    // Memory holds tens of sessions; the 273 GB/s stream only a few within the frame: the weights
    // alone take 46 ms, a full-context session 8.3 ms (bf16) or 4.3 ms (fp8) with its fixed 0.12.
    EXPECT_GT(cap.memory_sessions, 50);
    EXPECT_LT(*cap.bandwidth_sessions, cap.memory_sessions / 10);
    EXPECT_EQ(cap.sessions, *cap.bandwidth_sessions);
    EXPECT_EQ(cap.sessions, kv == KvDtype::kBf16 ? 3 : 6);
    EXPECT_NEAR(cap.weight_step_ms, 45.8, 0.1);
  }
  // bf16 weights (no --w8a16): 16.1 GB take longer than the frame; still one session, not zero.
  CapacityInputs in = gb10(KvDtype::kBf16);
  in.weight_bytes = 16.1e9;
  const Capacity cap = ppx::compute_capacity(in);
  EXPECT_EQ(*cap.bandwidth_sessions, 0);
  EXPECT_EQ(cap.sessions, 1);
}

TEST(Capacity, NoBandwidthMeansMemoryOnlyAndTheClamp) {
  CapacityInputs in = h200(KvDtype::kFp8);
  in.bandwidth = 0;
  Capacity cap = ppx::compute_capacity(in);
  EXPECT_FALSE(cap.bandwidth_sessions);
  EXPECT_EQ(cap.sessions, cap.memory_sessions);
  // Far more memory than 256 sessions need: clamped to --max-sessions' range.
  in.free_bytes = 1e15;
  cap = ppx::compute_capacity(in);
  EXPECT_GT(cap.memory_sessions, ppx::kMaxSessionsLimit);
  EXPECT_EQ(cap.sessions, ppx::kMaxSessionsLimit);
  // No memory at all: still one (the batch's own check then says what does not fit).
  in.free_bytes = 0;
  cap = ppx::compute_capacity(in);
  EXPECT_EQ(cap.memory_sessions, 0);
  EXPECT_EQ(cap.sessions, 1);
  // A prompt cache's byte cap counts against memory.
  in = h200(KvDtype::kBf16);
  const int without = ppx::compute_capacity(in).memory_sessions;
  in.prompt_cache_bytes = 16e9;
  EXPECT_EQ(ppx::compute_capacity(in).memory_sessions, without - 10);
}

TEST(Capacity, RejectsNonsense) {
  CapacityInputs in = h200(KvDtype::kBf16);
  in.headroom = 1.0;
  EXPECT_THROW(ppx::compute_capacity(in), ppx::Error);
  in = h200(KvDtype::kBf16);
  in.memory_headroom = -0.1;
  EXPECT_THROW(ppx::compute_capacity(in), ppx::Error);
  in = h200(KvDtype::kBf16);
  in.free_bytes = -1;
  EXPECT_THROW(ppx::compute_capacity(in), ppx::Error);
  in = h200(KvDtype::kBf16);
  in.kv_efficiency = 0;
  EXPECT_THROW(ppx::compute_capacity(in), ppx::Error);
}

}  // namespace

// --prompt-cache-mb auto: a tenth of the free memory, at most 4 GiB; the model counts what it is
// given and says so.
TEST(Capacity, AutoPromptCacheIsATenthOfFreeMemoryUpTo4GiB) {
  EXPECT_EQ(ppx::auto_prompt_cache_bytes(0), 0.0);
  EXPECT_DOUBLE_EQ(ppx::auto_prompt_cache_bytes(20e9), 2e9);
  EXPECT_DOUBLE_EQ(ppx::auto_prompt_cache_bytes(140e9), 4.0 * (1 << 30));
  ppx::CapacityInputs in;
  in.lm = *full_size().lm;
  in.free_bytes = 100e9;
  in.prompt_cache_bytes = 3e9;
  const ppx::Capacity with = ppx::compute_capacity(in);
  EXPECT_EQ(with.prompt_cache_bytes, 3e9);
  in.prompt_cache_bytes = 0;
  EXPECT_GE(ppx::compute_capacity(in).memory_sessions, with.memory_sessions);
}
