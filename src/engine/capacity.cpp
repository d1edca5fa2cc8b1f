#include "ppx/capacity.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "ppx/error.h"

namespace ppx {

size_t temporal_kv_bytes(const LmConfig& c, size_t slots, KvDtype kv) {
  const size_t rows = static_cast<size_t>(c.num_layers) * slots;  // (layer, slot) pairs
  const size_t values = rows * static_cast<size_t>(c.context) * static_cast<size_t>(c.dim);
  if (kv == KvDtype::kBf16) return 2 * values * 2;
  return 2 * (values + rows * static_cast<size_t>(c.num_heads) * kv_fp8_scale_pitch(c.context));
}

size_t lm_slot_bytes(const LmConfig& c, KvDtype kv) {
  // Mirrors CudaLmBatch's constructor: per slot, the temporal KV cache and the depformer's bf16 k
  // and v rings of [depformer layers, dep_q, depformer dim].
  return temporal_kv_bytes(c, 1, kv) + 2 * static_cast<size_t>(c.depformer_num_layers) *
                                           static_cast<size_t>(c.dep_q) * static_cast<size_t>(c.depformer_dim) * 2;
}

size_t lm_slot_read_bytes(const LmConfig& c, KvDtype kv) { return lm_slot_bytes(c, kv); }

size_t codec_slot_bytes_estimate(const MimiConfig& c) {
  const MimiTransformerConfig& t = c.transformer;
  // Encoder and decoder transformers, keys and values, fp32.
  const size_t rings = 2 * 2 * static_cast<size_t>(t.num_layers) * static_cast<size_t>(t.context) *
                       static_cast<size_t>(t.d_model) * 4;
  return rings + rings / 2;
}

Capacity compute_capacity(const CapacityInputs& in) {
  if (in.weight_bytes < 0 || in.free_bytes < 0 || in.bandwidth < 0 || in.reserve_bytes < 0 ||
      in.codec_bytes_per_session < 0 || in.prompt_cache_bytes < 0)
    throw Error("capacity: byte counts and the bandwidth must not be negative");
  if (!(in.headroom >= 0 && in.headroom < 1)) throw Error("capacity: the headroom must be in [0, 1)");
  if (!(in.memory_headroom >= 0 && in.memory_headroom < 1))
    throw Error("capacity: the memory headroom must be in [0, 1)");
  if (!(in.weight_efficiency > 0 && in.weight_efficiency <= 1) || !(in.kv_efficiency > 0 && in.kv_efficiency <= 1))
    throw Error("capacity: the stream efficiencies must be in (0, 1]");
  if (!(in.frame_ms > 0)) throw Error("capacity: the frame must be longer than 0 ms");
  if (!(in.session_fixed_ms >= 0)) throw Error("capacity: the fixed per-session time must not be negative");
  Capacity cap;
  cap.bandwidth = in.bandwidth;
  cap.free_bytes = in.free_bytes;
  cap.prompt_cache_bytes = in.prompt_cache_bytes;
  const double slot = static_cast<double>(lm_slot_bytes(in.lm, in.kv));
  cap.bytes_per_session = slot + in.codec_bytes_per_session;
  cap.read_bytes_per_session = static_cast<double>(lm_slot_read_bytes(in.lm, in.kv));

  // Memory: the batch allocates one slot more than its sessions (the scratch slot that padding
  // rows write), and the prompt cache and the fixed reserve come out of the same free memory.
  const double usable = in.free_bytes * (1 - in.memory_headroom) - in.reserve_bytes - in.prompt_cache_bytes - slot;
  cap.memory_sessions = usable <= 0 ? 0 : static_cast<int>(std::min(1e9, std::floor(usable / cap.bytes_per_session)));

  // Bandwidth: a step at batch N reads the weights once and N full-context KV caches, each at its
  // measured share of the copy rate, each session adds its fixed device time (its codec), and all
  // of it must end within the frame less the headroom.
  if (in.bandwidth > 0) {
    cap.weight_step_ms = 1e3 * in.weight_bytes / (in.weight_efficiency * in.bandwidth);
    cap.session_step_ms = 1e3 * cap.read_bytes_per_session / (in.kv_efficiency * in.bandwidth) + in.session_fixed_ms;
    const double left = in.frame_ms * (1 - in.headroom) - cap.weight_step_ms;
    cap.bandwidth_sessions =
        left <= 0 ? 0 : static_cast<int>(std::min(1e9, std::floor(left / cap.session_step_ms)));
  }
  const int limit = cap.bandwidth_sessions ? std::min(cap.memory_sessions, *cap.bandwidth_sessions)
                                           : cap.memory_sessions;
  cap.sessions = std::clamp(limit, 1, kMaxSessionsLimit);
  return cap;
}

}  // namespace ppx
