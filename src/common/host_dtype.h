// Host-side element access for TensorViews of any float dtype: read as double, round into the
// view's dtype on store (round-to-nearest-even, as the GPU's conversions do).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "turbopairformer/tensor.h"

namespace tpf::detail {

inline float bf16_bits_to_float(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t float_to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float fp16_bits_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ffu;
  float mag;
  if (exp == 0) mag = std::ldexp(static_cast<float>(mant), -24);
  else if (exp == 31) mag = mant ? NAN : INFINITY;
  else mag = std::ldexp(static_cast<float>(mant | 0x400u), static_cast<int>(exp) - 25);
  uint32_t u;
  std::memcpy(&u, &mag, 4);
  u |= sign;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t float_to_fp16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const float a = std::fabs(f);
  if (std::isnan(f)) return sign | 0x7e00u;
  if (a >= 65520.0f) return sign | 0x7c00u;  // rounds to inf
  if (a < 6.103515625e-05f) {                // subnormal: quantum 2^-24, rint is RNE
    return sign | static_cast<uint16_t>(std::nearbyint(std::ldexp(a, 24)));
  }
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5,1)
  const float q = std::ldexp(1.0f, e - 11);    // quantum of the binade
  const float r = std::nearbyint(a / q) * q;   // RNE to 11 significant bits
  int e2;
  const float m2 = std::frexp(r, &e2);
  const uint32_t mant = static_cast<uint32_t>(std::ldexp(m2, 11)) & 0x3ffu;
  return sign | static_cast<uint16_t>(((e2 + 14) << 10) | mant);
}

inline double load(const TensorView& t, int64_t off) {
  switch (t.dtype) {
    case DType::kBF16: return bf16_bits_to_float(static_cast<const uint16_t*>(t.data)[off]);
    case DType::kFP16: return fp16_bits_to_float(static_cast<const uint16_t*>(t.data)[off]);
    case DType::kFP32: return static_cast<const float*>(t.data)[off];
    case DType::kFP64: return static_cast<const double*>(t.data)[off];
    case DType::kBool: return static_cast<const uint8_t*>(t.data)[off] ? 1.0 : 0.0;
  }
  return 0.0;
}

// The value `v` becomes once stored in dtype `d`.
inline double round_to(DType d, double v) {
  switch (d) {
    case DType::kBF16: return bf16_bits_to_float(float_to_bf16_bits(static_cast<float>(v)));
    case DType::kFP16: return fp16_bits_to_float(float_to_fp16_bits(static_cast<float>(v)));
    case DType::kFP32: return static_cast<float>(v);
    default: return v;
  }
}

inline void store(const TensorView& t, int64_t off, double v) {
  switch (t.dtype) {
    case DType::kBF16:
      static_cast<uint16_t*>(t.data)[off] = float_to_bf16_bits(static_cast<float>(v));
      break;
    case DType::kFP16:
      static_cast<uint16_t*>(t.data)[off] = float_to_fp16_bits(static_cast<float>(v));
      break;
    case DType::kFP32: static_cast<float*>(t.data)[off] = static_cast<float>(v); break;
    case DType::kFP64: static_cast<double*>(t.data)[off] = v; break;
    case DType::kBool: static_cast<uint8_t*>(t.data)[off] = v != 0.0; break;
  }
}

}  // namespace tpf::detail
