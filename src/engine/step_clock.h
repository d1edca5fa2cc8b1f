// The LM scheduler's batch step in progress, as other threads may read it: whether one is running
// and when it is expected to end. The codec scheduler reads it to hold encodes back while a long
// step runs (an encode finished mid-step joins the next step no sooner than one finished just
// before the step ends; codec_scheduler.h), so that at large session counts the codec runs one
// large encode pass per step instead of many small ones beside it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>

namespace ppx {

class StepClock {
 public:
  using Clock = std::chrono::steady_clock;
  struct Step {
    uint64_t seq = 0;                // tells one step from the next
    Clock::time_point expected_end;  // when it is expected to end
  };

  // LM thread: a step expected to take `expected_ms` begins now (expected_ms <= 0: unknown, the
  // step is not announced).
  void begin(double expected_ms) {
    if (!(expected_ms > 0)) return;
    const auto end = Clock::now() + std::chrono::microseconds(static_cast<int64_t>(1000.0 * expected_ms));
    end_ns_.store(end.time_since_epoch().count(), std::memory_order_relaxed);
    seq_.fetch_add(1, std::memory_order_release);  // odd: in progress
  }
  // LM thread: the step announced by begin() has ended (no-op when none was).
  void end() {
    if (seq_.load(std::memory_order_relaxed) % 2 == 1) seq_.fetch_add(1, std::memory_order_release);
  }
  // Any thread: the step in progress, if one was announced and has not ended.
  std::optional<Step> current() const {
    const uint64_t s = seq_.load(std::memory_order_acquire);
    if (s % 2 == 0) return std::nullopt;
    const int64_t ns = end_ns_.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);  // the load above stays before the check below
    if (seq_.load(std::memory_order_relaxed) != s) return std::nullopt;  // it ended meanwhile
    return Step{s, Clock::time_point(Clock::duration(ns))};
  }

 private:
  std::atomic<uint64_t> seq_{0};  // odd while an announced step is in progress
  std::atomic<int64_t> end_ns_{0};
};

}  // namespace ppx
