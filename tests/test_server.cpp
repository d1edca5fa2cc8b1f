// The WebSocket server end to end on 127.0.0.1 with the embedded tiny demo model: a real
// conversation over /api/chat (Ogg Opus both ways), the HTTP routes, and hostile clients. Each test
// starts its own in-process server on a free port (tests/server_test_util.h).
#include <atomic>
#include <memory>

#include "server/chat_protocol.h"
#include "server/http_util.h"
#include "server_test_util.h"

namespace {

using namespace ppx::server_test;

TEST_F(ServerTest, HealthAndVoices) {
  int status = 0;
  const auto h = nlohmann::json::parse(http_get(port_, "/health", &status));
  EXPECT_EQ(status, 200);
  EXPECT_EQ(h["status"], "ok");
  const char* dev = std::getenv("PPX_TEST_DEVICE");
  EXPECT_EQ(h["device"].get<std::string>().rfind(dev ? dev : "cpu", 0), 0u) << h["device"];
  // The N of --device cuda:N; none on the CPU.
  if (dev && std::string(dev) == "cuda")
    EXPECT_EQ(h["device_index"], 0) << h;
  else
    EXPECT_TRUE(h["device_index"].is_null()) << h;
  EXPECT_EQ(h["sessions_in_use"], 0);
  EXPECT_EQ(h["max_sessions"], 1);
  // The capacity: the options' count, and the device's limits where they are modelled (CUDA).
  ASSERT_TRUE(h["capacity"].is_object()) << h;
  EXPECT_EQ(h["capacity"]["max_sessions"], 1);
  EXPECT_EQ(h["capacity"]["source"], "default");
  if (dev && std::string(dev) == "cuda") {
    EXPECT_TRUE(h["capacity"]["memory_sessions"].is_number_integer()) << h;
    EXPECT_GT(h["capacity"]["bandwidth_gb_s"].get<double>(), 0) << h;
  } else {
    EXPECT_TRUE(h["capacity"]["memory_sessions"].is_null()) << h;
  }
  // The symlink pointing outside the directory is not listed.
  EXPECT_EQ(nlohmann::json::parse(http_get(port_, "/api/voices")),
            nlohmann::json::array({"voice.wav"}));
  http_get(port_, "/../../etc/passwd", &status);
  EXPECT_EQ(status, 404);
}

// Query numbers are whole decimal numbers: no hex, white space, "+" or trailing text.
TEST_F(ServerTest, ChatParamsTakeOnlyDecimalNumbers) {
  const ppx::server::ServerModel m = ppx::app::server_model(*model_);
  ppx::server::ServerOptions o;
  o.voice_dir = *voice_dir_;
  for (const char* good : {"text_temperature=0.7", "text_temperature=1e-1", "text_temperature=3", "text_topk=25",
                           "audio_seed=-1", "text_seed=12"}) {
    ppx::server::SessionParams p;
    EXPECT_EQ(ppx::server::parse_chat_params(good, o, m, p), "") << good;
  }
  for (const char* bad : {"text_temperature=0x10", "text_temperature=%200.7", "text_temperature=0.7x",
                          "text_temperature=nan", "text_temperature=inf", "text_temperature=1e309", "text_topk=0x10",
                          "text_topk=%2025", "text_topk=2.5", "audio_seed=-2", "audio_seed=1e3"}) {
    ppx::server::SessionParams p;
    EXPECT_NE(ppx::server::parse_chat_params(bad, o, m, p), "") << bad;
  }
}

TEST(HttpUtil, WebSocketKeyIsSixteenBytesOfBase64) {
  EXPECT_TRUE(ppx::server::valid_websocket_key("dGhlIHNhbXBsZSBub25jZQ=="));  // RFC 6455's example
  EXPECT_TRUE(ppx::server::valid_websocket_key("AAAAAAAAAAAAAAAAAAAAAA=="));
  EXPECT_TRUE(ppx::server::valid_websocket_key("/+/+/+/+/+/+/+/+/+/+/w=="));
  for (const char* bad : {"", "short", "dGhlIHNhbXBsZSBub25jZR==", "dGhlIHNhbXBsZSBub25jZQ=", "dGhlIHNhbXBsZSBub25jZQ===",
                          "dGhlIHNhbXBsZSBub25jZ Q==", "dGhlIHNhbXBsZSBub25jZQ=x", "dGhlIHNhbXBsZSBub25jZQAA"})
    EXPECT_FALSE(ppx::server::valid_websocket_key(bad)) << bad;
}

TEST(HttpUtil, WebSocketProtocolsAreTrimmedTokens) {
  using V = std::vector<std::string>;
  EXPECT_EQ(ppx::server::websocket_protocols(""), V{});
  EXPECT_EQ(ppx::server::websocket_protocols("realtime"), V{"realtime"});
  EXPECT_EQ(ppx::server::websocket_protocols(" realtime ,\topenai-insecure-api-key.k, ,openai-beta.realtime-v1,"),
            (V{"realtime", "openai-insecure-api-key.k", "openai-beta.realtime-v1"}));
}

TEST_F(ServerTest, StaticFilesStayInsideTheirDirectory) {
  const std::string root = *voice_dir_ + "/www";
  fs::create_directories(root + "/assets");
  ppx::test::write_bytes(root + "/index.html", {'<', 'p', '>'});
  ppx::test::write_bytes(root + "/assets/app.js", {'1', ';'});
  std::error_code ec;
  fs::create_symlink("/etc/passwd", root + "/leak.txt", ec);
  // Larger than any one buffer of the file body: streamed, arrives whole.
  std::vector<char> big(3 << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 2654435761u >> 24);
  ppx::test::write_bytes(root + "/big.bin", big);
  start(1, 3.0, 2.0, root);
  int status = 0;
  EXPECT_EQ(http_get(port_, "/", &status), "<p>");
  EXPECT_EQ(status, 200);
  EXPECT_EQ(http_get(port_, "/big.bin", &status), std::string(big.begin(), big.end()));
  EXPECT_EQ(status, 200);
  EXPECT_EQ(http_get(port_, "/assets/app.js", &status), "1;");
  EXPECT_EQ(status, 200);
  for (const char* bad : {"/../voice.wav", "/assets/../../voice.wav", "/%2E%2E/voice.wav",
                          "/leak.txt", "/nope.js", "/assets/"}) {
    http_get(port_, bad, &status);
    EXPECT_EQ(status, 404) << bad;
  }
  fs::remove_all(root, ec);
}

TEST_F(ServerTest, ConversationOverWebSocket) {
  const std::vector<float> speech = user_speech();
  const int frames = static_cast<int>(speech.size() / kFrame);
  ASSERT_GT(frames, 50);
  Client c;
  ASSERT_TRUE(c.connect(port_, chat()));
  // 4x real time: one 80 ms frame every 20 ms. Done when every frame's answer is back.
  const Exchange ex = c.run(
      audio_messages(speech), 20ms, [&](const Exchange& e) { return e.audio_msgs >= frames + 2; },
      60s);
  EXPECT_TRUE(ex.handshake);
  EXPECT_TRUE(ex.errors.empty()) << ex.errors.front();
  EXPECT_GE(ex.text_msgs, 1);
  EXPECT_EQ(ex.audio_msgs, frames + 2);  // OpusHead + OpusTags + one page per frame
  ppx::OggOpusReader reader(24000);
  reader.push(ex.audio_bytes.data(), ex.audio_bytes.size());
  EXPECT_FALSE(reader.failed()) << reader.error();
  EXPECT_EQ(reader.errors(), 0u);
  ASSERT_TRUE(reader.head().has_value());
  EXPECT_NEAR(static_cast<double>(reader.available()), static_cast<double>(speech.size()), kFrame);
  std::vector<float> out;
  reader.read(out);
  double energy = 0;
  for (float v : out) energy += static_cast<double>(v) * v;
  EXPECT_GT(energy, 0.0);
  c.drop();
  expect_healthy();
  // /metrics (Prometheus text) counts the frames, the session and its end.
  int status = 0;
  const std::string metrics = http_get(port_, "/metrics", &status);
  EXPECT_EQ(status, 200);
  const auto value = [&](const std::string& name) { return metric(metrics, name); };
  EXPECT_GE(value("personaplex_frames_total"), frames);
  EXPECT_GE(value("personaplex_sessions_started_total"), 1.0);  // expect_healthy() opens one too
  EXPECT_EQ(value("personaplex_sessions_in_use"), 0.0);
  EXPECT_EQ(value("personaplex_frame_seconds_count"), value("personaplex_frames_total"));
  EXPECT_NE(metrics.find("personaplex_sessions_ended_total{reason="), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("personaplex_frame_seconds_bucket{le=\"+Inf\"}"), std::string::npos);
}

TEST_F(ServerTest, RandomBytesAsAudioGetAnErrorAndClose) {
  std::mt19937 rng(5);
  std::vector<std::vector<uint8_t>> junk;
  for (int i = 0; i < 300; ++i) {
    std::vector<uint8_t> p(4096);
    for (auto& b : p) b = static_cast<uint8_t>(rng());
    junk.push_back(msg(0x01, p));
  }
  Client c;
  ASSERT_TRUE(c.connect(port_, chat()));
  const Exchange ex = c.run(junk, 0ms, nullptr, 30s);
  EXPECT_TRUE(ex.handshake);
  EXPECT_TRUE(ex.closed);
  ASSERT_EQ(ex.errors.size(), 1u) << ex.close_reason << " sent " << ex.sent;
  EXPECT_NE(ex.errors[0].find("bad audio stream"), std::string::npos) << ex.errors[0];
  expect_healthy();
}

TEST_F(ServerTest, UnknownMessageKindsAreIgnored) {
  std::vector<float> speech = user_speech();
  speech.resize(5 * kFrame);
  auto audio = audio_messages(speech);
  std::vector<std::vector<uint8_t>> to_send{
      msg(0x02, {'h', 'i'}), msg(0x03, {0}), msg(0x07), msg(0xFF, {1, 2}), {}};
  to_send.insert(to_send.end(), audio.begin(), audio.end());
  Client c;
  ASSERT_TRUE(c.connect(port_, chat()));
  const Exchange ex = c.run(
      to_send, 1ms, [](const Exchange& e) { return e.audio_msgs >= 7; }, 30s);
  EXPECT_TRUE(ex.errors.empty());
  EXPECT_FALSE(ex.closed) << ex.close_reason;
  EXPECT_EQ(ex.audio_msgs, 7);
  c.drop();
  expect_healthy();
}

TEST_F(ServerTest, BadVoicePromptsAreRefused) {
  for (const std::string v : {"..%2F..%2Fetc%2Fpasswd", "%2Fetc%2Fpasswd", "../../etc/passwd",
                              "nope.pt", "escape.wav", "voice.wav%00.pt"}) {
    Client c;
    ASSERT_TRUE(c.connect(port_, "/api/chat?voice_prompt=" + v));
    const Exchange ex = c.run({}, 0ms, nullptr, 10s);
    EXPECT_FALSE(ex.handshake) << v;
    EXPECT_TRUE(ex.closed) << v;
    ASSERT_EQ(ex.errors.size(), 1u) << v;
    EXPECT_NE(ex.errors[0].find("voice_prompt"), std::string::npos) << ex.errors[0];
  }
  expect_healthy();
}

// A listed voice file that is not audio fails its session with an error that names the file but
// not the server's voice directory.
TEST_F(ServerTest, BrokenVoiceFileErrorHidesTheDirectory) {
  const std::string broken = *voice_dir_ + "/broken.wav";
  ppx::test::write_bytes(broken, std::vector<char>(4096, 'x'));
  Client c;
  ASSERT_TRUE(c.connect(port_, "/api/chat?voice_prompt=broken.wav"));
  const Exchange ex = c.run({}, 0ms, nullptr, 10s);
  std::error_code ec;
  fs::remove(broken, ec);
  EXPECT_FALSE(ex.handshake);
  ASSERT_EQ(ex.errors.size(), 1u);
  EXPECT_NE(ex.errors[0].find("'broken.wav'"), std::string::npos) << ex.errors[0];
  EXPECT_EQ(ex.errors[0].find(*voice_dir_), std::string::npos) << ex.errors[0];
  expect_healthy();
}

TEST_F(ServerTest, BadTextPromptsAreRefused) {
  for (const std::string& t : {std::string("%FF%FE"), std::string(5000, 'a'),
                               std::string(50 * 1024, 'b')}) {
    Client c;
    ASSERT_TRUE(c.connect(port_, "/api/chat?voice_prompt=voice.wav&text_prompt=" + t));
    const Exchange ex = c.run({}, 0ms, nullptr, 10s);
    EXPECT_FALSE(ex.handshake);
    EXPECT_TRUE(ex.closed);
    ASSERT_EQ(ex.errors.size(), 1u);
    EXPECT_NE(ex.errors[0].find("text_prompt"), std::string::npos) << ex.errors[0];
  }
  // Past the request head's limit (60 KiB) the upgrade itself is refused.
  EXPECT_EQ(upgrade_status(port_, "/api/chat?voice_prompt=voice.wav&text_prompt=" + std::string(100 * 1024, 'b')), 431);
  expect_healthy();
}

TEST_F(ServerTest, OversizedMessageClosesTheConnection) {
  Client c;
  ASSERT_TRUE(c.connect(port_, chat()));
  const Exchange ex = c.run({msg(0x01, std::vector<uint8_t>(100 << 20, 0x55))}, 0ms, nullptr, 20s);
  // (An ASan run once saw no handshake here, cause unknown: say what the client saw.)
  EXPECT_TRUE(ex.handshake) << "closed " << ex.closed << " reason '" << ex.close_reason << "' errors "
                            << ex.errors.size() << " sent " << ex.sent;
  EXPECT_TRUE(ex.closed) << "reason '" << ex.close_reason << "'";
  expect_healthy();
}

TEST_F(ServerTest, RapidConnectDisconnect) {
  int connected = 0;
  for (int i = 0; i < 50; ++i) {
    Client c;
    // While the previous client's session still holds the only slot, the upgrade is refused
    // (HTTP 503, a declined handshake); otherwise the client leaves during the system prompts.
    if (!c.connect(port_, chat())) continue;
    ++connected;
    if (i % 2) c.reset(); else c.drop();
  }
  EXPECT_GE(connected, 1);
  const std::string m = http_get(port_, "/metrics");
  // Each refused upgrade counts as busy.
  EXPECT_GE(metric(m, "personaplex_rejected_total{reason=\"busy\"}"), 50.0 - connected) << m;
  expect_healthy();
}

// Two upgrades at the same moment for the last slot: one gets 101, the other HTTP 503 (the slot
// is reserved at the busy check), never both 101 with a busy error after the upgrade.
TEST_F(ServerTest, SimultaneousUpgradesForTheLastSlot) {
  for (int round = 0; round < 20; ++round) {
    std::atomic<int> ready{0};
    bool upgraded[2] = {false, false};
    Client c[2];  // both stay connected until both have their answer
    std::vector<std::thread> t;
    for (int i = 0; i < 2; ++i)
      t.emplace_back([&, i] {
        ++ready;
        while (ready.load() < 2) {
        }
        upgraded[i] = c[i].connect(port_, chat());  // false: the handshake was declined (503)
      });
    for (auto& th : t) th.join();
    EXPECT_NE(upgraded[0], upgraded[1]) << round;
    c[0].drop();
    c[1].drop();
    ASSERT_TRUE(wait_slots_free(port_));
    std::this_thread::sleep_for(20ms);
  }
  expect_healthy();
}

// A page cut short in the middle of the stream costs its audio, not the session: the reader
// resynchronizes on the next page and the frames after it are answered.
TEST_F(ServerTest, TruncatedPageMidStream) {
  std::vector<float> speech = user_speech();
  speech.resize(16 * kFrame);
  auto audio = audio_messages(speech);  // head, tags, 16 frames
  audio[2 + 5].resize(audio[2 + 5].size() / 2);
  Client c;
  ASSERT_TRUE(c.connect(port_, chat()));
  const Exchange ex = c.run(
      audio, 1ms, [](const Exchange& e) { return e.audio_msgs >= 2 + 14; }, 30s);
  EXPECT_TRUE(ex.errors.empty()) << ex.errors.front();
  EXPECT_FALSE(ex.closed) << ex.close_reason;
  EXPECT_GE(ex.audio_msgs, 2 + 14);
  c.reset();
  expect_healthy();
}

// A bare /api/chat (as Kyutai's command-line client connects) gets upstream's defaults; the
// default voice is not in this voice directory, so the session runs without a voice prompt.
TEST_F(ServerTest, MissingParametersGetDefaults) {
  std::vector<float> speech = user_speech();
  speech.resize(3 * kFrame);
  Client c;
  ASSERT_TRUE(c.connect(port_, "/api/chat"));
  const Exchange ex = c.run(
      audio_messages(speech), 1ms, [](const Exchange& e) { return e.audio_msgs >= 5; }, 60s);
  EXPECT_TRUE(ex.handshake);
  EXPECT_TRUE(ex.errors.empty());
  EXPECT_EQ(ex.audio_msgs, 5);
  c.drop();
  expect_healthy();
}

// A long text prompt keeps the system prompts running for seconds; pings flow meanwhile, and a
// client that leaves during them frees its slot long before they would have finished.
TEST_F(ServerTest, ClientVanishesDuringSystemPrompts) {
  start(1, 3.0, 0.05);
  std::string words;
  while (words.size() + 12 < 4000) words += "listen+carefully+";
  Client c;
  ASSERT_TRUE(c.connect(port_, "/api/chat?voice_prompt=voice.wav&text_prompt=" + words));
  const auto t0 = std::chrono::steady_clock::now();
  const Exchange ex = c.run(
      {}, 0ms, [](const Exchange& e) { return e.pings >= 2 || e.handshake; }, 30s);
  EXPECT_GE(ex.pings, 2);
  ASSERT_FALSE(ex.handshake) << "the prompts finished too soon for this test";
  c.reset();  // a TCP reset in the middle of the system prompts
  EXPECT_TRUE(wait_slots_free(port_, 5s));
  // The uninterrupted prompts take at least as long as the full run below; the dropped one ended
  // sooner.
  const auto dropped = std::chrono::steady_clock::now() - t0;
  Client full;
  ASSERT_TRUE(full.connect(port_, "/api/chat?voice_prompt=voice.wav&text_prompt=" + words));
  const auto t1 = std::chrono::steady_clock::now();
  const Exchange ex2 = full.run(
      {}, 0ms, [](const Exchange& e) { return e.handshake; }, 60s);
  EXPECT_TRUE(ex2.handshake);
  const auto complete = std::chrono::steady_clock::now() - t1;
  EXPECT_LT(dropped, complete);
  full.drop();
  expect_healthy();
}

TEST_F(ServerTest, EmptyTextPromptAndNoVoice) {
  std::vector<float> speech = user_speech();
  speech.resize(3 * kFrame);
  Client c;
  ASSERT_TRUE(c.connect(port_, "/api/chat?voice_prompt=&text_prompt="));
  const Exchange ex = c.run(
      audio_messages(speech), 1ms, [](const Exchange& e) { return e.audio_msgs >= 5; }, 30s);
  EXPECT_TRUE(ex.handshake);
  EXPECT_TRUE(ex.errors.empty());
  EXPECT_EQ(ex.audio_msgs, 5);
  c.drop();
  expect_healthy();
}

TEST_F(ServerTest, ClientVanishesMidStream) {
  Client c;
  ASSERT_TRUE(c.connect(port_, chat()));
  const Exchange ex = c.run(
      audio_messages(user_speech()), 20ms, [](const Exchange& e) { return e.audio_msgs >= 6; },
      30s);
  EXPECT_GE(ex.audio_msgs, 6);
  c.reset();
  expect_healthy();
}

// With every slot in use the upgrade is refused before it happens (503 + Retry-After: 1 and a
// JSON reason), so that a load balancer can try another server; once the session leaves a new one
// gets in.
TEST_F(ServerTest, UpgradeIsRefusedWith503WhenEverySlotIsInUse) {
  Client a;
  ASSERT_TRUE(a.connect(port_, chat()));
  ASSERT_TRUE(a.run(
                   {}, 0ms, [](const Exchange& e) { return e.handshake; }, 20s)
                  .handshake);
  for (const std::string& target : {chat(), std::string("/v1/realtime")}) {
    const auto res = upgrade_response(port_, target);
    EXPECT_EQ(res.result_int(), 503u) << target;
    EXPECT_EQ(res[http::field::retry_after], "1") << target;
    EXPECT_EQ(res[http::field::content_type], "application/json") << target;
    const auto j = nlohmann::json::parse(res.body());
    EXPECT_EQ(j["error"]["code"], "busy") << res.body();
    EXPECT_NE(j["error"]["message"].get<std::string>().find("all 1 sessions in use"),
              std::string::npos)
        << res.body();
  }
  Client b;  // a WebSocket client sees a declined handshake, no session
  EXPECT_FALSE(b.connect(port_, chat()));
  EXPECT_EQ(nlohmann::json::parse(http_get(port_, "/health"))["sessions_in_use"], 1);
  EXPECT_EQ(metric(http_get(port_, "/metrics"), "personaplex_rejected_total{reason=\"busy\"}"),
            3.0);
  a.drop();
  expect_healthy();  // the slot comes back and a new session gets in
}

TEST_F(ServerTest, HealthLiveAndReady) {
  int status = 0;
  EXPECT_EQ(nlohmann::json::parse(http_get(port_, "/health/live", &status)),
            nlohmann::json({{"status", "live"}}));
  EXPECT_EQ(status, 200);
  auto ready = nlohmann::json::parse(http_get(port_, "/health/ready", &status));
  EXPECT_EQ(status, 200);
  EXPECT_EQ(ready["status"], "ok");
  EXPECT_EQ(ready["ready"], true);
  EXPECT_EQ(ready["max_sessions"], 1);
  // The same JSON as /health.
  auto health = nlohmann::json::parse(http_get(port_, "/health", &status));
  ready.erase("connections");  // the /health request itself is one
  health.erase("connections");
  EXPECT_EQ(ready, health);

  Client a;  // takes the only slot
  ASSERT_TRUE(a.connect(port_, chat()));
  ASSERT_TRUE(a.run(
                   {}, 0ms, [](const Exchange& e) { return e.handshake; }, 20s)
                  .handshake);
  ready = nlohmann::json::parse(http_get(port_, "/health/ready", &status));
  EXPECT_EQ(status, 503);
  EXPECT_EQ(ready["status"], "ok");
  EXPECT_EQ(ready["ready"], false);
  EXPECT_EQ(ready["sessions_in_use"], 1);
  EXPECT_EQ(nlohmann::json::parse(http_get(port_, "/health", &status))["ready"], false);
  EXPECT_EQ(status, 200);  // /health stays 200 while full
  http_get(port_, "/health/live", &status);
  EXPECT_EQ(status, 200);

  a.drop();  // the slot frees: ready again
  const auto until = std::chrono::steady_clock::now() + 10s;
  do {
    http_get(port_, "/health/ready", &status);
    if (status == 200) break;
    std::this_thread::sleep_for(20ms);
  } while (std::chrono::steady_clock::now() < until);
  EXPECT_EQ(status, 200);
}

// Many clients at once on one slot: exactly one gets the session; every other one is refused,
// before the upgrade (503) or, when it passed that check just before the slot was taken, after it
// with the 0x05 busy error. No client is left hanging.
TEST_F(ServerTest, ConcurrentClientsOnOneSlotAreAllAnswered) {
  constexpr int kClients = 8;
  std::atomic<int> sessions{0}, refused_before{0}, refused_after{0}, other{0};
  std::vector<std::unique_ptr<Client>> clients(kClients);
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i) {
    clients[static_cast<size_t>(i)] = std::make_unique<Client>();
    threads.emplace_back([&, i] {
      Client& c = *clients[static_cast<size_t>(i)];
      if (!c.connect(port_, chat())) return void(++refused_before);
      const Exchange ex = c.run(
          {}, 0ms, [](const Exchange& e) { return e.handshake || !e.errors.empty(); }, 20s);
      if (ex.handshake)
        ++sessions;
      else if (ex.errors.size() == 1 && ex.errors[0].find("busy") != std::string::npos)
        ++refused_after;
      else
        ++other;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(sessions.load(), 1);
  EXPECT_EQ(other.load(), 0);
  EXPECT_EQ(refused_before.load() + refused_after.load(), kClients - 1);
  EXPECT_EQ(metric(http_get(port_, "/metrics"), "personaplex_rejected_total{reason=\"busy\"}"),
            kClients - 1.0);
  std::printf("%d refused before the upgrade, %d after it\n", refused_before.load(),
              refused_after.load());
  for (auto& c : clients) c->drop();
  expect_healthy();
}

TEST_F(ServerTest, SilentClientIsDroppedAfterIdleTimeout) {
  start(1, 1.0);
  Client c;
  ASSERT_TRUE(c.connect(port_, chat()));
  const auto t0 = std::chrono::steady_clock::now();
  const Exchange ex = c.run({}, 0ms, nullptr, 15s);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  EXPECT_TRUE(ex.handshake);
  EXPECT_TRUE(ex.closed);
  ASSERT_EQ(ex.errors.size(), 1u);
  EXPECT_NE(ex.errors[0].find("idle"), std::string::npos) << ex.errors[0];
  expect_healthy();
}

TEST_F(ServerTest, TwoSessionsAtOnce) {
  start(2, 3.0);
  std::vector<float> speech = user_speech();
  speech.resize(10 * kFrame);
  Exchange ea, eb;
  std::thread ta([&] {
    Client c;
    if (c.connect(port_, chat()))
      ea = c.run(
          audio_messages(speech), 20ms, [](const Exchange& e) { return e.audio_msgs >= 12; }, 30s);
    c.drop();
  });
  Client c;
  EXPECT_TRUE(c.connect(port_, chat("&audio_seed=9")));
  eb = c.run(
      audio_messages(speech), 20ms, [](const Exchange& e) { return e.audio_msgs >= 12; }, 30s);
  c.drop();
  ta.join();
  EXPECT_EQ(ea.audio_msgs, 12);
  EXPECT_EQ(eb.audio_msgs, 12);
  EXPECT_TRUE(ea.errors.empty());
  EXPECT_TRUE(eb.errors.empty());
  expect_healthy();
}

// With --ssl: HTTPS for the routes and the web client, WSS for /api/chat, checked against the
// test certificate (tests/data/tls, CN localhost); a plain-HTTP request gets nothing.
TEST_F(ServerTest, TlsServesHttpsAndWss) {
  namespace ssl = net::ssl;
  start(1, 3.0, 2.0, "", ppx::test::data("tls"));
  net::io_context ioc;
  ssl::context ctx(ssl::context::tls_client);
  ctx.load_verify_file(ppx::test::data("tls/cert.pem"));
  ctx.set_verify_mode(ssl::verify_peer);
  ctx.set_verify_callback(ssl::host_name_verification("localhost"));
  const tcp::endpoint ep(net::ip::make_address("127.0.0.1"), port_);
  auto https_get = [&](const std::string& target, int& status) {
    beast::ssl_stream<beast::tcp_stream> s(ioc, ctx);
    beast::get_lowest_layer(s).connect(ep);
    beast::get_lowest_layer(s).expires_after(10s);
    SSL_set_tlsext_host_name(s.native_handle(), "localhost");
    s.handshake(ssl::stream_base::client);
    http::request<http::empty_body> req{http::verb::get, target, 11};
    req.set(http::field::host, "localhost");
    http::write(s, req);
    beast::flat_buffer b;
    http::response<http::string_body> res;
    http::read(s, b, res);
    status = static_cast<int>(res.result_int());
    return res.body();
  };
  int status = 0;
  EXPECT_EQ(nlohmann::json::parse(https_get("/health", status))["status"], "ok");
  EXPECT_EQ(status, 200);
  EXPECT_NE(https_get("/", status).find("<title>PersonaPlex</title>"), std::string::npos);
  EXPECT_EQ(status, 200);

  websocket::stream<beast::ssl_stream<beast::tcp_stream>> ws(ioc, ctx);
  beast::get_lowest_layer(ws).connect(ep);
  beast::get_lowest_layer(ws).expires_after(30s);
  SSL_set_tlsext_host_name(ws.next_layer().native_handle(), "localhost");
  ws.next_layer().handshake(ssl::stream_base::client);
  ws.binary(true);
  ws.handshake("localhost", chat());
  std::vector<float> speech = user_speech();
  speech.resize(3 * kFrame);
  int audio = 0;
  bool handshake = false;
  for (beast::flat_buffer b; audio < 5; b.clear()) {
    ws.read(b);
    const auto* d = static_cast<const uint8_t*>(b.data().data());
    if (b.size() >= 1 && d[0] == 0x00) {
      handshake = true;
      for (const auto& m : audio_messages(speech)) ws.write(net::buffer(m));
    }
    if (b.size() >= 1 && d[0] == 0x01) ++audio;
    ASSERT_FALSE(b.size() >= 1 && d[0] == 0x05) << "server error";
  }
  EXPECT_TRUE(handshake);
  EXPECT_EQ(audio, 5);  // OpusHead, OpusTags and one page per frame
  ws.close(websocket::close_code::normal);
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (server_->sessions_in_use() != 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(20ms);
  EXPECT_EQ(server_->sessions_in_use(), 0);

  // Plain HTTP on the TLS port: the TLS handshake fails and the connection is closed unanswered.
  tcp::socket plain(ioc);
  plain.connect(ep);
  const std::string get = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  net::write(plain, net::buffer(get));
  beast::error_code ec;
  std::string reply;
  net::read(plain, net::dynamic_buffer(reply), ec);
  EXPECT_EQ(reply.find("HTTP/1.1 200"), std::string::npos);
}

}  // namespace

// With the prompt cache on, the second session with the same voice and text prompt loads them
// instead of replaying them, and answers the same audio with exactly the same audio (same seeds).
TEST_F(ServerTest, PromptCacheHitAnswersAsTheReplay) {
  start(1, 3.0, 2.0, "", "", [](ppx::server::ServerOptions& o) { o.prompt_cache_bytes = size_t{16} << 20; });
  const std::vector<float> speech = user_speech();
  const int frames = static_cast<int>(speech.size() / kFrame);
  std::vector<std::vector<float>> outs;
  for (int i = 0; i < 2; ++i) {
    Client c;
    ASSERT_TRUE(c.connect(port_, chat()));
    const Exchange ex = c.run(
        audio_messages(speech), 20ms, [&](const Exchange& e) { return e.audio_msgs >= frames + 2; }, 60s);
    ASSERT_TRUE(ex.handshake);
    EXPECT_TRUE(ex.errors.empty()) << ex.errors.front();
    ppx::OggOpusReader reader(24000);
    reader.push(ex.audio_bytes.data(), ex.audio_bytes.size());
    std::vector<float> out;
    reader.read(out);
    outs.push_back(out);
    c.drop();
    ASSERT_TRUE(wait_slots_free(port_));
  }
  ASSERT_FALSE(outs[0].empty());
  EXPECT_EQ(outs[0], outs[1]) << "the cached session answered differently";
  const std::string m = http_get(port_, "/metrics");
  EXPECT_EQ(metric(m, "personaplex_prompt_cache_lookups_total{result=\"hit\"}"), 1.0) << m;
  EXPECT_EQ(metric(m, "personaplex_prompt_cache_lookups_total{result=\"miss\"}"), 1.0);
  EXPECT_EQ(metric(m, "personaplex_prompt_cache_entries"), 1.0);
  EXPECT_GT(metric(m, "personaplex_prompt_cache_bytes"), 0.0);
  const auto h = nlohmann::json::parse(http_get(port_, "/health"));
  EXPECT_EQ(h["prompt_cache"]["entries"], 1);
  EXPECT_EQ(h["prompt_cache"]["capacity_bytes"], size_t{16} << 20);
  // The voice file was read and prepared once (engine/voice_cache.h).
  EXPECT_EQ(h["voice_cache"]["misses"], 1) << h.dump();
  EXPECT_EQ(h["voice_cache"]["hits"], 1);
  EXPECT_EQ(h["voice_cache"]["entries"], 1);
  EXPECT_GT(h["voice_cache"]["used_bytes"].get<size_t>(), 0u);
}

namespace {

int process_threads() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator("/proc/self/task")) ++n;
  return n;
}

}  // namespace

// A live conversation holds no thread of its own: its frames run on the session executor and the
// schedulers (session_core.h). With 4 conversations streaming, the process has only the threads it
// had with none, plus the 4 test clients'.
TEST_F(ServerTest, LiveSessionsHoldNoThreadOfTheirOwn) {
  start(4, 3.0);
  expect_healthy();  // any thread made lazily on a first session exists from here on
  const int before = process_threads();
  std::vector<float> speech = user_speech();
  speech.resize(30 * kFrame);
  std::atomic<int> streaming{0};
  std::atomic<bool> counted{false};
  std::vector<Exchange> ex(4);
  std::vector<std::thread> clients;
  for (int i = 0; i < 4; ++i) {
    clients.emplace_back([&, i] {
      Client c;
      if (c.connect(port_, chat("&audio_seed=" + std::to_string(10 + i)))) {
        bool marked = false;
        ex[static_cast<size_t>(i)] = c.run(
            audio_messages(speech), 80ms,
            [&](const Exchange& e) {
              if (e.audio_msgs >= 4 && !marked) {
                marked = true;
                ++streaming;
              }
              return counted.load() && e.audio_msgs >= 8;
            },
            60s);
      }
      c.drop();
    });
  }
  const auto end = std::chrono::steady_clock::now() + 60s;
  while (streaming.load() < 4 && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(10ms);
  ASSERT_EQ(streaming.load(), 4) << "the conversations did not all stream";
  // The prompt phase's threads have handed over and exited (a brief race at most: recount).
  int during = process_threads();
  for (int tries = 0; during > before + 4 && tries < 50; ++tries) {
    std::this_thread::sleep_for(20ms);
    during = process_threads();
  }
  counted = true;
  for (auto& t : clients) t.join();
  EXPECT_LE(during, before + 4) << "threads with no session: " << before << ", with 4 live: " << during;
  for (const auto& e : ex) {
    EXPECT_GE(e.audio_msgs, 8);
    EXPECT_TRUE(e.errors.empty());
  }
  expect_healthy();
}
