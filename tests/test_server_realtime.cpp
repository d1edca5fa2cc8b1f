// /v1/realtime end to end on 127.0.0.1 with the embedded tiny demo model: session.created and
// session.updated, base64 PCM16 streamed in real time answered by real-time audio deltas inside a
// complete response lifecycle, GA vs beta event names, error events for malformed client events
// with the session going on, the invalid-event limit, and /api/chat beside it. The tiny model's
// output is never silent, so responses end at the maximum segment length (kMaxSegmentFrames).
#include <set>

#include "server/realtime_events.h"
#include "server/realtime_protocol.h"
#include "server_test_util.h"

namespace {

using namespace ppx::server_test;
using Json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct RtEvent {
  Json j;
  Clock::time_point at;
  std::string type() const { return j.value("type", ""); }
};

// PCM16 LE bytes of `pcm` (24 kHz mono floats).
std::vector<uint8_t> pcm16(const std::vector<float>& pcm) {
  std::vector<uint8_t> b(pcm.size() * 2);
  for (size_t i = 0; i < pcm.size(); ++i) {
    const auto v = static_cast<int16_t>(std::lrint(std::clamp(pcm[i], -1.f, 1.f) * 32767.f));
    b[2 * i] = static_cast<uint8_t>(static_cast<uint16_t>(v) & 0xFF);
    b[2 * i + 1] = static_cast<uint8_t>(static_cast<uint16_t>(v) >> 8);
  }
  return b;
}

std::string append_event(const uint8_t* d, size_t n) {
  return Json{{"type", "input_audio_buffer.append"},
              {"audio", ppx::server::realtime::base64_encode(d, n)}}
      .dump();
}

// A /v1/realtime client on one thread: writes queued messages in order, optionally streams PCM
// in real time (one append per `chunk_samples`), and reads every event until the handler says
// done, the server closes, or the deadline passes.
class RtClient {
 public:
  bool connect(uint16_t port, const std::string& target, const Headers& headers = {}) {
    beast::error_code ec;
    beast::get_lowest_layer(ws_).socket().connect(
        tcp::endpoint(net::ip::make_address("127.0.0.1"), port), ec);
    if (ec) return false;
    ws_.read_message_max(64 << 20);
    ws_.text(true);
    ws_.set_option(websocket::stream_base::decorator([headers](websocket::request_type& r) {
      for (const auto& [k, v] : headers) r.set(k, v);
    }));
    ws_.handshake("127.0.0.1:" + std::to_string(port), target, ec);
    return !ec;
  }

  void send(std::string m) {
    out_.push_back(std::move(m));
    out_samples_.push_back(0);
    write_next();
  }

  // Streams `pcm` in real time from now: append k carries samples [k*chunk, (k+1)*chunk).
  void stream(std::vector<uint8_t> pcm_bytes, size_t chunk_samples) {
    audio_ = std::move(pcm_bytes);
    chunk_ = chunk_samples;
    t_stream_ = Clock::now();
    next_chunk_ = 0;
    stream_next();
  }
  bool streaming_done() const { return next_chunk_ * chunk_ * 2 >= audio_.size(); }

  // Reads until on_event returns true, a close, or the deadline.
  void run(const std::function<bool(RtClient&, const RtEvent&)>& on_event,
           std::chrono::milliseconds deadline) {
    finished_ = false;
    net::steady_timer limit(ioc_);
    limit.expires_after(deadline);
    limit.async_wait([&](beast::error_code e) {
      if (!e) finish();
    });
    std::function<void()> read_next = [&] {
      ws_.async_read(buf_, [&](beast::error_code ec, size_t) {
        if (ec) {
          closed = true;
          return finish();
        }
        RtEvent ev{Json::parse(beast::buffers_to_string(buf_.data()), nullptr, false),
                   Clock::now()};
        buf_.consume(buf_.size());
        events.push_back(ev);
        if (on_event && on_event(*this, events.back())) return finish();
        read_next();
      });
    };
    read_next();
    ioc_.restart();
    ioc_.run();
    limit.cancel();
  }

  void drop() {
    beast::error_code ec;
    beast::get_lowest_layer(ws_).socket().close(ec);
  }

  std::vector<RtEvent> events;
  bool closed = false;
  // (when an append finished writing, cumulative samples sent by then)
  std::vector<std::pair<Clock::time_point, size_t>> sent;
  size_t samples_sent = 0;

