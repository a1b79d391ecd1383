#include <catch2/catch.hpp>

#include <partrain/core/half.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

using namespace partrain;

namespace {
// Round-to-nearest-even reference: the nearer of the two neighbours, the even one on a tie.
template <class H>
void check_exhaustive() {
  for (std::uint32_t b = 0; b < 0x10000; ++b) {
    const auto h = H::from_bits(static_cast<std::uint16_t>(b));
    const float f = static_cast<float>(h);
    if (std::isnan(f)) {
      CHECK(std::isnan(static_cast<float>(H(f))));
      continue;
    }
    // Every 16-bit value survives the round trip (-0 included).
    REQUIRE(H(f).bits == h.bits);
    if (std::isinf(f) || ((b + 1) & 0x8000u) != (b & 0x8000u)) continue;
    // The midpoint to the next value up (same sign) must round to the even neighbour.
    const auto up = H::from_bits(static_cast<std::uint16_t>(b + 1));
    const float fu = static_cast<float>(up);
    if (std::isnan(fu) || std::isinf(fu)) continue;
    const double mid = (static_cast<double>(f) + static_cast<double>(fu)) / 2.0;
    const float midf = static_cast<float>(mid);
    REQUIRE(static_cast<double>(midf) == mid);  // exactly representable in float
    const auto even = (h.bits & 1u) == 0 ? h.bits : up.bits;
    REQUIRE(H(midf).bits == even);
    // Just off the midpoint rounds to the nearer one.
    REQUIRE(H(std::nextafter(midf, f)).bits == h.bits);
    REQUIRE(H(std::nextafter(midf, fu)).bits == up.bits);
  }
}

// float -> binary16 written case by case with branches: the plain statement of the rules that
// the branch-free library conversion must agree with on every float.
std::uint16_t half_bits_by_cases(float f) {
  const std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t abs = x & 0x7FFFFFFFu;
  if (abs > 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7E00u | ((abs >> 13) & 0x3FFu));  // quiet NaN
  if (abs >= 0x477FF000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // >= 65520 and inf
  const double a = static_cast<double>(std::bit_cast<float>(abs));
  // Units of the result's last place: 2^-24 below 2^-14 (subnormals), else 2^(e-10).
  const int e = a < 0x1p-14 ? -14 : std::ilogb(a);
  const double ulp = std::ldexp(1.0, e - 10);
  const double q = a / ulp;  // exact: a power-of-two scaling
  double n = std::floor(q);
  if (q - n > 0.5 || (q - n == 0.5 && std::fmod(n, 2.0) != 0.0)) n += 1.0;
  const double rounded = n * ulp;  // may carry into the next binade, still exact
  // Encode the rounded magnitude: subnormal, or exponent and 10 mantissa bits.
  if (rounded < 0x1p-14) return static_cast<std::uint16_t>(sign | static_cast<std::uint32_t>(rounded / 0x1p-24));
  const int re = std::ilogb(rounded);
  const auto mant = static_cast<std::uint32_t>(std::ldexp(rounded, -re) * 1024.0) - 1024u;
  return static_cast<std::uint16_t>(sign | (static_cast<std::uint32_t>(re + 15) << 10) | mant);
}
}  // namespace

TEST_CASE("half's branch-free conversion agrees with the case-by-case rules across floats", "[core][half]") {
  // A stride through all 2^32 bit patterns (both signs, every exponent, NaN payloads) plus every
  // float near the subnormal, overflow and inf boundaries.
  std::uint64_t checked = 0;
  const auto check = [&](std::uint32_t bits) {
    const float f = std::bit_cast<float>(bits);
    const std::uint16_t got = detail::float_to_half_bits(f);
    const std::uint16_t want = half_bits_by_cases(f);
    if (got != want) {
      INFO("float bits 0x" << std::hex << bits << ": got 0x" << got << ", expected 0x" << want);
      REQUIRE(got == want);
    }
    ++checked;
  };
  for (std::uint64_t b = 0; b < (1ull << 32); b += 4093) check(static_cast<std::uint32_t>(b));
  for (const std::uint32_t edge : {0x38800000u, 0x33000000u, 0x477FF000u, 0x7F800000u, 0u}) {
    for (std::uint32_t d = 0; d < 4096; ++d) {
      for (const std::uint32_t s : {0u, 0x80000000u}) {
        check(s | (edge + d));
        if (edge >= d) check(s | (edge - d));
      }
    }
  }
  CHECK(checked > 1'000'000);
  static_assert(detail::float_to_half_bits(1.0f) == 0x3C00 && detail::half_bits_to_float(0x3C00) == 1.0f);
  static_assert(detail::float_to_half_bits(-0x1p-24f) == 0x8001 && detail::half_bits_to_float(0x8001) == -0x1p-24f);
}

TEST_CASE("half converts with round-to-nearest-even over all 65536 patterns", "[core][half]") {
  check_exhaustive<half>();
  CHECK(half(65504.0f).bits == 0x7BFF);
  CHECK(half(65520.0f).bits == 0x7C00);  // the tie above the largest finite rounds to inf
  CHECK(half(1e-8f).bits == 0);
  CHECK(static_cast<float>(half::from_bits(1)) == std::ldexp(1.0f, -24));
}

TEST_CASE("bfloat16 converts with round-to-nearest-even over all 65536 patterns", "[core][half]") {
  check_exhaustive<bfloat16>();
  CHECK(bfloat16(1.0f).bits == 0x3F80);
  CHECK(std::isinf(static_cast<float>(bfloat16(std::numeric_limits<float>::max()))));
  static_assert(static_cast<float>(bfloat16(2.0f)) == 2.0f);
}
