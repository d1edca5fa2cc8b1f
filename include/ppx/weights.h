// Where model weights come from: a checkpoint file (upstream key names) or a deterministic random
// generator (full-size models for benchmarks, no checkpoint needed). Models ask for each tensor by
// key and expected shape; a source either returns fp32 values or throws ppx::Error naming the key.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ppx {

class SafeTensors;

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // Values of `key` converted to fp32; the stored shape must equal `shape`.
  virtual std::vector<float> load(const std::string& key, const std::vector<int64_t>& shape) = 0;
  // Checks that `key` exists with `shape` without reading it (stored but unused tensors).
  virtual void require(const std::string& key, const std::vector<int64_t>& shape) = 0;
  // Every (key, shape) asked for so far, in order.
  const std::vector<std::pair<std::string, std::vector<int64_t>>>& requested() const { return requested_; }

 protected:
  void note(const std::string& key, const std::vector<int64_t>& shape) { requested_.emplace_back(key, shape); }

 private:
  std::vector<std::pair<std::string, std::vector<int64_t>>> requested_;
};

class FileWeights : public WeightSource {
 public:
  // `prefix` is prepended to every key (empty for the upstream files).
  explicit FileWeights(std::shared_ptr<const SafeTensors> file, std::string prefix = "");
  std::vector<float> load(const std::string& key, const std::vector<int64_t>& shape) override;
  void require(const std::string& key, const std::vector<int64_t>& shape) override;
  const SafeTensors& file() const { return *file_; }

 private:
  std::shared_ptr<const SafeTensors> file_;
  std::string prefix_;
};

// Deterministic pseudo-random weights with the statistics of a trained model's initialisation:
// matrices uniform in +-1/sqrt(fan_in), norm weights 1, biases and norm offsets small, layer
// scales `layer_scale`, codebook usages 1. The key decides the kind, so the same key always gets the
// same values for a given seed.
class RandomWeights : public WeightSource {
 public:
  explicit RandomWeights(uint64_t seed, float layer_scale = 0.01f) : seed_(seed), layer_scale_(layer_scale) {}
  std::vector<float> load(const std::string& key, const std::vector<int64_t>& shape) override;
  void require(const std::string& key, const std::vector<int64_t>& shape) override { note(key, shape); }

 private:
  uint64_t seed_;
  float layer_scale_;
};

}  // namespace ppx
