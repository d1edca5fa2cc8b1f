// personaplex-load: its synthetic speech, its encoded pages, its per-session verdicts, and the tool
// end to end against personaplex-server (tiny config, random weights, a vocabulary that only the
// synthetic tokenizer fits): 4 real-time sessions, no failed session, no missed frame.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>

#include "apps/load_client.h"
#include "apps/load_signal.h"
#include "ppx/ogg_opus.h"
#include "test_util.h"

namespace {

using namespace std::chrono_literals;
using ppx::load::Clock;
using ppx::load::kFrameSamples;

double rms(const float* x, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return std::sqrt(s / static_cast<double>(n));
}

TEST(LoadSignal, SpeechLikeSignalIsDeterministicPerSeedAndSpeechShaped) {
  const int64_t frames = 150;  // 12 s
  const std::vector<float> a = ppx::load::speech_like_signal(3, frames);
  ASSERT_EQ(a.size(), static_cast<size_t>(frames * kFrameSamples));
  EXPECT_EQ(a, ppx::load::speech_like_signal(3, frames));
  const std::vector<float> b = ppx::load::speech_like_signal(4, frames);
  EXPECT_NE(a, b);
  float peak = 0;
  for (float v : a) peak = std::max(peak, std::abs(v));
  EXPECT_NEAR(peak, 0.5f, 1e-4f);
  // Loud frames (syllables) and quiet ones (pauses between phrases).
  int loud = 0, quiet = 0;
  for (int64_t k = 0; k < frames; ++k) {
    const double r = rms(a.data() + k * kFrameSamples, kFrameSamples);
    loud += r > 0.05;
    quiet += r < 0.01;
  }
  EXPECT_GT(loud, frames / 3) << "too little voiced audio";
  EXPECT_GT(quiet, 3) << "no pauses";
  EXPECT_EQ(ppx::load::speech_like_signal(3, 1).size(), static_cast<size_t>(kFrameSamples));
}

TEST(LoadSignal, EncodedStreamIsTheWebClientsPages) {
  const std::vector<float> pcm = ppx::load::speech_like_signal(1, 25);
  const auto s = ppx::load::encode_stream(pcm);
  ASSERT_EQ(s->frames.size(), 25u);
  auto seq = [](const std::vector<uint8_t>& m) {
    EXPECT_GE(m.size(), 28u);
    EXPECT_EQ(m[0], 0x01);
    EXPECT_EQ(std::string(m.begin() + 1, m.begin() + 5), "OggS");
    return static_cast<uint32_t>(m[19] | m[20] << 8 | m[21] << 16 | m[22] << 24);
  };
  EXPECT_EQ(seq(s->head), 0u);
  EXPECT_EQ(seq(s->tags), 1u);
  for (size_t k = 0; k < s->frames.size(); ++k) EXPECT_EQ(seq(s->frames[k]), k + 2);
  // What the server reads back: exactly one 1920-sample frame per page.
  ppx::OggOpusReader r(24000);
  r.push(s->head.data() + 1, s->head.size() - 1);
  r.push(s->tags.data() + 1, s->tags.size() - 1);
  for (size_t k = 0; k < s->frames.size(); ++k) {
    r.push(s->frames[k].data() + 1, s->frames[k].size() - 1);
    EXPECT_EQ(r.available(), (k + 1) * kFrameSamples);
  }
  EXPECT_EQ(r.errors(), 0u);
}

// The streamed encoders (the PCM never whole) give the pages of the whole signal: the same bytes
// but for each writer's random stream serial and so the pages' checksums.
std::vector<std::vector<uint8_t>> without_serial(const ppx::load::EncodedStream& s) {
  std::vector<std::vector<uint8_t>> out{s.head, s.tags};
  out.insert(out.end(), s.frames.begin(), s.frames.end());
  for (auto& m : out) {
    EXPECT_GE(m.size(), 28u);
    std::fill(m.begin() + 1 + 14, m.begin() + 1 + 18, 0);  // the stream serial
    std::fill(m.begin() + 1 + 22, m.begin() + 1 + 26, 0);  // the page's CRC
  }
  return out;
}

TEST(LoadSignal, StreamedEncodingEqualsWholeSignalEncoding) {
  // With nothing kept whole (the default keeps ~11.6 minutes): made twice and streamed.
  for (const int64_t frames : {int64_t{1}, int64_t{37}, int64_t{260}}) {
    const auto whole = ppx::load::encode_stream(ppx::load::speech_like_signal(5, frames));
    const auto streamed = ppx::load::encode_speech_like(5, frames, /*whole_samples=*/0);
    ASSERT_EQ(streamed->frames.size(), static_cast<size_t>(frames));
    EXPECT_TRUE(without_serial(*whole) == without_serial(*streamed)) << frames << " frames";
  }
  const std::string wav = ppx::test::data("speech_16k.wav");
  const auto whole = ppx::load::encode_stream(ppx::load::file_signal(wav, 150));  // 12 s: the 7.8 s file repeats
  const auto streamed = ppx::load::encode_file(wav, 150);
  ASSERT_EQ(streamed->frames.size(), 150u);
  EXPECT_TRUE(without_serial(*whole) == without_serial(*streamed));
}

ppx::load::SessionTrace trace_of(int frames) {
  ppx::load::SessionTrace t;
  t.connected = t.handshake = true;
  t.t_connect = Clock::time_point{} + 1s;
  t.t_handshake = t.t_connect + 500ms;
  t.scheduled.resize(static_cast<size_t>(frames));
  t.written.resize(static_cast<size_t>(frames));
  t.answered.resize(static_cast<size_t>(frames));
  for (int k = 0; k < frames; ++k) {
    t.scheduled[k] = t.t_handshake + 80ms * k;
    t.written[k] = t.scheduled[k] + 1ms;
    t.answered[k] = t.written[k] + 20ms;
  }
  t.frames_written = t.frames_answered = frames;
  return t;
}

TEST(LoadSummary, LatencyIsWriteToAnswerPerFrame) {
  ppx::load::SessionTrace t = trace_of(10);
  t.answered[3] = t.written[3] + 200ms;  // over the 160 ms budget
  const auto s = ppx::load::summarize(t, 160, 2);
  EXPECT_TRUE(s.failure.empty()) << s.failure;
  EXPECT_DOUBLE_EQ(s.handshake_ms, 500);
  EXPECT_EQ(s.frames_sent, 10);
  EXPECT_EQ(s.frames_received, 10);
  EXPECT_EQ(s.frames_over_budget, 1);
  ASSERT_EQ(s.latency_ms.size(), 10u);
  EXPECT_DOUBLE_EQ(s.latency_ms[0], 20);
  EXPECT_DOUBLE_EQ(s.latency_ms[3], 200);
  ASSERT_EQ(s.send_lag_ms.size(), 10u);
  EXPECT_DOUBLE_EQ(s.send_lag_ms[9], 1);
}

TEST(LoadSummary, MissingAnswersBeyondTheTailFailTheSession) {
  ppx::load::SessionTrace t = trace_of(10);
  t.answered[9] = t.answered[8] = Clock::time_point{};
  auto s = ppx::load::summarize(t, 160, 2);
  EXPECT_TRUE(s.failure.empty()) << s.failure;
  EXPECT_EQ(s.frames_missed, 2);
  t.answered[4] = Clock::time_point{};
  s = ppx::load::summarize(t, 160, 2);
  EXPECT_EQ(s.failure, "3 of 10 frames unanswered");
}

TEST(LoadSummary, RecordedFailuresAndMissingHandshakesFail) {
  ppx::load::SessionTrace t = trace_of(4);
  t.failure = "server error: server busy";
  EXPECT_EQ(ppx::load::summarize(t, 160, 2).failure, "server error: server busy");
  ppx::load::SessionTrace u;
  u.connected = true;
  EXPECT_EQ(ppx::load::summarize(u, 160, 2).failure, "no handshake");
  EXPECT_EQ(ppx::load::summarize(u, 160, 2).handshake_ms, -1);
}

// A child process whose stdout and stderr go to a log file.
class Process {
 public:
  explicit Process(std::vector<std::string> args, const std::string& log) : log_(log) {
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
  ~Process() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  std::string log() const {
    std::ifstream f(log_);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
  // Exit status, or -1 when still running after `limit`.
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

 private:
  std::string log_;
  pid_t pid_ = -1;
  bool exited_ = false;
};

std::string bin(const char* env, const char* built) {
  const char* b = std::getenv(env);  // where the binaries run from another tree
  return b ? b : built;
}

TEST(LoadTool, FourRealTimeSessionsAgainstTheServerWithoutAMissedFrame) {
  // The tiny demo config with a 1200-piece text vocabulary: only the synthetic tokenizer fits it.
  std::ifstream cf(ppx::test::config_dir("tiny-demo.json"));
  nlohmann::json cfg = nlohmann::json::parse(cf);
  cfg["lm"]["text_card"] = 1200;
  const std::string config = ppx::test::scratch("load_tiny_1200.json");
  std::ofstream(config) << cfg.dump(1);

  Process server({bin("PPX_SERVER_BIN", PPX_SERVER_BIN), "--host", "127.0.0.1", "--port", "0",
                  "--config", config, "--random-weights", "--max-sessions", "4"},
                 ppx::test::scratch("load_server.log"));
  uint16_t port = 0;
  const std::regex re("listening on http://127\\.0\\.0\\.1:([0-9]+)");
  for (const auto end = Clock::now() + 60s; Clock::now() < end && port == 0;) {
    std::smatch m;
    const std::string text = server.log();
    if (std::regex_search(text, m, re)) port = static_cast<uint16_t>(std::stoi(m[1]));
    ASSERT_EQ(server.wait_exit(50ms), -1) << "the server exited:\n" << text;
  }
  ASSERT_NE(port, 0) << server.log();
  EXPECT_NE(server.log().find("text tokenizer: synthetic (1200 generated pieces"),
            std::string::npos)
      << server.log();

  const std::string json_path = ppx::test::scratch("load.json");
  Process load({bin("PPX_LOAD_BIN", PPX_LOAD_BIN), "--port", std::to_string(port), "--sessions",
                "4", "--duration", "4", "--ramp-ms", "50", "--text-prompt",
                "You are a load tester.", "--voice", "", "--json", json_path},
               ppx::test::scratch("load.log"));
  const int rc = load.wait_exit(60s);
  const std::string out = load.log();
  ASSERT_EQ(rc, 0) << out << "\nserver:\n" << server.log();
  EXPECT_NE(out.find("0 of 4 failed"), std::string::npos) << out;

  std::ifstream jf(json_path);
  const nlohmann::json j = nlohmann::json::parse(jf);  // throws when malformed
  EXPECT_EQ(j["tool"], "personaplex-load");
  EXPECT_FALSE(j["machine"]["commit"].get<std::string>().empty());
  EXPECT_NE(j["command"].get<std::string>().find("--sessions 4"), std::string::npos);
  EXPECT_EQ(j["parameters"]["frames_per_session"], 50);
  EXPECT_EQ(j["server"]["status"], "ok");
  const nlohmann::json& r = j["results"];
  EXPECT_EQ(r["sessions"], 4);
  EXPECT_EQ(r["failed_sessions"], 0);
  EXPECT_EQ(r["frames_sent"], 200);
  EXPECT_EQ(r["frames_received"], 200);
  EXPECT_EQ(r["frames_missed"], 0);
  EXPECT_EQ(r["frames_over_budget"], 0) << r.dump(1);
  EXPECT_EQ(r["added_latency_ms"]["n"], 200);
  EXPECT_GT(r["added_latency_ms"]["p50"].get<double>(), 0);
  EXPECT_LE(r["added_latency_ms"]["max"].get<double>(), 160);
  EXPECT_EQ(r["handshake_ms"]["n"], 4);
  ASSERT_EQ(j["sessions"].size(), 4u);
  for (const auto& s : j["sessions"]) {
    EXPECT_TRUE(s["ok"].get<bool>()) << s.dump();
    EXPECT_EQ(s["frames_received"], 50);
  }
}

TEST(LoadTool, FailedSessionsGiveExitStatusOne) {
  // Nothing listens on port 1: every session fails to connect.
  const std::string json_path = ppx::test::scratch("load_refused.json");
  Process load({bin("PPX_LOAD_BIN", PPX_LOAD_BIN), "--port", "1", "--sessions", "2", "--duration",
                "1", "--json", json_path},
               ppx::test::scratch("load_refused.log"));
  EXPECT_EQ(load.wait_exit(20s), 1) << load.log();
  std::ifstream jf(json_path);
  const nlohmann::json j = nlohmann::json::parse(jf);
  EXPECT_EQ(j["results"]["failed_sessions"], 2);
  EXPECT_NE(j["sessions"][0]["failure"].get<std::string>().find("connect"), std::string::npos);
}

}  // namespace
