// personaplex-server as a process (embedded tiny demo model): signals. The first SIGTERM drains
// (the live conversation goes on, then gets 0x05 + close) and the process exits 0; a second
// signal exits at once.
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
    log_ = ppx::test::scratch("server_process_" + std::to_string(counter_++) + ".log");
    const char* bin = std::getenv("PPX_SERVER_BIN");  // where the binaries run from another tree
    std::vector<std::string> args = {bin ? bin : PPX_SERVER_BIN, "--host", "127.0.0.1", "--port",
                                     "0"};
    args.insert(args.end(), extra.begin(), extra.end());
    pid_ = fork();
    if (pid_ == 0) {
      FILE* f = std::freopen(log_.c_str(), "w", stdout);
      (void)f;
      dup2(fileno(stdout), STDERR_FILENO);
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
  std::string log() const {
    std::ifstream f(log_);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }

 private:
  static inline int counter_ = 0;
  std::string log_;
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
  int audio_at_signal = 0;
  Clock::time_point t_signal;
  const Exchange ex = c.run(
      audio_messages(speech), 80ms,
      [&](const Exchange& e) {
        if (e.audio_msgs >= 5 && !signalled) {
          signalled = true;
          audio_at_signal = e.audio_msgs;
          t_signal = Clock::now();
          p.signal(SIGTERM);
        }
        return false;
      },
      30s);
  EXPECT_TRUE(signalled);
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

}  // namespace
