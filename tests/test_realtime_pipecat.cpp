// /v1/realtime as Pipecat's OpenAI Realtime service drives it (the event sequence of
// pipecat-ai/pipecat src/pipecat/services/openai/realtime/llm.py, summarized in docs/pipecat.md), on
// the in-process server with the embedded tiny model, in real time. Every server event goes through
// one validator that holds the field rules Pipecat's strict parser (pydantic models) depends on:
// one unknown type or missing field there ends its receive loop for the rest of the call.
// Also: the beta protocol (OpenAI-Beta: realtime=v1), malformed client events, a concurrent
// /api/chat conversation, the API key as a Bearer header, and slots freed afterwards.

#include <gtest/gtest.h>

#include "realtime_test_util.h"
#include "server_test_util.h"

namespace {

using namespace ppx::server_test;
using namespace ppx::realtime_test;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// --- the tests ----------------------------------------------------------------------------------

class PipecatReplayTest : public ServerTest {
 protected:
  void SetUp() override { start(2, 5.0); }

  // What Pipecat sends, in its order (realtime.md "Client events"), over `seconds` of real-time
  // audio; every server event is validated. Returns the validator.
  struct Replay {
    EventValidator v;
    size_t sent_samples = 0;
    size_t samples_after_updated = 0;  // appended after the first session.updated arrived
    int updates_sent = 0;
    std::vector<std::string> problems;  // ordering problems seen by the replay itself
    bool closed_cleanly = false, closed_by_server = false;
    std::string close_error;
    explicit Replay(bool beta) : v(beta) {}
  };

