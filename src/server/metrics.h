// Server counters exported at GET /metrics in the Prometheus text format (version 0.0.4).
// Thread-safe; updated by the I/O threads (rejections, unknown messages) and the session
// workers (frames, session ends). Label values come from the fixed sets of end_reason.h, so the
// number of series is bounded whatever clients send.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <string>

#include "engine/prompt_cache.h"
#include "server/end_reason.h"

namespace ppx::server {

class Metrics {
 public:
  void session_started();
  void session_ended(SessionEnd reason);
  void rejected(Rejection reason);  // a connection refused before it got a slot
  void ignored_message();           // a client message of an unknown kind, or an empty one
  // One model frame: wall time in ms against the frame budget (80 ms).
  void frame(double ms, double budget_ms);
  // One batch step of the LM scheduler: sessions stepped, its wall time (ms), steps queued
  // meanwhile.
  void batch_step(int batch, double ms, int waiting);
  // One pass of the codec scheduler: sessions in its batched encode and decode, its wall time (ms).
  void codec_pass(int encodes, int decodes, double ms);
  // `cache`: the prompt cache's figures, or nullptr when the server has none (its series are then
  // left out).
  std::string prometheus(int sessions_in_use, int max_sessions, int connections,
                         const PromptCache::Stats* cache = nullptr) const;

  // Upper bounds (ms) of the frame-time histogram buckets; +Inf is implied.
  static constexpr std::array<double, 9> kBucketsMs = {2.5, 5, 10, 20, 40, 60, 80, 120, 250};

 private:
  mutable std::mutex mu_;
  uint64_t sessions_started_ = 0, frames_ = 0, budget_misses_ = 0, ignored_ = 0;
  double frame_ms_sum_ = 0;
  std::array<uint64_t, kBucketsMs.size()> buckets_{};
  std::array<uint64_t, kSessionEndCount> ended_{};
  // The scheduler: batch steps, their sessions, the last step's batch size and queued steps, and
  // the step-time histogram (kBucketsMs).
  uint64_t batch_steps_ = 0, batch_items_ = 0;
  int last_batch_ = 0, last_waiting_ = 0;
  double batch_ms_sum_ = 0;
  std::array<uint64_t, kBucketsMs.size()> batch_buckets_{};
  // The codec scheduler: passes, their encoded and decoded frames, the pass-time histogram.
  uint64_t codec_passes_ = 0, codec_encodes_ = 0, codec_decodes_ = 0;
  double codec_ms_sum_ = 0;
  std::array<uint64_t, kBucketsMs.size()> codec_buckets_{};
  std::array<uint64_t, kRejectionCount> rejected_{};
};

}  // namespace ppx::server
