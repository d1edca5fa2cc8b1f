// Single-query attention over the CPU reference's ring KV cache (ppx/ring_kv.h, where the ring's
// position labels and upstream's exact visibility rule are described).
#pragma once

#include <cstdint>
#include <vector>

#include "ppx/ring_kv.h"

namespace ppx::cpu {

// o = softmax(q . K^T * scale) V over the visible slots, per head. q, o: [heads * head_dim].
// Scores, softmax and the weighted sum are fp32. `scratch` is resized as needed.
void ring_attend(const RingKv& kv, const float* q, int64_t q_pos, int context, float scale, float* o,
                 std::vector<float>& scratch);

}  // namespace ppx::cpu
