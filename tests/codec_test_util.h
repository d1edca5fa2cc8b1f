// The codec scheduler's check, shared by the CPU and CUDA tests: sessions that run their codec
// frames through a CodecScheduler (batched with each other, joining and leaving at different
// times) get exactly the codes and audio their own CodecStream gives them alone.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "ppx/backend.h"
#include "engine/codec_scheduler.h"
#include "ppx/conversation.h"

namespace ppx::test {

// One session's codec script: `frames` frames of its own signal; each frame is encoded, and the
// codes of the frame before (the first frame: its own) are decoded, as a conversation decodes the
// model's codes a frame behind the input.
struct CodecScript {
  int frames = 0;
  std::vector<float> pcm;  // [frames][fs]
};

inline CodecScript codec_script(int index, int fs) {
  CodecScript s;
  s.frames = 3 + index % 4;
  s.pcm.resize(static_cast<size_t>(s.frames) * fs);
  for (size_t i = 0; i < s.pcm.size(); ++i) {
    const float t = static_cast<float>(i);
    s.pcm[i] = 0.3f * std::sin((0.021f + 0.0037f * index) * t) * std::sin(0.0009f * t + index) +
               0.04f * std::sin(0.29f * t + 0.5f * index);
  }
  return s;
}

// Codes then PCM of every frame, in order.
struct CodecRun {
  std::vector<int32_t> codes;
  std::vector<float> pcm;
};

inline CodecRun play_codec(CodecStream& c, const CodecScript& s) {
  const int fs = c.frame_samples(), nq = c.num_codebooks();
  CodecRun r;
  std::vector<int32_t> codes(nq), prev(nq);
  std::vector<float> out(fs);
  for (int f = 0; f < s.frames; ++f) {
    c.encode(s.pcm.data() + static_cast<size_t>(f) * fs, codes.data());
    if (f == 0) prev = codes;
    c.decode(prev.data(), out.data());
    r.codes.insert(r.codes.end(), codes.begin(), codes.end());
    r.pcm.insert(r.pcm.end(), out.begin(), out.end());
    prev = codes;
  }
  return r;
}

// `slots` slots and 2 x slots sessions: session i runs in slot i % slots (the second round reuses
// the slots as the first leaves). Alone: each session on a fresh codec_stream(). Batched: one
// thread per slot through one CodecScheduler.
inline void codec_batched_equals_alone(ModelBackend& backend, int slots) {
  const int fs = backend.codec_stream(0)->frame_samples();
  const int sessions = 2 * slots;
  std::vector<CodecScript> scripts;
  for (int i = 0; i < sessions; ++i) scripts.push_back(codec_script(i, fs));
  std::vector<CodecRun> alone(sessions), batched(sessions);
  for (int i = 0; i < sessions; ++i) {
    auto c = backend.codec_stream(i % slots);
    c->reset();
    alone[static_cast<size_t>(i)] = play_codec(*c, scripts[static_cast<size_t>(i)]);
  }
  {
    CodecScheduler sched(backend.codec_batch(slots));
    std::vector<std::thread> threads;
    for (int slot = 0; slot < slots; ++slot) {
      threads.emplace_back([&, slot] {
        backend.attach_thread();
        std::this_thread::sleep_for(std::chrono::microseconds(300 * (slot % 5)));
        for (int i = slot; i < sessions; i += slots) {
          auto c = sched.open(slot);
          batched[static_cast<size_t>(i)] = play_codec(*c, scripts[static_cast<size_t>(i)]);
        }
      });
    }
    for (auto& t : threads) t.join();
    const CodecScheduler::Totals t = sched.totals();
    EXPECT_GE(t.encodes, sessions * 3);
    ::testing::Test::RecordProperty("max_encodes_per_pass", t.max_encodes);
    ::testing::Test::RecordProperty("passes", static_cast<int>(t.passes));
  }
  for (int i = 0; i < sessions; ++i) {
    EXPECT_EQ(batched[static_cast<size_t>(i)].codes, alone[static_cast<size_t>(i)].codes) << "session " << i;
    EXPECT_EQ(batched[static_cast<size_t>(i)].pcm, alone[static_cast<size_t>(i)].pcm) << "session " << i;
  }
  // Different sessions got different codes, else the comparison proves little.
  EXPECT_NE(alone[0].codes, alone[1].codes);
}

}  // namespace ppx::test
