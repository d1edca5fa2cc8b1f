// personaplex-bench: the server's per-frame path, timed stage by stage (PCM in -> Mimi encode ->
// LM step -> Mimi decode -> PCM out), after the system prompts and a warm-up that is excluded.
// Writes JSON with total and per-stage p50/p90/p99/p99.9/max in ms, frames over the 80 ms budget,
// the machine, commit and command.
//
// --sessions N: N conversations with independent audio through the frame scheduler (the server's
// path: one batched LM step for every session with a frame ready), each fed one frame every 80 ms
// in real time (staggered starts). Reports the batch step time, the batch sizes and each frame's
// added latency (its arrival to its output PCM ready) p50/p99/p99.9, and frames over the 160 ms
// budget (two frames), with their count per second of the run when there are any. Batch steps
// are counted once every session is in its timed frames. The sessions run as the server's do: a
// thread each for the prompts, then no thread per session (Conversation::step_async, paced by one
// thread). The codec runs as in the server: batched by the codec scheduler (pass times and frames
// per pass reported), or with --per-session-codec each session's own stream, on shared threads.
//
// --lm-batch B1 B2 ...: the batched LM step alone at each batch size (one LmBatch with max(B)
// slots, every row a session with random provided audio tokens and sampled text and agent tokens):
// step wall time p50/p99/p99.9 per batch size, --frames steps after --warmup.
//
// --sweep N1 N2 ...: the --sessions run at each count in one process (the model loaded once, a
// fresh scheduler and LM batch per count): one JSON with every run's results under "runs", a
// table on stderr, and a PNG beside --out (its name with .png) plotting the added latency p99
// and the batch step p99 against the count, with the 80 ms frame and the 160 ms budget.
//
// --prompt-steps P (with --sessions or --sweep): each session's system prompt is P text steps, run as
// the server runs a long prompt (prompt prefill in the scheduler), so the context fills without
// stepping frames. Every session waits after its prompts and --prefill frames until all are there.
//
// --prefill F (with any of them): F untimed steps first, back to back, so that the timed ones run with
// the context filled (the LM's context is 3000 frames; the KV cache is a ring). With --lm-batch the
// first min(F, context - 1) of them are prompt prefill (LmBatch::prefill, all streams given), timed
// as prefill_s.
//
//   personaplex-bench [model flags] [--frames N] [--warmup N] [--soak MINUTES] [--sessions N]
//                     [--sweep N1 N2 ...] [--lm-batch B1 B2 ...] [--prefill F] [--prompt-steps P]
//                     [--out FILE]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <queue>
#include <random>
#include <thread>

#if defined(PPX_HAVE_CUDA)
#include <cuda_profiler_api.h>  // cudaProfilerStart / Stop (--profile-steps)
#include <cuda_runtime.h>       // cudaMemGetInfo (device_free_bytes)

#include "backend/cuda/cuda_mimi.h"  // cuda::set_mimi_blas_rows (--mimi-blas-rows)
#include "backend/cuda/cuda_util.h"  // PPX_CUDA_CHECK
#include "lm_attention.cuh"           // kern::attention_set_policy (--attention-policy)
#include "lm_gemv.cuh"                // kern::gemm_set_policy (--gemm-policy)
#endif
#include "apps/cli_checks.h"
#include "apps/common.h"
#include "apps/model_loading.h"
#include "apps/png_plot.h"
#include "ppx/backend.h"
#include "engine/codec_scheduler.h"
#include "engine/scheduler.h"
#include "ppx/conversation.h"
#include "ppx/error.h"
#include "ppx/error_text.h"

namespace {

// prompt_steps > 0: a text prompt of that many tokens instead (--prompt-steps).
ppx::SystemPrompt bench_prompt(const ppx::app::LoadedModel& m, int prompt_steps = 0) {
  ppx::SystemPrompt prompt;
  if (prompt_steps > 0) {
    // Ordinary text tokens (past the specials at the start of every vocabulary), cycling.
    const int card = m.cfg.lm->text_card;
    const int first = std::min(100, card / 2), span = std::max(1, std::min(500, card - first));
    for (int i = 0; i < prompt_steps; ++i) prompt.text_tokens.push_back(first + i % span);
  } else if (m.tokenizer) {
    prompt.text_tokens = m.tokenizer->encode(ppx::wrap_system_prompt("You are a wise and friendly teacher."));
  } else {
    for (int i = 0; i < 20; ++i) prompt.text_tokens.push_back(100 + i);  // no tokenizer with random weights
  }
  return prompt;
}

int g_gemm_policy = -1;    // --gemm-policy (-1: as shipped)
int g_attention_policy = -1;  // --attention-policy (-1: as shipped)
int g_attention_parts = 0;    // --attention-parts (0: the plan's)
int g_mimi_blas_rows = 0;  // the codec's cuBLAS threshold as it applies (--mimi-blas-rows; 0: off or fp32 Mimi)

// The head of the --sessions and --lm-batch JSON: what ran, on what, with which speed flags.
nlohmann::ordered_json result_head(const char* bench, const ppx::app::LoadedModel& m,
                                   const ppx::app::ModelFlags& mf) {
  nlohmann::ordered_json j;
  j["bench"] = bench;
  j["model"] = m.description;
  j["device"] = m.backend->device();
  j["flags"] = {{"dep_steps", m.dep_steps < 0 ? m.cfg.lm->dep_q : m.dep_steps},
                {"w8a16", mf.w8a16 || mf.fast},
                {"speed_flags", m.speed_flags}};
  if (g_gemm_policy >= 0) j["gemm_policy"] = g_gemm_policy;
#if defined(PPX_HAVE_CUDA)
  // What ran (since v0.34 both are on as shipped; --no-gemm-chain and --kv-fp8-by-position turn
  // them off), written always so that files of different versions read alike.
  if (mf.device == "cuda") {
    j["gemm_chain"] = ppx::kern::gemm_chain();
    if (mf.kv_fp8) j["kv_fp8_by_head"] = ppx::kern::attention_fp8_by_head();
  }
#endif
  if (g_attention_policy >= 0) j["attention_policy"] = g_attention_policy;
  if (g_attention_parts > 0) j["attention_parts"] = g_attention_parts;
  j["mimi_blas_rows"] = g_mimi_blas_rows;
  return j;
}

// One --sessions run: N sessions through a fresh scheduler (its own LM batch of N slots). Returns
// the run's results, without the JSON head.
struct SessionRun {
  int frames = 0, warmup = 0, prefill = 0, prompt_steps = 0;
  bool codec_batch = true;
  int frames_in_flight = ppx::Conversation::kMaxFramesInFlight;  // per session (--frames-in-flight)
  double codec_gather_ms = 0;                                     // --codec-gather-ms
  bool codec_hold = false;                                        // --codec-hold
};
// Free device memory in bytes on this thread's CUDA device; -1 without one.
double device_free_bytes() {
#if defined(PPX_HAVE_CUDA)
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) return static_cast<double>(free_b);
  (void)cudaGetLastError();
#endif
  return -1;
}

