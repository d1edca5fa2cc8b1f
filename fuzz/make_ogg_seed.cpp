// Writes the Ogg seeds of fuzz/corpus/ogg/ (run by hand: make_ogg_seed fuzz/corpus/ogg). Each
// seed starts with the fuzz_ogg_opus control byte (rate and chunking), then an OggOpusWriter
// stream: headers, a few 80 ms frames of a tone, the end-of-stream page.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "ppx/ogg_opus.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_ogg_seed DIR\n");
    return 2;
  }
  const struct {
    int rate;
    uint8_t control;  // low 2 bits pick the reader's rate: 0 24k, 1 16k, 2 48k, 3 8k
    int frames;
  } kSeeds[] = {{24000, 0x00, 3}, {16000, 0x11, 2}, {48000, 0x2a, 1}};
  for (const auto& s : kSeeds) {
    ppx::OggOpusWriter w(s.rate);
    std::vector<uint8_t> out = {s.control};
    auto add = [&out](const std::vector<uint8_t>& b) { out.insert(out.end(), b.begin(), b.end()); };
    add(w.headers());
    std::vector<float> pcm(static_cast<size_t>(w.frame_samples()));
    for (int f = 0; f < s.frames; ++f) {
      for (size_t i = 0; i < pcm.size(); ++i) {
        pcm[i] = 0.3f * std::sin(2.0f * 3.14159265f * 440.0f * static_cast<float>(i) /
                                  static_cast<float>(s.rate));
      }
      add(w.encode_frame(pcm.data(), w.frame_samples()));
    }
    add(w.finish());
    const std::string path = std::string(argv[1]) + "/writer_" + std::to_string(s.rate) + ".ogg";
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.size()));
    std::printf("%s: %zu bytes\n", path.c_str(), out.size());
  }
  return 0;
}
