#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>
#include "ppx/ogg_opus.h"
int main() {
  const int fs = 1920, frames = 500;
  std::vector<float> pcm(fs * frames);
  for (size_t i = 0; i < pcm.size(); ++i) pcm[i] = 0.3f * std::sin(0.013f * i) + 0.05f * std::sin(0.37f * i * i * 1e-5f);
  ppx::OggOpusWriter w(24000);
  std::vector<std::vector<uint8_t>> pages{w.head_page(), w.tags_page()};
  auto t0 = std::chrono::steady_clock::now();
  for (int f = 0; f < frames; ++f) pages.push_back(w.encode_frame(pcm.data() + f * fs, fs));
  auto t1 = std::chrono::steady_clock::now();
  ppx::OggOpusReader r(24000);
  std::vector<float> out;
  size_t got = 0;
  for (auto& p : pages) { r.push(p.data(), p.size()); got += r.read(out); }
  auto t2 = std::chrono::steady_clock::now();
  std::printf("encode %.3f ms/frame, decode %.3f ms/frame (%zu samples)\n",
              std::chrono::duration<double, std::milli>(t1 - t0).count() / frames,
              std::chrono::duration<double, std::milli>(t2 - t1).count() / frames, got);
}