  Replay replay(bool beta, double seconds) {
    Replay r(beta);
    RtClient c;
    Headers h = {{"Authorization", "Bearer sk-anything"}};
    if (beta) h.push_back({"OpenAI-Beta", "realtime=v1"});
    const int status = c.connect(port_, "/v1/realtime?model=gpt-realtime-2", h);
    EXPECT_EQ(status, 101);
    if (status != 101) return r;
    const std::vector<uint8_t> pcm = speech_pcm16(seconds);
    const int chunks = static_cast<int>(pcm.size() / (2 * kChunk));
    bool updated_once = false, context_sent = false;
    size_t out_samples = 0;
    long max_ahead = -1 << 30;
    auto session_props = [&](bool second) {
      if (beta)
        return json{{"modalities", {"audio", "text"}},
                    {"instructions", "You are a tester."},
                    {"voice", "alloy"},
                    {"input_audio_format", "pcm16"},
                    {"output_audio_format", "pcm16"},
                    {"turn_detection",
                     {{"type", "server_vad"},
                      {"threshold", 0.5},
                      {"prefix_padding_ms", 300},
                      {"silence_duration_ms", 500}}}};
      json s = {
          {"type", "realtime"}, {"model", "gpt-realtime-2"}, {"instructions", "You are a tester."}};
      if (second) {  // what an app with settings sends: formats, VAD, transcription, tool choice
        s["output_modalities"] = {"audio"};
        s["audio"] = {{"input",
                       {{"format", {{"type", "audio/pcm"}, {"rate", 24000}}},
                        {"transcription", {{"model", "gpt-realtime-whisper"}}},
                        {"noise_reduction", {{"type", "near_field"}}},
                        {"turn_detection", {{"type", "semantic_vad"}}}}},
                      {"output",
                       {{"format", {{"type", "audio/pcm"}, {"rate", 24000}}},
                        {"voice", "alloy"},
                        {"speed", 1.0}}}};
        s["tool_choice"] = "auto";
        s["tools"] = json::array();
      }
      return s;
    };
    auto update = [&](bool second) {
      c.send({{"type", "session.update"},
              {"event_id", "evt_upd" + std::to_string(r.updates_sent)},
              {"session", session_props(second)}});
      ++r.updates_sent;
    };
    c.run(
        [&](const std::string& raw) {
          const json e = r.v.check(raw);
          if (e.is_null()) return;
          const std::string type = e.value("type", "");
          if (type == "session.created") update(false);
          if (type == "session.updated" && !updated_once) {
            updated_once = true;
            // The app's first context: its messages as items, another update, response.create.
            c.send({{"type", "conversation.item.create"},
                    {"item",
                     {{"id", "ctx_user_1"},
                      {"type", "message"},
                      {"role", "user"},
                      {"content", {{{"type", "input_text"}, {"text", "Hello there."}}}}}}});
            c.send({{"type", "conversation.item.create"},
                    {"item",
                     {{"id", "ctx_asst_1"},
                      {"type", "message"},
                      {"role", "assistant"},
                      {"content", {{{"type", beta ? "text" : "output_text"}, {"text", "Hi!"}}}}}}});
            update(true);
            c.send({{"type", "response.create"},
                    {"response", beta ? json{{"modalities", {"audio", "text"}}}
                                      : json{{"output_modalities", {"audio"}}}}});
            context_sent = true;
          }
          if (type == r.v.audio_delta()) {
            const auto pcm_out = b64_decode(e.value("delta", ""));
            if (pcm_out) out_samples += pcm_out->size() / 2;
            max_ahead = std::max(
                max_ahead, static_cast<long>(out_samples) - static_cast<long>(r.sent_samples));
          }
          if (type == "input_audio_buffer.speech_started") {  // Pipecat truncates what it played
            const std::string item = r.v.current_item();
            if (!item.empty())
              c.send({{"type", "conversation.item.truncate"},
                      {"item_id", item},
                      {"content_index", 0},
                      {"audio_end_ms", 200}});
          }
        },
        [&](int k) {
          if (k < chunks) {
            c.send(append_event(pcm.data() + 2 * kChunk * k, 2 * kChunk));
            r.sent_samples += kChunk;
            if (updated_once) r.samples_after_updated += kChunk;
          }
          // Interruptions: Pipecat truncates the item it is playing (at most what it received).
          if (context_sent && (k == 150 || k == 260)) {
            const std::string item = r.v.current_item();
            if (!item.empty())
              c.send({{"type", "conversation.item.truncate"},
                      {"event_id", "evt_trunc" + std::to_string(k)},
                      {"item_id", item},
                      {"content_index", 0},
                      {"audio_end_ms", 400}});
          }
          // Turn detection off on the Pipecat side: commit + response.create at the end of a user
          // turn; on interruption clear, re-append the last 0.5 s, response.cancel.
          if (k == 200) {
            c.send({{"type", "input_audio_buffer.commit"}});
            c.send({{"type", "response.create"}});
          }
          if (k == 240 && k < chunks) {
            c.send({{"type", "input_audio_buffer.clear"}});
            // Pipecat's pre-roll: the last 0.5 s again, in one event.
            const size_t n = 25 * kChunk;
            c.send(append_event(pcm.data() + 2 * (kChunk * static_cast<size_t>(k) - n), 2 * n));
            r.sent_samples += n;
            r.samples_after_updated += n;
            c.send({{"type", "response.cancel"}});
          }
          // The input ended: wait for the last answers (1.5 s), then leave.
          if (k == chunks + 75) c.stop();
        },
        std::chrono::milliseconds(static_cast<int>(seconds * 1000) + 20000));
    r.closed_by_server = c.server_closed();
    r.closed_cleanly = c.clean_close();
    r.close_error = c.close_error().message();
    if (max_ahead > kFrame)
      r.problems.push_back("audio out ran " + std::to_string(max_ahead) +
                           " samples ahead of audio in");
    if (out_samples + 2 * kFrame < r.samples_after_updated)
      r.problems.push_back("only " + std::to_string(out_samples) + " samples of audio out for " +
                           std::to_string(r.samples_after_updated) +
                           " appended after session.updated");
    if (!context_sent) r.problems.push_back("session.updated never came");
    return r;
  }

