// The launch helper itself: every index visited exactly once for ragged sizes and n = 0, and the
// reduction's fold order (init once, every element once, the same value on every run).
#include <catch2/catch.hpp>

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

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
  // On a GPU: CUB's device reduction, whose order is fixed for one GPU model (run to run).
  const double a = partrain::detail::transform_reduce_index(tier::exec(), n, 0.0, square_fn{x.data()}, partrain::detail::plus_fn{});
  int differing = 0;
  for (int run = 0; run < 10; ++run) {
    differing += partrain::detail::transform_reduce_index(tier::exec(), n, 0.0, square_fn{x.data()}, partrain::detail::plus_fn{}) != a;
  }
  CHECK(differing == 0);
  long double want = 0;
  for (std::size_t i = 0; i < n; ++i) want += static_cast<long double>(x[i]) * x[i];
  CHECK(std::fabs(a - static_cast<double>(want)) <= 1e-12 * static_cast<double>(want));
}

#if defined(PARTRAIN_THRUST_HOST) && !defined(__CUDACC__)
// The CPU tier runs Thrust's calls, the host training path its plain loops: both fold in index
// order, so a sum whose value depends on the order (terms of every magnitude) has the same bits.
TEST_CASE("Thrust's host system folds as the host loop does", "[cpu_tier][core][launch]") {
  using namespace launch_cases;
  const std::size_t n = 4099;
  std::vector<double> x(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = (i % 3 ? 1e-9 : 1e9) / static_cast<double>(i + 1);
  const double thrust_sum = partrain::detail::transform_reduce_index(partrain::detail::thrust_host_exec{}, n, 0.5,
                                                                     square_fn{x.data()}, partrain::detail::plus_fn{});
  const double loop_sum = partrain::detail::transform_reduce_index(partrain::detail::host_exec{}, n, 0.5,
                                                                   square_fn{x.data()}, partrain::detail::plus_fn{});
  double reversed = 0.5;
  for (std::size_t i = n; i-- > 0;) reversed += x[i] * x[i];
  CHECK(thrust_sum == loop_sum);
  CHECK(reversed != loop_sum);  // the order shows in the bits, so the equality above means something
  CHECK(std::string_view(tier::name) == "thrust-host");
}
#endif
