// Scalar dtypes of checkpoints and their conversion to fp32 (exact for bf16/fp16).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace ppx {

enum class DType { kF32, kF16, kBF16, kI64, kI32, kU8, kBool };

// Bytes per element.
size_t dtype_size(DType t);
// Safetensors spelling ("F32", "BF16", ...).
const char* dtype_name(DType t);
// Parses a safetensors dtype string; returns false when unknown.
bool parse_dtype(const std::string& s, DType* out);

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round-to-nearest-even, NaN kept quiet.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Rounds an fp32 value to the nearest bf16 value, returned as fp32.
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

float f16_to_f32(uint16_t h);

}  // namespace ppx
