// A moving average seeded by its first sample, as the schedulers keep their time estimates.
#pragma once

namespace ppx {

// `avg` updated with `x` at weight `w` (0 < w <= 1); avg == 0 means no sample yet, and `x` is taken.
inline double moving_average(double avg, double x, double w) { return avg == 0 ? x : (1 - w) * avg + w * x; }

}  // namespace ppx