nlohmann::ordered_json run_sessions(const ppx::app::LoadedModel& m, int sessions, const SessionRun& o) {
  const int frames = o.frames, warmup = o.warmup, prefill = o.prefill;
  // What the run allocates on the device beside the model: the LM batch (KV caches, row buffers),
  // the codec batch, and later the graphs of each batch size and the prefill buffers.
  const double free_before = device_free_bytes();
  const bool codec_batch = o.codec_batch;
  using Clock = std::chrono::steady_clock;
  const ppx::LmGenConfig gen = *m.cfg.lm_gen;
  std::mutex mu;  // guards the vectors below
  std::vector<double> step_ms, latency;
  std::vector<int64_t> late_frames;  // timed frame index of each frame over budget (all sessions)
  std::vector<int> batch;
  // Batch steps count once every session is past its prompts and warm-up (before that, prompt
  // steps of some sessions run beside the real-time frames of others).
  std::atomic<int> timed{0};
  ppx::StepClock step_clock;  // --codec-hold: the LM's steps as the codec scheduler sees them
  ppx::StepClock* const hold_clock = o.codec_hold ? &step_clock : nullptr;
  ppx::LmScheduler sched(
      m.backend->lm_batch(sessions, m.dep_steps),
      [&](const ppx::LmScheduler::StepInfo& i) {
        if (timed.load() < sessions) return;
        std::lock_guard<std::mutex> lk(mu);
        step_ms.push_back(i.ms);
        batch.push_back(i.batch);
      },
      0, 0, hold_clock);
  // The codec as the server runs it: every session's frames batched by the codec scheduler, or
  // (--per-session-codec) each session's own stream on its thread.
  std::vector<double> codec_ms, codec_rows;
  std::unique_ptr<ppx::CodecScheduler> codec_sched;
  if (codec_batch)
    codec_sched = std::make_unique<ppx::CodecScheduler>(m.backend->codec_batch(sessions),
                                                        [&](const ppx::CodecScheduler::PassInfo& i) {
                                                          if (timed.load() < sessions) return;
                                                          std::lock_guard<std::mutex> lk(mu);
                                                          codec_ms.push_back(i.ms);
                                                          codec_rows.push_back(i.encodes + i.decodes);
                                                        }, o.codec_gather_ms, hold_clock);
  const double free_setup = device_free_bytes();
  const int fs = m.cfg.mimi.frame_samples();
  const double frame_ms = 1000.0 / m.cfg.mimi.frame_rate;
  const ppx::SystemPrompt prompt = bench_prompt(m, o.prompt_steps);
  std::vector<std::string> errors;
  // One session: its model state and the timed phase's state.
  struct Session {
    std::unique_ptr<ppx::CodecStream> codec;
    std::unique_ptr<ppx::LmStepper> stepper;
    std::unique_ptr<ppx::Conversation> conv;
    float w = 0;
    std::vector<float> pcm;
    int64_t issued = 0, completed = 0;   // frames started and finished, warm-up included
    bool queued = false;                 // its next frame waits in `due` (under mu)
    bool failed = false;                 // a frame of it failed: it is finished (under mu)
    Clock::time_point t0;                // timed phase start
    std::vector<double> mine;            // added latency of each timed frame
    std::vector<int64_t> my_late;        // timed frames over budget
  };
  std::vector<Session> ss(static_cast<size_t>(sessions));
  // --per-session-codec: the sessions' codec calls run on a few shared threads, as the server runs
  // them on its session executor (8 threads at most there too).
  std::mutex task_mu;
  std::condition_variable task_cv;
  std::deque<std::function<void()>> tasks;  // under task_mu
  bool tasks_done = false;                  // under task_mu
  std::vector<std::thread> codec_workers;
  const auto post_codec = [&](std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lk(task_mu);
      tasks.push_back(std::move(task));
    }
    task_cv.notify_one();
  };
  if (!codec_batch) {
    for (int i = 0; i < 8; ++i) {
      codec_workers.emplace_back([&] {
        m.backend->attach_thread();
        for (;;) {
          std::function<void()> t;
          {
            std::unique_lock<std::mutex> lk(task_mu);
            task_cv.wait(lk, [&] { return tasks_done || !tasks.empty(); });
            if (tasks.empty()) return;
            t = std::move(tasks.front());
            tasks.pop_front();
          }
          try {
            t();  // a codec call hands its own error to its frame; nothing else may escape
          } catch (...) {
          }
        }
      });
    }
  }
  // Stops the codec workers however the run ends.
  struct JoinWorkers {
    std::function<void()> f;
    ~JoinWorkers() { f(); }
  } join_workers{[&] {
    {
      std::lock_guard<std::mutex> lk(task_mu);
      tasks_done = true;
    }
    task_cv.notify_all();
    for (auto& t : codec_workers) t.join();
  }};
  auto input = [&](Session& x, int64_t f) {
    for (int i = 0; i < fs; ++i) x.pcm[i] = 0.2f * std::sin(x.w * static_cast<float>(f * fs + i));
  };
  // Sessions start as the server's do: a thread each for the prompts (and --prefill frames, back to
  // back, batched with the other sessions', to fill the context). No timed frame runs until every
  // session is through (a failed session ends the run).
  const auto t_start = Clock::now();
  {
    std::vector<std::thread> threads;
    for (int s = 0; s < sessions; ++s) {
      threads.emplace_back([&, s] {
        Session& x = ss[static_cast<size_t>(s)];
        try {
          m.backend->attach_thread();  // --device cuda:N: this thread's codec work on that device
          if (codec_sched)
            x.codec = codec_sched->open(s);
          else  // its async calls run on the codec workers below, as the server's on the strands
            x.codec = std::make_unique<ppx::PostingCodecStream>(m.backend->codec_stream(s), post_codec);
          x.stepper = sched.open(s, gen, 42424242 + static_cast<uint64_t>(s));
          x.conv = std::make_unique<ppx::Conversation>(*x.codec, *x.stepper, gen);
          sched.run_system_prompts(*x.stepper, *x.conv, prompt);
          x.pcm.resize(fs);
          x.w = 0.011f + 0.003f * static_cast<float>(s);
          for (int64_t f = 0; f < prefill; ++f) {
            input(x, f);
            x.conv->step(x.pcm.data());
          }
        } catch (const std::exception& e) {
          std::lock_guard<std::mutex> lk(mu);
          errors.push_back("session " + std::to_string(s) + ": " + e.what());
        }
      });
    }
    for (auto& t : threads) t.join();
  }
  if (!errors.empty()) throw ppx::Error(errors.front() + " (" + std::to_string(errors.size()) + " sessions failed)");
  // The timed frames, as the server's live sessions run: no thread per session. A pacer thread
  // starts each frame at its arrival (Conversation::step_async: the codec and LM schedulers'
  // threads carry it on), up to o.frames_in_flight of a session at once (pipelined: the next
  // frame's encode and step overlap this one's decode); a completion records the added latency
  // and hands the session back to the pacer for its next arrival (or, with it passed, the next
  // frame starts at once). Arrivals are staggered over one frame period, as real clients are.
  struct Due {
    Clock::time_point at;
    int s;
    bool operator>(const Due& o) const { return at > o.at; }
  };
  std::priority_queue<Due, std::vector<Due>, std::greater<Due>> due;  // under mu
  std::condition_variable cv;
  int finished = 0;  // under mu
  const auto frame_at = [&](const Session& x, int64_t f) {
    return x.t0 + std::chrono::microseconds(static_cast<int64_t>(1000.0 * frame_ms * static_cast<double>(f)));
  };
  const int64_t total = warmup + frames;
  // Under mu: queues the session's next frame for the pacer when it may start one more.
  const auto queue_next = [&](Session& x, int s) {
    if (x.failed || x.queued || x.issued >= total || x.issued - x.completed >= o.frames_in_flight) return;
    x.queued = true;
    due.push(Due{frame_at(x, x.issued), s});
  };
  // Called by the pacer with mu held for frame f (taken from `issued` under mu); runs unlocked.
  std::function<void(int, int64_t)> start_frame = [&](int s, int64_t f) {
    Session& x = ss[static_cast<size_t>(s)];
    input(x, f);  // step_async copies it
    x.conv->step_async(x.pcm.data(), [&, s](std::optional<ppx::FrameOut> fr, std::exception_ptr e) {
      Session& y = ss[static_cast<size_t>(s)];
      std::lock_guard<std::mutex> lk(mu);
      const int64_t k = y.completed++;
      if (y.failed) {  // a frame behind the failed one: the session is done once all are back
        if (y.completed == y.issued) ++finished;
        cv.notify_all();
        return;
      }
      std::string err = ppx::error_text(e);
      if (!e && !fr) {
        err = "no frame produced after the system prompts";
      }
      if (!err.empty()) {
        errors.push_back("session " + std::to_string(s) + ": " + err);
        y.failed = true;
        if (y.completed == y.issued) ++finished;
        cv.notify_all();
        return;
      }
      if (k >= warmup) {
        y.mine.push_back(std::chrono::duration<double, std::milli>(Clock::now() - frame_at(y, k)).count());
        if (y.mine.back() > 2 * frame_ms) y.my_late.push_back(k - warmup);
      }
      if (y.completed == total)
        ++finished;
      else
        queue_next(y, s);
      cv.notify_all();
    });
  };
  const auto t_timed = Clock::now();
  for (int s = 0; s < sessions; ++s) {
    Session& x = ss[static_cast<size_t>(s)];
    x.t0 = t_timed + std::chrono::microseconds(static_cast<int64_t>(1000.0 * frame_ms * s / sessions));
    x.queued = true;
    due.push(Due{x.t0, s});
  }
  {
    std::unique_lock<std::mutex> lk(mu);
    while (finished < sessions) {
      if (due.empty()) {
        cv.wait(lk);
        continue;
      }
      const Due d = due.top();
      if (Clock::now() < d.at) {
        cv.wait_until(lk, d.at);
        continue;
      }
      due.pop();
      Session& x = ss[static_cast<size_t>(d.s)];
      x.queued = false;
      if (x.failed) continue;
      const int64_t f = x.issued++;
      if (f == warmup) ++timed;
      lk.unlock();
      std::optional<std::string> failure;
      try {
        start_frame(d.s, f);
      } catch (const std::exception& e) {
        failure = e.what();
      } catch (...) {
        failure = "unknown error";
      }
      lk.lock();
      if (failure) {
        --x.issued;  // it never started
        if (!x.failed) errors.push_back("session " + std::to_string(d.s) + ": " + *failure);
        x.failed = true;
        if (x.completed == x.issued) ++finished;
      } else {
        queue_next(x, d.s);
      }
    }
  }
  if (!errors.empty()) throw ppx::Error(errors.front() + " (" + std::to_string(errors.size()) + " sessions failed)");
  for (const Session& x : ss) {
    latency.insert(latency.end(), x.mine.begin(), x.mine.end());
    late_frames.insert(late_frames.end(), x.my_late.begin(), x.my_late.end());
  }
  const double wall_s = std::chrono::duration<double>(Clock::now() - t_start).count();
  if (!errors.empty()) throw ppx::Error(errors.front() + " (" + std::to_string(errors.size()) + " sessions failed)");
  const double budget_ms = 2 * frame_ms;
  int64_t over = 0;
  for (double l : latency) over += l > budget_ms;
  std::vector<double> bsz(batch.begin(), batch.end());
  nlohmann::ordered_json j;
  j["sessions"] = sessions;
  j["frames_per_session"] = frames;
  j["warmup"] = warmup;
  j["prefill"] = prefill;
  j["prompt_steps"] = o.prompt_steps;
  j["frames_in_flight"] = o.frames_in_flight;
  j["codec_gather_ms"] = o.codec_gather_ms;
  j["codec_hold"] = o.codec_hold;
  j["budget_ms"] = budget_ms;
  j["frames"] = latency.size();
  j["frames_over_budget"] = over;
  // When in the run the late frames were: their count per second of timed frames (every session
  // starts its timed frames within one frame period of the others).
  if (!late_frames.empty()) {
    std::vector<int64_t> per_s(static_cast<size_t>(std::ceil(frames * frame_ms / 1000.0)) + 1, 0);
    for (int64_t f : late_frames) ++per_s[std::min(per_s.size() - 1, static_cast<size_t>(f * frame_ms / 1000.0))];
    j["late_frames_per_second"] = per_s;
  }
  j["added_latency_ms"] = ppx::app::latency_stats(latency);
  j["batch_step_ms"] = ppx::app::latency_stats(step_ms);
  j["batch_size"] = ppx::app::latency_stats(bsz);
  j["batch_steps"] = step_ms.size();
  j["codec"] = codec_batch ? "batched" : "per-session";
  if (codec_batch) {
    j["codec_pass_ms"] = ppx::app::latency_stats(codec_ms);
    j["codec_pass_frames"] = ppx::app::latency_stats(codec_rows);
    if (o.codec_hold) {
      const ppx::CodecScheduler::Totals t = codec_sched->totals();  // since the start, prompts included
      j["codec_held_passes"] = t.held_passes;
      j["codec_held_ms"] = t.held_ms;
    }
  }
  j["wall_s"] = wall_s;
  if (free_before >= 0)
    j["device_free_bytes"] = {{"before_batches", free_before}, {"after_batches", free_setup},
                              {"after_run", device_free_bytes()}};
  return j;
}

