// Jobs from many threads to one worker thread, the shape both frame schedulers share
// (scheduler.h for the LM, codec_scheduler.h for the codec). A caller either submit()s a job it
// owns and blocks until the worker has run it, or post()s it with a completion callback and goes
// on (the session loop of the server: no thread waits per session). The worker takes everything
// queued at once, runs it as one pass, and marks it done (or puts some back at the front for the
// next pass); finish() then runs the callbacks of the posted ones, on the worker's thread.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "ppx/error.h"

namespace ppx {

namespace detail {
// While a worker runs the callbacks of a pass (JobQueue::finish), the wake-ups of the jobs they
// post (to any queue) wait until the last callback has run: a pass's follow-up jobs (the LM steps
// of a codec pass's encodes, say) are then taken by the next worker in one batch, not the first
// alone with the rest a whole pass later.
struct HeldWakeups {
  bool holding = false;
  std::vector<std::condition_variable*> cvs;
};
inline thread_local HeldWakeups held_wakeups;
}  // namespace detail

// Job: any type with `bool done`, `std::exception_ptr error` and `std::function<void()> on_done`
// (empty for submit()).
template <typename Job>
class JobQueue {
 public:
  explicit JobQueue(const char* name) : name_(name) {}

  // Caller side: queues `j`, waits until the worker marked it done, rethrows its error.
  void submit(Job& j) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      if (stopping_) throw Error(std::string("the ") + name_ + " has stopped");
      j.on_done = nullptr;
      pending_.push_back(&j);
      work_cv_.notify_one();
      done_cv_.wait(lk, [&] { return j.done; });
    }
    if (j.error) std::rethrow_exception(j.error);
  }

  // Caller side: queues `j` and returns; once the worker has run it, `on_done` runs on the
  // worker's thread (j.error tells how it went). `j` must stay alive until then; `on_done` may
  // destroy or reuse it. Must be short, must not throw and must not wait for work it posts (it
  // delays the worker's next pass, and the wake-ups of what it posts are held until the pass's
  // callbacks are done; hand longer work to another thread). Throws ppx::Error, without queuing,
  // once stop() was called.
  void post(Job& j, std::function<void()> on_done) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (stopping_) throw Error(std::string("the ") + name_ + " has stopped");
      j.done = false;
      j.error = nullptr;
      j.on_done = std::move(on_done);
      pending_.push_back(&j);
    }
    detail::HeldWakeups& h = detail::held_wakeups;
    if (!h.holding) {
      work_cv_.notify_one();
    } else if (std::find(h.cvs.begin(), h.cvs.end(), &work_cv_) == h.cvs.end()) {
      if (h.cvs.size() < h.cvs.capacity())
        h.cvs.push_back(&work_cv_);
      else
        work_cv_.notify_one();  // more queues than reserved: wake now rather than allocate
    }
  }

  // Worker side: waits for jobs and moves all of them into `out` (emptied first). False once
  // stop() was called and nothing is queued.
  bool take(std::vector<Job*>& out) {
    out.clear();
    std::unique_lock<std::mutex> lk(mu_);
    work_cv_.wait(lk, [&] { return stopping_ || !pending_.empty(); });
    if (pending_.empty()) return false;
    out.swap(pending_);
    return true;
  }

  // Worker side, after take(): while `out` holds fewer than `enough` jobs that `counts`, waits
  // until `deadline` for more and appends them (in the order queued). Returns at the deadline, on
  // stop(), or once `out` holds `enough` of them.
  template <typename TimePoint, typename Counts>
  void take_more(std::vector<Job*>& out, size_t enough, TimePoint deadline, Counts counts) {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      if (!pending_.empty()) {
        out.insert(out.end(), pending_.begin(), pending_.end());
        pending_.clear();
      }
      if (static_cast<size_t>(std::count_if(out.begin(), out.end(), counts)) >= enough || stopping_) return;
      if (work_cv_.wait_until(lk, deadline) == std::cv_status::timeout) {
        out.insert(out.end(), pending_.begin(), pending_.end());
        pending_.clear();
        return;
      }
    }
  }

  // Worker side: marks `finished` done and puts `requeue` back at the front of the queue (they
  // run in the next pass, before newer jobs). `under_lock` runs while the queue is locked with the
  // number of jobs now queued (for the scheduler's own totals). Returns that number.
  // The callbacks of posted jobs run after the lock is released, in the order of `finished`.
  size_t finish(const std::vector<Job*>& finished, const std::vector<Job*>& requeue,
                const std::function<void(size_t)>& under_lock = {}) {
    size_t waiting = 0;
    bool waiters = false;
    callbacks_.clear();
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (Job* j : finished) {
        j->done = true;
        if (j->on_done)
          callbacks_.push_back(std::move(j->on_done));  // `j` may be gone once it runs
        else
          waiters = true;
        j->on_done = nullptr;
      }
      pending_.insert(pending_.begin(), requeue.begin(), requeue.end());
      waiting = pending_.size();
      if (under_lock) under_lock(waiting);
    }
    if (waiters) done_cv_.notify_all();
    detail::HeldWakeups& h = detail::held_wakeups;
    h.cvs.reserve(8);  // before any post() records a wake-up: recording then cannot fail
    h.holding = !callbacks_.empty();
    for (auto& f : callbacks_) {
      try {
        f();
      } catch (...) {
        // A callback must not throw; if one does, the worker serves on.
      }
    }
    h.holding = false;
    for (std::condition_variable* cv : h.cvs) cv->notify_one();
    h.cvs.clear();
    callbacks_.clear();
    return waiting;
  }

  // post() of a job nobody waits for: the queue owns it and frees it once it has run (its error
  // is the worker's to record). Throws as post() does, freeing the job.
  void post_owned(std::unique_ptr<Job> j) {
    Job* raw = j.get();
    post(*raw, [raw] { delete raw; });
    j.release();
  }

  // Whether stop() was called.
  bool stopping() {
    std::lock_guard<std::mutex> lk(mu_);
    return stopping_;
  }

  // Jobs queued and not yet taken by the worker.
  size_t queued() {
    std::lock_guard<std::mutex> lk(mu_);
    return pending_.size();
  }

  // Runs `f` under the queue's lock (for state the worker and callers share).
  template <typename F>
  auto locked(F&& f) {
    std::lock_guard<std::mutex> lk(mu_);
    return f();
  }

  // No more submissions; the worker's take() drains what is queued, then returns false.
  void stop() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stopping_ = true;
    }
    work_cv_.notify_all();
  }

 private:
  const char* name_;
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::vector<Job*> pending_;
  bool stopping_ = false;
  std::vector<std::function<void()>> callbacks_;  // worker only (finish)
};

}  // namespace ppx
