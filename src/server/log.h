// The server's log: one line per event on stderr through spdlog, with a UTC timestamp and a level,
// as text (`2026-12-04T05:00:00.123Z [info] session started session=3f9c0a1b-1 slot=0 ...`) or, with
// --log-json, one JSON object per line (`{"time":...,"level":...,"msg":...}` plus the event's
// structured fields) for log collectors. Every server message goes through here, so a message is
// formatted in one place whichever output is chosen. Thread-safe.
#pragma once

#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

namespace ppx::server::log {

enum class Level { kTrace, kDebug, kInfo, kWarn, kError, kOff };

// `--log-level` values: trace, debug, info, warn, error, off.
inline constexpr const char* kLevelNames[] = {"trace", "debug", "info", "warn", "error", "off"};
// The level named `name`; false when it is not one of kLevelNames.
bool parse_level(const std::string& name, Level& level);

// Replaces the default output (text at info) with `level` and text or JSON lines. Call before any
// thread logs.
void init(Level level, bool json);

// A structured field of an event: in JSON lines a member of the object, in text ` key=value`
// after the message (left out there when the value is null). Keys other than time, level and msg.
using Field = std::pair<const char*, nlohmann::json>;
using Fields = std::initializer_list<Field>;

bool enabled(Level level);
void write(Level level, const std::string& msg, Fields fields = {});
inline void trace(const std::string& msg, Fields f = {}) { write(Level::kTrace, msg, f); }
inline void debug(const std::string& msg, Fields f = {}) { write(Level::kDebug, msg, f); }
inline void info(const std::string& msg, Fields f = {}) { write(Level::kInfo, msg, f); }
inline void warn(const std::string& msg, Fields f = {}) { write(Level::kWarn, msg, f); }
inline void error(const std::string& msg, Fields f = {}) { write(Level::kError, msg, f); }

// A new session id: 8 random hex digits followed by a per-process counter, so that ids differ
// between the servers behind one load balancer and never repeat within a process.
std::string new_session_id();

}  // namespace ppx::server::log
