// partrain/core/half.hpp: 16-bit float storage types for the host (IEEE binary16 and
// bfloat16). Conversions from float round to nearest, ties to even; NaN stays NaN.
#pragma once

#include <bit>
#include <cstdint>

#include <partrain/config.hpp>

namespace partrain::inline v0 {

namespace detail {

[[nodiscard]] constexpr std::uint16_t float_to_half_bits(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  std::uint32_t abs = x & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) {  // inf or NaN; NaN keeps its top payload bits and is made quiet
    return static_cast<std::uint16_t>(sign | 0x7C00u | (abs > 0x7F800000u ? 0x0200u | ((abs >> 13) & 0x3FFu) : 0u));
  }
  if (abs >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // >= 65520 rounds to inf
  if (abs < 0x38800000u) {
    // Below 2^-14: a half subnormal. Adding 0.5 puts the 2^-24 unit in the float's last
    // mantissa bit, so the FPU's own round-to-nearest-even does the rounding.
    const float shifted = std::bit_cast<float>(abs) + 0.5f;
    return static_cast<std::uint16_t>(sign | (std::bit_cast<std::uint32_t>(shifted) - 0x3F000000u));
  }
  const std::uint32_t odd = (abs >> 13) & 1u;
  abs += 0xC8000FFFu + odd;  // rebias exponent by -112 and add the rounding bias
  return static_cast<std::uint16_t>(sign | (abs >> 13));
}

[[nodiscard]] constexpr float half_bits_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1Fu;
  const std::uint32_t mant = h & 0x3FFu;
  if (exp == 0) {
    const float mag = static_cast<float>(mant) * 5.9604644775390625e-8f;  // mant * 2^-24, exact
    return std::bit_cast<float>(sign | std::bit_cast<std::uint32_t>(mag));
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7F800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

[[nodiscard]] constexpr std::uint16_t float_to_bfloat16_bits(float f) noexcept {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((x >> 16) | 0x0040u);  // quiet NaN
  const std::uint32_t bias = 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>((x + bias) >> 16);
}

[[nodiscard]] constexpr float bfloat16_bits_to_float(std::uint16_t b) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

}  // namespace detail

// IEEE 754 binary16. Arithmetic goes through float (storage type, as on the host in PyTorch).
struct half {
  std::uint16_t bits = 0;

  constexpr half() noexcept = default;
  constexpr explicit half(float f) noexcept : bits(detail::float_to_half_bits(f)) {}
  [[nodiscard]] static constexpr half from_bits(std::uint16_t b) noexcept {
    half h;
    h.bits = b;
    return h;
  }
  constexpr explicit operator float() const noexcept { return detail::half_bits_to_float(bits); }
  friend constexpr bool operator==(half a, half b) noexcept { return float(a) == float(b); }
};

// bfloat16: float's exponent range with 8 bits of mantissa.
struct bfloat16 {
  std::uint16_t bits = 0;

  constexpr bfloat16() noexcept = default;
  constexpr explicit bfloat16(float f) noexcept : bits(detail::float_to_bfloat16_bits(f)) {}
  [[nodiscard]] static constexpr bfloat16 from_bits(std::uint16_t b) noexcept {
    bfloat16 h;
    h.bits = b;
    return h;
  }
  constexpr explicit operator float() const noexcept { return detail::bfloat16_bits_to_float(bits); }
  friend constexpr bool operator==(bfloat16 a, bfloat16 b) noexcept { return float(a) == float(b); }
};

static_assert(sizeof(half) == 2 && sizeof(bfloat16) == 2);

}  // namespace partrain::inline v0
