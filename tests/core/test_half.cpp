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
}  // namespace

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
