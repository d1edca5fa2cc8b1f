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

}  // namespace ppx