 private:
  void finish() {
    if (finished_) return;
    finished_ = true;
    pace_.cancel();
    beast::error_code ec;
    beast::get_lowest_layer(ws_).socket().cancel(ec);
    ioc_.stop();
  }

  void stream_next() {
    if (streaming_done()) return;
    const size_t begin = next_chunk_ * chunk_ * 2;
    const size_t n = std::min(chunk_ * 2, audio_.size() - begin);
    out_.push_back(append_event(audio_.data() + begin, n));
    out_samples_.push_back(n / 2);
    write_next();
    ++next_chunk_;
    pace_.expires_at(t_stream_ + std::chrono::microseconds(static_cast<int64_t>(
                                     next_chunk_ * chunk_ * 1'000'000 / 24000)));
    pace_.async_wait([this](beast::error_code e) {
      if (!e) stream_next();
    });
  }

  void write_next() {
    if (writing_ || out_.empty()) return;
    writing_ = true;
    ws_.async_write(net::buffer(out_.front()), [this](beast::error_code ec, size_t) {
      writing_ = false;
      if (ec) return;
      samples_sent += out_samples_.front();
      if (out_samples_.front()) sent.emplace_back(Clock::now(), samples_sent);
      out_.pop_front();
      out_samples_.pop_front();
      write_next();
    });
  }

