// The message of an error carried as a std::exception_ptr (a completion callback's argument).
#pragma once

#include <exception>
#include <string>

namespace ppx {

// "" for no error, what() for a std::exception, "unknown error" for anything else.
inline std::string error_text(std::exception_ptr e) {
  if (!e) return "";
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "unknown error";
  }
}

}  // namespace ppx
