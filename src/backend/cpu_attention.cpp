#include "backend/cpu_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/cpu_ops.h"

namespace ppx::cpu {

void RingKv::init(int capacity_, int heads_, int head_dim_) {
  capacity = capacity_;
  heads = heads_;
  head_dim = head_dim_;
  const size_t n = static_cast<size_t>(capacity) * heads * head_dim;
  k.assign(n, 0.f);
  v.assign(n, 0.f);
  end = 0;
}

void RingKv::append(const float* key, const float* value) {
  const size_t row = static_cast<size_t>(heads) * head_dim;
  const size_t slot = static_cast<size_t>(end % capacity);
  std::copy_n(key, row, k.begin() + slot * row);
  std::copy_n(value, row, v.begin() + slot * row);
  ++end;
}

int64_t RingKv::slot_pos(int idx) const {
  if (idx >= end) return -1;
  const int64_t delta = idx - end % capacity;
  return delta <= 0 ? end + delta : end + delta - capacity;
}

void ring_attend(const RingKv& kv, const float* q, int64_t q_pos, int context, float scale, float* o,
                 std::vector<float>& scratch) {
  const int C = kv.capacity, hd = kv.head_dim;
  const size_t row = static_cast<size_t>(kv.heads) * hd;
  // Visible slots, in slot order.
  std::vector<int> vis;
  vis.reserve(C);
  for (int idx = 0; idx < C; ++idx) {
    const int64_t p = kv.slot_pos(idx);
    if (p >= 0 && q_pos - p >= 0 && (context <= 0 || q_pos - p < context)) vis.push_back(idx);
  }
  scratch.resize(vis.size());
  for (int h = 0; h < kv.heads; ++h) {
    const float* qh = q + static_cast<size_t>(h) * hd;
    float* oh = o + static_cast<size_t>(h) * hd;
    std::fill_n(oh, hd, 0.f);
    if (vis.empty()) continue;  // nothing visible: upstream would produce NaN; never happens in use
    float mx = -std::numeric_limits<float>::infinity();
    for (size_t j = 0; j < vis.size(); ++j) {
      const float s = dot(qh, kv.k.data() + vis[j] * row + h * hd, hd) * scale;
      scratch[j] = s;
      mx = std::max(mx, s);
    }
    float sum = 0.f;
    for (size_t j = 0; j < vis.size(); ++j) {
      scratch[j] = std::exp(scratch[j] - mx);
      sum += scratch[j];
    }
    const float inv = 1.f / sum;
    for (size_t j = 0; j < vis.size(); ++j) {
      const float p = scratch[j] * inv;
      const float* vh = kv.v.data() + vis[j] * row + h * hd;
#pragma omp simd
      for (int d = 0; d < hd; ++d) oh[d] += p * vh[d];
    }
  }
}

}  // namespace ppx::cpu
