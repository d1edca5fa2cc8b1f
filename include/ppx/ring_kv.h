// The CPU reference's per-layer KV cache (ppx::LmState holds one per temporal layer); the
// attention over it is src/backend/cpu_attention.h.
//
// A ring of `capacity` slots per layer holds rotated keys and values [capacity, heads*head_dim];
// `end` counts every token ever written. After the write of a call, slot idx carries the position
//   delta = idx - end % capacity;  pos = delta <= 0 ? end + delta : end + delta - capacity
// (pos = -1 for slots never written), and a query at position q sees the slot iff pos >= 0,
// q - pos >= 0 and, when context > 0, q - pos < context. Once end >= capacity the oldest slot gets
// a future label and is masked: the upstream quirk (at most capacity - 1 keys are seen).
#pragma once

#include <cstdint>
#include <vector>

namespace ppx::cpu {

struct RingKv {
  int capacity = 0, heads = 0, head_dim = 0;
  std::vector<float> k, v;  // [capacity, heads * head_dim]
  int64_t end = 0;          // tokens written so far

  void init(int capacity_, int heads_, int head_dim_);
  void reset() { end = 0; }
  // Appends one token's key and value ([heads * head_dim] each).
  void append(const float* key, const float* value);
  // Position label of a slot as defined above.
  int64_t slot_pos(int idx) const;
};

}  // namespace ppx::cpu
