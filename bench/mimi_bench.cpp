// personaplex-bench-mimi: per-frame streaming encode and decode time of Mimi on the CPU (fp32
// reference path) or on CUDA (--device cuda: encode and decode each captured once in a CUDA graph,
// graph replays timed with CUDA events), with random full-size weights by default. Writes JSON with
// machine, commit, command. Warm-up frames are excluded.
//
//
// --batch N1 N2 ... (CUDA): the batched codec the server's codec scheduler runs: one CudaMimi with
// max(N) slots, and per N the batched encode and decode of N slots (encode_batch/decode_batch, each
// captured once in a graph), timed per pass and reported per row as well.
//
//   personaplex-bench-mimi [--config C] [--mimi W] [--frames N]
//                          [--warmup N] [--device cpu|cuda] [--batch N1 N2 ...] [--out bench/results/x.json]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <utility>

#include "apps/cli_checks.h"
#include "apps/common.h"
#include "ppx/error.h"
#include "ppx/config.h"
#include "ppx/resources.h"
#include "ppx/mimi.h"
#include "ppx/safetensors.h"
#include "ppx/weights.h"
#ifdef PPX_HAVE_CUDA
#include "backend/cuda/cuda_mimi.h"
#include "backend/cuda/cuda_util.h"
#endif

namespace {

// Test signal of frame f.
void fill_frame(std::vector<float>& pcm, int f) {
  const int fs = static_cast<int>(pcm.size());
  for (int i = 0; i < fs; ++i) pcm[i] = 0.3f * std::sin(0.03f * (f * fs + i)) * std::sin(0.0007f * (f * fs + i));
}

#ifdef PPX_HAVE_CUDA
// One frame's encode graph and decode graph replayed back to back on `s`, each timed with events.
class EncDecTimer {
 public:
  EncDecTimer() {
    for (cudaEvent_t& e : ev_) PPX_CUDA_CHECK(cudaEventCreate(&e));
  }
  ~EncDecTimer() {
    for (cudaEvent_t e : ev_) cudaEventDestroy(e);
  }
  EncDecTimer(const EncDecTimer&) = delete;
  EncDecTimer& operator=(const EncDecTimer&) = delete;
  // Replays both and waits; ms of the encode and of the decode.
  std::pair<float, float> run(cudaGraphExec_t enc, cudaGraphExec_t dec, cudaStream_t s) {
    PPX_CUDA_CHECK(cudaEventRecord(ev_[0], s));
    PPX_CUDA_CHECK(cudaGraphLaunch(enc, s));
    PPX_CUDA_CHECK(cudaEventRecord(ev_[1], s));
    PPX_CUDA_CHECK(cudaGraphLaunch(dec, s));
    PPX_CUDA_CHECK(cudaEventRecord(ev_[2], s));
    PPX_CUDA_CHECK(cudaEventSynchronize(ev_[2]));
    float a = 0.f, b = 0.f;
    PPX_CUDA_CHECK(cudaEventElapsedTime(&a, ev_[0], ev_[1]));
    PPX_CUDA_CHECK(cudaEventElapsedTime(&b, ev_[1], ev_[2]));
    return {a, b};
  }