  void expect_replay_ok(const Replay& r, bool beta) {
    EXPECT_TRUE(r.v.problems().empty()) << r.v.problems().size() << " problems:\n" << r.v.report();
    for (const auto& p : r.problems) ADD_FAILURE() << p;
    EXPECT_FALSE(r.closed_by_server) << "the server closed the conversation";
    EXPECT_EQ(r.v.count("session.created"), 1);
    EXPECT_EQ(r.v.count("session.updated"), r.updates_sent)
        << "every session.update gets session.updated";
    EXPECT_EQ(r.v.fatal_errors(), 0) << "an error event Pipecat treats as fatal";
    EXPECT_GE(r.v.complete_lifecycles(), 1) << r.v.lifecycles();
    EXPECT_GE(r.v.transcript_deltas(), 1) << "no transcript deltas";
    EXPECT_GT(r.v.audio_deltas(), 0);
    EXPECT_EQ(r.v.count(beta ? "response.output_audio.delta" : "response.audio.delta"), 0);
    std::cout << "events: " << r.v.audio_deltas() << " audio deltas ("
              << r.v.audio_samples() / double(kRate) << " s for " << r.sent_samples / double(kRate)
              << " s in), " << r.v.transcript_deltas() << " transcript deltas, "
              << r.v.complete_lifecycles()
              << " complete responses; transcript: " << r.v.transcript().substr(0, 120) << "\n";
  }
};

TEST_F(PipecatReplayTest, PipecatGaReplayPassesEveryFieldRule) {
  const Replay r = replay(false, 8.0);
  expect_replay_ok(r, false);
  EXPECT_TRUE(r.closed_cleanly) << "the close handshake did not complete: " << r.close_error;
  EXPECT_TRUE(wait_slots_free(port_));
  expect_healthy();
}

TEST_F(PipecatReplayTest, PipecatBetaReplayGetsBetaNames) {
  const Replay r = replay(true, 6.0);
  expect_replay_ok(r, true);
  EXPECT_EQ(r.v.count("conversation.item.added"), 0);
  EXPECT_GE(r.v.count("response.audio.delta"), 1);
  EXPECT_TRUE(wait_slots_free(port_));
}

// Sends `bad` events after session.updated, each followed by 300 ms of real-time audio; returns
// (errors, validator problems, audio deltas after the last bad event, closed).
struct MalformedResult {
  int errors = 0;
  int deltas_after = 0;
  bool closed = false;
  std::string problems;
  std::vector<std::string> error_types;
};

MalformedResult send_malformed(uint16_t port, const std::vector<std::string>& bad, double tail_s) {
  MalformedResult m;
  EventValidator v(false);
  RtClient c;
  if (c.connect(port, "/v1/realtime?model=x") != 101) {
    m.problems = "no upgrade";
    return m;
  }
  const std::vector<uint8_t> pcm = speech_pcm16(tail_s + 0.3 * static_cast<double>(bad.size()) + 2);
  const int chunks = static_cast<int>(pcm.size() / (2 * kChunk));
  int started_at = -1;
  size_t next_bad = 0;
  const int per_bad = 15;  // 300 ms
  int tail_from = -1;
  c.run(
      [&](const std::string& raw) {
        const json e = v.check(raw);
        if (e.is_null()) return;
        const std::string type = e.value("type", "");
        if (type == "session.created")
          c.send({{"type", "session.update"},
                  {"session", {{"type", "realtime"}, {"instructions", "hi"}}}});
        if (type == "session.updated" && started_at < 0) started_at = 0;
        if (type == "error") {
          ++m.errors;
          m.error_types.push_back(
              e["error"].value("type", "") + "/" +
              (e["error"]["code"].is_string() ? e["error"]["code"].get<std::string>() : "") + ": " +
              e["error"].value("message", ""));
        }
        if (type == "response.output_audio.delta" && tail_from >= 0) ++m.deltas_after;
      },
      [&](int k) {
        if (k < chunks) c.send(append_event(pcm.data() + 2 * kChunk * k, 2 * kChunk));
        if (started_at < 0) return;
        if (started_at == 0) started_at = k;
        const int rel = k - started_at;
        if (next_bad < bad.size() && rel == per_bad * static_cast<int>(next_bad)) {
          c.send_raw(bad[next_bad]);
          ++next_bad;
          if (next_bad == bad.size()) tail_from = k + 10;  // answers to the bad ones, then count
        }
        if (tail_from >= 0 && k >= tail_from + static_cast<int>(tail_s * 50)) c.stop();
      },
      std::chrono::milliseconds(
          static_cast<int>((tail_s + 0.3 * static_cast<double>(bad.size())) * 1000) + 20000));
  m.closed = c.server_closed();
  m.problems = v.report();
  return m;
}

TEST_F(PipecatReplayTest, MalformedEventsGetErrorEventsAndTheSessionGoesOn) {
  const std::string odd = b64_encode(reinterpret_cast<const uint8_t*>("abc"), 3);
  const std::vector<std::string> bad = {
      "this is not json {",
      R"({"type":"no.such.event","event_id":"e1"})",
      R"({"event_id":"e2"})",
      R"([1,2,3])",
      R"({"type":"input_audio_buffer.append","audio":"!!!not base64!!!"})",
      json{{"type", "input_audio_buffer.append"}, {"audio", odd}}.dump(),
      R"({"type":"input_audio_buffer.append","audio":12})",
      R"({"type":"session.update","session":"not an object"})",
      R"({"type":"conversation.item.truncate","item_id":"item_never_existed","content_index":0,"audio_end_ms":10})",
  };
  const MalformedResult m = send_malformed(port_, bad, 2.0);
  std::string errs;
  for (const auto& e : m.error_types) errs += "  " + e + "\n";
  std::cout << m.errors << " error events:\n" << errs;
  EXPECT_TRUE(m.problems.empty()) << m.problems;
  EXPECT_FALSE(m.closed) << "the session must go on after malformed events";
  // One error for each of the first seven (the last two may be acknowledged instead).
  EXPECT_GE(m.errors, 7) << errs;
  EXPECT_LE(m.errors, static_cast<int>(bad.size())) << errs;
  EXPECT_GE(m.deltas_after, 15) << "audio must keep flowing after the malformed events";
  EXPECT_TRUE(wait_slots_free(port_));
}

// An event over the per-event limit gets an error and the session goes on; a message over the
// WebSocket limit closes the connection. Either way the slot comes back.
TEST_F(PipecatReplayTest, OversizedEventsGetAnErrorThenACleanClose) {
  RtClient c;
  ASSERT_EQ(c.connect(port_, "/v1/realtime"), 101);
  EventValidator v(false);
  int errors = 0, deltas_after_error = 0;
  std::string error_code;
  const std::vector<uint8_t> pcm = speech_pcm16(6.0);
  std::vector<uint8_t> big(3 << 19, 0);    // 1.5 MiB of PCM: 2 MiB of base64 in one event
  std::vector<uint8_t> huge(15 << 18, 0);  // 3.75 MiB of PCM: 5 MiB of base64
  bool huge_sent = false;
  c.run(
      [&](const std::string& raw) {
        const json e = v.check(raw);
        if (e.is_null()) return;
        const std::string type = e.value("type", "");
        if (type == "session.created") {
          c.send({{"type", "session.update"}, {"session", {{"type", "realtime"}}}});
          c.send(append_event(big.data(), big.size()));
        }
        if (type == "error") {
          ++errors;
          if (e["error"]["code"].is_string()) error_code = e["error"]["code"].get<std::string>();
        }
        if (type == "response.output_audio.delta" && errors > 0 && ++deltas_after_error == 10) {
          c.send(append_event(huge.data(), huge.size()));
          huge_sent = true;
        }
      },
      [&](int k) {
        if (k < 300) c.send(append_event(pcm.data() + 2 * kChunk * k, 2 * kChunk));
      },
      20s);
  EXPECT_TRUE(v.problems().empty()) << v.report();
  EXPECT_EQ(errors, 1) << "one error event for the 2 MiB event";
  std::cout << "2 MiB event: error code " << error_code << "\n";
  EXPECT_GE(deltas_after_error, 10) << "the session must go on after an oversized event";
  EXPECT_TRUE(huge_sent);
  EXPECT_TRUE(c.server_closed()) << "a 5 MiB message must close the connection";
  std::cout << "5 MiB message: " << c.close_error().message() << ", close code "
            << c.close_reason().code << "\n";
  EXPECT_TRUE(wait_slots_free(port_));
  expect_healthy();
}

// A /api/chat conversation goes on, untouched, while a /v1/realtime client sends garbage and an
// oversized event.
TEST_F(PipecatReplayTest, ChatSessionIsUnaffectedByAMisbehavingRealtimeClient) {
  std::vector<float> speech = user_speech();
  speech.resize(50 * kFrame);  // 4 s
  const auto msgs = audio_messages(speech);
  Exchange chat_ex;
  std::thread t([&] {
    Client cc;
    if (!cc.connect(port_, chat())) return;
    chat_ex = cc.run(
        msgs, 80ms, [&](const Exchange& e) { return e.audio_msgs >= 2 + 50; }, 30s);
    cc.drop();
  });
  std::this_thread::sleep_for(300ms);
  const MalformedResult m = send_malformed(
      port_,
      {"{{{", R"({"type":"bogus"})", R"({"type":"input_audio_buffer.append","audio":"%%%"})"}, 1.0);
  RtClient big;
  if (big.connect(port_, "/v1/realtime") == 101) {
    std::vector<uint8_t> large(3 << 19, 0), huge(15 << 18, 0);  // 2 and 5 MiB as base64
    big.run([&](const std::string&) {},
            [&](int k) {
              if (k == 5) big.send(append_event(large.data(), large.size()));
              if (k == 10) big.send(append_event(huge.data(), huge.size()));
              if (k == 100) big.stop();
            },
            10s);
    EXPECT_TRUE(big.server_closed());
  }
  t.join();
  EXPECT_GE(m.errors, 3);
  EXPECT_TRUE(chat_ex.handshake);
  EXPECT_TRUE(chat_ex.errors.empty()) << (chat_ex.errors.empty() ? "" : chat_ex.errors[0]);
  EXPECT_FALSE(chat_ex.closed) << chat_ex.close_reason;
  EXPECT_EQ(chat_ex.audio_msgs, 2 + 50) << "the chat session lost audio";
  EXPECT_TRUE(wait_slots_free(port_));
  expect_healthy();
}

TEST_F(PipecatReplayTest, ApiKeyAsBearerHeader) {
  start(1, 5.0, 2.0, "", "", [](ppx::server::ServerOptions& o) { o.api_key = "sekret"; });
  EXPECT_EQ(upgrade_status(port_, "/v1/realtime?model=m"), 401);
  EXPECT_EQ(upgrade_status(port_, "/v1/realtime?model=m", {{"Authorization", "Bearer wrong"}}),
            401);
  RtClient c;
  ASSERT_EQ(c.connect(port_, "/v1/realtime?model=m", {{"Authorization", "Bearer sekret"}}), 101);
  EventValidator v(false);
  c.run(
      [&](const std::string& raw) {
        if (v.check(raw).value("type", "") == "session.created") c.stop();
      },
      {}, 10s);
  EXPECT_EQ(v.count("session.created"), 1);
  EXPECT_TRUE(v.problems().empty()) << v.report();
  EXPECT_TRUE(c.clean_close());
  EXPECT_TRUE(wait_slots_free(port_));
  // The key as a query parameter works too (last: the dropped upgrade holds the slot a moment).
  EXPECT_EQ(upgrade_status(port_, "/v1/realtime?model=m&api_key=sekret"), 101);
}

// A client that leaves mid-response: its slot comes back, and the next client is served.
TEST_F(PipecatReplayTest, ClientLeavingMidResponseFreesTheSlot) {
  for (int round = 0; round < 2; ++round) {
    RtClient c;
    ASSERT_EQ(c.connect(port_, "/v1/realtime"), 101);
    EventValidator v(false);
    const std::vector<uint8_t> pcm = speech_pcm16(3.0);
    c.run(
        [&](const std::string& raw) {
          const json e = v.check(raw);
          if (e.value("type", "") == "session.created")
            c.send({{"type", "session.update"}, {"session", {{"type", "realtime"}}}});
          if (v.audio_deltas() >= 10) c.stop(/*drop=*/round == 0);
        },
        [&](int k) {
          if (k < 150) c.send(append_event(pcm.data() + 2 * kChunk * k, 2 * kChunk));
        },
        15s);
    EXPECT_GE(v.audio_deltas(), 10);
    EXPECT_TRUE(v.problems().empty()) << v.report();
    if (round == 1) {
      EXPECT_TRUE(c.clean_close()) << c.close_error().message();
    }
    EXPECT_TRUE(wait_slots_free(port_)) << "round " << round;
  }
}

}  // namespace
