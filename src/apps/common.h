// Small helpers shared by the command-line tools: timing statistics, machine description,
// relative L2 error, fatal-error reporting.
#pragma once

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace ppx::app {

// Percentiles (nearest rank) and max of a sample of durations in milliseconds.
nlohmann::ordered_json latency_stats(std::vector<double> ms);
// CPU model, core count, host name, GPU (when given), commit, version.
nlohmann::ordered_json machine_info();
// The command line as one string.
std::string command_line(int argc, char** argv);
// ||a - b|| / ||b|| over the common length (a and b must have equal size).
double rel_l2(const std::vector<float>& a, const std::vector<float>& b);

inline double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

// Prints a benchmark result (indented JSON) on stdout and, when `path` is not empty, writes it
// there too. Throws ppx::Error when the file cannot be written.
void emit_json(const nlohmann::ordered_json& j, const std::string& path);

// Runs `body`, turning ppx::Error and other exceptions into "error: ..." on stderr and exit code 2.
int run_main(int (*body)(int, char**), int argc, char** argv);

}  // namespace ppx::app
