// Helpers for tests: paths of bundled data, scratch files.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ppx::test {

// Polls `done` every millisecond until it holds or `timeout` passes; returns its last value.
template <typename Pred>
bool poll_until(Pred done, std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= until) return done();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// The source tree's paths are baked in at build time; PPX_TEST_DATA_DIR and PPX_TEST_CONFIG_DIR
// override them where the binaries run from another checkout (the GPU machine's copy).
inline std::string data(const std::string& name) {
  const char* d = std::getenv("PPX_TEST_DATA_DIR");
  return std::string(d ? d : PPX_TEST_DATA) + "/" + name;
}
inline std::string config_dir(const std::string& name) {
  const char* d = std::getenv("PPX_TEST_CONFIG_DIR");
  return std::string(d ? d : PPX_CONFIG_DIR) + "/" + name;
}

// A path in a scratch directory private to this process: ctest runs test cases as parallel
// processes, so shared names would race. The directory is named by the pid, and pids are reused
// across runs on one machine, so the first call in a process (a forked child included) empties
// whatever an earlier process of that pid left there.
inline std::string scratch(const std::string& name) {
  static std::mutex mu;
  static pid_t emptied = 0;
  const pid_t pid = ::getpid();
  const auto dir = std::filesystem::temp_directory_path() / "ppx_tests" / std::to_string(pid);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (emptied != pid) {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
      emptied = pid;
    }
  }
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

inline std::vector<char> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<char>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

inline void write_bytes(const std::string& path, const std::vector<char>& b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(b.data(), static_cast<std::streamsize>(b.size()));
}

}  // namespace ppx::test
