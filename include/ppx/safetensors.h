// Memory-mapped safetensors reader.
//
// The file is mapped read-only; the JSON header is parsed with nlohmann_json and every tensor's
// dtype, shape and data offsets are checked against the file size before any byte is read, so a
// truncated, corrupt or hostile file raises ppx::Error (naming the file and the tensor) instead of
// reading out of bounds. Conversions copy out of the mapping into owned vectors.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ppx/dtype.h"

namespace ppx {

struct TensorInfo {
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin;  // byte offset inside the data section
  uint64_t nbytes;
  int64_t numel() const;
};

class SafeTensors {
 public:
  // Opens and validates `path`. Throws ppx::Error on any problem.
  explicit SafeTensors(const std::string& path);
  ~SafeTensors();
  SafeTensors(const SafeTensors&) = delete;
  SafeTensors& operator=(const SafeTensors&) = delete;

  const std::string& path() const { return path_; }
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const;  // throws when absent
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  // Raw bytes of a tensor inside the mapping (valid while this object lives).
  const uint8_t* data(const std::string& name) const;

  // Converted copies. Floating dtypes convert to float; integer and bool dtypes to int64.
  // Asking a float for an integer tensor (or the reverse) is an error naming the tensor.
  std::vector<float> to_f32(const std::string& name) const;
  std::vector<int64_t> to_i64(const std::string& name) const;
  // As to_f32 but also checks the shape; the message names the tensor and both shapes.
  std::vector<float> to_f32(const std::string& name, const std::vector<int64_t>& shape) const;

 private:
  [[noreturn]] void fail(const std::string& what) const;
  std::string path_;
  int fd_ = -1;
  const uint8_t* map_ = nullptr;
  uint64_t file_size_ = 0;
  uint64_t data_start_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

std::string shape_str(const std::vector<int64_t>& shape);

}  // namespace ppx

namespace ppx {

// One tensor to write: raw little-endian bytes of `dtype` with `shape`.
struct TensorBlob {
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};
TensorBlob blob_f32(const std::vector<int64_t>& shape, const std::vector<float>& v);
TensorBlob blob_bf16(const std::vector<int64_t>& shape, const std::vector<float>& v);  // rounds to nearest even
TensorBlob blob_i64(const std::vector<int64_t>& shape, const std::vector<int64_t>& v);

// Writes a safetensors file (tensors in key order, 8-byte aligned header). Throws ppx::Error.
void write_safetensors(const std::string& path, const std::map<std::string, TensorBlob>& tensors);

}  // namespace ppx
