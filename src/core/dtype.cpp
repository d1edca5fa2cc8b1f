#include "ppx/dtype.h"

#include <cmath>

namespace ppx {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kI64: return 8;
    case DType::kI32: return 4;
    case DType::kU8: return 1;
    case DType::kBool: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kI64: return "I64";
    case DType::kI32: return "I32";
    case DType::kU8: return "U8";
    case DType::kBool: return "BOOL";
  }
  return "?";
}

bool parse_dtype(const std::string& s, DType* out) {
  static const struct { const char* name; DType t; } kTable[] = {
      {"F32", DType::kF32}, {"F16", DType::kF16}, {"BF16", DType::kBF16}, {"I64", DType::kI64},
      {"I32", DType::kI32}, {"U8", DType::kU8},   {"BOOL", DType::kBool}};
  for (const auto& e : kTable) {
    if (s == e.name) {
      *out = e.t;
      return true;
    }
  }
  return false;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1u, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(man), -24);  // subnormal or zero
  } else if (exp == 31) {
    v = man ? NAN : INFINITY;
  } else {
    v = std::ldexp(static_cast<float>(man | 0x400u), static_cast<int>(exp) - 25);
  }
  return sign ? -v : v;
}

}  // namespace ppx
