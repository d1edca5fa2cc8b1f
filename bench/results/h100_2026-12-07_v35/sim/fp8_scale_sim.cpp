// Host simulation of the fp8 KV cache's scale schemes (session 41, not part of the build):
//   A: scale = largest |x| / 448 (fp32; shipped until v0.34)
//   B: scale = the smallest power of two with largest / scale <= 448 (one byte; v0.35)
//   C: scale = the smallest 2^(k/4) with largest / scale <= 448 (a quarter-power variant, not built)
// Mode "test [seed offset]": CudaLmAttention.Fp8CacheMatchesBf16Cache's data (fill_random_bf16's
// hash, RoPE, bf16 rounding, 20x rows every 7th position), fp64 attention over the bf16 cache and
// over each quantized cache, rel L2 of the (bf16-rounded) outputs at positions 49, 99, 149, 199.
// Mode "rms": the rel rms rounding error of 128-value rows (uniform and normal, magnitudes spread
// over 2^-10..2^10) under A, B and C.
// Build: g++ -O2 -o fp8_scale_sim fp8_scale_sim.cpp
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

static uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static float bf(float x) {  // round to bf16, nearest even
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u = (u + ((u >> 16) & 1) + 0x7fff) & 0xffff0000u;
  float y;
  std::memcpy(&y, &u, 4);
  return y;
}
static float e4m3(float x) {  // round to e4m3, nearest even, saturating at 448
  const float a = std::fabs(x);
  if (a == 0) return 0;
  if (a >= 448) return std::copysign(448.f, x);
  const int e = std::max(-6, static_cast<int>(std::floor(std::log2(a))));
  const double q = std::ldexp(1.0, e - 3);
  return std::copysign(static_cast<float>(std::min(448.0, std::nearbyint(a / q) * q)), x);
}
static void scales(float mx, float s[3]) {
  s[0] = s[1] = s[2] = 1.f;
  if (!(mx > 0)) return;
  s[0] = mx / 448.f;
  int E;
  const float f = std::frexp(mx, &E);
  s[1] = std::ldexp(1.f, E - 9 + (f > 0.875f ? 1 : 0));
  const int k = static_cast<int>(std::ceil(4.0 * std::log2(mx / 448.0)));
  s[2] = std::exp2(k / 4.f);
  if (mx / s[2] > 448.f) s[2] = std::exp2((k + 1) / 4.f);
}

static int test_mode(uint64_t off) {
  const int H = 4, hd = 128, D = H * hd, steps = 200;
  const double c = -2.0 * std::log(10000.0) / hd;
  std::vector<float> Q(steps * D), K(steps * D), V(steps * D);
  std::vector<std::vector<float>> KQ(3, std::vector<float>(steps * D)), VQ(KQ);
  double worst[3] = {0, 0, 0};
  for (int t = 0; t < steps; ++t) {
    std::vector<float> qkv(3 * D);
    const float sc = t % 7 == 0 ? 20.f : 1.f;
    for (int i = 0; i < 3 * D; ++i) {
      const uint64_t h = mix64(100 + t + off + static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ull);
      qkv[i] = bf(sc * (static_cast<float>(h >> 40) * (1.0f / 8388608.0f) - 1.0f));
    }
    for (int p = 0; p < D / 2; ++p) {
      const int e = 2 * p, i = p % (hd / 2);
      const float th = t * std::exp(i * static_cast<float>(c)), cs = std::cos(th), sn = std::sin(th);
      Q[t * D + e] = bf(qkv[e] * cs - qkv[e + 1] * sn);
      Q[t * D + e + 1] = bf(qkv[e] * sn + qkv[e + 1] * cs);
      K[t * D + e] = bf(qkv[D + e] * cs - qkv[D + e + 1] * sn);
      K[t * D + e + 1] = bf(qkv[D + e] * sn + qkv[D + e + 1] * cs);
      V[t * D + e] = qkv[2 * D + e];
      V[t * D + e + 1] = qkv[2 * D + e + 1];
    }
    for (int h = 0; h < H; ++h)
      for (int w = 0; w < 2; ++w) {
        const float* src = (w ? V : K).data() + t * D + h * hd;
        float mx = 0, s[3];
        for (int j = 0; j < hd; ++j) mx = std::max(mx, std::fabs(src[j]));
        scales(mx, s);
        for (int m = 0; m < 3; ++m)
          for (int j = 0; j < hd; ++j) (w ? VQ : KQ)[m][t * D + h * hd + j] = e4m3(src[j] / s[m]) * s[m];
      }
    if (t % 50 != 49) continue;
    auto att = [&](const std::vector<float>& KK, const std::vector<float>& VV) {
      std::vector<double> o(D, 0.0);
      for (int h = 0; h < H; ++h) {
        std::vector<double> s(t + 1);
        double m = -1e300, l = 0;
        for (int k = 0; k <= t; ++k) {
          double d = 0;
          for (int j = 0; j < hd; ++j) d += static_cast<double>(Q[t * D + h * hd + j]) * KK[k * D + h * hd + j];
          s[k] = d / std::sqrt(128.0);
          m = std::max(m, s[k]);
        }
        for (int k = 0; k <= t; ++k) {
          const double p = std::exp(s[k] - m);
          l += p;
          for (int j = 0; j < hd; ++j) o[h * hd + j] += p * VV[k * D + h * hd + j];
        }
        for (int j = 0; j < hd; ++j) o[h * hd + j] /= l;
      }
      return o;
    };
    const std::vector<double> o = att(K, V);
    std::printf("t=%d", t);
    for (int m = 0; m < 3; ++m) {
      const std::vector<double> om = att(KQ[m], VQ[m]);
      double n = 0, e = 0;
      for (int i = 0; i < D; ++i) {
        const double r = bf(static_cast<float>(o[i])), g = bf(static_cast<float>(om[i]));
        n += r * r;
        e += (g - r) * (g - r);
      }
      std::printf(" %c %.4f", "ABC"[m], std::sqrt(e / n));
      worst[m] = std::max(worst[m], std::sqrt(e / n));
    }
    std::printf("\n");
  }
  std::printf("worst A %.4f B %.4f C %.4f\n", worst[0], worst[1], worst[2]);
  return 0;
}

static int rms_mode() {
  std::mt19937_64 g(1);
  std::uniform_real_distribution<float> U(-1, 1);
  std::normal_distribution<float> N(0, 1);
  for (int dist = 0; dist < 2; ++dist) {
    double e[3] = {0, 0, 0}, n = 0;
    for (int it = 0; it < 20000; ++it) {
      float x[128], mx = 0, s[3];
      const float sc = std::exp2(U(g) * 10);
      for (float& v : x) {
        v = (dist ? N(g) : U(g)) * sc;
        mx = std::max(mx, std::fabs(v));
      }
      scales(mx, s);
      for (const float v : x) {
        for (int m = 0; m < 3; ++m) e[m] += std::pow(e4m3(v / s[m]) * s[m] - v, 2.0);
        n += static_cast<double>(v) * v;
      }
    }
    std::printf("%s rows: rel rms A %.4f B %.4f C %.4f\n", dist ? "normal" : "uniform", std::sqrt(e[0] / n),
                std::sqrt(e[1] / n), std::sqrt(e[2] / n));
  }
  return 0;
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "test";
  if (mode == "rms") return rms_mode();
  return test_mode(argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 0);
}
