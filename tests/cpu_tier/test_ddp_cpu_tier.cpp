// DDP's bucket functors (parallel/detail/ddp_elements.hpp) through the launch helper: the division
// before the all_reduce (a multiplication for powers of two, with the division's bits), no_sync accumulation, the fp16/bf16 compression hooks' casts and ZeRO's
// widened accumulation of 16-bit gradients.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include <partrain/parallel/detail/ddp_elements.hpp>

#include "reference_16.hpp"
#include "tier.hpp"

namespace ddp_cases {
namespace pd = partrain::detail;

template <class T>
void check_divide_accumulate() {
  for (const std::size_t n : tier::ragged_sizes) {
    CAPTURE(n, tier::name);
    const auto in = tier::awkward_floats(n, 3);
    tier::vec<T> x(n), y(n);
    for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<T>(in[i]), y[i] = static_cast<T>(i % 7);
    pd::for_each_index(tier::exec(), n, pd::ddp::divide_fn<T>{x.data(), T(3)});
    tier::finish();
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) bad += x[i] != static_cast<T>(in[i]) / T(3);
    CHECK(bad == 0);
    pd::for_each_index(tier::exec(), n, pd::ddp::accumulate_fn<T>{y.data(), x.data()});
    tier::finish();
    bad = 0;
    for (std::size_t i = 0; i < n; ++i) bad += y[i] != static_cast<T>(i % 7) + static_cast<T>(in[i]) / T(3);
    CHECK(bad == 0);
  }
}

// buffer.to(H).div_(d) then back, with the reference conversions.
template <class T, class H>
void check_compress(std::uint16_t (*to16)(float), float (*from16)(std::uint16_t)) {
  for (const std::size_t n : tier::ragged_sizes) {
    CAPTURE(n, tier::name);
    auto in = tier::awkward_floats(n, 9);
    if (n > 2) in[1] = std::numeric_limits<float>::quiet_NaN(), in[2] = -std::numeric_limits<float>::infinity();
    tier::vec<T> x(n), out(n);
    tier::vec<H> h(n);
    for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<T>(in[i]);
    const float d = 3.0f;
    pd::for_each_index(tier::exec(), n, pd::ddp::compress_16_fn<T, H>{x.data(), h.data(), d});
    tier::finish();
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint16_t want = to16(from16(to16(static_cast<float>(static_cast<T>(in[i])))) / d);
      // A NaN's payload is the hardware's (a GPU's division returns its canonical NaN, x86
      // keeps the operand's; seen on an H200): a NaN must stay a NaN, its bits may differ.
      bad += std::isnan(from16(want)) ? !std::isnan(from16(h[i].bits)) : h[i].bits != want;
    }
    CHECK(bad == 0);
    pd::for_each_index(tier::exec(), n, pd::ddp::decompress_16_fn<H, T>{h.data(), out.data()});
    tier::finish();
    bad = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const T want = static_cast<T>(from16(h[i].bits));
      bad += !(std::isnan(want) ? std::isnan(out[i]) : out[i] == want);
    }
    CHECK(bad == 0);
    // ZeRO's no_sync with 16-bit gradients: widened and added into the float bucket.
    tier::vec<T> acc(n);
    for (std::size_t i = 0; i < n; ++i) acc[i] = static_cast<T>(i % 5);
    pd::for_each_index(tier::exec(), n, pd::ddp::accumulate_widened_fn<H, T>{acc.data(), h.data()});
    tier::finish();
    bad = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const T want = static_cast<T>(i % 5) + static_cast<T>(from16(h[i].bits));
      bad += !(std::isnan(want) ? std::isnan(acc[i]) : acc[i] == want);
    }
    CHECK(bad == 0);
  }
}

// Equal bits, or both NaN.
template <class T>
bool same_bits(T a, T b) {
  using U = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  return std::isnan(b) ? std::isnan(a) : std::bit_cast<U>(a) == std::bit_cast<U>(b);
}

// divide_elements: a multiplication by the exact reciprocal where d is a power of two, the
// division otherwise; either way the division's bits, subnormals, infinities and NaNs included.
template <class T>
void check_divide_elements() {
  const T divisors[] = {T(1), T(2), T(4), T(8), T(0.5), T(3), T(6), T(1e-3)};
  for (const std::size_t n : tier::ragged_sizes) {
    auto in = tier::awkward_floats(n, 5);
    if (n > 3) {
      in[1] = std::numeric_limits<float>::quiet_NaN();
      in[2] = -std::numeric_limits<float>::infinity();
      in[3] = std::numeric_limits<float>::max();
    }
    for (const T d : divisors) {
      CAPTURE(n, tier::name, d);
      tier::vec<T> x(n);
      for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<T>(in[i]);
      pd::ddp::divide_elements(tier::exec(), n, x.data(), d);
      tier::finish();
      std::size_t bad = 0;
      for (std::size_t i = 0; i < n; ++i) {
        bad += !same_bits(x[i], static_cast<T>(in[i]) / d);
      }
      CHECK(bad == 0);
    }
  }
}

}  // namespace ddp_cases

TEST_CASE("divide_fn and accumulate_fn on float and double buckets", "[cpu_tier][parallel][ddp]") {
  ddp_cases::check_divide_accumulate<float>();
  ddp_cases::check_divide_accumulate<double>();
}

TEST_CASE("divide_elements gives the division's bits, by a multiplication for powers of two", "[cpu_tier][parallel][ddp]") {
  ddp_cases::check_divide_elements<float>();
  ddp_cases::check_divide_elements<double>();
  // Only a power of two with a normal reciprocal is multiplied.
  namespace pd = partrain::detail;
  CHECK(pd::exact_reciprocal(2.0f) == 0.5f);
  CHECK(pd::exact_reciprocal(0.25) == 4.0);
  CHECK(pd::exact_reciprocal(std::ldexp(1.0f, 126)) == std::ldexp(1.0f, -126));
  CHECK_FALSE(pd::exact_reciprocal(std::ldexp(1.0f, 127)).has_value());  // 2^-127 is subnormal
  CHECK_FALSE(pd::exact_reciprocal(3.0f).has_value());
  CHECK_FALSE(pd::exact_reciprocal(0.0f).has_value());
  CHECK_FALSE(pd::exact_reciprocal(-2.0f).has_value());
  CHECK_FALSE(pd::exact_reciprocal(std::numeric_limits<double>::infinity()).has_value());
  CHECK_FALSE(pd::exact_reciprocal(std::numeric_limits<float>::quiet_NaN()).has_value());
}

TEST_CASE("compress_16_fn / decompress_16_fn / accumulate_widened_fn: fp16 and bf16 hooks, cast then divide; widened sums", "[cpu_tier][parallel][ddp]") {
  using partrain::bfloat16;
  using partrain::half;
  ddp_cases::check_compress<float, half>(tier::ref::float_to_half, tier::ref::half_to_float);
  ddp_cases::check_compress<double, half>(tier::ref::float_to_half, tier::ref::half_to_float);
  ddp_cases::check_compress<float, bfloat16>(tier::ref::float_to_bfloat16, tier::ref::bfloat16_to_float);
  ddp_cases::check_compress<double, bfloat16>(tier::ref::float_to_bfloat16, tier::ref::bfloat16_to_float);
}
