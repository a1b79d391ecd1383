// partrain/core/half.hpp: 16-bit float storage types (IEEE binary16 and bfloat16). Conversions
// from float round to nearest, ties to even; NaN stays NaN. The one float <-> 16-bit conversion of
// the library: host loops, CUDA kernels (through the element functors) and the CPU tier all call
// these, so the device's results are the host's bit for bit.
#pragma once

#include <cstdint>

#include <partrain/config.hpp>

namespace partrain::inline v0 {

namespace detail {

// std::bit_cast is a host function (nvcc refuses it in device code without
// --expt-relaxed-constexpr); the builtin behind it is callable on both sides.
template <class To, class From>
[[nodiscard]] PARTRAIN_HOST_DEVICE constexpr To bits_as(From f) noexcept {
  return __builtin_bit_cast(To, f);
}

// The binary16 conversions are written without branches (each case computed, then picked by a
// mask) so a loop over an array vectorizes: ReLU activations are half zeros, and a branch per
// element on "is it subnormal" mispredicts on them. Checked against a case-by-case
// reference over a stride of all floats and every float near the edges (tests/core/test_half.cpp).
[[nodiscard]] PARTRAIN_HOST_DEVICE constexpr std::uint32_t all_ones_if(bool c) noexcept { return 0u - static_cast<std::uint32_t>(c); }
[[nodiscard]] PARTRAIN_HOST_DEVICE constexpr std::uint32_t select_bits(std::uint32_t m, std::uint32_t a, std::uint32_t b) noexcept {
  return (a & m) | (b & ~m);
}

[[nodiscard]] PARTRAIN_HOST_DEVICE constexpr std::uint16_t float_to_half_bits(float f) noexcept {
  const std::uint32_t x = bits_as<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t abs = x & 0x7FFFFFFFu;
  const auto sabs = static_cast<std::int32_t>(abs);  // < 2^31: signed compares vectorize on SSE2
  // Normal range: rebias the exponent by -112 and add the round-to-nearest-even bias.
  const std::uint32_t normal = (abs + 0xC8000FFFu + ((abs >> 13) & 1u)) >> 13;
  // Below 2^-14, a half subnormal: adding 0.5 puts the 2^-24 unit in the float's last mantissa
  // bit, so the FPU's own round-to-nearest-even does the rounding. Masked to stay finite.
  const std::uint32_t is_subnormal = all_ones_if(sabs < 0x38800000);
  const float shifted = bits_as<float>(abs & is_subnormal) + 0.5f;
  const std::uint32_t subnormal = bits_as<std::uint32_t>(shifted) - 0x3F000000u;
  std::uint32_t r = select_bits(is_subnormal, subnormal, normal);
  r = select_bits(all_ones_if(sabs >= 0x477FF000), 0x7C00u, r);  // >= 65520 (and inf) rounds to inf
  // NaN keeps its top payload bits and is made quiet.
  r = select_bits(all_ones_if(sabs > 0x7F800000), 0x7E00u | ((abs >> 13) & 0x3FFu), r);
  return static_cast<std::uint16_t>(sign | r);
}

[[nodiscard]] PARTRAIN_HOST_DEVICE constexpr float half_bits_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::int32_t exp = (h >> 10) & 0x1F;
  const std::uint32_t mant = h & 0x3FFu;
  // exp 0: mant * 2^-24, exact in float.
  const std::uint32_t subnormal =
      bits_as<std::uint32_t>(static_cast<float>(static_cast<std::int32_t>(mant)) * 5.9604644775390625e-8f);
  const std::uint32_t normal = (static_cast<std::uint32_t>(exp + 112) << 23) | (mant << 13);
  std::uint32_t r = select_bits(all_ones_if(exp == 0), subnormal, normal);
  r = select_bits(all_ones_if(exp == 31), 0x7F800000u | (mant << 13), r);  // inf and NaN
  return bits_as<float>(sign | r);
}

[[nodiscard]] PARTRAIN_HOST_DEVICE constexpr std::uint16_t float_to_bfloat16_bits(float f) noexcept {
  const std::uint32_t x = bits_as<std::uint32_t>(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((x >> 16) | 0x0040u);  // quiet NaN
  const std::uint32_t bias = 0x7FFFu + ((x >> 16) & 1u);
  return static_cast<std::uint16_t>((x + bias) >> 16);
}

[[nodiscard]] PARTRAIN_HOST_DEVICE constexpr float bfloat16_bits_to_float(std::uint16_t b) noexcept {
  return bits_as<float>(static_cast<std::uint32_t>(b) << 16);
}

}  // namespace detail

// IEEE 754 binary16. Arithmetic goes through float (storage type, as on the host in PyTorch).
struct half {
  std::uint16_t bits = 0;

  constexpr half() noexcept = default;
  PARTRAIN_HOST_DEVICE constexpr explicit half(float f) noexcept : bits(detail::float_to_half_bits(f)) {}
  [[nodiscard]] PARTRAIN_HOST_DEVICE static constexpr half from_bits(std::uint16_t b) noexcept {
    half h;
    h.bits = b;
    return h;
  }
  PARTRAIN_HOST_DEVICE constexpr explicit operator float() const noexcept { return detail::half_bits_to_float(bits); }
  friend PARTRAIN_HOST_DEVICE constexpr bool operator==(half a, half b) noexcept { return float(a) == float(b); }
};

// bfloat16: float's exponent range with 8 bits of mantissa.
struct bfloat16 {
  std::uint16_t bits = 0;

  constexpr bfloat16() noexcept = default;
  PARTRAIN_HOST_DEVICE constexpr explicit bfloat16(float f) noexcept : bits(detail::float_to_bfloat16_bits(f)) {}
  [[nodiscard]] PARTRAIN_HOST_DEVICE static constexpr bfloat16 from_bits(std::uint16_t b) noexcept {
    bfloat16 h;
    h.bits = b;
    return h;
  }
  PARTRAIN_HOST_DEVICE constexpr explicit operator float() const noexcept { return detail::bfloat16_bits_to_float(bits); }
  friend PARTRAIN_HOST_DEVICE constexpr bool operator==(bfloat16 a, bfloat16 b) noexcept { return float(a) == float(b); }
};

static_assert(sizeof(half) == 2 && sizeof(bfloat16) == 2);

}  // namespace partrain::inline v0
