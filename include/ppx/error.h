// Error type of the project: every failure a user can cause (bad file, bad flag, bad config)
// surfaces as a ppx::Error whose message names the file, key or tensor involved.
#pragma once

#include <stdexcept>
#include <string>

namespace ppx {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// The compute device is unusable for the rest of the process (a sticky CUDA error such as an
// illegal address or a failed launch): every later call on it fails too. A server that sees one
// stops serving and exits non-zero so that its supervisor restarts it.
class DeviceError : public Error {
 public:
  explicit DeviceError(const std::string& what) : Error(what) {}
};

}  // namespace ppx