// --sessions N (see the top of this file).
int bench_sessions(const ppx::app::LoadedModel& m, const ppx::app::ModelFlags& mf, int sessions, const SessionRun& o,
                   int argc, char** argv, const std::string& out) {
  nlohmann::ordered_json j = result_head("sessions", m, mf);
  j.update(run_sessions(m, sessions, o));
  j["machine"] = ppx::app::machine_info();
  j["command"] = ppx::app::command_line(argc, argv);
  ppx::app::emit_json(j, out);
  return 0;
}

// `path` with its extension (if any) replaced by `ext`.
std::string with_extension(const std::string& path, const std::string& ext) {
  return std::filesystem::path(path).replace_extension(ext).string();
}

// --sweep N1 N2 ... (see the top of this file).
int bench_sweep(const ppx::app::LoadedModel& m, const ppx::app::ModelFlags& mf, const std::vector<int>& counts,
                const SessionRun& o, int argc, char** argv, const std::string& out) {
  const double frame_ms = 1000.0 / m.cfg.mimi.frame_rate;
  nlohmann::ordered_json runs = nlohmann::ordered_json::array();
  ppx::app::PlotSeries added{"added latency p99", {214, 39, 40}, {}, {}};
  ppx::app::PlotSeries step{"batch step p99", {31, 119, 180}, {}, {}};
  for (const int n : counts) {
    std::fprintf(stderr, "sweep: %d sessions\n", n);
    nlohmann::ordered_json r = run_sessions(m, n, o);
    // A run too short to time a step after every session started has no step statistics.
    const auto p99 = [](const nlohmann::ordered_json& st) {
      return st.contains("p99") ? st["p99"].get<double>() : std::nan("");
    };
    added.x.push_back(n);
    added.y.push_back(p99(r["added_latency_ms"]));
    step.x.push_back(n);
    step.y.push_back(p99(r["batch_step_ms"]));
    runs.push_back(std::move(r));
  }
  const std::string png = with_extension(out, ".png");
  ppx::app::PlotSpec spec;
  spec.title = "personaplex-bench --sweep: p99 against sessions";
  spec.x_label = "sessions";
  spec.y_label = "ms";
  spec.series = {added, step};
  spec.lines = {{"80 ms frame", {120, 120, 120}, frame_ms}, {"160 ms budget", {44, 160, 44}, 2 * frame_ms}};
  // Points without a value (no timed step) are left out of the plot.
  for (ppx::app::PlotSeries& s : spec.series) {
    ppx::app::PlotSeries kept{s.label, s.color, {}, {}};
    for (size_t i = 0; i < s.x.size(); ++i)
      if (std::isfinite(s.y[i])) kept.x.push_back(s.x[i]), kept.y.push_back(s.y[i]);
    s = kept;
  }
  ppx::app::write_png(ppx::app::plot(spec), png);

  // The table, on stderr so that stdout stays one JSON document.
  std::fprintf(stderr, "%8s %8s %10s %10s %10s %10s %10s %8s\n", "sessions", "frames", "step p50", "step p99",
               "added p50", "added p99", "added p99.9", "over");
  for (const auto& r : runs) {
    const auto v = [&](const char* k, const char* p) {
      return r[k].contains(p) ? r[k][p].get<double>() : std::nan("");
    };
    std::fprintf(stderr, "%8d %8d %10.2f %10.2f %10.2f %10.2f %11.2f %8d\n", r["sessions"].get<int>(),
                 r["frames"].get<int>(), v("batch_step_ms", "p50"), v("batch_step_ms", "p99"),
                 v("added_latency_ms", "p50"), v("added_latency_ms", "p99"), v("added_latency_ms", "p99_9"),
                 r["frames_over_budget"].get<int>());
  }
  std::fprintf(stderr, "plot: %s\n", png.c_str());

  nlohmann::ordered_json j = result_head("sweep", m, mf);
  j["frames_per_session"] = o.frames;
  j["warmup"] = o.warmup;
  j["prefill"] = o.prefill;
  j["prompt_steps"] = o.prompt_steps;
  j["frames_in_flight"] = o.frames_in_flight;
  j["codec_gather_ms"] = o.codec_gather_ms;
  j["codec_hold"] = o.codec_hold;
  j["frame_ms"] = frame_ms;
  j["budget_ms"] = 2 * frame_ms;
  j["plot"] = png;
  j["runs"] = runs;
  j["machine"] = ppx::app::machine_info();
  j["command"] = ppx::app::command_line(argc, argv);
  ppx::app::emit_json(j, out);
  return 0;
}

