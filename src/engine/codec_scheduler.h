// The codec scheduler: one thread that owns every session's codec state (a CodecBatch) and runs,
// per pass, one batched encode for every session with a frame of audio to encode and one batched
// decode for every session with codes to decode. On CUDA that is ~65 kernel launches per direction
// for all sessions together instead of per session, on the scheduler's own stream, so the codec of
// the next frames overlaps the LM's batch step (scheduler.h) on the other.
//
// Sessions reach it through the CodecStream that open() returns: its encode()/decode() hand the
// frame to the scheduler and block until the pass that carries it is done (encode_async() and
// decode_async() return at once and call back from the scheduler's thread instead), so a session
// has at most one encode and one decode in flight (a pipelined Conversation overlaps the two). reset() goes through the same queue without waiting (the
// slot's later calls run after it).
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "engine/job_queue.h"
#include "engine/step_clock.h"
#include "ppx/codec_batch.h"
#include "ppx/conversation.h"

namespace ppx {

class CodecScheduler {
 public:
  // What one pass did, for metrics (called on the scheduler thread after each pass with work).
  struct PassInfo {
    int encodes = 0, decodes = 0;  // sessions in the pass's batched encode and decode
    double ms = 0;                 // wall time of the pass
  };
  using PassObserver = std::function<void(const PassInfo&)>;

  // `gather_ms` (a measurement hook, personaplex-bench --codec-gather-ms; 0, the default, is off):
  // a pass that found at least one encode or decode but fewer than a quarter of the open streams
  // waits up to this long (from when it found its first job) for more (resets neither start a wait
  // nor count toward it), so that at large session counts the codec runs fewer,
  // larger passes (a row of a 2-row pass costs ~6x one of a 64-row pass, docs/PERF.md v0.23) at
  // the price of up to that much added latency per encode and decode.
  //
  // `hold_for` (a measurement hook, personaplex-bench --codec-hold; nullptr, the default, is off):
  // the LM scheduler's step clock (step_clock.h). A pass of encodes without a decode, taken while
  // an announced LM step runs, waits until shortly before that step's expected end (the lead: the
  // recent encode passes' time, x kHoldLeadFactor, plus kHoldMarginMs), taking the encodes that
  // arrive meanwhile: their frames join the next LM step either way, so the wait adds no latency
  // when the expectation holds (a step that ends early costs the held encodes that step), and the codec runs one large encode pass per step instead of many
  // small ones that slow the step beside them (docs/PERF.md v0.24). A decode arriving ends the
  // wait (it runs at once, with the encodes held), as do the step's end and stop().
  explicit CodecScheduler(std::unique_ptr<CodecBatch> batch, PassObserver on_pass = {}, double gather_ms = 0,
                          const StepClock* hold_for = nullptr);
  static constexpr double kHoldLeadFactor = 1.25;
  static constexpr double kHoldMarginMs = 1.0;
  ~CodecScheduler();  // serves what is queued, then stops
  CodecScheduler(const CodecScheduler&) = delete;
  CodecScheduler& operator=(const CodecScheduler&) = delete;

  int slots() const { return slots_; }
  // The codec stream of the session in `slot`, reset (a first frame next). One stream per slot at
  // a time: the caller (the server's slot allocator) guarantees it.
  std::unique_ptr<CodecStream> open(int slot);

  struct Totals {
    int64_t passes = 0;              // passes with an encode or a decode
    int64_t encodes = 0, decodes = 0;  // session frames in them
    int max_encodes = 0, max_decodes = 0;
    int64_t held_passes = 0;  // passes that waited, however briefly, for an LM step's end (hold_for)
    double held_ms = 0;       // the time they waited
  };
  Totals totals();
  // Calls queued and not yet taken by a pass.
  size_t queued() { return queue_.queued(); }

 private:
  class SlotCodec;
  enum class Kind { kEncode, kDecode, kReset };
  struct Job {
    Kind kind = Kind::kEncode;
    int slot = 0;
    const float* pcm_in = nullptr;
    int32_t* codes_out = nullptr;
    const int32_t* codes_in = nullptr;
    float* pcm_out = nullptr;
    bool done = false;
    std::exception_ptr error;
    std::function<void()> on_done;  // posted jobs
  };
  void loop();
  // hold_for's wait (see the constructor); returns the milliseconds waited.
  double hold_encodes(std::vector<Job*>& jobs);
  // One batched call for `jobs` (all of one kind, distinct slots); failures fail them all.
  void run(Kind kind, const std::vector<Job*>& jobs);

  std::unique_ptr<CodecBatch> batch_;
  PassObserver on_pass_;
  double gather_ms_ = 0;
  std::atomic<int> open_streams_{0};  // SlotCodecs alive (gather_ms's target)
  const StepClock* hold_for_ = nullptr;
  // Scheduler thread: moving average of the held encode passes' time (of any encode pass until one
  // was held), the hold's lead.
  double encode_ms_avg_ = 0;
  bool held_encode_seen_ = false;
  int slots_ = 0, fs_ = 0, ncb_ = 0, bins_ = 0;
  JobQueue<Job> queue_{"codec scheduler"};
  Totals totals_;  // under the queue's lock
  // Scheduler thread only: the rows of the batched calls.
  std::vector<int> ids_;
  std::vector<float> pcm_;
  std::vector<int32_t> codes_;
  std::thread thread_;
};

}  // namespace ppx