  net::io_context ioc_;
  websocket::stream<beast::tcp_stream> ws_{ioc_};
  beast::flat_buffer buf_;
  net::steady_timer pace_{ioc_};
  std::deque<std::string> out_;
  std::deque<size_t> out_samples_;
  bool writing_ = false, finished_ = false;
  std::vector<uint8_t> audio_;
  size_t chunk_ = 0, next_chunk_ = 0;
  Clock::time_point t_stream_;
};

size_t count(const std::vector<RtEvent>& evs, const std::string& type) {
  return static_cast<size_t>(
      std::count_if(evs.begin(), evs.end(), [&](const RtEvent& e) { return e.type() == type; }));
}

// Every event has a unique event_id; no event is larger than kMaxServerEventBytes.
void expect_well_formed(const std::vector<RtEvent>& evs) {
  std::set<std::string> ids;
  for (const auto& e : evs) {
    ASSERT_TRUE(e.j.is_object());
    ASSERT_TRUE(e.j.contains("event_id") && e.j["event_id"].is_string()) << e.j.dump();
    EXPECT_TRUE(ids.insert(e.j["event_id"].get<std::string>()).second) << e.j.dump();
    EXPECT_LE(e.j.dump().size(), ppx::server::kMaxServerEventBytes);
  }
}

// The responses' events in order, checked against the lifecycle; returns the completed (not
// cancelled) responses.
int check_lifecycles(const std::vector<RtEvent>& evs, bool beta) {
  const char* added = beta ? "conversation.item.created" : "conversation.item.added";
  const char* audio_delta = beta ? "response.audio.delta" : "response.output_audio.delta";
  const char* audio_done = beta ? "response.audio.done" : "response.output_audio.done";
  const char* tr_delta =
      beta ? "response.audio_transcript.delta" : "response.output_audio_transcript.delta";
  const char* tr_done =
      beta ? "response.audio_transcript.done" : "response.output_audio_transcript.done";
  std::vector<std::string> closing = {audio_done, tr_done, "response.content_part.done",
                                      "response.output_item.done"};
  if (!beta) closing.push_back("conversation.item.done");
  closing.push_back("response.done");
  int completed = 0;
  std::string resp, item, transcript;
  size_t closing_at = 0;
  int opening = 0;  // events of the opening sequence seen
  for (const auto& e : evs) {
    const std::string t = e.type();
    if (t == "response.created") {
      EXPECT_TRUE(resp.empty()) << "response.created inside an open response";
      const Json& r = e.j["response"];
      EXPECT_EQ(r["object"], "realtime.response");
      EXPECT_EQ(r["status"], "in_progress");
      EXPECT_TRUE(r.contains("status_details") && r["status_details"].is_null());
      EXPECT_EQ(r["output"], Json::array());
      resp = r["id"];
      item.clear();
      transcript.clear();
      closing_at = 0;
      opening = 1;
    } else if (t == added) {
      EXPECT_EQ(opening, 1);
      opening = 2;
      EXPECT_EQ(e.j["item"]["role"], "assistant");
      EXPECT_EQ(e.j["item"]["status"], "in_progress");
      EXPECT_EQ(e.j["item"]["type"], "message");
      item = e.j["item"]["id"];
    } else if (t == "response.output_item.added") {
      EXPECT_EQ(opening, 2);
      opening = 3;
      EXPECT_EQ(e.j["response_id"], resp);
      EXPECT_EQ(e.j["item"]["id"], item);
    } else if (t == "response.content_part.added") {
      EXPECT_EQ(opening, 3);
      opening = 4;
      EXPECT_EQ(e.j["item_id"], item);
      EXPECT_EQ(e.j["part"]["type"], beta ? "audio" : "output_audio");
    } else if (t == audio_delta || t == tr_delta) {
      EXPECT_EQ(opening, 4) << t << " outside an opened response";
      EXPECT_EQ(closing_at, 0u);
      EXPECT_EQ(e.j["response_id"], resp);
      EXPECT_EQ(e.j["item_id"], item);
      EXPECT_EQ(e.j["output_index"], 0);
      EXPECT_EQ(e.j["content_index"], 0);
      if (t == tr_delta) transcript += e.j["delta"].get<std::string>();
    } else if (closing_at < closing.size() && t == closing[closing_at]) {
      EXPECT_EQ(opening, 4);
      ++closing_at;
      if (t == tr_done) {
        EXPECT_EQ(e.j["transcript"], transcript);
      }
      if (t == "response.done") {
        const Json& r = e.j["response"];
        EXPECT_EQ(r["id"], resp);
        EXPECT_EQ(r["object"], "realtime.response");
        const bool cancelled = r["status"] == "cancelled";
        if (cancelled) {
          EXPECT_EQ(r["status_details"]["type"], "cancelled");
        } else {
          EXPECT_EQ(r["status"], "completed");
          EXPECT_TRUE(r.contains("status_details") && r["status_details"].is_null());
        }
        EXPECT_EQ(r["output"].size(), 1u);
        EXPECT_EQ(r["output"][0]["id"], item);
        EXPECT_EQ(r["output"][0]["status"], cancelled ? "incomplete" : "completed");
        EXPECT_EQ(r["output"][0]["content"][0]["transcript"], transcript);
        for (const char* k : {"total_tokens", "input_tokens", "output_tokens"})
          EXPECT_EQ(r["usage"][k], 0) << k;
        EXPECT_TRUE(r["usage"]["input_token_details"].is_object());
        EXPECT_TRUE(r["usage"]["output_token_details"].is_object());
        if (!cancelled) ++completed;
        resp.clear();
        opening = 0;
      }
    } else if (!resp.empty() && closing_at > 0) {
      ADD_FAILURE() << "out of order in a closing response: " << t;
    }
  }
  return completed;
}

class RealtimeServerTest : public ServerTest {
 protected:
  std::string target(const std::string& q = "model=personaplex-test") const {
    return "/v1/realtime?" + q;
  }
};

TEST_F(RealtimeServerTest, SessionCreatedThenUpdated) {
  RtClient c;
  ASSERT_TRUE(c.connect(port_, target()));
  int updated = 0;
  c.run(
      [&](RtClient& cl, const RtEvent& e) {
        if (e.type() == "session.created") {
          cl.send(R"({"type":"session.update","event_id":"c1","session":{"type":"realtime",)"
                  R"("instructions":"You are a tester.","audio":{"output":{"voice":"voice"}}}})");
        }
        if (e.type() == "session.updated" && ++updated == 1)  // not a voice file: ignored
          cl.send(R"({"type":"session.update","session":{"audio":{"output":{"voice":"alloy"}}}})");
        return updated == 2;
      },
      10s);
  ASSERT_GE(c.events.size(), 3u);
  expect_well_formed(c.events);
  const Json& created = c.events[0].j;
  ASSERT_EQ(created["type"], "session.created");
  const Json& s = created["session"];
  EXPECT_EQ(s["type"], "realtime");
  EXPECT_EQ(s["object"], "realtime.session");
  EXPECT_EQ(s["id"].get<std::string>().rfind("sess_", 0), 0u);
  EXPECT_EQ(s["model"], "personaplex-test");
  EXPECT_EQ(s["output_modalities"], Json::array({"audio"}));
  EXPECT_EQ(s["audio"]["input"]["format"], (Json{{"type", "audio/pcm"}, {"rate", 24000}}));
  EXPECT_EQ(s["audio"]["output"]["format"], (Json{{"type", "audio/pcm"}, {"rate", 24000}}));
  EXPECT_TRUE(s["audio"]["input"]["turn_detection"].is_null());
  EXPECT_EQ(s["tool_choice"], "auto");
  EXPECT_EQ(s["tools"], Json::array());
  EXPECT_TRUE(s["audio"]["output"]["voice"].is_null());  // no NATF0.pt in the test voice dir
  ASSERT_EQ(c.events[1].type(), "session.updated");
  EXPECT_EQ(c.events[1].j["session"]["instructions"], "You are a tester.");
  EXPECT_EQ(c.events[1].j["session"]["audio"]["output"]["voice"], "voice.wav");
  EXPECT_EQ(c.events[1].j["session"]["id"], s["id"]);
  ASSERT_EQ(c.events[2].type(), "session.updated");
  EXPECT_EQ(c.events[2].j["session"]["audio"]["output"]["voice"], "voice.wav");
  EXPECT_EQ(count(c.events, "error"), 0u);
  c.drop();
  EXPECT_TRUE(wait_slots_free(port_));
}

// Pipecat's order: audio from the first moment, session.update on session.created, a second
// session.update and response.create once the conversation runs.
TEST_F(RealtimeServerTest, RealTimeAudioDeltasInResponses) {
  std::vector<float> speech = user_speech();
  const size_t frames = 70;  // 5.6 s: at least one response reaches kMaxSegmentFrames
  speech.resize(frames * kFrame, 0.f);
  RtClient c;
  ASSERT_TRUE(c.connect(port_, target()));
  c.stream(pcm16(speech), 1000);  // 41.7 ms chunks: not a whole number of frames
  size_t deltas = 0;
  bool second_update = false;
  c.run(
      [&](RtClient& cl, const RtEvent& e) {
        if (e.type() == "session.created")
          cl.send(R"({"type":"session.update","session":{"instructions":"Be brief."}})");
        if (e.type() == "response.output_audio.delta") {
          ++deltas;
          EXPECT_EQ(ppx::server::realtime::base64_decode(e.j["delta"])->size(), 2u * kFrame);
          if (!second_update) {
            second_update = true;
            cl.send(R"({"type":"session.update","session":{"instructions":"Changed."}})");
            cl.send(R"({"type":"response.create","response":{"output_modalities":["audio"]}})");
          }
        }
        return deltas >= frames;
      },
      20s);
  expect_well_formed(c.events);
  EXPECT_EQ(count(c.events, "error"), 0u) << c.events.back().j.dump() << " deltas " << deltas
                                          << " responses " << count(c.events, "response.done");
  // As many frames as were sent (the tiny model is never silent; its prompts take well under the
  // kept second of early audio), within one frame.
  EXPECT_GE(deltas + 1, frames);
  EXPECT_LE(deltas, frames);
  // Never ahead of the input: by each delta's arrival, at least that many frames were sent.
  size_t k = 0;
  for (const auto& e : c.events) {
    if (e.type() != "response.output_audio.delta") continue;
    ++k;
    size_t sent_by_then = 0;
    for (const auto& [t, n] : c.sent)
      if (t <= e.at) sent_by_then = n;
    EXPECT_LE(k, sent_by_then / kFrame + 1) << "delta " << k << " ahead of the input";
  }
  EXPECT_GE(check_lifecycles(c.events, false), 1);
  EXPECT_GE(count(c.events, "response.output_audio_transcript.delta"), 1u);
  // The update after the start is acknowledged with the session as it really is.
  std::vector<Json> updates;
  for (const auto& e : c.events)
    if (e.type() == "session.updated") updates.push_back(e.j["session"]);
  ASSERT_EQ(updates.size(), 2u);
  EXPECT_EQ(updates[0]["instructions"], "Be brief.");
  EXPECT_EQ(updates[1]["instructions"], "Be brief.");
  c.drop();
  EXPECT_TRUE(wait_slots_free(port_));
}

// response.cancel closes the open response as cancelled; the next frame opens a new one.
TEST_F(RealtimeServerTest, ResponseCancelClosesTheOpenResponse) {
  std::vector<float> speech = user_speech();
  speech.resize(30 * kFrame, 0.f);
  RtClient c;
  ASSERT_TRUE(c.connect(port_, target()));
  c.stream(pcm16(speech), 1920);
  bool cancelled = false;
  c.run(
      [&](RtClient& cl, const RtEvent& e) {
        if (e.type() == "session.created") cl.send(R"({"type":"session.update","session":{}})");
        if (e.type() == "response.output_audio.delta" && !cancelled) {
          cancelled = true;
          cl.send(R"({"type":"response.cancel"})");
        }
        return count(cl.events, "response.created") >= 2 &&
               e.type() == "response.output_audio.delta";
      },
      20s);
  expect_well_formed(c.events);
  EXPECT_EQ(check_lifecycles(c.events, false), 0);
  std::vector<Json> done;
  for (const auto& e : c.events)
    if (e.type() == "response.done") done.push_back(e.j["response"]);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0]["status"], "cancelled");
  EXPECT_EQ(done[0]["status_details"]["reason"], "client_cancelled");
  EXPECT_EQ(count(c.events, "response.created"), 2u);
  EXPECT_EQ(count(c.events, "error"), 0u);
  c.drop();
  EXPECT_TRUE(wait_slots_free(port_));
}