// --lm-batch (see the top of this file).
int bench_lm_batch(const ppx::app::LoadedModel& m, const ppx::app::ModelFlags& mf, const std::vector<int>& sizes,
                   int frames, int warmup, int prefill, int profile_steps, int argc, char** argv,
                   const std::string& out) {
  const ppx::LmConfig& c = *m.cfg.lm;
  const int max_b = *std::max_element(sizes.begin(), sizes.end());
  auto batch = m.backend->lm_batch(max_b, m.dep_steps);
  batch->attach_thread();
  const int K = c.n_q + 1, half = c.n_q / 2;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> tok(0, c.card - 1);
  // Row b's request: the previous column (random tokens), the target column with the user's
  // codebooks provided (as in conversation) and the text and agent streams sampled.
  std::vector<std::vector<int64_t>> input(max_b, std::vector<int64_t>(K)), target(max_b, std::vector<int64_t>(K));
  std::vector<std::vector<uint8_t>> provided(max_b, std::vector<uint8_t>(K, 0));
  std::vector<ppx::StepRequest> req(max_b);
  std::vector<ppx::StepResult> res(max_b);
  std::vector<ppx::BatchStep> steps(max_b);
  nlohmann::ordered_json per_b = nlohmann::ordered_json::array();
  // --prefill: the positions inside the ring go through LmBatch::prefill (a system prompt's path:
  // every stream given, many positions per pass), the rest as steps.
  const int prefilled = std::min(prefill, c.context - 1);
  std::vector<std::vector<int64_t>> p_in, p_tgt;
  std::vector<uint8_t> all_given(K, 1);
  std::vector<ppx::StepRequest> p_req;
  const int chunk = std::max(1, batch->prefill_rows());
  double prefill_ms = 0;
  for (const int B : sizes) {
    for (int b = 0; b < B; ++b) batch->open(b, *m.cfg.lm_gen, 42424242 + static_cast<uint64_t>(b));
    const double tp = ppx::app::now_ms();
    for (int b = 0; b < B; ++b) {
      for (int p0 = 0; p0 < prefilled; p0 += chunk) {
        const int n = std::min(chunk, prefilled - p0);
        p_in.assign(n, std::vector<int64_t>(K));
        p_tgt.assign(n, std::vector<int64_t>(K));
        p_req.resize(n);
        for (int i = 0; i < n; ++i) {
          for (int k = 0; k < K; ++k) p_in[i][k] = p_tgt[i][k] = k == 0 ? 3 : tok(rng);
          p_req[i] = ppx::StepRequest{p_in[i].data(), nullptr, p_tgt[i].data(), all_given.data(), nullptr};
        }
        batch->prefill(b, p_req.data(), n);
      }
    }
    prefill_ms = ppx::app::now_ms() - tp;
    std::vector<double> ms;
    for (int f = prefilled; f < prefill + warmup + frames; ++f) {
      for (int b = 0; b < B; ++b) {
        for (int k = 0; k < K; ++k) {
          input[b][k] = k == 0 ? 3 : tok(rng);
          target[b][k] = k > half ? tok(rng) : 0;
          provided[b][k] = k > half ? 1 : 0;
        }
        req[b] = ppx::StepRequest{input[b].data(), nullptr, target[b].data(), provided[b].data(), nullptr};
        steps[b] = ppx::BatchStep{b, &req[b], &res[b], nullptr};
      }
      // --profile-steps: the last timed steps of the largest batch inside the profiler's range.
#if defined(PPX_HAVE_CUDA)
      if (profile_steps > 0 && B == max_b && f == prefill + warmup + frames - profile_steps)
        PPX_CUDA_CHECK(cudaProfilerStart());
#endif
      const double t0 = ppx::app::now_ms();
      batch->run(steps.data(), B);
      if (f >= prefill + warmup) ms.push_back(ppx::app::now_ms() - t0);
    }
#if defined(PPX_HAVE_CUDA)
    if (profile_steps > 0 && B == max_b) PPX_CUDA_CHECK(cudaProfilerStop());
#endif
    nlohmann::ordered_json e;
    e["batch"] = B;
    e["prefill_positions"] = prefilled;
    e["prefill_s"] = prefill_ms / 1e3;  // all B sessions, one after the other
    e["step_ms"] = ppx::app::latency_stats(ms);
    e["ms_per_session_p50"] = e["step_ms"]["p50"].get<double>() / B;
    per_b.push_back(e);
  }
  nlohmann::ordered_json j = result_head("lm_batch", m, mf);
  j["frames"] = frames;
  j["warmup"] = warmup;
  j["prefill"] = prefill;
  j["profile_steps"] = profile_steps;
  j["batches"] = per_b;
  j["machine"] = ppx::app::machine_info();
  j["command"] = ppx::app::command_line(argc, argv);
  ppx::app::emit_json(j, out);
  return 0;
}

