#include "ppx/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "ppx/error.h"

namespace ppx {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the format's own limit is 100 MB
constexpr int kMaxRank = 8;

bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) {
  return __builtin_mul_overflow(a, b, out);
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

void SafeTensors::fail(const std::string& what) const {
  throw Error("safetensors file '" + path_ + "': " + what);
}

SafeTensors::SafeTensors(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) fail(std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0) fail(std::string("cannot stat: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail("not a regular file");
  file_size_ = static_cast<uint64_t>(st.st_size);
  if (file_size_ < 8) fail("file is " + std::to_string(file_size_) + " bytes, too short for a header");
  void* m = ::mmap(nullptr, file_size_, PROT_READ, MAP_PRIVATE, fd_, 0);
  if (m == MAP_FAILED) fail(std::string("mmap failed: ") + std::strerror(errno));
  map_ = static_cast<const uint8_t*>(m);

  uint64_t header_len = 0;
  std::memcpy(&header_len, map_, 8);  // little-endian hosts only (x86-64, aarch64)
  if (header_len > kMaxHeaderBytes) fail("header length " + std::to_string(header_len) + " is too large");
  if (header_len > file_size_ - 8) {
    fail("header length " + std::to_string(header_len) + " exceeds the file size " +
         std::to_string(file_size_) + " (truncated file?)");
  }
  data_start_ = 8 + header_len;
  const uint64_t data_size = file_size_ - data_start_;

  nlohmann::json header;
  try {
    header = nlohmann::json::parse(map_ + 8, map_ + 8 + header_len);
  } catch (const std::exception& e) {
    fail(std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) fail("header is not a JSON object");

  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const auto& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) fail("__metadata__ is not an object");
      for (auto m2 = v.begin(); m2 != v.end(); ++m2) {
        if (m2.value().is_string()) metadata_[m2.key()] = m2.value().get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor '" + name + "': ";
    if (!v.is_object()) fail(where + "entry is not an object");
    if (!v.contains("dtype") || !v["dtype"].is_string()) fail(where + "missing dtype");
    if (!v.contains("shape") || !v["shape"].is_array()) fail(where + "missing shape");
    if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2)
      fail(where + "missing or malformed data_offsets");
    TensorInfo ti;
    const std::string dt = v["dtype"].get<std::string>();
    if (!parse_dtype(dt, &ti.dtype)) fail(where + "unsupported dtype '" + dt + "'");
    if (v["shape"].size() > kMaxRank) fail(where + "rank above " + std::to_string(kMaxRank));
    uint64_t numel = 1;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) fail(where + "shape has a bad dimension");
      const uint64_t dim = d.get<uint64_t>();
      if (mul_overflows(numel, dim, &numel)) fail(where + "shape overflows");
      ti.shape.push_back(static_cast<int64_t>(dim));
    }
    const auto& off = v["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      fail(where + "data_offsets are not non-negative integers");
    const uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
    if (b > e) fail(where + "data_offsets begin after they end");
    if (e > data_size) {
      fail(where + "data ends at byte " + std::to_string(e) + " of a " + std::to_string(data_size) +
           "-byte data section (truncated file?)");
    }
    uint64_t expected = 0;
    if (mul_overflows(numel, dtype_size(ti.dtype), &expected) || expected != e - b) {
      fail(where + "holds " + std::to_string(e - b) + " bytes but dtype " + dt + " and shape " +
           shape_str(ti.shape) + " need " + std::to_string(expected));
    }
    ti.begin = b;
    ti.nbytes = e - b;
    if (ti.nbytes) ranges.emplace_back(b, e);
    tensors_.emplace(name, std::move(ti));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) fail("two tensors overlap in the data section");
  }
}

SafeTensors::~SafeTensors() {
  if (map_) ::munmap(const_cast<uint8_t*>(map_), file_size_);
  if (fd_ >= 0) ::close(fd_);
}

const TensorInfo& SafeTensors::info(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) fail("missing tensor '" + name + "'");
  return it->second;
}