TEST_F(RealtimeServerTest, BetaHeaderGivesBetaNames) {
  std::vector<float> speech = user_speech();
  speech.resize(60 * kFrame, 0.f);  // 4.8 s: one full response
  RtClient c;
  ASSERT_TRUE(c.connect(port_, target(), {{"OpenAI-Beta", "realtime=v1"}}));
  c.stream(pcm16(speech), 960);
  c.run(
      [&](RtClient& cl, const RtEvent& e) {
        if (e.type() == "session.created")
          cl.send(R"({"type":"session.update","session":{"voice":"voice","temperature":0.7}})");
        return e.type() == "response.done";
      },
      20s);
  expect_well_formed(c.events);
  ASSERT_FALSE(c.events.empty());
  const Json& s = c.events[0].j["session"];
  EXPECT_EQ(s["input_audio_format"], "pcm16");
  EXPECT_EQ(s["modalities"], Json::array({"audio", "text"}));
  EXPECT_EQ(c.events[1].j["session"]["voice"], "voice.wav");
  EXPECT_DOUBLE_EQ(c.events[1].j["session"]["temperature"].get<double>(), 0.7);
  EXPECT_GE(count(c.events, "response.audio.delta"), 1u);
  EXPECT_EQ(check_lifecycles(c.events, true), 1);
  for (const char* ga : {"response.output_audio.delta", "conversation.item.added",
                         "conversation.item.done", "response.output_audio.done"})
    EXPECT_EQ(count(c.events, ga), 0u) << ga;
  c.drop();
  EXPECT_TRUE(wait_slots_free(port_));
}

