// tests/cpu_tier/reference_16.hpp: float <-> binary16/bfloat16 written case by case in double
// arithmetic (round to nearest even by std::nearbyint in the default rounding mode): the
// reference the CPU tier compares core/half.hpp's branch-free conversion with.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace tier::ref {

inline std::uint16_t float_to_half(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((x >> 16) & 0x8000u);
  if (std::isnan(f)) return static_cast<std::uint16_t>(sign | 0x7E00u | ((x >> 13) & 0x3FFu));  // quiet, top payload
  const double a = std::fabs(static_cast<double>(f));
  if (a >= 65520.0) return static_cast<std::uint16_t>(sign | 0x7C00u);  // halfway above 65504 rounds to inf
  if (a < std::ldexp(1.0, -14)) {  // subnormal: a multiple of 2^-24 (1024 of them is the smallest normal)
    return static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(std::nearbyint(std::ldexp(a, 24))));
  }
  int e = 0;
  const double m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  double q = std::nearbyint(std::ldexp(m, 11));  // 1024..2048 steps of the 11-bit significand
  if (q == 2048) q = 1024, ++e;
  const int biased = e - 1 + 15;
  if (biased >= 31) return static_cast<std::uint16_t>(sign | 0x7C00u);
  return static_cast<std::uint16_t>(sign | (biased << 10) | (static_cast<int>(q) - 1024));
}

inline float half_to_float(std::uint16_t h) {
  const double s = (h & 0x8000u) ? -1.0 : 1.0;
  const int e = (h >> 10) & 0x1F;
  const int m = h & 0x3FF;
  if (e == 31) {
    if (m == 0) return static_cast<float>(s * INFINITY);
    return std::bit_cast<float>((static_cast<std::uint32_t>(h & 0x8000u) << 16) | 0x7F800000u |
                                (static_cast<std::uint32_t>(m) << 13));
  }
  if (e == 0) return static_cast<float>(s * std::ldexp(m, -24));
  return static_cast<float>(s * std::ldexp(1024 + m, e - 25));
}

inline std::uint16_t float_to_bfloat16(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if (std::isnan(f)) return static_cast<std::uint16_t>((x >> 16) | 0x0040u);
  if (std::isinf(f) || f == 0.0f) return static_cast<std::uint16_t>(x >> 16);
  const double a = std::fabs(static_cast<double>(f));
  double r = 0;
  if (a < std::ldexp(1.0, -126)) {
    r = std::ldexp(std::nearbyint(std::ldexp(a, 133)), -133);  // bfloat16 subnormals: steps of 2^-133
  } else {
    int e = 0;
    const double m = std::frexp(a, &e);
    r = std::ldexp(std::nearbyint(std::ldexp(m, 8)), e - 8);  // 8 significant bits
  }
  const float rf = r > 3.3895313892515355e38 ? INFINITY : static_cast<float>(r);  // above bf16's max: inf
  return static_cast<std::uint16_t>(((x >> 16) & 0x8000u) | (std::bit_cast<std::uint32_t>(rf) >> 16));
}

inline float bfloat16_to_float(std::uint16_t b) { return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16); }

}  // namespace tier::ref