const uint8_t* SafeTensors::data(const std::string& name) const {
  return map_ + data_start_ + info(name).begin;
}

std::vector<float> SafeTensors::to_f32(const std::string& name) const {
  const TensorInfo& ti = info(name);
  const uint8_t* p = data(name);
  const size_t n = static_cast<size_t>(ti.numel());
  std::vector<float> out(n);
  switch (ti.dtype) {
    case DType::kF32:
      if (n > 0) std::memcpy(out.data(), p, n * 4);  // memcpy(nullptr, ...) is UB even for 0 bytes
      break;
    case DType::kBF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = bf16_to_f32(h);
      }
      break;
    case DType::kF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = f16_to_f32(h);
      }
      break;
    default:
      fail("tensor '" + name + "' has dtype " + dtype_name(ti.dtype) + ", expected a float dtype");
  }
  return out;
}

std::vector<float> SafeTensors::to_f32(const std::string& name,
                                       const std::vector<int64_t>& shape) const {
  const TensorInfo& ti = info(name);
  if (ti.shape != shape) {
    fail("tensor '" + name + "' has shape " + shape_str(ti.shape) + ", expected " + shape_str(shape));
  }
  return to_f32(name);
}

std::vector<int64_t> SafeTensors::to_i64(const std::string& name) const {
  const TensorInfo& ti = info(name);
  const uint8_t* p = data(name);
  const size_t n = static_cast<size_t>(ti.numel());
  std::vector<int64_t> out(n);
  for (size_t i = 0; i < n; ++i) {
    switch (ti.dtype) {
      case DType::kI64: std::memcpy(&out[i], p + 8 * i, 8); break;
      case DType::kI32: {
        int32_t v;
        std::memcpy(&v, p + 4 * i, 4);
        out[i] = v;
        break;
      }
      case DType::kU8:
      case DType::kBool: out[i] = p[i]; break;
      default:
        fail("tensor '" + name + "' has dtype " + dtype_name(ti.dtype) + ", expected an integer dtype");
    }
  }
  return out;
}

}  // namespace ppx

namespace ppx {

TensorBlob blob_f32(const std::vector<int64_t>& shape, const std::vector<float>& v) {
  TensorBlob b{DType::kF32, shape, std::vector<uint8_t>(v.size() * 4)};
  if (!v.empty()) std::memcpy(b.bytes.data(), v.data(), b.bytes.size());
  return b;
}

TensorBlob blob_bf16(const std::vector<int64_t>& shape, const std::vector<float>& v) {
  TensorBlob b{DType::kBF16, shape, std::vector<uint8_t>(v.size() * 2)};
  for (size_t i = 0; i < v.size(); ++i) {
    const uint16_t h = f32_to_bf16(v[i]);
    std::memcpy(b.bytes.data() + 2 * i, &h, 2);
  }
  return b;
}

TensorBlob blob_i64(const std::vector<int64_t>& shape, const std::vector<int64_t>& v) {
  TensorBlob b{DType::kI64, shape, std::vector<uint8_t>(v.size() * 8)};
  if (!v.empty()) std::memcpy(b.bytes.data(), v.data(), b.bytes.size());
  return b;
}

void write_safetensors(const std::string& path, const std::map<std::string, TensorBlob>& tensors) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  uint64_t off = 0;
  for (const auto& [name, t] : tensors) {
    h[name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {off, off + t.bytes.size()}}};
    off += t.bytes.size();
  }
  std::string header = h.dump();
  while ((header.size() + 8) % 8 != 0) header.push_back(' ');
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw Error("cannot write '" + path + "': " + std::strerror(errno));
  const uint64_t n = header.size();
  bool ok = std::fwrite(&n, 8, 1, f) == 1 && std::fwrite(header.data(), 1, n, f) == n;
  for (const auto& [name, t] : tensors) {
    ok = ok && (t.bytes.empty() || std::fwrite(t.bytes.data(), 1, t.bytes.size(), f) == t.bytes.size());
  }
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) throw Error("cannot write '" + path + "': write failed");
}

}  // namespace ppx