TEST_F(RealtimeServerTest, MalformedEventsGetErrorsAndTheSessionGoesOn) {
  const std::string huge = R"({"type":"input_audio_buffer.append","audio":")" +
                           std::string(ppx::server::kMaxClientEventBytes, 'A') + "\"}";
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"not json", "invalid_json"},
      {"[1,2]", "invalid_json"},
      {std::string(100, '[') + std::string(100, ']'), "invalid_json"},
      {R"({"type":"no.such.event","event_id":"e5"})", "unknown_event_type"},
      {R"({"event_id":"e6"})", "missing_required_parameter"},
      {R"({"type":"input_audio_buffer.append","audio":"@@@@"})", "invalid_base64"},
      {R"({"type":"input_audio_buffer.append","audio":"QUJD"})", "invalid_audio_length"},
      {R"({"type":"input_audio_buffer.append"})", "missing_required_parameter"},
      {huge, "event_too_large"},
  };
  const std::vector<std::pair<std::string, std::string>> turn_based = {
      {R"({"type":"input_audio_buffer.commit"})", "input_audio_buffer.committed"},
      {R"({"type":"input_audio_buffer.clear"})", "input_audio_buffer.cleared"},
      {R"({"type":"conversation.item.truncate","item_id":"item_x","content_index":0,"audio_end_ms":640})",
       "conversation.item.truncated"},
      {R"({"type":"conversation.item.delete","item_id":"item_x"})", "conversation.item.deleted"},
  };
  std::vector<float> speech = user_speech();
  speech.resize(15 * kFrame, 0.f);
  RtClient c;
  ASSERT_TRUE(c.connect(port_, target()));
  size_t deltas = 0;
  c.run(
      [&](RtClient& cl, const RtEvent& e) {
        if (e.type() == "session.created") {
          for (const auto& [m, code] : bad) cl.send(m);
          for (const auto& [m, reply] : turn_based) cl.send(m);
          cl.send(R"({"type":"conversation.item.retrieve","item_id":"item_x"})");
          for (
              const char* quiet :
              {R"({"type":"response.create"})", R"({"type":"response.cancel"})",
               R"({"type":"output_audio_buffer.clear"})",
               R"({"type":"conversation.item.create","item":{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]}})"})
            cl.send(quiet);
          cl.send(R"({"type":"session.update","session":{}})");
          cl.stream(pcm16(speech), 1920);
        }
        if (e.type() == "response.output_audio.delta") ++deltas;
        return deltas >= 10;
      },
      20s);
  expect_well_formed(c.events);
  EXPECT_FALSE(c.closed);
  std::vector<Json> errors;
  for (const auto& e : c.events)
    if (e.type() == "error") errors.push_back(e.j["error"]);
  ASSERT_EQ(errors.size(), bad.size() + 1);  // + the answer to conversation.item.retrieve
  EXPECT_EQ(errors.back()["code"], "item_retrieve_invalid_item_id");
  for (size_t i = 0; i < bad.size(); ++i) {
    EXPECT_EQ(errors[i]["type"], "invalid_request_error");
    EXPECT_EQ(errors[i]["code"], bad[i].second) << i;
    EXPECT_TRUE(errors[i]["message"].is_string());
    EXPECT_TRUE(errors[i].contains("param"));
  }
  EXPECT_EQ(errors[3]["event_id"], "e5");  // the client's event_id is echoed
  EXPECT_EQ(errors[3]["param"], "type");
  for (const auto& [m, reply] : turn_based) EXPECT_EQ(count(c.events, reply), 1u) << reply;
  EXPECT_EQ(count(c.events, "session.updated"), 1u);
  EXPECT_GE(deltas, 10u);  // the session went on
  c.drop();
  EXPECT_TRUE(wait_slots_free(port_));
}

