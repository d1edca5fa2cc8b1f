// Checks the command-line tools share: numbers that must be finite (CLI11's Range lets NaN
// through: every comparison with it is false) and output files, checked before the long work and
// written with their errors seen.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <utility>
#include <vector>

namespace ppx::app {

// A command line CLI11 could not parse: its message as "error: ..." (as every other error of the
// tools) and exit status 2; --help and --version print and give 0.
int parse_failed(CLI::App& app, const CLI::ParseError& e);

// Checks every numeric option of `app` and its subcommands (call it once the options are added,
// before parsing): an empty value is refused (CLI11 would keep the default: `--port ""` served on
// the default port) and so is an integer outside its type's range (CLI11 would clamp it:
// `--seed 99999999999999999999` ran as the largest seed; or wrap it: an unsigned 64-bit `--seed -1`
// ran as 2^64 - 1).
void check_numbers(CLI::App& app);

// A validator that refuses nan and inf (any case, signed): `->check(finite() & CLI::Range(a, b))`.
CLI::Validator finite();

// Before any long work: each output ({flag, path}) names a file that can be written (not empty,
// not a directory, its directory exists and is writable), no two outputs are the same file, and no
// output is one of `inputs`. Throws ppx::Error naming the flag.
void check_outputs(const std::vector<std::pair<std::string, std::string>>& outputs,
                   const std::vector<std::string>& inputs = {});

// Writes `text` to `path` and closes it, throwing ppx::Error with the system's reason when any
// part fails (a full disk shows only at the flush).
void write_text_file(const std::string& path, const std::string& text);

}  // namespace ppx::app