 private:
  cudaEvent_t ev_[3] = {};
};

// Times graph replays of one encode and one decode per frame; returns the GPU description.
std::string bench_cuda(const ppx::MimiConfig& c, ppx::WeightSource& w, int warmup, int frames, bool fp16,
                       bool fp16_always, double* load_ms, std::vector<double>& enc, std::vector<double>& dec) {
  using namespace ppx::cuda;
  if (device_count() == 0) throw ppx::Error("--device cuda: no CUDA device found");
  const double t_load = ppx::app::now_ms();
  CudaMimi mimi(c, w, 1, true, fp16);
  mimi.set_mma_always(fp16_always);
  *load_ms = ppx::app::now_ms() - t_load;
  const int fs = mimi.frame_samples();
  cudaStream_t s;
  PPX_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  DeviceBuffer<float> d_pcm(fs), d_out(fs);
  DeviceBuffer<int32_t> d_codes(mimi.num_codebooks());
  PinnedBuffer<float> h_pcm(fs);
  const cudaGraphExec_t x_enc = capture_graph(s, [&] { mimi.encode(0, d_pcm.get(), d_codes.get(), s); });
  const cudaGraphExec_t x_dec = capture_graph(s, [&] { mimi.decode(0, d_codes.get(), d_out.get(), s); });
  EncDecTimer timer;
  std::vector<float> pcm(fs);
  for (int f = 0; f < warmup + frames; ++f) {
    fill_frame(pcm, f);
    std::copy(pcm.begin(), pcm.end(), h_pcm.get());
    PPX_CUDA_CHECK(cudaMemcpyAsync(d_pcm.get(), h_pcm.get(), fs * sizeof(float), cudaMemcpyHostToDevice, s));
    const auto [a, b] = timer.run(x_enc, x_dec, s);
    if (f >= warmup) {
      enc.push_back(a);
      dec.push_back(b);
    }
  }
  cudaGraphExecDestroy(x_enc);
  cudaGraphExecDestroy(x_dec);
  cudaStreamDestroy(s);
  return device_description();
}

// --batch: per batch size, graph replays of one batched encode and one batched decode per frame.
nlohmann::ordered_json bench_cuda_batches(const ppx::MimiConfig& c, ppx::WeightSource& w, int warmup, int frames,
                                          bool fp16, bool fp16_always, const std::vector<int>& sizes) {
  using namespace ppx::cuda;
  if (device_count() == 0) throw ppx::Error("--device cuda: no CUDA device found");
  const int max_n = *std::max_element(sizes.begin(), sizes.end());
  CudaMimi mimi(c, w, max_n, true, fp16);
  mimi.set_mma_always(fp16_always);
  const int fs = mimi.frame_samples(), nq = mimi.num_codebooks();
  cudaStream_t s;
  PPX_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  DeviceBuffer<int> ids(max_n);
  std::vector<int> h_ids(max_n);
  for (int i = 0; i < max_n; ++i) h_ids[i] = i;
  ids.upload(h_ids.data(), h_ids.size(), s);
  DeviceBuffer<float> d_pcm(static_cast<size_t>(max_n) * fs), d_out(static_cast<size_t>(max_n) * fs);
  DeviceBuffer<int32_t> d_codes(static_cast<size_t>(max_n) * nq);
  std::vector<float> pcm(static_cast<size_t>(max_n) * fs), one(fs);
  EncDecTimer timer;
  nlohmann::ordered_json runs = nlohmann::ordered_json::array();
  for (const int n : sizes) {
    for (int i = 0; i < n; ++i) {
      mimi.reset_encoder(i, s);
      mimi.reset_decoder(i, s);
    }
    const cudaGraphExec_t ge = capture_graph(s, [&] { mimi.encode_batch(ids.get(), n, d_pcm.get(), d_codes.get(), s); });
    const cudaGraphExec_t gd = capture_graph(s, [&] { mimi.decode_batch(ids.get(), n, d_codes.get(), d_out.get(), s); });
    std::vector<double> enc, dec;
    for (int f = 0; f < warmup + frames; ++f) {
      for (int i = 0; i < n; ++i) {
        fill_frame(one, f + 7 * i);
        std::copy(one.begin(), one.end(), pcm.begin() + static_cast<size_t>(i) * fs);
      }
      d_pcm.upload(pcm.data(), static_cast<size_t>(n) * fs, s);
      const auto [a, b] = timer.run(ge, gd, s);
      if (f >= warmup) {
        enc.push_back(a);
        dec.push_back(b);
      }
    }
    cudaGraphExecDestroy(ge);
    cudaGraphExecDestroy(gd);
    nlohmann::ordered_json r;
    r["batch"] = n;
    r["encode_ms"] = ppx::app::latency_stats(enc);
    r["decode_ms"] = ppx::app::latency_stats(dec);
    const double ep = r["encode_ms"]["p50"].get<double>(), dp = r["decode_ms"]["p50"].get<double>();
    r["encode_us_per_row_p50"] = 1000.0 * ep / n;
    r["decode_us_per_row_p50"] = 1000.0 * dp / n;
    // Sessions whose encode + decode fit in one 80 ms frame at this batch's cost per row.
    r["rows_per_frame_p50"] = (1000.0 / c.frame_rate) / ((ep + dp) / n);
    std::fprintf(stderr, "batch %4d: encode p50 %8.3f ms (%7.1f us/row), decode p50 %8.3f ms (%7.1f us/row)\n", n, ep,
                 1000.0 * ep / n, dp, 1000.0 * dp / n);
    runs.push_back(r);
  }
  cudaStreamDestroy(s);
  nlohmann::ordered_json j;
  j["gpu"] = device_description();
  j["batches"] = runs;
  return j;
}
#endif

int bench(int argc, char** argv) {
  CLI::App app{"Per-frame Mimi encode/decode timing on the CPU"};
  std::string config, weights, out;  // no --config: the embedded PersonaPlex 7B config
  int frames = 50, warmup = 5;
  uint64_t seed = 1234;
  app.add_option("--config", config, "model config JSON (default: the embedded PersonaPlex 7B config)")
      ->check(CLI::ExistingFile);
  app.add_option("--mimi", weights, "Mimi weights; random weights of the config's size when absent");
  app.add_option("--frames", frames, "timed frames")->capture_default_str()->check(CLI::Range(1, 1000000));
  app.add_option("--warmup", warmup, "untimed frames first")->capture_default_str()->check(CLI::Range(0, 1000000));
  app.add_option("--seed", seed, "random weight seed")->capture_default_str();
  std::string device = "cpu";
  app.add_option("--device", device, "cpu or cuda")->capture_default_str()->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--out", out, "write the JSON result here too");
  std::vector<int> batch_sizes;
  app.add_option("--batch", batch_sizes, "with --device cuda: time the batched encode and decode of this many slots")
      ->delimiter(',')
      ->check(CLI::Range(1, 4096));
  bool fp16 = false, fp16_always = false;
  app.add_flag("--mimi-fp16", fp16, "with --device cuda: the fp16 tensor-core convolutions (CudaOptions::mimi_fp16)");
  app.add_flag("--mimi-fp16-always", fp16_always,
               "with --mimi-fp16: tensor cores in every launch, also those it leaves in fp32 (small batches)");
  int blas_rows = -1;
  app.add_option("--mimi-blas-rows", blas_rows,
                 "with --mimi-fp16 and --batch: run the transformer linears and the short convolutions of launches "
                 "of at least this many rows (2 or more) as TF32 cuBLAS GEMMs (cuda::set_mimi_blas_rows); 0: never "
                 "(the v0.20 codec); default: as shipped (4 rows)")
      ->check(CLI::Range(0, 100000));
  ppx::app::check_numbers(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return ppx::app::parse_failed(app, e);
  }
  const ppx::ModelConfig cfg =
      config.empty() ? ppx::parse_config(std::string(ppx::embedded_config("personaplex-7b")), "embedded:personaplex-7b")
                     : ppx::load_config(config);
  std::unique_ptr<ppx::WeightSource> w;
  if (weights.empty()) {
    w = std::make_unique<ppx::RandomWeights>(seed);
  } else {
    w = std::make_unique<ppx::FileWeights>(std::make_shared<const ppx::SafeTensors>(weights));
  }
  if (fp16 && device != "cuda") throw ppx::Error("--mimi-fp16 needs --device cuda");
  if (fp16_always && !fp16) throw ppx::Error("--mimi-fp16-always needs --mimi-fp16");
  if (blas_rows >= 0 && !fp16) throw ppx::Error("--mimi-blas-rows needs --mimi-fp16");
  if (blas_rows >= 0 && batch_sizes.empty()) throw ppx::Error("--mimi-blas-rows needs --batch (one row never uses it)");
#ifdef PPX_HAVE_CUDA
  if (blas_rows >= 0) ppx::cuda::set_mimi_blas_rows(blas_rows);  // before any CudaMimi is built
  blas_rows = fp16 ? ppx::cuda::mimi_blas_rows() : 0;             // as it applies (1 counts as 2)
#else
  blas_rows = 0;
#endif
  if (!batch_sizes.empty()) {
    if (device != "cuda") throw ppx::Error("--batch needs --device cuda");
#ifdef PPX_HAVE_CUDA
    nlohmann::ordered_json j;
    j["bench"] = fp16 ? "mimi_cuda_fp16_batched" : "mimi_cuda_fp32_batched";
    j["mimi_fp16"] = fp16;
    j["mimi_fp16_always"] = fp16_always;
    j["mimi_blas_rows"] = blas_rows;
    j["config"] = config.empty() ? "embedded:personaplex-7b" : config;
    j["weights"] = weights.empty() ? "random" : weights;
    j["frames"] = frames;
    j["warmup"] = warmup;
    j.update(bench_cuda_batches(cfg.mimi, *w, warmup, frames, fp16, fp16_always, batch_sizes));
    j["machine"] = ppx::app::machine_info();
    j["command"] = ppx::app::command_line(argc, argv);
    ppx::app::emit_json(j, out);
    return 0;
#else
    throw ppx::Error("--device cuda: this build has no CUDA backend (configure with -DPPX_CUDA=ON)");
#endif
  }
  double load_ms = 0;
  std::vector<double> enc, dec;
  std::string gpu;
  if (device == "cuda") {
#ifdef PPX_HAVE_CUDA
    gpu = bench_cuda(cfg.mimi, *w, warmup, frames, fp16, fp16_always, &load_ms, enc, dec);
#else
    throw ppx::Error("--device cuda: this build has no CUDA backend (configure with -DPPX_CUDA=ON)");
#endif
  } else {
    const double t_load = ppx::app::now_ms();
    const ppx::Mimi mimi(cfg.mimi, *w);
    load_ms = ppx::app::now_ms() - t_load;
    const int fs = mimi.frame_samples();
    ppx::MimiState st;
    std::vector<float> pcm(fs), out_pcm(fs);
    std::vector<int32_t> codes(mimi.num_codebooks());
    for (int f = 0; f < warmup + frames; ++f) {
      fill_frame(pcm, f);
      const double t0 = ppx::app::now_ms();
      mimi.encode(st, pcm.data(), codes.data());
      const double t1 = ppx::app::now_ms();
      mimi.decode(st, codes.data(), out_pcm.data());
      const double t2 = ppx::app::now_ms();
      if (f >= warmup) {
        enc.push_back(t1 - t0);
        dec.push_back(t2 - t1);
      }
      std::fprintf(stderr, "\rframe %d/%d", f + 1, warmup + frames);
    }
    std::fprintf(stderr, "\n");
  }
  std::vector<double> total(enc.size());
  for (size_t i = 0; i < enc.size(); ++i) total[i] = enc[i] + dec[i];
  nlohmann::ordered_json j;
  j["bench"] = device == "cuda" ? (fp16 ? "mimi_cuda_fp16_graph" : "mimi_cuda_fp32_graph") : "mimi_cpu_fp32";
  j["mimi_fp16"] = fp16;
  j["mimi_fp16_always"] = fp16_always;
  j["mimi_blas_rows"] = blas_rows;
  j["config"] = config.empty() ? "embedded:personaplex-7b" : config;
  j["weights"] = weights.empty() ? "random" : weights;
  j["device"] = device;
  if (!gpu.empty()) j["gpu"] = gpu;
  j["frames"] = frames;
  j["warmup"] = warmup;
  j["load_ms"] = load_ms;
  j["encode_ms"] = ppx::app::latency_stats(enc);
  j["decode_ms"] = ppx::app::latency_stats(dec);
  j["total_ms"] = ppx::app::latency_stats(total);
  const double frame_ms = 1000.0 / cfg.mimi.frame_rate;
  j["real_time_factor_p50"] = j["total_ms"]["p50"].get<double>() / frame_ms;
  j["machine"] = ppx::app::machine_info();
  j["command"] = ppx::app::command_line(argc, argv);
  ppx::app::emit_json(j, out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return ppx::app::run_main(bench, argc, argv); }
