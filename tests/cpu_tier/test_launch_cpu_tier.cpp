// The launch helper itself: every index visited exactly once for ragged sizes and n = 0, and the
// reduction's fold order (init once, every element once, the same value on every run).
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>

#include "tier.hpp"

namespace launch_cases {

struct count_fn {
  std::uint32_t* hits;
  PARTRAIN_HOST_DEVICE void operator()(std::size_t i) const { hits[i] += 1; }
};

struct index_fn {
  PARTRAIN_HOST_DEVICE std::uint64_t operator()(std::size_t i) const { return i + 1; }
};

struct square_fn {
  const double* x;
  PARTRAIN_HOST_DEVICE double operator()(std::size_t i) const { return x[i] * x[i]; }
};

// Not commutative: a fold that reorders two elements or drops init gives a different value.
struct first_seen_fn {
  PARTRAIN_HOST_DEVICE std::uint64_t operator()(std::uint64_t acc, std::uint64_t x) const {
    return acc == 0 ? x : acc;
  }
};

}  // namespace launch_cases

TEST_CASE("for_each_index visits every index below n exactly once", "[cpu_tier][core][launch]") {
  using namespace launch_cases;
  for (const std::size_t n : tier::ragged_sizes) {
    CAPTURE(n, tier::name);
    tier::vec<std::uint32_t> hits(n + 1, 0);  // one past the end must stay untouched
    partrain::detail::for_each_index(tier::exec(), n, count_fn{hits.data()});
    tier::finish();
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i) wrong += hits[i] != 1;
    CHECK(wrong == 0);
    CHECK(hits[n] == 0);
  }
}

TEST_CASE("transform_reduce_index folds init once and every element once", "[cpu_tier][core][launch]") {
  using namespace launch_cases;
  for (const std::size_t n : tier::ragged_sizes) {
    CAPTURE(n, tier::name);
    const std::uint64_t init = 1000;
    const auto got = partrain::detail::transform_reduce_index(tier::exec(), n, init, index_fn{}, partrain::detail::plus_fn{});
    CHECK(got == init + static_cast<std::uint64_t>(n) * (n + 1) / 2);
  }
  // n = 0 returns init untouched, whatever the combine.
  CHECK(partrain::detail::transform_reduce_index(tier::exec(), 0, std::uint64_t{42}, index_fn{}, first_seen_fn{}) == 42);
}

TEST_CASE("transform_reduce_index gives the same double sum on every run", "[cpu_tier][core][launch]") {
  using namespace launch_cases;
  const std::size_t n = 70001;
  tier::vec<double> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = 1.0 / static_cast<double>(i + 3) * (i % 2 ? 1e8 : 1e-8);
  const double a = partrain::detail::transform_reduce_index(tier::exec(), n, 0.0, square_fn{x.data()}, partrain::detail::plus_fn{});
  const double b = partrain::detail::transform_reduce_index(tier::exec(), n, 0.0, square_fn{x.data()}, partrain::detail::plus_fn{});
  CHECK(a == b);
  long double want = 0;
  for (std::size_t i = 0; i < n; ++i) want += static_cast<long double>(x[i]) * x[i];
  CHECK(std::fabs(a - static_cast<double>(want)) <= 1e-12 * static_cast<double>(want));
}
