// libFuzzer target: the client audio path, ppx::OggOpusReader (public API only).
// Input layout: byte 0 picks the output rate (low 2 bits) and seeds the chunk sizes; the rest is
// the byte stream, pushed in chunks of 1..4096 bytes. Decoded PCM is read back with take() and
// read(), as a session would, and must be finite.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "ppx/error.h"
#include "ppx/ogg_opus.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  static constexpr int kRates[] = {24000, 16000, 48000, 8000};
  uint32_t state = 0x9E3779B9u ^ data[0];
  auto next = [&state] {  // xorshift32
    state ^= state << 13;
    state ^= state >> 17;
    state ^= state << 5;
    return state;
  };
  ppx::OggOpusReader reader(kRates[data[0] & 3]);
  const uint8_t* p = data + 1;
  size_t left = size - 1;
  std::vector<float> pcm;
  while (left > 0) {
    // Mostly small chunks (the browser sends one page per message), sometimes large ones.
    const uint32_t r = next();
    size_t n = (r & 7) == 0 ? 1 + (r >> 8) % 4096 : 1 + (r >> 8) % 300;
    if (n > left) n = left;
    reader.push(p, n);
    p += n;
    left -= n;
    if (reader.available() >= 1920) {
      const std::vector<float> frame = reader.take(1920);
      if (frame.size() != 1920) std::abort();
      for (float x : frame) {
        if (!std::isfinite(x)) std::abort();
      }
    }
    if (reader.failed() && reader.error().empty()) std::abort();
  }
  const size_t waiting = reader.available();
  if (reader.read(pcm) != waiting || reader.available() != 0) std::abort();
  for (float x : pcm) {
    if (!std::isfinite(x)) std::abort();
  }
  return 0;
}