TEST_F(RealtimeServerTest, InvalidEventFloodEndsTheSession) {
  RtClient c;
  ASSERT_TRUE(c.connect(port_, target()));
  c.run(
      [&](RtClient& cl, const RtEvent& e) {
        if (e.type() == "session.created")
          for (int i = 0; i < ppx::server::kMaxInvalidEvents + 20; ++i) cl.send("{");
        return false;
      },
      10s);
  EXPECT_TRUE(c.closed);
  size_t invalid = 0;
  for (const auto& e : c.events)
    if (e.type() == "error" && e.j["error"]["code"] == "invalid_json") ++invalid;
  EXPECT_EQ(invalid, static_cast<size_t>(ppx::server::kMaxInvalidEvents));
  ASSERT_FALSE(c.events.empty());
  EXPECT_EQ(c.events.back().j["error"]["code"], "session_error");
  EXPECT_TRUE(wait_slots_free(port_));
}

// Valid events faster than the server's budget end the session with a fatal error that says so:
// small control events, and large ones (each parsed).
TEST_F(RealtimeServerTest, EventFloodsEndTheSession) {
  const std::string big = R"({"type":"conversation.item.create","item":{"type":"message","x":")" +
                          std::string(1000 * 1000, 'a') + "\"}}";
  for (const bool large : {false, true}) {
    RtClient c;
    ASSERT_TRUE(c.connect(port_, target()));
    size_t sent = 0;
    c.run(
        [&](RtClient& cl, const RtEvent& e) {
          if (e.type() == "session.created") {
            // Large: 64 MB, so that a server parsing at only ~1.4 MB/s (sanitizers) still trips it.
            const size_t n = large ? 64 : static_cast<size_t>(ppx::server::kControlEventsBurst) + 100;
            for (; sent < n; ++sent)
              cl.send(large ? big : std::string(R"({"type":"response.create"})"));  // no answer: no output queue
          }
          return false;
        },
        20s);
    EXPECT_TRUE(c.closed) << large;
    ASSERT_FALSE(c.events.empty());
    const auto& last = c.events.back().j;
    EXPECT_EQ(last["error"]["code"], "session_error") << last.dump();
    EXPECT_NE(last["error"]["message"].get<std::string>().find(large ? "MiB a second" : "50 a second"),
              std::string::npos)
        << last.dump();
    EXPECT_TRUE(wait_slots_free(port_));
  }
}

