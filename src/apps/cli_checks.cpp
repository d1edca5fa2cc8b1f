#include "apps/cli_checks.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "ppx/error.h"

namespace ppx::app {

namespace fs = std::filesystem;

int parse_failed(CLI::App& app, const CLI::ParseError& e) {
  app.failure_message([](const CLI::App*, const CLI::Error& err) {
    return "error: " + std::string(err.what()) + "\nRun with --help for more information.\n";
  });
  return app.exit(e) == 0 ? 0 : 2;
}

CLI::Validator finite() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        if (end != s.c_str() && !std::isfinite(v)) return "must be a finite number, got " + s;
        return "";
      },
      "FINITE");
}

void check_numbers(CLI::App& app) {
  for (CLI::Option* o : app.get_options()) {
    const std::string type = o->get_type_name();
    const bool is_int = type.rfind("INT", 0) == 0, is_uint = type.rfind("UINT", 0) == 0;
    if (!is_int && !is_uint && type.rfind("FLOAT", 0) != 0) continue;
    o->check(CLI::Validator(
        [is_int, is_uint](std::string& v) -> std::string {
          if (v.empty()) return "expects a number, got an empty value";
          if (!is_int && !is_uint) return "";
          errno = 0;
          char* end = nullptr;
          if (is_uint) {
            // CLI11 wraps a negative value of a 64-bit unsigned option (--seed -1: 2^64 - 1).
            if (v.find('-') != std::string::npos) return "expects a number of at least 0, got " + v;
            (void)std::strtoull(v.c_str(), &end, 0);
          } else {
            (void)std::strtoll(v.c_str(), &end, 0);
          }
          if (errno == ERANGE) return "the number " + v + " is out of range";
          return "";
        },
        ""));
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) check_numbers(*sub);
}

namespace {

// The file `p` names, for comparing paths that may not exist yet.
fs::path identity(const std::string& p) {
  std::error_code ec;
  fs::path c = fs::weakly_canonical(fs::absolute(p), ec);
  return ec ? fs::absolute(p).lexically_normal() : c;
}

}  // namespace

void check_outputs(const std::vector<std::pair<std::string, std::string>>& outputs,
                   const std::vector<std::string>& inputs) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    const auto& [flag, path] = outputs[i];
    if (path.empty()) throw Error(flag + ": an empty path");
    std::error_code ec;
    if (fs::is_directory(path, ec)) throw Error(flag + " '" + path + "' is a directory");
    const fs::path dir = fs::absolute(path).parent_path();
    if (!fs::is_directory(dir, ec)) throw Error(flag + " '" + path + "': no directory '" + dir.string() + "'");
    // Devices and pipes (/dev/null for both outputs, /dev/stdout) may be shared; files may not.
    const bool exists = fs::exists(path, ec);
    if (!exists || fs::is_regular_file(path, ec)) {
      const fs::path id = identity(path);
      for (size_t j = 0; j < i; ++j)
        if (identity(outputs[j].second) == id)
          throw Error(flag + " and " + outputs[j].first + " name the same file '" + path + "'");
      for (const std::string& in : inputs)
        if (!in.empty() && identity(in) == id) throw Error(flag + " '" + path + "' is an input file");
    }
    if (exists ? ::access(path.c_str(), W_OK) != 0 : ::access(dir.c_str(), W_OK) != 0)
      throw Error(flag + " '" + path + "' cannot be written: " + std::strerror(errno));
  }
}

void write_text_file(const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw Error("cannot write '" + path + "': " + std::strerror(errno));
  const bool wrote = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const int err = errno;
  if (std::fclose(f) != 0 || !wrote)
    throw Error("cannot write '" + path + "': " + std::strerror(wrote ? errno : err));
}

}  // namespace ppx::app
