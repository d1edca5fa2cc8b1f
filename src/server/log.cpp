#include "server/log.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdio>
#include <iterator>
#include <memory>
#include <random>

namespace ppx::server::log {

namespace {

spdlog::level::level_enum to_spdlog(Level l) {
  switch (l) {
    case Level::kTrace: return spdlog::level::trace;
    case Level::kDebug: return spdlog::level::debug;
    case Level::kInfo: return spdlog::level::info;
    case Level::kWarn: return spdlog::level::warn;
    case Level::kError: return spdlog::level::err;
    case Level::kOff: break;
  }
  return spdlog::level::off;
}

// The `%*` pattern flag: the level as --log-level names it (spdlog's own %l says "warning").
class LevelFlag : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& m, const std::tm&, spdlog::memory_buf_t& dest) override {
    const char* name = m.level == spdlog::level::trace   ? "trace"
                       : m.level == spdlog::level::debug ? "debug"
                       : m.level == spdlog::level::info  ? "info"
                       : m.level == spdlog::level::warn  ? "warn"
                                                          : "error";
    dest.append(name, name + std::char_traits<char>::length(name));
  }
  std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<LevelFlag>(); }
};

struct State {
  std::shared_ptr<spdlog::logger> logger;
  bool json = false;
};

State make_state(Level level, bool json) {
  State s;
  s.json = json;
  s.logger = std::make_shared<spdlog::logger>("ppx", std::make_shared<spdlog::sinks::stderr_sink_mt>());
  // In JSON mode the message (%v) is the body of the object that write() built with nlohmann_json,
  // whose dump escapes every string; the pattern adds only the time and the level, which need no
  // escaping.
  auto f = std::make_unique<spdlog::pattern_formatter>(spdlog::pattern_time_type::utc, std::string("\n"));
  f->add_flag<LevelFlag>('*').set_pattern(json ? R"({"time":"%Y-%m-%dT%H:%M:%S.%eZ","level":"%*",%v})"
                                               : "%Y-%m-%dT%H:%M:%S.%eZ [%*] %v");
  s.logger->set_formatter(std::move(f));
  s.logger->set_level(to_spdlog(level));
  // Every line reaches the file at once: a supervisor's log, or a crash right after, loses none.
  s.logger->flush_on(spdlog::level::trace);
  return s;
}

State& state() {
  static State s = make_state(Level::kInfo, false);
  return s;
}

// A text field's value: bare when it is one plain word, else JSON-quoted so that it stays one token.
void append_text_value(std::string& out, const nlohmann::json& v) {
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    bool plain = !s.empty();
    for (const char c : s) plain = plain && c > ' ' && c != '"' && c != '=' && c != 0x7f;
    if (plain) {
      out += s;
      return;
    }
  }
  out += v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

bool parse_level(const std::string& name, Level& level) {
  for (size_t i = 0; i < std::size(kLevelNames); ++i) {
    if (name == kLevelNames[i]) {
      level = static_cast<Level>(i);
      return true;
    }
  }
  return false;
}

void init(Level level, bool json) { state() = make_state(level, json); }

bool enabled(Level level) { return level != Level::kOff && state().logger->should_log(to_spdlog(level)); }

void write(Level level, const std::string& msg, Fields fields) {
  if (!enabled(level)) return;
  State& s = state();
  std::string line;
  if (s.json) {
    nlohmann::ordered_json j;
    j["msg"] = msg;
    for (const auto& [key, value] : fields) j[key] = value;
    // Invalid UTF-8 (a client's text echoed in a message) becomes U+FFFD rather than an exception.
    line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    line = line.substr(1, line.size() - 2);  // the pattern adds the braces around time and level
  } else {
    line = msg;
    for (const auto& [key, value] : fields) {
      if (value.is_null()) continue;  // nothing to say (JSON lines keep the key, as null)
      line += ' ';
      line += key;
      line += '=';
      append_text_value(line, value);
    }
  }
  s.logger->log(to_spdlog(level), spdlog::string_view_t(line.data(), line.size()));
}

std::string new_session_id() {
  static const uint32_t prefix = [] {
    std::random_device rd;
    return static_cast<uint32_t>(rd());
  }();
  static std::atomic<uint64_t> counter{0};
  char buf[40];
  std::snprintf(buf, sizeof buf, "%08x-%llu", prefix, static_cast<unsigned long long>(++counter));
  return buf;
}

}  // namespace ppx::server::log
