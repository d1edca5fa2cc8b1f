// CUDA Mimi against the golden upstream vectors and against the CPU reference ppx::Mimi; graph
// replay, slot independence and reset. Every test skips (not fails) on a machine without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "backend/cuda/cuda_mimi.h"
#include "backend/cuda/cuda_util.h"
#include "codec_test_util.h"
#include "ppx/audio.h"
#include "ppx/backend.h"
#include "ppx/config.h"
#include "ppx/mimi.h"
#include "ppx/safetensors.h"
#include "ppx/weights.h"
#include "test_util.h"

using namespace ppx;

namespace {

#define PPX_REQUIRE_GPU()                                            \
  do {                                                               \
    if (ppx::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

// Stream-ordered helpers around one CudaMimi slot: host in, host out, synchronised per call.
struct Runner {
  cuda::CudaMimi& m;
  cudaStream_t s = nullptr;
  cuda::DeviceBuffer<float> pcm_in, pcm_out;
  cuda::DeviceBuffer<int32_t> codes_in, codes_out;
  explicit Runner(cuda::CudaMimi& mimi) : m(mimi) {
    PPX_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    pcm_in.resize(m.frame_samples());
    pcm_out.resize(m.frame_samples());
    codes_in.resize(m.num_codebooks());
    codes_out.resize(m.num_codebooks());
  }
  ~Runner() { cudaStreamDestroy(s); }
  std::vector<int32_t> encode(int slot, const float* pcm) {
    std::vector<int32_t> c(m.num_codebooks());
    pcm_in.upload(pcm, m.frame_samples(), s);
    m.encode(slot, pcm_in.get(), codes_out.get(), s);
    PPX_CUDA_CHECK(cudaMemcpyAsync(c.data(), codes_out.get(), c.size() * 4, cudaMemcpyDeviceToHost, s));
    PPX_CUDA_CHECK(cudaStreamSynchronize(s));
    return c;
  }
  std::vector<float> decode(int slot, const int32_t* codes) {
    std::vector<float> y(m.frame_samples());
    codes_in.upload(codes, m.num_codebooks(), s);
    m.decode(slot, codes_in.get(), pcm_out.get(), s);
    PPX_CUDA_CHECK(cudaMemcpyAsync(y.data(), pcm_out.get(), y.size() * 4, cudaMemcpyDeviceToHost, s));
    PPX_CUDA_CHECK(cudaStreamSynchronize(s));
    return y;
  }
};

// A synthetic signal: two modulated tones, different per `seed`.
std::vector<float> signal(int n, int seed) {
  std::vector<float> x(n);
  for (int i = 0; i < n; ++i) {
    const float t = static_cast<float>(i);
    x[i] = 0.3f * std::sin((0.03f + 0.004f * seed) * t) * std::sin(0.0007f * t) + 0.05f * std::sin(0.31f * t + seed);
  }
  return x;
}

// Full-size model with random weights: CPU reference results for kFrames frames, built once.
constexpr int kFrames = 10;
struct FullSize {
  ModelConfig cfg = load_config(test::config_dir("personaplex-7b.json"));
  int fs = cfg.mimi.frame_samples(), nq = cfg.mimi.num_codebooks;
  std::vector<float> pcm = signal(kFrames * fs, 0), pcm_b = signal(kFrames * fs, 3);
  std::vector<int32_t> cpu_codes;  // [kFrames][nq]
  std::vector<float> cpu_pcm;      // decode of cpu_codes
  std::unique_ptr<cuda::CudaMimi> gpu;
  FullSize() {
    {
      RandomWeights w(20261202);
      const Mimi cpu(cfg.mimi, w);
      MimiState st;
      cpu_codes.resize(static_cast<size_t>(kFrames) * nq);
      cpu_pcm.resize(pcm.size());
      for (int f = 0; f < kFrames; ++f) cpu.encode(st, pcm.data() + f * fs, cpu_codes.data() + f * nq);
      for (int f = 0; f < kFrames; ++f) cpu.decode(st, cpu_codes.data() + f * nq, cpu_pcm.data() + f * fs);
    }
    RandomWeights w(20261202);
    gpu = std::make_unique<cuda::CudaMimi>(cfg.mimi, w, 2);
  }
  // Eager CUDA run of `x` on `slot` from a reset: codes [kFrames][nq] and decode of cpu_codes.
  void run(int slot, const std::vector<float>& x, std::vector<int32_t>& codes, std::vector<float>& out) {
    Runner r(*gpu);
    gpu->reset_encoder(slot, r.s);
    gpu->reset_decoder(slot, r.s);
    codes.clear();
    out.clear();
    for (int f = 0; f < kFrames; ++f) {
      const auto c = r.encode(slot, x.data() + f * fs);
      codes.insert(codes.end(), c.begin(), c.end());
      const auto y = r.decode(slot, cpu_codes.data() + f * nq);
      out.insert(out.end(), y.begin(), y.end());
    }
  }
};

FullSize& full() {
  static FullSize f;
  return f;
}

double agreement(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t same = 0;
  for (size_t i = 0; i < b.size(); ++i) same += a[i] == b[i];
  return static_cast<double>(same) / static_cast<double>(b.size());
}

}  // namespace

// mimi_tiny_a_io.safetensors: upstream streaming encode/decode, one frame at a time (tests/data/README.md).
// 24 frames with a context-16 ring: the ring wraps, so the visibility quirk is exercised.
TEST(CudaMimiGolden, StreamingEncodeAndDecodeMatchUpstream) {
  PPX_REQUIRE_GPU();
  const ModelConfig cfg = load_config(test::data("tiny_config_a.json"));
  FileWeights w(std::make_shared<const SafeTensors>(test::data("mimi_tiny_a.safetensors")));
  cuda::CudaMimi m(cfg.mimi, w, 1);
  const SafeTensors io(test::data("mimi_tiny_a_io.safetensors"));
  const auto pcm = io.to_f32("pcm_in");
  const auto ref_codes = io.to_i64("codes");
  const auto ref_pcm = io.to_f32("pcm_out");
  const int frames = 24, fs = m.frame_samples(), nq = m.num_codebooks();
  ASSERT_EQ(fs, 1920);
  ASSERT_EQ(nq, 8);
  ASSERT_EQ(pcm.size(), static_cast<size_t>(frames * fs));
  Runner r(m);
  int same = 0;
  std::vector<float> out;
  for (int f = 0; f < frames; ++f) {
    const auto c = r.encode(0, pcm.data() + f * fs);
    for (int q = 0; q < nq; ++q) {
      EXPECT_EQ(c[q], ref_codes[q * frames + f]) << "frame " << f << " codebook " << q;
      same += c[q] == ref_codes[q * frames + f];
    }
  }
  for (int f = 0; f < frames; ++f) {
    int32_t codes[8];
    for (int q = 0; q < nq; ++q) codes[q] = static_cast<int32_t>(ref_codes[q * frames + f]);
    const auto y = r.decode(0, codes);
    out.insert(out.end(), y.begin(), y.end());
  }
  EXPECT_GE(static_cast<double>(same) / (frames * nq), 0.99);
  const double err = rel_l2(out, ref_pcm);
  EXPECT_LE(err, 1e-3);
  RecordProperty("pcm_rel_l2", std::to_string(err));
}

// CudaMimi with pdl = false (--no-mimi-pdl, CudaOptions::mimi_pdl) launches the same kernels
// without programmatic dependent launch: codes and PCM are bitwise those of the default (PDL
// where the device supports it), over 24 frames of the golden input.
TEST(CudaMimiGolden, PdlOffEqualsDefault) {
  PPX_REQUIRE_GPU();
  const ModelConfig cfg = load_config(test::data("tiny_config_a.json"));
  FileWeights w(std::make_shared<const SafeTensors>(test::data("mimi_tiny_a.safetensors")));
  const SafeTensors io(test::data("mimi_tiny_a_io.safetensors"));
  const auto pcm = io.to_f32("pcm_in");
  auto run = [&](bool pdl, std::vector<int32_t>& codes, std::vector<float>& out) {
    cuda::CudaMimi m(cfg.mimi, w, 1, pdl);
    Runner r(m);
    const int fs = m.frame_samples();
    for (int f = 0; f < 24; ++f) {
      const auto c = r.encode(0, pcm.data() + f * fs);
      codes.insert(codes.end(), c.begin(), c.end());
      const auto y = r.decode(0, c.data());
      out.insert(out.end(), y.begin(), y.end());
    }
  };
  std::vector<int32_t> codes_on, codes_off;
  std::vector<float> out_on, out_off;
  run(true, codes_on, out_on);
  run(false, codes_off, out_off);
  EXPECT_EQ(codes_off, codes_on);
  ASSERT_EQ(out_off.size(), out_on.size());
  size_t differ = 0;
  for (size_t i = 0; i < out_on.size(); ++i) differ += out_off[i] != out_on[i];
  EXPECT_EQ(differ, 0u) << "PCM samples that differ without PDL";
}

TEST(CudaMimiFullSize, MatchesCpuReference) {
  PPX_REQUIRE_GPU();
  FullSize& F = full();
  std::vector<int32_t> codes;
  std::vector<float> out;
  F.run(0, F.pcm, codes, out);
  for (int32_t c : codes) ASSERT_TRUE(c >= 0 && c < F.cfg.mimi.quantizer.bins);
  EXPECT_GE(agreement(codes, F.cpu_codes), 0.99);
  const double err = rel_l2(out, F.cpu_pcm);
  EXPECT_LE(err, 1e-3);
  RecordProperty("pcm_rel_l2", std::to_string(err));
  RecordProperty("codes_agreement", std::to_string(agreement(codes, F.cpu_codes)));
}

// Encode and decode captured once in a CUDA graph and replayed per frame give the eager results exactly.
TEST(CudaMimiFullSize, GraphReplayEqualsEager) {
  PPX_REQUIRE_GPU();
  FullSize& F = full();
  std::vector<int32_t> eager_codes, graph_codes;
  std::vector<float> eager_out, graph_out;
  F.run(0, F.pcm, eager_codes, eager_out);

  cuda::CudaMimi& m = *F.gpu;
  Runner r(m);
  m.reset_encoder(1, r.s);
  m.reset_decoder(1, r.s);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  PPX_CUDA_CHECK(cudaStreamBeginCapture(r.s, cudaStreamCaptureModeThreadLocal));
  m.encode(1, r.pcm_in.get(), r.codes_out.get(), r.s);
  m.decode(1, r.codes_in.get(), r.pcm_out.get(), r.s);
  PPX_CUDA_CHECK(cudaStreamEndCapture(r.s, &graph));
  PPX_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  std::vector<int32_t> c(F.nq);
  std::vector<float> y(F.fs);
  for (int f = 0; f < kFrames; ++f) {
    r.pcm_in.upload(F.pcm.data() + f * F.fs, F.fs, r.s);
    r.codes_in.upload(F.cpu_codes.data() + f * F.nq, F.nq, r.s);
    PPX_CUDA_CHECK(cudaGraphLaunch(exec, r.s));
    PPX_CUDA_CHECK(cudaMemcpyAsync(c.data(), r.codes_out.get(), c.size() * 4, cudaMemcpyDeviceToHost, r.s));
    PPX_CUDA_CHECK(cudaMemcpyAsync(y.data(), r.pcm_out.get(), y.size() * 4, cudaMemcpyDeviceToHost, r.s));
    PPX_CUDA_CHECK(cudaStreamSynchronize(r.s));
    graph_codes.insert(graph_codes.end(), c.begin(), c.end());
    graph_out.insert(graph_out.end(), y.begin(), y.end());
  }
  PPX_CUDA_CHECK(cudaGraphExecDestroy(exec));
  PPX_CUDA_CHECK(cudaGraphDestroy(graph));
  EXPECT_EQ(graph_codes, eager_codes);
  EXPECT_EQ(graph_out, eager_out);
}

// Two slots interleaved frame by frame give what each gives alone.
TEST(CudaMimiFullSize, SlotsAreIndependent) {
  PPX_REQUIRE_GPU();
  FullSize& F = full();
  std::vector<int32_t> a_codes, b_codes;
  std::vector<float> a_out, b_out;
  F.run(0, F.pcm, a_codes, a_out);
  F.run(1, F.pcm_b, b_codes, b_out);
  EXPECT_NE(a_codes, b_codes);  // otherwise the test proves nothing

  cuda::CudaMimi& m = *F.gpu;
  Runner r(m);
  for (int slot : {0, 1}) {
    m.reset_encoder(slot, r.s);
    m.reset_decoder(slot, r.s);
  }
  std::vector<int32_t> ia, ib;
  std::vector<float> oa, ob;
  for (int f = 0; f < kFrames; ++f) {
    const auto ca = r.encode(0, F.pcm.data() + f * F.fs);
    const auto cb = r.encode(1, F.pcm_b.data() + f * F.fs);
    const auto yb = r.decode(1, F.cpu_codes.data() + ((f + 3) % kFrames) * F.nq);
    const auto ya = r.decode(0, F.cpu_codes.data() + f * F.nq);
    ia.insert(ia.end(), ca.begin(), ca.end());
    ib.insert(ib.end(), cb.begin(), cb.end());
    oa.insert(oa.end(), ya.begin(), ya.end());
    ob.insert(ob.end(), yb.begin(), yb.end());
  }
  EXPECT_EQ(ia, a_codes);
  EXPECT_EQ(ib, b_codes);
  EXPECT_EQ(oa, a_out);
  // Slot 1 decoded other codes than in the solo run; its own solo run of those codes must match.
  std::vector<float> solo;
  m.reset_decoder(1, r.s);
  for (int f = 0; f < kFrames; ++f) {
    const auto y = r.decode(1, F.cpu_codes.data() + ((f + 3) % kFrames) * F.nq);
    solo.insert(solo.end(), y.begin(), y.end());
  }
  EXPECT_EQ(ob, solo);
}

// Batched launches (encode_batch / decode_batch over any subset of slots, in any order) give
// every slot exactly what its own per-slot calls give: 6 slots with their own signals, each tick
// a random subset of them takes its next frame.
TEST(CudaMimiFullSize, BatchedEqualsPerSlot) {
  PPX_REQUIRE_GPU();
  FullSize& F = full();
  constexpr int kSlots = 6;
  RandomWeights w(20261202);
  cuda::CudaMimi m(F.cfg.mimi, w, kSlots);
  Runner r(m);
  std::vector<std::vector<float>> sig;
  for (int i = 0; i < kSlots; ++i) sig.push_back(signal(kFrames * F.fs, 10 + i));
  // Per slot, alone: codes of every frame, and the decode of the CPU codes shifted by the slot.
  auto dec_codes = [&](int slot, int f) { return F.cpu_codes.data() + ((f + slot) % kFrames) * F.nq; };
  std::vector<std::vector<int32_t>> codes_alone(kSlots);
  std::vector<std::vector<float>> pcm_alone(kSlots);
  for (int i = 0; i < kSlots; ++i) {
    m.reset_encoder(i, r.s);
    m.reset_decoder(i, r.s);
    for (int f = 0; f < kFrames; ++f) {
      const auto c = r.encode(i, sig[i].data() + f * F.fs);
      const auto y = r.decode(i, dec_codes(i, f));
      codes_alone[i].insert(codes_alone[i].end(), c.begin(), c.end());
      pcm_alone[i].insert(pcm_alone[i].end(), y.begin(), y.end());
    }
  }
  for (int i = 0; i < kSlots; ++i) {
    m.reset_encoder(i, r.s);
    m.reset_decoder(i, r.s);
  }
  std::vector<std::vector<int32_t>> codes_b(kSlots);
  std::vector<std::vector<float>> pcm_b(kSlots);
  std::vector<int> next(kSlots, 0);
  std::mt19937 rng(7);
  cuda::DeviceBuffer<int> ids(kSlots);
  cuda::DeviceBuffer<float> pin(static_cast<size_t>(kSlots) * F.fs), pout(static_cast<size_t>(kSlots) * F.fs);
  cuda::DeviceBuffer<int32_t> cin(static_cast<size_t>(kSlots) * F.nq), cout(static_cast<size_t>(kSlots) * F.nq);
  int max_rows = 0;
  while (true) {
    std::vector<int> rows;
    for (int i = 0; i < kSlots; ++i)
      if (next[i] < kFrames && rng() % 3 != 0) rows.push_back(i);
    if (rows.empty()) {
      if (std::all_of(next.begin(), next.end(), [](int f) { return f == kFrames; })) break;
      continue;
    }
    std::shuffle(rows.begin(), rows.end(), rng);
    const int n = static_cast<int>(rows.size());
    max_rows = std::max(max_rows, n);
    std::vector<float> x(static_cast<size_t>(n) * F.fs);
    std::vector<int32_t> dc(static_cast<size_t>(n) * F.nq);
    for (int b = 0; b < n; ++b) {
      const int i = rows[b];
      std::copy_n(sig[i].data() + next[i] * F.fs, F.fs, x.data() + b * F.fs);
      std::copy_n(dec_codes(i, next[i]), F.nq, dc.data() + b * F.nq);
    }
    ids.upload(rows.data(), rows.size(), r.s);
    pin.upload(x.data(), x.size(), r.s);
    cin.upload(dc.data(), dc.size(), r.s);
    m.encode_batch(ids.get(), n, pin.get(), cout.get(), r.s);
    m.decode_batch(ids.get(), n, cin.get(), pout.get(), r.s);
    std::vector<int32_t> c(static_cast<size_t>(n) * F.nq);
    std::vector<float> y(static_cast<size_t>(n) * F.fs);
    PPX_CUDA_CHECK(cudaMemcpyAsync(c.data(), cout.get(), c.size() * 4, cudaMemcpyDeviceToHost, r.s));
    PPX_CUDA_CHECK(cudaMemcpyAsync(y.data(), pout.get(), y.size() * 4, cudaMemcpyDeviceToHost, r.s));
    PPX_CUDA_CHECK(cudaStreamSynchronize(r.s));
    for (int b = 0; b < n; ++b) {
      const int i = rows[b];
      codes_b[i].insert(codes_b[i].end(), c.begin() + b * F.nq, c.begin() + (b + 1) * F.nq);
      pcm_b[i].insert(pcm_b[i].end(), y.begin() + b * F.fs, y.begin() + (b + 1) * F.fs);
      ++next[i];
    }
  }
  EXPECT_GE(max_rows, 3);
  for (int i = 0; i < kSlots; ++i) {
    EXPECT_EQ(codes_b[i], codes_alone[i]) << "slot " << i;
    EXPECT_EQ(pcm_b[i], pcm_alone[i]) << "slot " << i;
  }
  EXPECT_NE(codes_alone[0], codes_alone[1]);
  EXPECT_THROW(m.encode_batch(ids.get(), kSlots + 1, pin.get(), cout.get(), r.s), Error);
  EXPECT_THROW(m.decode_batch(nullptr, 1, cin.get(), pout.get(), r.s), Error);
}

// --mimi-fp16 (CudaMimi fp16: the long and transposed convs on tensor cores, fp16 operands) against
// the fp32 CUDA Mimi, full size with random weights, on 98 frames of speech (tests/data/speech_16k.wav
// at 24 kHz, loudness-normalised as a voice prompt) and on the synthetic signal: the encoder keeps
// at least 98% of the codes and the decoder's audio stays within 1e-2 relative L2 (issue #13's
// bars). Batched rows equal rows alone, as in fp32. The figures go to stdout for docs/QUALITY.md.
TEST(CudaMimiFullSize, Fp16KeepsTheCodesAndTheAudio) {
  PPX_REQUIRE_GPU();
  FullSize& F = full();
  RandomWeights w(20261202);
  cuda::CudaMimi h(F.cfg.mimi, w, 3, true, /*fp16=*/true);
  ASSERT_TRUE(h.fp16());
  h.set_mma_always(true);  // one or two rows would otherwise run the fp32 kernels
  ASSERT_FALSE(F.gpu->fp16());
  EXPECT_LT(h.weight_bytes(), F.gpu->weight_bytes() * 2);
  const std::vector<float> speech = prepare_voice_audio(test::data("speech_16k.wav"));
  const int frames = static_cast<int>(speech.size()) / F.fs;
  ASSERT_GE(frames, 90);
  struct Result {
    std::vector<int32_t> codes;
    std::vector<float> pcm;  // decode of the fp32 codes
  };
  // Encode every frame, then decode the fp32 encoder's codes (`ref`, or this run's own when null).
  auto run = [&](cuda::CudaMimi& m, int slot, const std::vector<float>& x, int n, const Result* ref) {
    Runner r(m);
    m.reset_encoder(slot, r.s);
    m.reset_decoder(slot, r.s);
    Result out;
    for (int f = 0; f < n; ++f) {
      const auto c = r.encode(slot, x.data() + static_cast<size_t>(f) * F.fs);
      out.codes.insert(out.codes.end(), c.begin(), c.end());
    }
    const std::vector<int32_t>& dc = ref ? ref->codes : out.codes;
    for (int f = 0; f < n; ++f) {
      const auto y = r.decode(slot, dc.data() + static_cast<size_t>(f) * F.nq);
      out.pcm.insert(out.pcm.end(), y.begin(), y.end());
    }
    return out;
  };
  const std::vector<float> tones = signal(frames * F.fs, 5);
  for (const auto& [name, x] : {std::pair<const char*, const std::vector<float>*>{"speech", &speech},
                                {"tones", &tones}}) {
    const Result ref = run(*F.gpu, 0, *x, frames, nullptr);
    const Result got = run(h, 0, *x, frames, &ref);
    const double agree = agreement(got.codes, ref.codes), err = rel_l2(got.pcm, ref.pcm);
    std::vector<double> per_book(F.nq, 0.0);
    for (size_t i = 0; i < ref.codes.size(); ++i) per_book[i % F.nq] += got.codes[i] == ref.codes[i];
    std::printf("mimi fp16 vs fp32 (%s, %d frames): codes agree %.4f, decode rel L2 %.2e; per codebook:", name,
                frames, agree, err);
    for (double v : per_book) std::printf(" %.3f", v / frames);
    std::printf("\n");
    EXPECT_GE(agree, 0.98) << name;
    EXPECT_LE(err, 1e-2) << name;
    for (float v : got.pcm) ASSERT_TRUE(std::isfinite(v)) << name;
  }
  // Batch invariance: rows 1 and 2 together give what each gives alone.
  const Result alone1 = run(h, 1, speech, 12, nullptr), alone2 = run(h, 2, tones, 12, nullptr);
  Runner r(h);
  for (int i : {1, 2}) {
    h.reset_encoder(i, r.s);
    h.reset_decoder(i, r.s);
  }
  const int rows[2] = {2, 1};
  cuda::DeviceBuffer<int> ids(2);
  ids.upload(rows, 2, r.s);
  cuda::DeviceBuffer<float> pin(2 * static_cast<size_t>(F.fs)), pout(2 * static_cast<size_t>(F.fs));
  cuda::DeviceBuffer<int32_t> cbuf(2 * static_cast<size_t>(F.nq)), dbuf(2 * static_cast<size_t>(F.nq));
  std::vector<int32_t> codes1, codes2;
  std::vector<float> pcm1, pcm2;
  for (int f = 0; f < 12; ++f) {
    std::vector<float> x(2 * static_cast<size_t>(F.fs));
    std::copy_n(tones.data() + static_cast<size_t>(f) * F.fs, F.fs, x.data());
    std::copy_n(speech.data() + static_cast<size_t>(f) * F.fs, F.fs, x.data() + F.fs);
    pin.upload(x.data(), x.size(), r.s);
    h.encode_batch(ids.get(), 2, pin.get(), cbuf.get(), r.s);
    // Decode each row's own codes (as `run` with no reference does).
    PPX_CUDA_CHECK(cudaMemcpyAsync(dbuf.get(), cbuf.get(), 2 * F.nq * 4, cudaMemcpyDeviceToDevice, r.s));
    h.decode_batch(ids.get(), 2, dbuf.get(), pout.get(), r.s);
    std::vector<int32_t> c(2 * static_cast<size_t>(F.nq));
    std::vector<float> y(2 * static_cast<size_t>(F.fs));
    PPX_CUDA_CHECK(cudaMemcpyAsync(c.data(), cbuf.get(), c.size() * 4, cudaMemcpyDeviceToHost, r.s));
    PPX_CUDA_CHECK(cudaMemcpyAsync(y.data(), pout.get(), y.size() * 4, cudaMemcpyDeviceToHost, r.s));
    PPX_CUDA_CHECK(cudaStreamSynchronize(r.s));
    codes2.insert(codes2.end(), c.begin(), c.begin() + F.nq);
    codes1.insert(codes1.end(), c.begin() + F.nq, c.end());
    pcm2.insert(pcm2.end(), y.begin(), y.begin() + F.fs);
    pcm1.insert(pcm1.end(), y.begin() + F.fs, y.end());
  }
  EXPECT_EQ(codes1, alone1.codes);
  EXPECT_EQ(codes2, alone2.codes);
  EXPECT_EQ(pcm1, alone1.pcm);
  EXPECT_EQ(pcm2, alone2.pcm);
}

// --mimi-fp16 as shipped (no set_mma_always): at 32 batch rows the long and transposed convs fill
// the device and run on tensor cores, and the transformer's linears and the short convs run as TF32
// cuBLAS GEMMs (kDefaultMimiBlasRows), so every row's codes and audio go through the mixed path.
// Each row (its own offset into the speech) against the fp32 CUDA Mimi run on the same rows: the
// same bars as above, and the audio must differ (the fp16 path ran). Then the same with the cuBLAS
// path off (set_mimi_blas_rows(0): v0.20's codec, linears and short convs in fp32): the same bars,
// and its audio differs from the shipped path's.
TEST(CudaMimiFullSize, Fp16AsShippedAtThirtyTwoRows) {
  PPX_REQUIRE_GPU();
  FullSize& F = full();
  constexpr int kRows = 32, kN = 16;
  static_assert(kRows >= cuda::kDefaultMimiBlasRows);
  RandomWeights w16(20261202), w32(20261202), wb(20261202);
  ASSERT_EQ(cuda::mimi_blas_rows(), cuda::kDefaultMimiBlasRows);
  cuda::CudaMimi h(F.cfg.mimi, w16, kRows, true, /*fp16=*/true), f(F.cfg.mimi, w32, kRows, true, /*fp16=*/false);
  ASSERT_EQ(h.blas_rows(), cuda::kDefaultMimiBlasRows);
  ASSERT_EQ(f.blas_rows(), 0);
  cuda::set_mimi_blas_rows(0);
  std::unique_ptr<cuda::CudaMimi> h_off;
  try {
    h_off = std::make_unique<cuda::CudaMimi>(F.cfg.mimi, wb, kRows, true, /*fp16=*/true);
  } catch (...) {
    cuda::set_mimi_blas_rows(cuda::kDefaultMimiBlasRows);
    throw;
  }
  cuda::set_mimi_blas_rows(cuda::kDefaultMimiBlasRows);
  ASSERT_EQ(h_off->blas_rows(), 0);
  const std::vector<float> speech = prepare_voice_audio(test::data("speech_16k.wav"));
  ASSERT_GE(static_cast<int>(speech.size()) / F.fs, kN + kRows);
  struct Out {
    std::vector<int32_t> codes;
    std::vector<float> pcm;
  };
  // Encodes kN frames of every row (row r starts r frames into the speech), then decodes the codes
  // `dec` gives (the fp32 model's, so both decoders see the same input), or its own.
  auto run = [&](cuda::CudaMimi& m, const std::vector<int32_t>* dec) {
    Runner r(m);
    std::vector<int> rows(kRows);
    for (int i = 0; i < kRows; ++i) {
      rows[i] = i;
      m.reset_encoder(i, r.s);
      m.reset_decoder(i, r.s);
    }
    cuda::DeviceBuffer<int> ids(kRows);
    ids.upload(rows.data(), kRows, r.s);
    cuda::DeviceBuffer<float> pin(static_cast<size_t>(kRows) * F.fs), pout(pin.size());
    cuda::DeviceBuffer<int32_t> cbuf(static_cast<size_t>(kRows) * F.nq);
    Out o;
    std::vector<float> x(pin.size());
    std::vector<int32_t> c(cbuf.size());
    for (int fr = 0; fr < kN; ++fr) {
      for (int i = 0; i < kRows; ++i)
        std::copy_n(speech.data() + static_cast<size_t>(fr + i) * F.fs, F.fs, x.data() + static_cast<size_t>(i) * F.fs);
      pin.upload(x.data(), x.size(), r.s);
      m.encode_batch(ids.get(), kRows, pin.get(), cbuf.get(), r.s);
      PPX_CUDA_CHECK(cudaMemcpyAsync(c.data(), cbuf.get(), c.size() * 4, cudaMemcpyDeviceToHost, r.s));
      PPX_CUDA_CHECK(cudaStreamSynchronize(r.s));
      o.codes.insert(o.codes.end(), c.begin(), c.end());
    }
    const std::vector<int32_t>& dc = dec ? *dec : o.codes;
    std::vector<float> y(pout.size());
    for (int fr = 0; fr < kN; ++fr) {
      cbuf.upload(dc.data() + static_cast<size_t>(fr) * kRows * F.nq, static_cast<size_t>(kRows) * F.nq, r.s);
      m.decode_batch(ids.get(), kRows, cbuf.get(), pout.get(), r.s);
      PPX_CUDA_CHECK(cudaMemcpyAsync(y.data(), pout.get(), y.size() * 4, cudaMemcpyDeviceToHost, r.s));
      PPX_CUDA_CHECK(cudaStreamSynchronize(r.s));
      o.pcm.insert(o.pcm.end(), y.begin(), y.end());
    }
    return o;
  };
  const Out ref = run(f, nullptr);
  const Out got = run(h, &ref.codes);
  const double agree = agreement(got.codes, ref.codes), err = rel_l2(got.pcm, ref.pcm);
  std::printf("mimi fp16 as shipped vs fp32 (%d rows x %d frames of speech): codes agree %.4f, decode rel L2 %.2e\n",
              kRows, kN, agree, err);
  EXPECT_GE(agree, 0.98);
  EXPECT_LE(err, 1e-2);
  EXPECT_GT(err, 0.0) << "no conv ran on tensor cores at 32 rows";
  for (float v : got.pcm) ASSERT_TRUE(std::isfinite(v));

  const Out off = run(*h_off, &ref.codes);
  const double agree_off = agreement(off.codes, ref.codes), err_off = rel_l2(off.pcm, ref.pcm);
  std::printf("mimi fp16 without cuBLAS (v0.20) vs fp32 (%d rows x %d frames of speech): codes agree %.4f, decode "
              "rel L2 %.2e\n",
              kRows, kN, agree_off, err_off);
  EXPECT_GE(agree_off, 0.98);
  EXPECT_LE(err_off, 1e-2);
  EXPECT_NE(off.pcm, got.pcm) << "the shipped codec did not run the cuBLAS path";
  for (float v : off.pcm) ASSERT_TRUE(std::isfinite(v));
}

// The CUDA backend's codec batch (graphs per batch size) through the codec scheduler, sessions
// joining and leaving: each session gets what its own codec stream gives alone.
TEST(CudaCodecScheduler, BatchedEqualsAlone) {
  PPX_REQUIRE_GPU();
  const ModelConfig cfg = load_config(test::data("tiny_config_a.json"));
  FileWeights w(std::make_shared<const SafeTensors>(test::data("mimi_tiny_a.safetensors")));
  auto backend = make_cuda_backend(cfg, w, nullptr, 0, 5, /*with_lm=*/false);
  test::codec_batched_equals_alone(*backend, 5);
}

// After some frames, a reset makes the slot behave like a fresh one.
TEST(CudaMimiFullSize, ResetRestartsTheStream) {
  PPX_REQUIRE_GPU();
  FullSize& F = full();
  std::vector<int32_t> fresh_codes;
  std::vector<float> fresh_out;
  F.run(0, F.pcm, fresh_codes, fresh_out);
  cuda::CudaMimi& m = *F.gpu;
  Runner r(m);
  for (int f = 0; f < 5; ++f) {  // some other history first
    r.encode(0, F.pcm_b.data() + f * F.fs);
    r.decode(0, F.cpu_codes.data() + (kFrames - 1 - f) * F.nq);
  }
  m.reset_encoder(0, r.s);
  m.reset_decoder(0, r.s);
  for (int f = 0; f < 4; ++f) {
    const auto c = r.encode(0, F.pcm.data() + f * F.fs);
    const auto y = r.decode(0, F.cpu_codes.data() + f * F.nq);
    EXPECT_TRUE(std::equal(c.begin(), c.end(), fresh_codes.begin() + f * F.nq)) << "frame " << f;
    EXPECT_TRUE(std::equal(y.begin(), y.end(), fresh_out.begin() + f * F.fs)) << "frame " << f;
  }
  // The decoder alone reset, the encoder left running: the encoder continues its own stream.
  m.reset_decoder(0, r.s);
  const auto y0 = r.decode(0, F.cpu_codes.data());
  EXPECT_TRUE(std::equal(y0.begin(), y0.end(), fresh_out.begin()));
  const auto c4 = r.encode(0, F.pcm.data() + 4 * F.fs);
  EXPECT_TRUE(std::equal(c4.begin(), c4.end(), fresh_codes.begin() + 4 * F.nq));
}

TEST(CudaMimi, BadSlotIsAClearError) {
  PPX_REQUIRE_GPU();
  const ModelConfig cfg = load_config(test::data("tiny_config_a.json"));
  FileWeights w(std::make_shared<const SafeTensors>(test::data("mimi_tiny_a.safetensors")));
  cuda::CudaMimi m(cfg.mimi, w, 2);
  EXPECT_EQ(m.slots(), 2);
  EXPECT_THROW(m.reset_encoder(2, nullptr), Error);
  EXPECT_THROW(m.encode(-1, nullptr, nullptr, nullptr), Error);
}