// A client that streams audio but never reads: once the socket buffers fill, a write that waits
// longer than the stall limit (10 s, or the idle timeout if longer) ends the session and frees its
// slot (was: only at 1024 queued messages, ~80 s here, and ~18 minutes for /api/chat).
TEST_F(RealtimeServerTest, ClientThatStopsReadingIsDropped) {
  net::io_context ioc;
  websocket::stream<beast::tcp_stream> ws(ioc);
  beast::get_lowest_layer(ws).connect(tcp::endpoint(net::ip::make_address("127.0.0.1"), port_));
  ws.text(true);
  ws.handshake("127.0.0.1:" + std::to_string(port_), target());
  const std::vector<float> silence(1920, 0.01f);
  const std::vector<uint8_t> b = pcm16(silence);
  const std::string append = append_event(b.data(), b.size());
  const auto t0 = std::chrono::steady_clock::now();
  bool freed = false;
  for (int i = 0; i < 50 * 12 && !freed; ++i) {  // real time, at most 50 s; nothing is read
    beast::error_code ec;
    ws.write(net::buffer(append), ec);
    if (ec) break;  // the server closed
    std::this_thread::sleep_until(t0 + 80ms * (i + 1));
    if (i % 12 == 0) freed = nlohmann::json::parse(http_get(port_, "/health"))["sessions_in_use"] == 0 && i > 0;
  }
  EXPECT_TRUE(wait_slots_free(port_, 5s));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GT(s, 10.0);
  EXPECT_LT(s, 50.0);
  // Dropped for not reading (not, say, for audio piling up on a slow machine: input_overflow).
  EXPECT_EQ(metric(http_get(port_, "/metrics"), "personaplex_sessions_ended_total{reason=\"client_left\"}"), 1.0);
  beast::get_lowest_layer(ws).close();
}

TEST_F(RealtimeServerTest, RefusalsAreErrorEvents) {
  // A bad model name: an error event and a close.
  {
    RtClient c;
    ASSERT_TRUE(c.connect(port_, target("model=" + std::string(200, 'm'))));
    c.run({}, 5s);
    EXPECT_TRUE(c.closed);
    ASSERT_EQ(c.events.size(), 1u);
    EXPECT_EQ(c.events[0].j["error"]["code"], "bad_request");
  }
  // Busy: the only slot is taken by another realtime session. The upgrade is refused before it
  // happens (HTTP 503 + Retry-After, tests/test_server.cpp; the check reserves the slot, so two
  // upgrades at once cannot both pass it).
  RtClient a;
  ASSERT_TRUE(a.connect(port_, target()));
  a.run([](RtClient&, const RtEvent& e) { return e.type() == "session.created"; }, 5s);
  EXPECT_EQ(upgrade_status(port_, target()), 503);
  RtClient b;
  EXPECT_FALSE(b.connect(port_, target()));
  a.drop();
  EXPECT_TRUE(wait_slots_free(port_));
  RtClient c;  // the slot is free again: a new session gets in
  ASSERT_TRUE(c.connect(port_, target()));
  c.run([](RtClient&, const RtEvent& e) { return e.type() == "session.created"; }, 5s);
  ASSERT_FALSE(c.events.empty());
  EXPECT_EQ(c.events[0].type(), "session.created");
  c.drop();
  EXPECT_TRUE(wait_slots_free(port_));
  // The API key as a Bearer header (or the api_key query parameter, as /api/chat).
  start(1, 3.0, 2.0, "", "", [](ppx::server::ServerOptions& o) { o.api_key = "sekret"; });
  EXPECT_EQ(upgrade_status(port_, target()), 401);
  EXPECT_EQ(upgrade_status(port_, target(), {{"Authorization", "Bearer wrong"}}), 401);
  {
    RtClient k;
    ASSERT_TRUE(k.connect(port_, target(), {{"Authorization", "Bearer sekret"}}));
    k.run([](RtClient&, const RtEvent& e) { return e.type() == "session.created"; }, 5s);
    ASSERT_FALSE(k.events.empty());
    EXPECT_EQ(k.events[0].type(), "session.created");
    k.drop();
  }
  // A browser's way (OpenAI's browser clients cannot set headers): the key and the beta flag as
  // subprotocols; the server selects `realtime`, as a browser requires.
  const Headers browser = {
      {"Sec-WebSocket-Protocol", "realtime, openai-insecure-api-key.sekret , openai-beta.realtime-v1"}};
  EXPECT_TRUE(wait_slots_free(port_));
  {
    const auto res = upgrade_response(port_, target(), browser);
    EXPECT_EQ(res.result_int(), 101);
    EXPECT_EQ(res[http::field::sec_websocket_protocol], "realtime");
  }
  EXPECT_TRUE(wait_slots_free(port_));
  {  // the same list over two header lines (RFC 9110 5.3)
    const auto res = upgrade_response(port_, target(),
                                      {{"Sec-WebSocket-Protocol", "openai-insecure-api-key.sekret"},
                                       {"Sec-WebSocket-Protocol", "realtime"}});
    EXPECT_EQ(res.result_int(), 101);
    EXPECT_EQ(res[http::field::sec_websocket_protocol], "realtime");
  }
  EXPECT_TRUE(wait_slots_free(port_));
  EXPECT_EQ(upgrade_status(port_, target(), {{"Sec-WebSocket-Protocol", "realtime, openai-insecure-api-key.wrong"}}),
            401);
  {
    RtClient b;
    ASSERT_TRUE(b.connect(port_, target(), browser));
    b.run([](RtClient&, const RtEvent& e) { return e.type() == "session.created"; }, 5s);
    ASSERT_FALSE(b.events.empty());
    EXPECT_EQ(b.events[0].type(), "session.created");
    EXPECT_TRUE(b.events[0].j["session"].contains("modalities")) << b.events[0].j.dump();  // beta shape
    b.drop();
  }
  // Last: a session holds the only slot a moment after its client left (an upgrade gets 503 then).
  EXPECT_TRUE(wait_slots_free(port_));
  EXPECT_EQ(upgrade_status(port_, target("model=m&api_key=sekret")), 101);
  EXPECT_TRUE(wait_slots_free(port_));
}

