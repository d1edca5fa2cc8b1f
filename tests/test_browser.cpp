// The built-in web client in a real browser: headless Chromium, its microphone faked from a WAV
// file, holds a conversation of at least 5 seconds with an in-process server running the tiny demo
// model. The page must show text and play non-silent audio; a screenshot is saved next to the
// test binary. The test drives Chromium over the DevTools protocol (a WebSocket, JSON messages).
// Without a Chromium binary (PPX_CHROMIUM, or chromium / chromium-browser / google-chrome on
// PATH) it is skipped with a message; scripts/setup.sh installs Debian's chromium.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/websocket.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "apps/model_loading.h"
#include "ppx/audio.h"
#include "apps/server_model.h"
#include "server/server.h"
#include "test_util.h"

extern char** environ;

namespace {

namespace beast = boost::beast;
namespace websocket = beast::websocket;
namespace net = boost::asio;
namespace fs = std::filesystem;
using tcp = net::ip::tcp;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

std::string find_chromium() {
  if (const char* p = std::getenv("PPX_CHROMIUM"); p && *p) return p;
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');)
    for (const char* name : {"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"}) {
      const fs::path p = fs::path(dir) / name;
      if (::access(p.c_str(), X_OK) == 0) return p.string();
    }
  return "";
}

std::vector<uint8_t> base64_decode(const std::string& s) {
  std::vector<uint8_t> out;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : s) {
    int v;
    if (c >= 'A' && c <= 'Z') v = c - 'A';
    else if (c >= 'a' && c <= 'z') v = c - 'a' + 26;
    else if (c >= '0' && c <= '9') v = c - '0' + 52;
    else if (c == '+') v = 62;
    else if (c == '/') v = 63;
    else continue;  // padding, line breaks
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<uint8_t>(acc >> bits));
    }
  }
  return out;
}

