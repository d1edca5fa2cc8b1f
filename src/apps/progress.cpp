#include "apps/progress.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "apps/common.h"

namespace ppx::app {

Progress::Progress(std::string label, bool quiet) : label_(std::move(label)), start_ms_(now_ms()) {
  const char* env = std::getenv("PPX_PROGRESS");
  enabled_ = !quiet && (isatty(STDERR_FILENO) || (env && std::strcmp(env, "1") == 0));
}

void Progress::update(int64_t done, int64_t total) {
  done_ = done;
  total_ = total;
  if (!enabled_) return;
  const double t = now_ms();
  if (t - last_ms_ < 100 && done < total) return;
  last_ms_ = t;
  const int width = 30;
  const int filled = total > 0 ? static_cast<int>(width * done / total) : 0;
  std::string bar(filled, '=');
  if (filled < width) bar += '>' + std::string(width - filled - 1, ' ');
  const double el = (t - start_ms_) / 1000.0;
  const double eta = done > 0 ? el * (total - done) / done : 0.0;
  std::fprintf(stderr, "\r%-16s [%s] %3d%% %lld/%lld  %.1fs elapsed, %.1fs left ", label_.c_str(), bar.c_str(),
               total > 0 ? static_cast<int>(100 * done / total) : 0, static_cast<long long>(done),
               static_cast<long long>(total), el, eta);
  std::fflush(stderr);
}

void Progress::finish() {
  if (enabled_ && total_ > 0) std::fprintf(stderr, "\n");
}

}  // namespace ppx::app
