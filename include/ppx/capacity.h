// How many sessions a device can hold: the lower of what its free memory allows (per-session LM
// slot and codec state, the prompt cache) and what its memory bandwidth allows within the frame
// (every batch step reads the LM weights once plus every session's full-context KV cache). The
// server uses the result as the default --max-sessions and reports both limits in /health
// (docs/CLI.md). Pure arithmetic, so that it is tested on the CPU with any device's numbers.
#pragma once

#include <algorithm>
#include <cstddef>
#include <optional>

#include "ppx/config.h"

namespace ppx {

enum class KvDtype {
  kBf16,  // the CUDA default: 2 bytes a value
  kFp8,   // --kv-fp8: 1 byte a value plus one scale byte per (position, head) for keys and values
};

// Positions a head's row of fp8 scale bytes takes: the context padded to 16 (the attention reads
// a warp's 16 scales as one 16-byte copy). Equal to kern::fp8_scale_pitch, which the CUDA code
// checks at compile time (the engine does not include kernel headers).
inline constexpr size_t kv_fp8_scale_pitch(int context) { return (static_cast<size_t>(context) + 15) / 16 * 16; }

// Device bytes of the temporal transformer's KV cache for `slots` slots, as cuda::TemporalKv
// allocates it: keys and values of [layers, slots, context, dim] in `kv` (bf16: 2 bytes a value;
// fp8: 1), with fp8 also a scale byte per (layer, slot, head, position), each head's row padded to
// kv_fp8_scale_pitch.
size_t temporal_kv_bytes(const LmConfig& c, size_t slots, KvDtype kv);

// Device bytes of one LM session slot as CudaLmBatch allocates it: the temporal transformer's
// keys and values over the whole context (temporal_kv_bytes of one slot) and the depformer's
// per-frame ring (bf16, depformer layers x dep_q x depformer dim, keys and values).
size_t lm_slot_bytes(const LmConfig& c, KvDtype kv);

// Bytes one batch step reads from one session's slot at full context: every position's keys and
// values in every layer (with their fp8 scales) and the depformer ring. Equal to lm_slot_bytes:
// a full-context session reads all of its slot every step.
size_t lm_slot_read_bytes(const LmConfig& c, KvDtype kv);

// An estimate of one CUDA codec stream's device state: the Mimi encoder and decoder transformers'
// fp32 key and value rings, times 1.5 for the SEANet convolution histories and activations (which
// are smaller; the headroom covers any error). Sized before the codec is built, as its slot count
// is the capacity itself.
size_t codec_slot_bytes_estimate(const MimiConfig& c);

// The efficiencies of the bandwidth model: the fraction of the measured device-to-device copy rate
// (bytes read plus written, as cudaMemcpy moves them: ~3.76 TB/s on an H200) at which a batch step
// streams the weights and the KV caches. Measured there (docs/PERF.md v0.15): the weights at ~2-3
// TB/s (0.6); the batched attention reads a bf16 KV cache at ~4.5 TB/s and an fp8 one at ~2.6 TB/s
// (0.7, the lower; the fp8 one at ~3.5 TB/s since v0.18, the factor kept). Better kernels raise them.
inline constexpr double kWeightStreamEfficiency = 0.6;
inline constexpr double kKvStreamEfficiency = 0.7;
// Device time each session costs a frame besides its KV reads: its Mimi encode and decode and its
// rows of the batched step. Calibrated on an H200 (docs/PERF.md v0.26, the wgmma GEMM, k-tiles of 64):
// with every context full, 160 `--fast --kv-fp8` sessions held real time for two minutes with the
// GPU busy ~99% of the time (2.67 steps of ~60 rows a frame; memory holds no more), and 80 bf16-KV
// sessions (v0.24; memory holds 82). At the copy rate the server measured there (3.74 TB/s) and
// its 8.7 GB of weights, 0.12 ms made the model allow 158 fp8 sessions (161 since v0.35's one-byte
// scales, not measured) and 94 bf16 ones, so memory binds both there. (0.25 from v0.24, before the wgmma GEMM, when 136 fp8 sessions held and 148
// did not quite; 0.38 from v0.20; 0.6 before, on v0.15's per-session codec graphs.)
inline constexpr double kSessionFixedMs = 0.12;

// --prompt-cache-mb auto (CudaOptions::prompt_cache_bytes == kPromptCacheAuto): the prompt cache
// takes a tenth of the free memory after the LM loaded, at most 4 GiB (15 prompts of 1000 text
// tokens with --kv-fp8, 7 with the bf16 KV cache; hundreds of the default prompt).
inline constexpr size_t kPromptCacheAuto = ~size_t{0};
inline double auto_prompt_cache_bytes(double free_bytes) {
  return free_bytes <= 0 ? 0 : std::min(4.0 * (1 << 30), 0.1 * free_bytes);
}

// The sessions a server may hold at most (--max-sessions' range).
inline constexpr int kMaxSessionsLimit = 256;

// What the memory limit keeps back of the free device memory (also the LM batch's own check before
// it allocates its KV caches): 2% and 1 GiB. What comes after the server measures free memory and
// is not counted per session: the codec's weights (~0.33 GB fp32, its fp16 and GEMM-order copies
// less) and what the batches allocate beside the KV caches, measured (docs/PERF.md v0.22, H100, 48
// `--kv-fp8` sessions) at ~0.14 GB (the LM and codec batches took 39.90 GB, 39.76 GB of it KV
// caches: row buffers, graphs of every batch size, cuBLAS workspaces). (3 GiB before 2026-12-05.)
inline constexpr double kMemoryHeadroom = 0.02;
inline constexpr double kMemoryReserveBytes = 1.0 * (1u << 30);

struct CapacityInputs {
  LmConfig lm;
  KvDtype kv = KvDtype::kBf16;
  // The LM's weight bytes, all read once per batch step (cuda::CudaLm::weight_bytes(): ~16.1 GB
  // in bf16 at full size, ~7.5 GB with --w8a16).
  double weight_bytes = 0;
  // Free device memory after the model loaded (the LM's weights are no longer in it).
  double free_bytes = 0;
  // The device's copy rate in bytes per second (read plus written); 0: unknown, no bandwidth
  // limit (the CPU).
  double bandwidth = 0;
  double frame_ms = 80;  // one frame of audio: every session needs one step per frame
  // The fraction of the frame kept back: for the host work and jitter within a frame.
  double headroom = 0.1;
  // Free memory kept back: a fraction (allocator slack) and fixed bytes still to come after
  // free_bytes was measured that do not scale with the sessions (the codec's weights, the batch's
  // row buffers, CUDA graphs, cuBLAS's workspace).
  double memory_headroom = kMemoryHeadroom;
  double reserve_bytes = kMemoryReserveBytes;
  double codec_bytes_per_session = 0;  // codec_slot_bytes_estimate() on CUDA
  double prompt_cache_bytes = 0;       // the prompt cache's store (--prompt-cache-mb)
  double weight_efficiency = kWeightStreamEfficiency;
  double kv_efficiency = kKvStreamEfficiency;
  double session_fixed_ms = kSessionFixedMs;  // with a known bandwidth only
};

struct Capacity {
  int memory_sessions = 0;               // what free memory allows (unclamped, >= 0)
  std::optional<int> bandwidth_sessions;  // what bandwidth allows (unclamped, >= 0); none when unknown
  int sessions = 1;                       // min of both, clamped to [1, kMaxSessionsLimit]
  double bytes_per_session = 0;           // LM slot plus codec state
  double read_bytes_per_session = 0;      // bytes a full-context session adds to every step
  double weight_step_ms = 0;              // the weights' share of a step at the modelled rate
  double session_step_ms = 0;             // each full-context session's share of a frame (KV reads + fixed)
  double bandwidth = 0;                   // the input's copy rate (bytes/s); 0: unknown
  double free_bytes = 0;                  // the input's free memory
  double prompt_cache_bytes = 0;          // the input's prompt cache (what memory_sessions left for it)
};

// The capacity model above. Throws ppx::Error on inputs that make no sense (negative bytes, a
// headroom outside [0, 1), efficiencies outside (0, 1]).
Capacity compute_capacity(const CapacityInputs& in);

}  // namespace ppx
