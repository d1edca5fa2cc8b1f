// personaplex-server as a process (embedded tiny demo model): signals. The first SIGTERM drains
// (/health/ready turns 503 at once, the live conversation goes on, then gets 0x05 + close) and the
// process exits 0; a second signal exits at once. With --log-json every stderr line is a JSON
// object, and the session's start and end lines carry its fields.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <regex>
#include <sstream>

#include "server_test_util.h"

namespace {

using namespace ppx::server_test;
using Clock = std::chrono::steady_clock;

class ServerProcess {
 public:
  explicit ServerProcess(const std::vector<std::string>& extra) {
    log_ = ppx::test::scratch("server_process_" + std::to_string(counter_) + ".log");
    err_ = ppx::test::scratch("server_process_" + std::to_string(counter_++) + ".err");
    const char* bin = std::getenv("PPX_SERVER_BIN");  // where the binaries run from another tree
    std::vector<std::string> args = {bin ? bin : PPX_SERVER_BIN, "--host", "127.0.0.1", "--port",
                                     "0"};
    args.insert(args.end(), extra.begin(), extra.end());
    pid_ = fork();
    if (pid_ == 0) {
      FILE* f = std::freopen(log_.c_str(), "w", stdout);
      FILE* e = std::freopen(err_.c_str(), "w", stderr);
      (void)f;
      (void)e;
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
  }
  ~ServerProcess() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  // The port from the ready line, or 0 after `limit`.
  uint16_t port(std::chrono::seconds limit = 60s) {
    const std::regex re("listening on http://127\\.0\\.0\\.1:([0-9]+)");
    for (const auto end = Clock::now() + limit; Clock::now() < end;) {
      std::smatch m;
      const std::string text = log();
      if (std::regex_search(text, m, re)) return static_cast<uint16_t>(std::stoi(m[1]));
      std::this_thread::sleep_for(50ms);
    }
    return 0;
  }
  void signal(int sig) { kill(pid_, sig); }
  // The exit status (or 128 + signal), or -1 when it has not exited within `limit`.
  int wait_exit(std::chrono::milliseconds limit) {
    for (const auto end = Clock::now() + limit; Clock::now() < end;) {
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        exited_ = true;
        return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
      std::this_thread::sleep_for(20ms);
    }
    return -1;
  }
  // Standard output (the ready lines) and standard error (the log).
  std::string log() const { return read(log_) + read(err_); }
  std::string err() const { return read(err_); }

 private:
  static std::string read(const std::string& path) {
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
  static inline int counter_ = 0;
  std::string log_, err_;
  pid_t pid_ = -1;
  bool exited_ = false;
};

TEST(ServerProcessTest, SigtermDrainsThenTellsTheClientAndExitsZero) {
  ServerProcess p({"--drain-timeout", "2.5"});
  const uint16_t port = p.port();
  ASSERT_NE(port, 0) << p.log();
  std::vector<float> speech = user_speech();
  speech.resize(80 * kFrame);
  Client c;
  ASSERT_TRUE(c.connect(port, "/api/chat?text_prompt=hi&voice_prompt="));
  bool signalled = false;
  int audio_at_signal = 0, ready_status = 0;
  Clock::time_point t_signal;
  const Exchange ex = c.run(
      audio_messages(speech), 80ms,
      [&](const Exchange& e) {
        if (e.audio_msgs >= 5 && !signalled) {
          signalled = true;
          audio_at_signal = e.audio_msgs;
          t_signal = Clock::now();
          p.signal(SIGTERM);
          // Not ready at once, so that a load balancer sends no new session here.
          int status = 0;
          for (const auto end = Clock::now() + 1s; status != 503 && Clock::now() < end;) {
            http_get(port, "/health/ready", &status);
            if (status != 503) std::this_thread::sleep_for(10ms);
          }
          ready_status = status;
        }
        return false;
      },
      30s);
  EXPECT_TRUE(signalled);
  EXPECT_EQ(ready_status, 503);
  EXPECT_TRUE(ex.closed);
  ASSERT_EQ(ex.errors.size(), 1u) << p.log();
  EXPECT_NE(ex.errors[0].find("shutting down"), std::string::npos) << ex.errors[0];
  // ~30 frames at real time; a sanitizer build of the server answers fewer.
  EXPECT_GE(ex.audio_msgs - audio_at_signal, 5) << "the conversation stopped before the drain";
  EXPECT_EQ(p.wait_exit(5s), 0) << p.log();
  EXPECT_LT(Clock::now() - t_signal, 8s);
}

TEST(ServerProcessTest, SecondSignalExitsAtOnce) {
  ServerProcess p({"--drain-timeout", "60"});
  const uint16_t port = p.port();
  ASSERT_NE(port, 0) << p.log();
  Client c;
  ASSERT_TRUE(c.connect(port, "/api/chat?text_prompt=hi&voice_prompt="));
  ASSERT_TRUE(c.run(
                   {}, 0ms, [](const Exchange& e) { return e.handshake; }, 20s)
                  .handshake);
  p.signal(SIGTERM);
  EXPECT_EQ(p.wait_exit(500ms), -1) << "the first signal must drain, not exit";
  p.signal(SIGINT);
  EXPECT_EQ(p.wait_exit(2s), 128 + SIGINT) << p.log();
}

// Every stderr line of a --log-json server is a JSON object with time, level and msg; one short
// /api/chat session logs one start and one end line with its fields.
TEST(ServerProcessTest, LogJsonLinesCarryTheSessionFields) {
  ServerProcess p({"--log-json"});
  const uint16_t port = p.port();
  ASSERT_NE(port, 0) << p.log();
  std::vector<float> speech = user_speech();
  speech.resize(40 * kFrame);
  int answered = 0;  // audio frames the client received (its first two 0x01 are the Ogg headers)
  {
    Client c;
    ASSERT_TRUE(c.connect(port, "/api/chat?text_prompt=hi&voice_prompt="));
    const Exchange ex = c.run(
        audio_messages(speech), 80ms, [](const Exchange& e) { return e.audio_msgs >= 10; }, 30s);
    ASSERT_GE(ex.audio_msgs, 10) << p.log();
    answered = ex.audio_msgs - 2;
    c.drop();
  }
  for (const auto end = Clock::now() + 10s;
       p.err().find("\"session ended\"") == std::string::npos && Clock::now() < end;)
    std::this_thread::sleep_for(20ms);
  p.signal(SIGTERM);
  ASSERT_EQ(p.wait_exit(10s), 0) << p.log();

  std::vector<nlohmann::json> lines;
  std::istringstream in(p.err());
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception&) {
      ADD_FAILURE() << "not a JSON line: " << line;
      continue;
    }
    ASSERT_TRUE(j.is_object()) << line;
    EXPECT_TRUE(j.contains("time") && j["time"].is_string()) << line;
    EXPECT_TRUE(std::regex_match(j.value("time", ""),
                                 std::regex("[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:]{8}\\.[0-9]{3}Z")))
        << line;
    EXPECT_TRUE(j.contains("level") && j["level"].is_string()) << line;
    EXPECT_TRUE(j.contains("msg") && j["msg"].is_string()) << line;
    lines.push_back(j);
  }
  auto find = [&](const std::string& msg) {
    std::vector<nlohmann::json> found;
    for (const auto& j : lines)
      if (j.value("msg", "") == msg) found.push_back(j);
    return found;
  };
  const auto starts = find("session started"), ends = find("session ended");
  ASSERT_EQ(starts.size(), 1u) << p.err();
  ASSERT_EQ(ends.size(), 1u) << p.err();
  const nlohmann::json& s = starts[0];
  const nlohmann::json& e = ends[0];
  EXPECT_EQ(s["level"], "info");
  ASSERT_TRUE(s["session"].is_string()) << s;
  EXPECT_FALSE(s["session"].get<std::string>().empty());
  EXPECT_EQ(s["slot"], 0);
  EXPECT_EQ(s["endpoint"], "/api/chat");
  EXPECT_EQ(e["session"], s["session"]);
  EXPECT_EQ(e["slot"], 0);
  EXPECT_EQ(e["endpoint"], "/api/chat");
  ASSERT_TRUE(e["duration_s"].is_number()) << e;
  EXPECT_GT(e["duration_s"].get<double>(), 0.5) << e;
  EXPECT_LT(e["duration_s"].get<double>(), 30.0) << e;
  ASSERT_TRUE(e["frames"].is_number_integer()) << e;
  EXPECT_GE(e["frames"].get<int>(), answered) << e;
  EXPECT_EQ(e["end_reason"], "client_left") << e;
  ASSERT_TRUE(e["budget_misses"].is_number_integer()) << e;
  EXPECT_GE(e["budget_misses"].get<int>(), 0);
  EXPECT_LE(e["budget_misses"].get<int>(), e["frames"].get<int>());
  EXPECT_EQ(find("server stopped cleanly").size(), 1u) << p.err();
}

// /health's capacity: without --max-sessions the CPU backend keeps its default of 1 (its capacity
// is not modelled: the limits are null); --max-sessions wins and says so. The startup log says
// what was chosen.
TEST(ServerProcessTest, HealthReportsTheCapacity) {
  {
    ServerProcess p({});
    const uint16_t port = p.port();
    ASSERT_NE(port, 0) << p.log();
    int status = 0;
    const auto h = nlohmann::json::parse(http_get(port, "/health", &status));
    EXPECT_EQ(status, 200);
    EXPECT_EQ(h["max_sessions"], 1) << h;
    ASSERT_TRUE(h["capacity"].is_object()) << h;
    const auto& c = h["capacity"];
    EXPECT_EQ(c["max_sessions"], 1) << c;
    EXPECT_EQ(c["source"], "default") << c;
    for (const char* k : {"memory_sessions", "bandwidth_sessions", "computed_sessions", "bandwidth_gb_s",
                          "free_bytes", "bytes_per_session"})
      EXPECT_TRUE(c.contains(k) && c[k].is_null()) << k << ": " << c;
    EXPECT_NE(p.err().find("capacity: not modelled on this device, using 1"), std::string::npos) << p.err();
  }
  {
    ServerProcess p({"--max-sessions", "3"});
    const uint16_t port = p.port();
    ASSERT_NE(port, 0) << p.log();
    const auto h = nlohmann::json::parse(http_get(port, "/health"));
    EXPECT_EQ(h["max_sessions"], 3) << h;
    EXPECT_EQ(h["capacity"]["max_sessions"], 3) << h;
    EXPECT_EQ(h["capacity"]["source"], "given") << h;
    EXPECT_NE(p.err().find("using 3 (--max-sessions)"), std::string::npos) << p.err();
  }
}

}  // namespace
