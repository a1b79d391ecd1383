#include <catch2/catch.hpp>

#include <partrain/core/dtype.hpp>
#include <partrain/core/weighted_shares.hpp>

#include <cstddef>
#include <cmath>
#include <limits>
#include <numeric>
#include <utility>
#include <type_traits>
#include <vector>

using namespace partrain;

TEST_CASE("visit_dtype hands every dtype its C++ type", "[core][dtype]") {
  for (dtype t : {dtype::float32, dtype::float64, dtype::int32, dtype::int64, dtype::uint8, dtype::float16, dtype::bfloat16}) {
    const auto [size, back] = visit_dtype(t, []<class T>(std::type_identity<T>) { return std::pair{sizeof(T), dtype_of<T>}; });
    CHECK(size == size_of(t));
    CHECK(back == t);
  }
  CHECK_THROWS_AS(visit_dtype(static_cast<dtype>(99), []<class T>(std::type_identity<T>) { return 0; }), invalid_argument_error);
}

TEST_CASE("weighted_shares: largest remainder, ties to the lower index, zero weights get nothing", "[core][shares]") {
  using v = std::vector<std::size_t>;
  CHECK(weighted_shares(10, std::vector<double>{1, 1, 1}) == v{4, 3, 3});
  CHECK(weighted_shares(2, std::vector<double>{1, 3}) == v{1, 1});  // 0.5 / 1.5: the tie goes to index 0
  CHECK(weighted_shares(3, std::vector<double>{1, 0, 1, 0}) == v{2, 0, 1, 0});
  CHECK(weighted_shares(1, std::vector<double>{0, 0, 2}) == v{0, 0, 1});
  CHECK(weighted_shares(0, std::vector<double>{1, 2}) == v{0, 0});
  for (std::size_t n : {1u, 2u, 5u, 17u, 100u, 1001u}) {
    const std::vector<double> w{0.13, 0.5, 0.37, 1e-3, 0};
    const auto s = weighted_shares(n, w);
    CHECK(std::accumulate(s.begin(), s.end(), std::size_t{0}) == n);
    CHECK(s[4] == 0);
    for (std::size_t i = 0; i < w.size(); ++i) {
      const double quota = static_cast<double>(n) * w[i] / 1.001;
      CHECK(std::abs(static_cast<double>(s[i]) - quota) < 1.0);
    }
  }
  CHECK_THROWS_WITH(weighted_shares(4, std::vector<double>{1, -1}, "data_parallel"), Catch::Contains("data_parallel: weight 1"));
  CHECK_THROWS_AS(weighted_shares(4, std::vector<double>{1, std::numeric_limits<double>::infinity()}), invalid_argument_error);
}
