#include "server/metrics.h"

#include <sstream>

namespace ppx::server {

namespace {

// One observation of `ms` in a histogram's cumulative buckets (upper bounds Metrics::kBucketsMs).
template <size_t N>
void observe(std::array<uint64_t, N>& buckets, double ms) {
  for (size_t i = 0; i < N; ++i)
    if (ms <= Metrics::kBucketsMs[i]) ++buckets[i];
}

// A Prometheus histogram's bucket, sum and count lines (its HELP and TYPE lines precede it): the
// cumulative counts of `buckets` at the upper bounds Metrics::kBucketsMs, in seconds.
template <size_t N>
void histogram(std::ostringstream& o, const char* name, const std::array<uint64_t, N>& buckets, uint64_t count,
               double sum_ms) {
  for (size_t i = 0; i < N; ++i)
    o << name << "_bucket{le=\"" << Metrics::kBucketsMs[i] / 1000.0 << "\"} " << buckets[i] << "\n";
  o << name << "_bucket{le=\"+Inf\"} " << count << "\n";
  o << name << "_sum " << sum_ms / 1000.0 << "\n";
  o << name << "_count " << count << "\n";
}

// One unlabelled series: its HELP and TYPE lines and its value.
template <typename T>
void series(std::ostringstream& o, const char* name, const char* type, const char* help, T value) {
  o << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n" << name << " " << value << "\n";
}

}  // namespace

void Metrics::session_started() {
  std::lock_guard<std::mutex> lk(mu_);
  ++sessions_started_;
}

void Metrics::session_ended(SessionEnd reason) {
  std::lock_guard<std::mutex> lk(mu_);
  ++ended_[static_cast<size_t>(reason)];
}

void Metrics::rejected(Rejection reason) {
  std::lock_guard<std::mutex> lk(mu_);
  ++rejected_[static_cast<size_t>(reason)];
}

void Metrics::ignored_message() {
  std::lock_guard<std::mutex> lk(mu_);
  ++ignored_;
}

void Metrics::frame(double ms, double budget_ms) {
  std::lock_guard<std::mutex> lk(mu_);
  ++frames_;
  frame_ms_sum_ += ms;
  budget_misses_ += ms > budget_ms;
  observe(buckets_, ms);
}

void Metrics::batch_step(int batch, double ms, int waiting) {
  std::lock_guard<std::mutex> lk(mu_);
  ++batch_steps_;
  batch_items_ += static_cast<uint64_t>(batch);
  last_batch_ = batch;
  last_waiting_ = waiting;
  batch_ms_sum_ += ms;
  observe(batch_buckets_, ms);
}

void Metrics::codec_pass(int encodes, int decodes, double ms) {
  std::lock_guard<std::mutex> lk(mu_);
  ++codec_passes_;
  codec_encodes_ += static_cast<uint64_t>(encodes);
  codec_decodes_ += static_cast<uint64_t>(decodes);
  codec_ms_sum_ += ms;
  observe(codec_buckets_, ms);
}

std::string Metrics::prometheus(int sessions_in_use, int max_sessions, int connections,
                                const PromptCache::Stats* cache) const {
  std::lock_guard<std::mutex> lk(mu_);
  std::ostringstream o;
  o << "# HELP personaplex_sessions_in_use Conversations holding a slot.\n"
       "# TYPE personaplex_sessions_in_use gauge\npersonaplex_sessions_in_use "
    << sessions_in_use << "\n";
  o << "# HELP personaplex_sessions_max Slots (--max-sessions).\n"
       "# TYPE personaplex_sessions_max gauge\npersonaplex_sessions_max "
    << max_sessions << "\n";
  o << "# HELP personaplex_connections_open Open client connections (HTTP and WebSocket).\n"
       "# TYPE personaplex_connections_open gauge\npersonaplex_connections_open "
    << connections << "\n";
  o << "# HELP personaplex_sessions_started_total Conversations that got a slot.\n"
       "# TYPE personaplex_sessions_started_total counter\npersonaplex_sessions_started_total "
    << sessions_started_ << "\n";
  o << "# HELP personaplex_sessions_ended_total Conversations ended, by reason.\n"
       "# TYPE personaplex_sessions_ended_total counter\n";
  for (size_t i = 0; i < kSessionEndCount; ++i)
    o << "personaplex_sessions_ended_total{reason=\"" << kSessionEndLabels[i] << "\"} " << ended_[i]
      << "\n";
  o << "# HELP personaplex_rejected_total Connections refused before a slot, by reason.\n"
       "# TYPE personaplex_rejected_total counter\n";
  for (size_t i = 0; i < kRejectionCount; ++i)
    o << "personaplex_rejected_total{reason=\"" << kRejectionLabels[i] << "\"} " << rejected_[i]
      << "\n";
  o << "# HELP personaplex_ignored_messages_total Client messages of unknown kinds, and empty "
       "ones.\n"
       "# TYPE personaplex_ignored_messages_total counter\npersonaplex_ignored_messages_total "
    << ignored_ << "\n";
  o << "# HELP personaplex_frames_total Model frames computed.\n"
       "# TYPE personaplex_frames_total counter\npersonaplex_frames_total "
    << frames_ << "\n";
  o << "# HELP personaplex_frame_budget_misses_total Frames that took longer than 80 ms.\n"
       "# TYPE personaplex_frame_budget_misses_total "
       "counter\npersonaplex_frame_budget_misses_total "
    << budget_misses_ << "\n";
  o << "# HELP personaplex_frame_seconds Wall time of one frame (encode, LM step, decode).\n"
       "# TYPE personaplex_frame_seconds histogram\n";
  histogram(o, "personaplex_frame_seconds", buckets_, frames_, frame_ms_sum_);
  o << "# HELP personaplex_scheduler_batch_size Sessions in the last LM batch step.\n"
       "# TYPE personaplex_scheduler_batch_size gauge\npersonaplex_scheduler_batch_size "
    << last_batch_ << "\n";
  o << "# HELP personaplex_scheduler_steps_waiting Session steps queued when the last batch step "
       "ended.\n"
       "# TYPE personaplex_scheduler_steps_waiting gauge\npersonaplex_scheduler_steps_waiting "
    << last_waiting_ << "\n";
  o << "# HELP personaplex_scheduler_session_steps_total Session steps run in batch steps.\n"
       "# TYPE personaplex_scheduler_session_steps_total counter\n"
       "personaplex_scheduler_session_steps_total "
    << batch_items_ << "\n";
  o << "# HELP personaplex_scheduler_step_seconds Wall time of one LM batch step.\n"
       "# TYPE personaplex_scheduler_step_seconds histogram\n";
  histogram(o, "personaplex_scheduler_step_seconds", batch_buckets_, batch_steps_, batch_ms_sum_);
  o << "# HELP personaplex_codec_frames_total Session frames through the codec scheduler's batched "
       "calls.\n"
       "# TYPE personaplex_codec_frames_total counter\n"
       "personaplex_codec_frames_total{direction=\"encode\"} "
    << codec_encodes_ << "\npersonaplex_codec_frames_total{direction=\"decode\"} " << codec_decodes_ << "\n";
  o << "# HELP personaplex_codec_pass_seconds Wall time of one codec scheduler pass (a batched "
       "encode and a batched decode).\n"
       "# TYPE personaplex_codec_pass_seconds histogram\n";
  histogram(o, "personaplex_codec_pass_seconds", codec_buckets_, codec_passes_, codec_ms_sum_);
  if (cache) {
    o << "# HELP personaplex_prompt_cache_lookups_total System prompts looked up in the prompt cache, "
         "by result.\n"
         "# TYPE personaplex_prompt_cache_lookups_total counter\n"
         "personaplex_prompt_cache_lookups_total{result=\"hit\"} "
      << cache->hits << "\npersonaplex_prompt_cache_lookups_total{result=\"miss\"} " << cache->misses << "\n";
    series(o, "personaplex_prompt_cache_inserts_total", "counter", "Prompts saved into the prompt cache.", cache->inserts);
    series(o, "personaplex_prompt_cache_evictions_total", "counter", "Entries dropped to make room.", cache->evictions);
    series(o, "personaplex_prompt_cache_entries", "gauge", "Prompts in the prompt cache.", cache->entries);
    series(o, "personaplex_prompt_cache_bytes", "gauge", "Bytes of the prompt cache's store in use.", cache->used_bytes);
    series(o, "personaplex_prompt_cache_capacity_bytes", "gauge", "The prompt cache's store (--prompt-cache-mb).",
           cache->capacity_bytes);
  }
  return o.str();
}

}  // namespace ppx::server