// A running Chromium; killed (with its process group) on destruction.
class Browser {
 public:
  bool launch(const std::string& exe, const std::string& profile, const std::string& wav,
              const std::string& log) {
    std::vector<std::string> args = {
        exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream",
        "--use-file-for-fake-audio-capture=" + wav, "--autoplay-policy=no-user-gesture-required",
        "--remote-debugging-port=0", "--user-data-dir=" + profile, "--window-size=1000,900",
        "about:blank"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&attr, 0);
    const int rc = posix_spawn(&pid_, exe.c_str(), &fa, &attr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    if (rc != 0) pid_ = -1;
    return rc == 0;
  }
  ~Browser() {
    if (pid_ > 0) {
      ::kill(-pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }

 private:
  pid_t pid_ = -1;
};

// A minimal DevTools protocol client: one WebSocket to the browser, commands answered by id,
// events ignored; page commands carry the session id of an attached target.
class Cdp {
 public:
  void connect(uint16_t port, const std::string& path) {
    stream().connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port));
    ws_.read_message_max(64 << 20);
    ws_.handshake("127.0.0.1:" + std::to_string(port), path);
  }

  json call(const std::string& method, json params = json::object(), const std::string& session = "") {
    json cmd = {{"id", ++id_}, {"method", method}, {"params", std::move(params)}};
    if (!session.empty()) cmd["sessionId"] = session;
    stream().expires_after(30s);
    ws_.write(net::buffer(cmd.dump()));
    while (true) {
      beast::flat_buffer b;
      stream().expires_after(30s);
      ws_.read(b);
      json m = json::parse(beast::buffers_to_string(b.data()));
      if (m.value("id", -1) != id_) continue;
      if (m.contains("error")) throw std::runtime_error(method + ": " + m["error"].dump());
      return m["result"];
    }
  }

  json eval(const std::string& session, const std::string& expr) {
    const json r = call("Runtime.evaluate", {{"expression", expr}, {"returnByValue", true}}, session);
    return r["result"].value("value", json());
  }

 private:
  beast::tcp_stream& stream() { return ws_.next_layer(); }
  net::io_context ioc_;
  websocket::stream<beast::tcp_stream> ws_{ioc_};
  int id_ = 0;
};

TEST(BrowserTest, WebClientHoldsAConversation) {
  const std::string exe = find_chromium();
  if (exe.empty()) GTEST_SKIP() << "no Chromium found (install Debian's chromium or set PPX_CHROMIUM)";
  const std::string dir = ppx::test::scratch("browser");
  fs::create_directories(dir + "/voices");
  // The fake microphone plays user speech on a loop; the voice prompt is the same speech.
  const ppx::Audio a = ppx::read_audio(ppx::test::data("speech_16k.wav"));
  std::vector<float> voice = ppx::resample(ppx::take_channel(a, 0), a.sample_rate, 24000);
  voice.resize(24000);
  ppx::write_wav_pcm16(dir + "/voices/voice.wav", 24000, voice);

  const ppx::app::LoadedModel model = ppx::app::load_model(ppx::app::ModelFlags{});
  ppx::server::ServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.voice_dir = dir + "/voices";
  o.idle_timeout_s = 10;
  const ppx::server::ServerModel m = ppx::app::server_model(model);
  ppx::server::Server server(o, m);
  server.start();

  Browser browser;
  const std::string profile = dir + "/profile";
  ASSERT_TRUE(browser.launch(exe, profile, fs::absolute(ppx::test::data("speech_16k.wav")).string(),
                             dir + "/chromium.log"));
  // Chromium writes its DevTools port and browser path here once it listens.
  std::string port_line, path_line;
  for (const auto end = Clock::now() + 60s; Clock::now() < end; std::this_thread::sleep_for(100ms)) {
    std::ifstream f(profile + "/DevToolsActivePort");
    if (std::getline(f, port_line) && std::getline(f, path_line) && !path_line.empty()) break;
    port_line.clear();
  }
  ASSERT_FALSE(port_line.empty()) << "Chromium did not start; see " << dir << "/chromium.log";

  Cdp cdp;
  cdp.connect(static_cast<uint16_t>(std::stoi(port_line)), path_line);
  const std::string url = "http://127.0.0.1:" + std::to_string(server.port()) +
                          "/?autostart=1&voice_prompt=voice.wav&text_prompt=You+are+a+tester.";
  const std::string target = cdp.call("Target.createTarget", {{"url", url}})["targetId"];
  const std::string session =
      cdp.call("Target.attachToTarget", {{"targetId", target}, {"flatten", true}})["sessionId"];

  // Live, then at least 5 s of microphone audio sent and 5 s of agent audio received.
  json stats;
  const auto end = Clock::now() + 120s;
  for (; Clock::now() < end; std::this_thread::sleep_for(250ms)) {
    const json v = cdp.eval(session, "JSON.stringify(window.ppxStats ?? null)");
    if (!v.is_string()) continue;
    stats = json::parse(v.get<std::string>());
    if (stats.is_null()) continue;
    if (stats["state"] == "error" || stats["state"] == "closed") break;
    if (stats["state"] == "live" && stats["micSeconds"].get<double>() >= 5.0 &&
        stats["agentSeconds"].get<double>() >= 5.0)
      break;
  }
  const json transcript = cdp.eval(session, "document.getElementById('transcript').textContent");
  const json shot = cdp.call("Page.captureScreenshot", {{"format", "png"}}, session);
  const std::string png = "browser_web_client.png";  // in the test's working directory
  {
    const std::vector<uint8_t> bytes = base64_decode(shot.value("data", ""));
    std::ofstream(png, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                               static_cast<std::streamsize>(bytes.size()));
    std::printf("screenshot: %s (%zu bytes)\npage stats: %s\n", fs::absolute(png).c_str(),
                bytes.size(), stats.dump().c_str());
    EXPECT_GT(bytes.size(), 1000u);
  }
  try {
    cdp.call("Browser.close");
  } catch (const std::exception&) {  // the browser may drop the socket as it exits
  }

  ASSERT_TRUE(stats.is_object()) << "the page never reported its state";
  EXPECT_EQ(stats["state"], "live") << stats.dump();
  EXPECT_TRUE(stats["error"].is_null()) << stats.dump();
  EXPECT_GE(stats["micSeconds"].get<double>(), 5.0);
  EXPECT_GE(stats["agentSeconds"].get<double>(), 5.0);
  EXPECT_GT(stats["textPieces"].get<int>(), 0);
  ASSERT_TRUE(transcript.is_string());
  EXPECT_FALSE(transcript.get<std::string>().empty());
  // Non-silent: peaks above -60 dBFS (the tiny random-weight model speaks quietly, ~-44 dBFS).
  EXPECT_GT(stats["decodedPeak"].get<double>(), 1e-3) << "the agent audio decoded to silence";
  EXPECT_GT(stats["playedPeak"].get<double>(), 1e-3) << "nothing reached the audio output";
  server.stop();
  std::error_code ec;
  fs::remove_all(dir, ec);
}

}  // namespace
