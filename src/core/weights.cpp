#include "ppx/weights.h"

#include <cmath>

#include "ppx/error.h"
#include "ppx/safetensors.h"

namespace ppx {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// splitmix64: small, fast, good enough for weights.
struct SplitMix {
  uint64_t x;
  uint64_t next() {
    uint64_t z = (x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float uniform() { return static_cast<float>((next() >> 40) * (1.0 / 16777216.0)) * 2.f - 1.f; }
};

}  // namespace

FileWeights::FileWeights(std::shared_ptr<const SafeTensors> file, std::string prefix)
    : file_(std::move(file)), prefix_(std::move(prefix)) {}

std::vector<float> FileWeights::load(const std::string& key, const std::vector<int64_t>& shape) {
  note(key, shape);
  return file_->to_f32(prefix_ + key, shape);
}

void FileWeights::require(const std::string& key, const std::vector<int64_t>& shape) {
  note(key, shape);
  const TensorInfo& ti = file_->info(prefix_ + key);
  if (ti.shape != shape) {
    throw Error("safetensors file '" + file_->path() + "': tensor '" + prefix_ + key + "' has shape " +
                shape_str(ti.shape) + ", expected " + shape_str(shape));
  }
}

std::vector<float> RandomWeights::load(const std::string& key, const std::vector<int64_t>& shape) {
  note(key, shape);
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<float> w(static_cast<size_t>(n));
  SplitMix rng{seed_ ^ fnv1a(key)};
  const bool is_norm = key.find("norm") != std::string::npos;
  if (ends_with(key, "alpha") || (is_norm && ends_with(key, ".weight"))) {
    for (auto& v : w) v = 1.f + 0.05f * rng.uniform();
  } else if (ends_with(key, ".scale")) {
    for (auto& v : w) v = layer_scale_;
  } else if (ends_with(key, "cluster_usage") || ends_with(key, "_initialized")) {
    for (auto& v : w) v = 1.f;
  } else if (ends_with(key, ".bias")) {
    for (auto& v : w) v = 0.01f * rng.uniform();
  } else {
    int64_t fan_in = 1;
    for (size_t i = 1; i < shape.size(); ++i) fan_in *= shape[i];
    const float a = shape.size() >= 2 ? 1.f / std::sqrt(static_cast<float>(fan_in)) : 1.f;
    for (auto& v : w) v = a * rng.uniform();
  }
  return w;
}

}  // namespace ppx
