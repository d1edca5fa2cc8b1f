// A one-line progress bar on stderr, redrawn at most ten times a second and only on a terminal
// (or when PPX_PROGRESS=1), so logs and CI output stay clean.
#pragma once

#include <cstdint>
#include <string>

namespace ppx::app {

class Progress {
 public:
  Progress(std::string label, bool quiet);
  void update(int64_t done, int64_t total);
  void finish();

 private:
  std::string label_;
  bool enabled_;
  double last_ms_ = -1e9, start_ms_;
  int64_t done_ = 0, total_ = 0;
};

}  // namespace ppx::app
