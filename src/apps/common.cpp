#include "apps/common.h"

#include "apps/cli_checks.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <thread>

#include "ppx/error.h"

extern const char* const ppx_git_commit;

namespace ppx::app {

nlohmann::ordered_json latency_stats(std::vector<double> ms) {
  nlohmann::ordered_json j;
  if (ms.empty()) return j;
  std::sort(ms.begin(), ms.end());
  auto pct = [&](double p) {
    const size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * ms.size()));
    return ms[std::clamp<size_t>(rank, 1, ms.size()) - 1];
  };
  double sum = 0;
  for (double v : ms) sum += v;
  j["n"] = ms.size();
  j["mean"] = sum / ms.size();
  j["p50"] = pct(50);
  j["p90"] = pct(90);
  j["p99"] = pct(99);
  j["p99_9"] = pct(99.9);
  j["max"] = ms.back();
  return j;
}

nlohmann::ordered_json machine_info() {
  nlohmann::ordered_json j;
  std::ifstream cpu("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpu, line)) {
    if (line.rfind("model name", 0) == 0) {
      j["cpu"] = line.substr(line.find(':') + 2);
      break;
    }
  }
  j["cpu_threads"] = std::thread::hardware_concurrency();
  char host[256] = {0};
  if (gethostname(host, sizeof(host) - 1) == 0) j["host"] = host;
  j["commit"] = ppx_git_commit;
  j["version"] = PPX_VERSION;
  // The engine's experiment switches (docs/CLI.md), so that a result says which path ran.
  nlohmann::ordered_json env = nlohmann::ordered_json::object();
  for (char** e = environ; e && *e; ++e) {
    const std::string kv = *e;
    if (kv.rfind("PPX_", 0) == 0) {
      const size_t eq = kv.find('=');
      env[kv.substr(0, eq)] = eq == std::string::npos ? "" : kv.substr(eq + 1);
    }
  }
  j["env"] = env;
  return j;
}

std::string command_line(int argc, char** argv) {
  std::string s;
  for (int i = 0; i < argc; ++i) {
    if (i) s.push_back(' ');
    s.append(argv[i]);
  }
  return s;
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

void emit_json(const nlohmann::ordered_json& j, const std::string& path) {
  const std::string s = j.dump(2);
  std::printf("%s\n", s.c_str());
  if (path.empty()) return;
  write_text_file(path, s + "\n");
}

int run_main(int (*body)(int, char**), int argc, char** argv) {
  try {
    return body(argc, argv);
  } catch (const ppx::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}

}  // namespace ppx::app