int bench(int argc, char** argv) {
  CLI::App app{"Per-frame latency of the full conversation step (encode, LM, decode)"};
  ppx::app::ModelFlags mf;
  mf.add_to(app);
  int frames = 500, warmup = 20;
  double soak_minutes = 0;
  std::string out;
  app.add_option("--frames", frames, "timed frames")->capture_default_str()->check(CLI::Range(1, 100000000));
  app.add_option("--warmup", warmup, "untimed frames first")->capture_default_str()->check(CLI::Range(0, 1000000));
  app.add_option("--soak", soak_minutes, "run for this many minutes instead of --frames")->check(ppx::app::finite() & CLI::Range(0.0, 1e6));
  app.add_option("--out", out, "write the JSON result here too");
  int sessions = 0;
  app.add_option("--sessions", sessions,
                 "N real-time sessions through the frame scheduler (0: one session, back to back)")
      ->check(CLI::Range(0, 4096));
  int prefill = 0;
  app.add_option("--prefill", prefill,
                 "with --sessions or --lm-batch: this many steps first, back to back and untimed, to fill the "
                 "context (the LM context is 3000 frames)")
      ->check(CLI::Range(0, 1000000));
  int prompt_steps = 0;
  app.add_option("--prompt-steps", prompt_steps,
                 "with --sessions or --sweep: each session's system prompt is a text prompt of this many steps "
                 "(filling the context through prompt prefill, as a server session with a long prompt does)")
      ->check(CLI::Range(0, 1000000));
  std::vector<int> sweep;
  app.add_option("--sweep", sweep,
                 "--sessions at each of these counts (space- or comma-separated; one model, a fresh scheduler "
                 "each): one JSON with every run, and a PNG of p99 against the count beside --out")
      ->delimiter(',')
      ->check(CLI::Range(1, 4096));
  bool per_session_codec = false;
  app.add_flag("--per-session-codec", per_session_codec,
               "with --sessions or --sweep: each session runs its own codec stream on its thread instead of "
               "the batched codec scheduler (the server's --per-session-codec)");
  int frames_in_flight = ppx::Conversation::kMaxFramesInFlight;
  app.add_option("--frames-in-flight", frames_in_flight,
                 "with --sessions or --sweep: frames of a session in flight at once (1: each frame's encode, step "
                 "and decode before the next frame starts, as before 2026-12-05; the server runs the most)")
      ->capture_default_str()
      ->check(CLI::Range(1, ppx::Conversation::kMaxFramesInFlight));
  double codec_gather_ms = 0;
  app.add_option("--codec-gather-ms", codec_gather_ms,
                 "measurement hook, with --sessions or --sweep and the batched codec: a codec pass with fewer "
                 "frames than a quarter of the sessions waits up to this long for more (0: off, as shipped)")
      ->capture_default_str()
      ->check(ppx::app::finite() & CLI::Range(0.0, 1000.0));
  bool codec_hold = false;
  app.add_flag("--codec-hold", codec_hold,
               "measurement hook, with --sessions or --sweep and the batched codec: a codec pass of encodes waits "
               "until shortly before the LM step in progress is expected to end, taking the encodes that arrive "
               "meanwhile (off as shipped)");
  int gemm_policy = -1;
  app.add_option("--gemm-policy", gemm_policy,
                 "measurement hook: the batched GEMM kernel (personaplex-bench-kernels --gemm-policy; default: as "
                 "shipped, 6; 0 the mma.sync kernel, 1-3 experiments, 3 keeping a bf16 copy of the int8 weights, "
                 "~16 GB more at full size, and doing nothing with --w8-format fp8; 4 and 5 int8 weights on wgmma, "
                 "H100 / H200 only; 6 wgmma from 40 rows where it runs, policy 8's kernel; 8 policy 5 with the epilogue "
                 "in the GEMM kernel where one K slice runs); CUDA builds only")
      ->check(CLI::IsMember({0, 1, 2, 3, 4, 5, 6, 8}));
  bool no_gemm_chain = false;
  app.add_flag("--no-gemm-chain", no_gemm_chain,
               "measurement hook (v0.34): every split-K epilogue as its own kernel (shipped: FFN in's gate-up "
               "epilogue runs inside FFN out's staging kernel, one launch fewer a layer); CUDA builds only");
  bool kv_fp8_by_position = false;
  app.add_flag("--kv-fp8-by-position", kv_fp8_by_position,
               "measurement hook (v0.34): with --kv-fp8, the fp8 KV cache laid out by position, as before v0.34 "
               "(shipped: by head, a head's keys contiguous over the positions); CUDA builds only");
  int attention_policy = -1;
  app.add_option("--attention-policy", attention_policy,
                 "measurement hook: the temporal attention's kernel (personaplex-bench-kernels --only "
                 "attention-batch; default: as shipped, 0; 2 the fp8 cache on the scalar kernel, 3 and 5 the fp8 "
                 "tensor-core kernel with 3 and 4 stages (up to 4 rows both 3), 4 v0.18's tensor-core kernel); "
                 "CUDA builds only")
      ->check(CLI::Range(0, 5));
  int attention_parts = 0;
  app.add_option("--attention-parts", attention_parts,
                 "measurement hook (v0.37): the fp8 cache's tensor-core attention at 5 or more rows takes this many "
                 "parts (blocks a row and head, each over every parts-th 64-key split; at most the context's "
                 "splits) instead of its plan's; CUDA builds only")
      ->check(CLI::Range(1, 1000));
  int mimi_blas_rows = -1;
  app.add_option("--mimi-blas-rows", mimi_blas_rows,
                 "with --mimi-fp16 (or --fast): run the transformer linears and the short convolutions of codec "
                 "batches of at least this many rows (2 or more) as TF32 cuBLAS GEMMs; 0: never (the v0.20 codec); "
                 "default: as shipped (4 rows; personaplex-bench-mimi --mimi-blas-rows); CUDA builds only")
      ->check(CLI::Range(0, 100000));
  std::vector<int> batch_sizes;
  app.add_option("--lm-batch", batch_sizes,
                 "time the batched LM step alone (no codec, no scheduler thread) at each of these batch sizes")
      ->check(CLI::Range(1, 4096));
  int profile_steps = 0;
  app.add_option("--profile-steps", profile_steps,
                 "with --lm-batch: the last N timed steps of the largest batch run inside a CUDA profiler range "
                 "(cudaProfilerStart / Stop), so that a profiler started with its capture off (ncu "
                 "--profile-from-start off) measures only those steps, after the prefill; CUDA builds only")
      ->check(CLI::Range(0, 100000000));
  ppx::app::check_numbers(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return ppx::app::parse_failed(app, e);
  }
  if (mimi_blas_rows >= 0 && !mf.mimi_fp16 && !mf.fast) throw ppx::Error("--mimi-blas-rows needs --mimi-fp16 (or --fast)");
  if (mimi_blas_rows >= 0 && sessions == 0 && sweep.empty())
    throw ppx::Error("--mimi-blas-rows needs --sessions or --sweep (one session's codec runs one row)");
  if (gemm_policy >= 0 && mf.device != "cuda") throw ppx::Error("--gemm-policy needs --device cuda");
  if (no_gemm_chain && mf.device != "cuda") throw ppx::Error("--no-gemm-chain needs --device cuda");
  if (kv_fp8_by_position && !mf.kv_fp8) throw ppx::Error("--kv-fp8-by-position needs --kv-fp8");
  if (profile_steps > 0 && (batch_sizes.empty() || mf.device != "cuda"))
    throw ppx::Error("--profile-steps needs --lm-batch and --device cuda");
  if (profile_steps > frames) throw ppx::Error("--profile-steps cannot exceed --frames (it profiles timed steps)");
  if (attention_policy >= 0 && mf.device != "cuda") throw ppx::Error("--attention-policy needs --device cuda");
  if (attention_parts > 0 && (mf.device != "cuda" || !mf.kv_fp8))
    throw ppx::Error("--attention-parts needs --device cuda and --kv-fp8");
  if ((codec_hold || codec_gather_ms > 0) && (per_session_codec || (sessions == 0 && sweep.empty())))
    throw ppx::Error(std::string(codec_hold ? "--codec-hold" : "--codec-gather-ms") +
                     " needs --sessions or --sweep with the batched codec (not --per-session-codec)");
#if defined(PPX_HAVE_CUDA)
  // Before the model loads (policy 3 keeps a bf16 copy of the int8 weights) and the LM batch
  // captures its graphs; policy 3's cuBLAS handle lives on the --device chosen.
  if (gemm_policy >= 0 || attention_policy >= 0 || attention_parts > 0) {
    if (const std::string why = ppx::cuda_device_problem(mf.cuda_device); !why.empty())
      throw ppx::Error("--device " + mf.device_flag + ": " + why);
    PPX_CUDA_CHECK(cudaSetDevice(mf.cuda_device));
  }
  if (gemm_policy >= 0) ppx::kern::gemm_set_policy(gemm_policy);
  g_gemm_policy = gemm_policy;
  if (no_gemm_chain) ppx::kern::gemm_set_chain(false);  // before the graphs are captured
  if (kv_fp8_by_position) ppx::kern::attention_set_fp8_by_head(false);  // before the model is built
  if (attention_policy >= 0) ppx::kern::attention_set_policy(attention_policy);  // before the graphs are captured
  g_attention_policy = attention_policy;
  ppx::kern::attention_set_parts(attention_parts);  // before the graphs are captured
  g_attention_parts = attention_parts;
  if (mimi_blas_rows >= 0) ppx::cuda::set_mimi_blas_rows(mimi_blas_rows);  // before the codec is built
  if ((mf.mimi_fp16 || mf.fast) && mf.device == "cuda") g_mimi_blas_rows = ppx::cuda::mimi_blas_rows();  // as it applies
#else
  if (gemm_policy >= 0) throw ppx::Error("--gemm-policy needs a build with CUDA");
  if (no_gemm_chain) throw ppx::Error("--no-gemm-chain needs a build with CUDA");
  if (attention_policy >= 0) throw ppx::Error("--attention-policy needs a build with CUDA");
  if (attention_parts > 0) throw ppx::Error("--attention-parts needs a build with CUDA");
  if (mimi_blas_rows >= 0) throw ppx::Error("--mimi-blas-rows needs a build with CUDA");
#endif
  if (!sweep.empty()) {
    if (sessions > 0 || soak_minutes > 0 || !batch_sizes.empty())
      throw ppx::Error("--sweep cannot be combined with --sessions, --lm-batch or --soak");
    if (out.empty()) throw ppx::Error("--sweep needs --out FILE (the plot is written beside it, as FILE with .png)");
    // Before the runs, not after them: the files are written at the end.
    if (const auto dir = std::filesystem::path(out).parent_path(); !dir.empty() && !std::filesystem::is_directory(dir))
      throw ppx::Error("--out '" + out + "': no directory '" + dir.string() + "'");
    mf.codec_slots = std::max(mf.codec_slots, *std::max_element(sweep.begin(), sweep.end()));
    const ppx::app::LoadedModel m = ppx::app::load_model(mf);
    return bench_sweep(m, mf, sweep, SessionRun{frames, warmup, prefill, prompt_steps, !per_session_codec, frames_in_flight, codec_gather_ms, codec_hold}, argc, argv,
                       out);
  }
  if (!batch_sizes.empty()) {
    if (sessions > 0 || soak_minutes > 0 || prompt_steps > 0)
      throw ppx::Error("--lm-batch cannot be combined with --sessions, --soak or --prompt-steps");
    const ppx::app::LoadedModel m = ppx::app::load_model(mf);
    return bench_lm_batch(m, mf, batch_sizes, frames, warmup, prefill, profile_steps, argc, argv, out);
  }
  if (prefill > 0 && sessions == 0) throw ppx::Error("--prefill needs --sessions, --sweep or --lm-batch");
  if (prompt_steps > 0 && sessions == 0) throw ppx::Error("--prompt-steps needs --sessions or --sweep");
  if (sessions > 0) {
    if (soak_minutes > 0) throw ppx::Error("--soak and --sessions cannot be combined");
    mf.codec_slots = std::max(mf.codec_slots, sessions);
    const ppx::app::LoadedModel m = ppx::app::load_model(mf);
    return bench_sessions(m, mf, sessions, SessionRun{frames, warmup, prefill, prompt_steps, !per_session_codec, frames_in_flight, codec_gather_ms, codec_hold}, argc,
                          argv, out);
  }
  ppx::app::LoadedModel m = ppx::app::load_model(mf);
  const int dep_steps = m.dep_steps;
  ppx::LmGenConfig gen = *m.cfg.lm_gen;
  std::unique_ptr<ppx::CodecStream> codec = m.backend->codec_stream(0);
  if (m.other_mimi) codec = std::make_unique<ppx::MirroredCodecStream>(std::move(codec), m.backend->codec_stream(1));
  auto stepper = m.backend->lm_stepper(gen, 42424242, dep_steps);
  ppx::Conversation conv(*codec, *stepper, gen);
  conv.run_system_prompts(bench_prompt(m));

  const int fs = m.cfg.mimi.frame_samples();
  const double budget_ms = 1000.0 / m.cfg.mimi.frame_rate;
  std::vector<float> pcm(fs);
  std::vector<double> enc, lm, dec, total, deferred;
  const double soak_end = ppx::app::now_ms() + soak_minutes * 60000.0;
  int64_t over_budget = 0;
  for (int64_t f = 0;; ++f) {
    if (soak_minutes > 0 ? (f >= warmup && ppx::app::now_ms() >= soak_end) : f >= warmup + frames) break;
    for (int i = 0; i < fs; ++i) pcm[i] = 0.2f * std::sin(0.031f * static_cast<float>(f * fs + i));
    ppx::Conversation::StageTimes t;
    const double t0 = ppx::app::now_ms();
    const auto fr = conv.step(pcm.data(), &t);
    const double el = ppx::app::now_ms() - t0;
    if (!fr) throw ppx::Error("no frame produced after the system prompts");
    if (f < warmup) continue;
    // The previous frame's deferred depformer steps (device time; they overlapped this frame).
    if (f > warmup && stepper->deferred_ms() > 0) deferred.push_back(stepper->deferred_ms());
    enc.push_back(t.encode);
    lm.push_back(t.lm);
    dec.push_back(t.decode);
    total.push_back(el);
    over_budget += el > budget_ms;
  }
  nlohmann::ordered_json j;
  j["bench"] = "frame";
  j["model"] = m.description;
  j["device"] = m.backend->device();
  j["flags"] = {{"dep_steps", dep_steps < 0 ? m.cfg.lm->dep_q : dep_steps},
                {"other_mimi", m.other_mimi},
                {"w8a16", mf.w8a16 || mf.fast},
                {"speed_flags", m.speed_flags}};
  j["frames"] = total.size();
  j["warmup"] = warmup;
  j["budget_ms"] = budget_ms;
  j["frames_over_budget"] = over_budget;
  j["total_ms"] = ppx::app::latency_stats(total);
  j["stages_ms"] = {{"mimi_encode", ppx::app::latency_stats(enc)},
                    {"lm_step", ppx::app::latency_stats(lm)},
                    {"mimi_decode", ppx::app::latency_stats(dec)}};
  // lm_step ends when the frame's tokens are ready; the depformer steps of the user's (provided)
  // codebooks run after that, overlapping Mimi decode and the next frame (docs/ARCHITECTURE.md).
  if (!deferred.empty()) j["stages_ms"]["lm_deferred_depformer_device"] = ppx::app::latency_stats(deferred);
  j["machine"] = ppx::app::machine_info();
  j["command"] = ppx::app::command_line(argc, argv);
  ppx::app::emit_json(j, out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return ppx::app::run_main(bench, argc, argv); }
