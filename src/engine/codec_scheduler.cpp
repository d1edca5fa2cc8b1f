#include "engine/codec_scheduler.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "engine/moving_average.h"
#include "ppx/error.h"

namespace ppx {

// A session's view of the scheduler: a CodecStream whose calls are jobs of its slot.
class CodecScheduler::SlotCodec : public CodecStream {
 public:
  SlotCodec(CodecScheduler& s, int slot) : s_(s), slot_(slot) { ++s_.open_streams_; }
  ~SlotCodec() override { --s_.open_streams_; }
  int frame_samples() const override { return s_.fs_; }
  int num_codebooks() const override { return s_.ncb_; }
  int codebook_size() const override { return s_.bins_; }
  // Queued, not waited for: the slot's later calls run after it, and fail with its error should
  // it fail. The job frees itself once run.
  void reset() override {
    auto j = std::make_unique<Job>();
    fill(*j, Kind::kReset, slot_, nullptr, nullptr, nullptr, nullptr);
    s_.queue_.post_owned(std::move(j));
  }
  void encode(const float* pcm, int32_t* codes) override { submit(Kind::kEncode, pcm, codes); }
  void decode(const int32_t* codes, float* pcm) override { submit(Kind::kDecode, nullptr, nullptr, codes, pcm); }
  void encode_async(const float* pcm, int32_t* codes, Done done) override {
    post(enc_async_, Kind::kEncode, std::move(done), pcm, codes);
  }
  void decode_async(const int32_t* codes, float* pcm, Done done) override {
    post(dec_async_, Kind::kDecode, std::move(done), nullptr, nullptr, codes, pcm);
  }

 private:
  static void fill(Job& j, Kind kind, int slot, const float* pcm_in, int32_t* codes_out, const int32_t* codes_in,
                   float* pcm_out) {
    j.kind = kind;
    j.slot = slot;
    j.pcm_in = pcm_in;
    j.codes_out = codes_out;
    j.codes_in = codes_in;
    j.pcm_out = pcm_out;
  }
  // Queues a job of this slot in `job` (one of each kind in flight); `done` gets its error.
  void post(Job& job, Kind kind, Done done, const float* pcm_in = nullptr, int32_t* codes_out = nullptr,
            const int32_t* codes_in = nullptr, float* pcm_out = nullptr) {
    fill(job, kind, slot_, pcm_in, codes_out, codes_in, pcm_out);
    s_.queue_.post(job, [&job, done = std::move(done)] { done(job.error); });
  }
  // Runs a job of this slot (blocks until the scheduler has).
  void submit(Kind kind, const float* pcm_in = nullptr, int32_t* codes_out = nullptr,
              const int32_t* codes_in = nullptr, float* pcm_out = nullptr) {
    Job j;
    fill(j, kind, slot_, pcm_in, codes_out, codes_in, pcm_out);
    s_.queue_.submit(j);
  }