// A realtime session and an /api/chat session side by side, each unaffected by the other.
TEST_F(RealtimeServerTest, ChatBesideRealtime) {
  start(2, 3.0);
  std::vector<float> speech = user_speech();
  speech.resize(30 * kFrame, 0.f);
  size_t deltas = 0;
  std::thread rt([&] {
    RtClient c;
    ASSERT_TRUE(c.connect(port_, target()));
    c.stream(pcm16(speech), 1920);
    c.run(
        [&](RtClient& cl, const RtEvent& e) {
          if (e.type() == "session.created") cl.send(R"({"type":"session.update","session":{}})");
          if (e.type() == "response.output_audio.delta") ++deltas;
          return deltas >= 28;
        },
        20s);
    EXPECT_EQ(count(c.events, "error"), 0u);
    c.drop();
  });
  Client chat_client;
  ASSERT_TRUE(chat_client.connect(port_, chat()));
  const Exchange ex = chat_client.run(
      audio_messages(speech), 80ms, [&](const Exchange& e) { return e.audio_msgs >= 30 + 2; }, 20s);
  rt.join();
  EXPECT_TRUE(ex.handshake);
  EXPECT_TRUE(ex.errors.empty());
  EXPECT_EQ(ex.audio_msgs, 30 + 2);
  EXPECT_GE(deltas, 28u);
  chat_client.drop();
  EXPECT_TRUE(wait_slots_free(port_));
  expect_healthy();
}

TEST(RealtimeEvents, Base64RoundTripAndStrictness) {
  using ppx::server::realtime::base64_decode;
  using ppx::server::realtime::base64_encode;
  for (size_t n = 0; n < 10; ++n) {
    std::vector<uint8_t> b;
    for (size_t i = 0; i < n; ++i) b.push_back(static_cast<uint8_t>(i * 37 + 250));
    const std::string s = base64_encode(b.data(), b.size());
    EXPECT_EQ(s.size() % 4, 0u);
    EXPECT_EQ(base64_decode(s), b) << s;
  }
  EXPECT_EQ(base64_encode(reinterpret_cast<const uint8_t*>("foob"), 4), "Zm9vYg==");
  for (const char* bad : {"Zm9", "Zm9v!A==", "Z===", "Zm==Zm9v", "Zm9vYg=a"})
    EXPECT_FALSE(base64_decode(bad)) << bad;
}

}  // namespace
