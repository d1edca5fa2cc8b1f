// The server's log (src/server/log.h): text and JSON lines, levels, and strings that a client
// controls (request targets, messages) kept on one line and valid JSON.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "server/log.h"
#include "test_util.h"

namespace {

namespace slog = ppx::server::log;

// What `body` writes to stderr, as lines; the log is back to text at info afterwards.
std::vector<std::string> captured(slog::Level level, bool json, const std::function<void()>& body) {
  const std::string path = ppx::test::scratch("server_log_" + std::to_string(::getpid()) + ".txt");
  std::fflush(stderr);
  const int saved = dup(STDERR_FILENO);
  FILE* f = std::fopen(path.c_str(), "w");
  dup2(fileno(f), STDERR_FILENO);
  slog::init(level, json);
  body();
  slog::init(slog::Level::kInfo, false);
  std::fflush(stderr);
  dup2(saved, STDERR_FILENO);
  close(saved);
  std::fclose(f);
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

TEST(ServerLog, JsonLinesEscapeEveryString) {
  const std::string hostile = "a \"quoted\"\nsecond line\t\x01 and invalid UTF-8 \xff\xfe";
  const auto lines = captured(slog::Level::kInfo, true, [&] {
    slog::info(hostile, {{"target", hostile}, {"n", 3}, {"x", 1.5}, {"none", nullptr}});
    slog::warn("w");
    slog::error("e");
  });
  ASSERT_EQ(lines.size(), 3u);
  const nlohmann::json j = nlohmann::json::parse(lines[0]);
  EXPECT_EQ(j["level"], "info");
  EXPECT_TRUE(std::regex_match(j["time"].get<std::string>(),
                               std::regex("[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]{8}\\.[0-9]{3}Z")));
  EXPECT_EQ(j["msg"].get<std::string>().substr(0, 12), "a \"quoted\"\ns");
  EXPECT_EQ(j["target"], j["msg"]);
  EXPECT_EQ(j["n"], 3);
  EXPECT_EQ(j["x"], 1.5);
  EXPECT_TRUE(j["none"].is_null());
  EXPECT_EQ(nlohmann::json::parse(lines[1])["level"], "warn");
  EXPECT_EQ(nlohmann::json::parse(lines[2])["level"], "error");
}

TEST(ServerLog, TextLinesAndLevels) {
  const auto lines = captured(slog::Level::kWarn, false, [] {
    slog::debug("hidden");
    slog::info("hidden too");
    slog::warn("accept failed", {{"error", "Too many open files"}, {"retry_ms", 10}, {"none", nullptr}});
    EXPECT_FALSE(slog::enabled(slog::Level::kInfo));
    EXPECT_TRUE(slog::enabled(slog::Level::kError));
  });
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_TRUE(std::regex_match(
      lines[0], std::regex("[0-9-]{10}T[0-9:]{8}\\.[0-9]{3}Z \\[warn\\] accept failed "
                           "error=\"Too many open files\" retry_ms=10")))
      << lines[0];
  EXPECT_TRUE(captured(slog::Level::kOff, true, [] { slog::error("nothing"); }).empty());
}

TEST(ServerLog, LevelNamesAndSessionIds) {
  slog::Level l = slog::Level::kInfo;
  for (const char* name : slog::kLevelNames) EXPECT_TRUE(slog::parse_level(name, l)) << name;
  EXPECT_EQ(l, slog::Level::kOff);
  EXPECT_FALSE(slog::parse_level("warning", l));
  std::set<std::string> ids;
  for (int i = 0; i < 100; ++i) ids.insert(slog::new_session_id());
  EXPECT_EQ(ids.size(), 100u);
  EXPECT_TRUE(std::regex_match(*ids.begin(), std::regex("[0-9a-f]{8}-[0-9]+")));
}

}  // namespace