  CodecScheduler& s_;
  int slot_;
  Job enc_async_, dec_async_;  // the posted calls in flight (an encode and a decode may overlap)
};

CodecScheduler::CodecScheduler(std::unique_ptr<CodecBatch> batch, PassObserver on_pass, double gather_ms,
                               const StepClock* hold_for)
    : batch_(std::move(batch)), on_pass_(std::move(on_pass)), gather_ms_(gather_ms), hold_for_(hold_for) {
  if (!batch_) throw Error("CodecScheduler: no codec batch");
  if (!(gather_ms >= 0 && gather_ms <= 1000)) throw Error("CodecScheduler: gather_ms must be in [0, 1000]");
  slots_ = batch_->slots();
  fs_ = batch_->frame_samples();
  ncb_ = batch_->num_codebooks();
  bins_ = batch_->codebook_size();
  thread_ = std::thread([this] { loop(); });
}

CodecScheduler::~CodecScheduler() {
  queue_.stop();
  thread_.join();
}

std::unique_ptr<CodecStream> CodecScheduler::open(int slot) {
  if (slot < 0 || slot >= slots_) throw Error("codec slot " + std::to_string(slot) + " out of range");
  auto s = std::make_unique<SlotCodec>(*this, slot);
  s->reset();
  return s;
}

CodecScheduler::Totals CodecScheduler::totals() {
  return queue_.locked([&] { return totals_; });
}

void CodecScheduler::run(Kind kind, const std::vector<Job*>& jobs) {
  if (jobs.empty()) return;
  const int n = static_cast<int>(jobs.size());
  ids_.resize(jobs.size());
  for (int i = 0; i < n; ++i) ids_[static_cast<size_t>(i)] = jobs[static_cast<size_t>(i)]->slot;
  const size_t f = static_cast<size_t>(fs_), c = static_cast<size_t>(ncb_);
  pcm_.resize(jobs.size() * f);
  codes_.resize(jobs.size() * c);
  try {
    if (kind == Kind::kEncode) {
      for (int i = 0; i < n; ++i) std::copy_n(jobs[static_cast<size_t>(i)]->pcm_in, f, pcm_.data() + i * f);
      batch_->encode(ids_.data(), n, pcm_.data(), codes_.data());
      for (int i = 0; i < n; ++i) std::copy_n(codes_.data() + i * c, c, jobs[static_cast<size_t>(i)]->codes_out);
    } else {
      for (int i = 0; i < n; ++i) std::copy_n(jobs[static_cast<size_t>(i)]->codes_in, c, codes_.data() + i * c);
      batch_->decode(ids_.data(), n, codes_.data(), pcm_.data());
      for (int i = 0; i < n; ++i) std::copy_n(pcm_.data() + i * f, f, jobs[static_cast<size_t>(i)]->pcm_out);
    }
  } catch (...) {
    for (Job* j : jobs) j->error = std::current_exception();
  }
}

double CodecScheduler::hold_encodes(std::vector<Job*>& jobs) {
  using Clock = StepClock::Clock;
  const auto is_decode = [](const Job* j) { return j->kind == Kind::kDecode; };
  const auto has_decode = [&] { return std::any_of(jobs.begin(), jobs.end(), is_decode); };
  if (has_decode() || std::none_of(jobs.begin(), jobs.end(), [](const Job* j) { return j->kind == Kind::kEncode; }))
    return 0;
  const std::optional<StepClock::Step> step = hold_for_->current();
  if (!step) return 0;
  const auto lead = std::chrono::microseconds(static_cast<int64_t>(1000.0 * (kHoldMarginMs + kHoldLeadFactor * encode_ms_avg_)));
  const auto release = step->expected_end - lead;
  const auto t0 = Clock::now();
  if (release <= t0) return 0;
  // In slices of at most a millisecond, to see the step end early.
  for (auto now = t0; now < release; now = Clock::now()) {
    queue_.take_more(jobs, 1, std::min(release, now + std::chrono::milliseconds(1)), is_decode);
    if (has_decode() || queue_.stopping()) break;
    const std::optional<StepClock::Step> cur = hold_for_->current();
    if (!cur || cur->seq != step->seq) break;
  }
  // However brief, a wait was begun: the pass counts as held.
  return std::max(1e-6, std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
}

void CodecScheduler::loop() {
  // A thread that cannot use the device fails every job with that error, so sessions see why.
  std::exception_ptr attach_error;
  try {
    batch_->attach_thread();
  } catch (...) {
    attach_error = std::current_exception();
  }
  std::vector<Job*> jobs, enc, dec, later, finished;
  std::vector<char> enc_busy(static_cast<size_t>(slots_), 0), dec_busy(static_cast<size_t>(slots_), 0);
  // Per pass: a job of the slot went to the next pass, so its later jobs follow it there (a slot's
  // jobs run in the order asked: resets are posted without waiting, so a slot can have several).
  std::vector<char> deferred(static_cast<size_t>(slots_), 0);
  // The error of each slot's last reset, if it failed: the slot's later calls fail with it until a
  // reset succeeds (nothing waits for a reset, so this is where its caller learns of it).
  std::vector<std::exception_ptr> reset_error(static_cast<size_t>(slots_));
  while (queue_.take(jobs)) {
    if (gather_ms_ > 0) {
      // Waits only for frames: a pass of resets alone (sessions opening) runs at once, and resets
      // taken with a frame do not count toward the frames it waits for.
      const auto is_frame = [](const Job* j) { return j->kind != Kind::kReset; };
      const size_t enough = static_cast<size_t>(std::max(1, open_streams_.load() / 4));
      const size_t frames = static_cast<size_t>(std::count_if(jobs.begin(), jobs.end(), is_frame));
      if (frames > 0 && frames < enough)
        queue_.take_more(jobs, enough,
                         std::chrono::steady_clock::now() +
                             std::chrono::microseconds(static_cast<int64_t>(1000.0 * gather_ms_)),
                         is_frame);
    }
    const double held_ms = hold_for_ ? hold_encodes(jobs) : 0;
    std::fill(deferred.begin(), deferred.end(), 0);
    enc.clear();
    dec.clear();
    later.clear();
    finished.clear();
    // Resets first, in the order asked; then one batched encode and one batched decode. A slot
    // appears at most once per batched call (a second job of it waits for the next pass; a
    // session's calls block, so only a misbehaving caller gets here).
    for (Job* j : jobs) {
      if (attach_error) {
        j->error = attach_error;
        finished.push_back(j);
        continue;
      }
      if (j->slot < 0 || j->slot >= slots_) {
        j->error = std::make_exception_ptr(Error("codec slot " + std::to_string(j->slot) + " out of range"));
        finished.push_back(j);
        continue;
      }
      const size_t s = static_cast<size_t>(j->slot);
      if (deferred[s]) {
        later.push_back(j);
        continue;
      }
      if (j->kind == Kind::kReset) {
        if (enc_busy[s] || dec_busy[s]) {
          later.push_back(j);  // after this pass's frame of the slot, as asked
          deferred[s] = 1;
          continue;
        }
        try {
          reset_error[s] = nullptr;
          batch_->reset(j->slot);
        } catch (...) {
          j->error = std::current_exception();
          reset_error[s] = j->error;
        }
        finished.push_back(j);
        continue;
      }
      if (reset_error[s]) {
        j->error = reset_error[s];
        finished.push_back(j);
        continue;
      }
      if (j->kind == Kind::kDecode &&
          !std::all_of(j->codes_in, j->codes_in + ncb_, [&](int32_t c) { return c >= 0 && c < bins_; })) {
        // Only this session's call fails: a batched call would fail every session in it.
        j->error = std::make_exception_ptr(Error("mimi decode: a code is outside [0, " + std::to_string(bins_) + ")"));
        finished.push_back(j);
        continue;
      }
      std::vector<char>& busy = j->kind == Kind::kEncode ? enc_busy : dec_busy;
      if (busy[s]) {
        later.push_back(j);
        deferred[s] = 1;
        continue;
      }
      busy[s] = 1;
      (j->kind == Kind::kEncode ? enc : dec).push_back(j);
    }
    const auto t0 = std::chrono::steady_clock::now();
    run(Kind::kEncode, enc);
    if (!enc.empty() && (held_ms > 0 || !held_encode_seen_)) {
      // The lead is for held passes, which are the large ones: the first restarts the average, and
      // from then on only they count.
      const double ems = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      const bool first_held = held_ms > 0 && !held_encode_seen_;
      encode_ms_avg_ = moving_average(first_held ? 0 : encode_ms_avg_, ems, 0.25);
      held_encode_seen_ = held_encode_seen_ || held_ms > 0;
    }
    run(Kind::kDecode, dec);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    for (Job* j : enc) enc_busy[static_cast<size_t>(j->slot)] = 0;
    for (Job* j : dec) dec_busy[static_cast<size_t>(j->slot)] = 0;
    finished.insert(finished.end(), enc.begin(), enc.end());
    finished.insert(finished.end(), dec.begin(), dec.end());
    const int ne = static_cast<int>(enc.size()), nd = static_cast<int>(dec.size());
    queue_.finish(finished, later, [&](size_t) {
      if (ne + nd == 0) return;
      ++totals_.passes;
      totals_.encodes += ne;
      totals_.decodes += nd;
      totals_.max_encodes = std::max(totals_.max_encodes, ne);
      totals_.max_decodes = std::max(totals_.max_decodes, nd);
      if (held_ms > 0) {
        ++totals_.held_passes;
        totals_.held_ms += held_ms;
      }
    });
    if (ne + nd > 0 && on_pass_) {
      try {
        on_pass_(PassInfo{ne, nd, ms});
      } catch (...) {
        // Metrics must not stop the scheduler.
      }
    }
  }
}

}  // namespace ppx
