// generator<T>: laziness, references without copies, exceptions to the consumer, frame cleanup.
#include <catch2/catch.hpp>

#include <partrain/core/generator.hpp>

#include <iterator>
#include <ranges>
#include <stdexcept>
#include <string>
#include <vector>

using partrain::generator;

namespace {

// Counts live instances, so a test can see that a destroyed generator frame destroyed its locals.
struct counted {
  static inline int alive = 0;
  static inline int copies = 0;
  int value = 0;
  explicit counted(int v) : value(v) { ++alive; }
  counted(const counted& o) : value(o.value) { ++alive; ++copies; }
  ~counted() { --alive; }
};

generator<int> iota(int n, int* started = nullptr) {
  if (started) ++*started;
  for (int i = 0; i < n; ++i) co_yield i;
}

generator<const counted&> counted_values(int n) {
  counted local(-1);  // lives in the frame until it is destroyed
  for (int i = 0; i < n; ++i) {
    counted c(i);
    co_yield c;
  }
}

generator<int> throws_after(int n) {
  for (int i = 0; i < n; ++i) co_yield i;
  throw std::runtime_error("generator body failed at " + std::to_string(n));
}

}  // namespace

static_assert(std::ranges::input_range<generator<int>>);
static_assert(std::ranges::view<generator<int>>);
static_assert(std::same_as<std::ranges::range_reference_t<generator<const counted&>>, const counted&>);
static_assert(std::same_as<std::ranges::range_reference_t<generator<int>>, int&>);

TEST_CASE("generator is lazy and yields in order", "[core][generator]") {
  int started = 0;
  auto g = iota(5, &started);
  CHECK(started == 0);  // nothing runs before begin()
  std::vector<int> seen;
  for (int v : g) seen.push_back(v);
  CHECK(started == 1);
  CHECK(seen == std::vector<int>{0, 1, 2, 3, 4});
}

TEST_CASE("generator of an empty body is an empty range", "[core][generator]") {
  auto g = iota(0);
  CHECK(g.begin() == g.end());
}

TEST_CASE("generator hands out references, never copies", "[core][generator]") {
  counted::copies = 0;
  {
    std::vector<int> seen;
    for (const counted& c : counted_values(3)) seen.push_back(c.value);
    CHECK(seen == std::vector<int>{0, 1, 2});
  }
  CHECK(counted::copies == 0);
  CHECK(counted::alive == 0);
}

TEST_CASE("breaking out early destroys the frame and its locals", "[core][generator]") {
  counted::alive = 0;
  {
    auto g = counted_values(100);
    auto it = g.begin();
    CHECK(it->value == 0);
    ++it;
    CHECK((*it).value == 1);
    CHECK(counted::alive == 2);  // `local` and the current `c`
  }
  CHECK(counted::alive == 0);
}

TEST_CASE("an exception in the body reaches the consumer", "[core][generator]") {
  std::vector<int> seen;
  auto consume = [&] {
    for (int v : throws_after(2)) seen.push_back(v);
  };
  CHECK_THROWS_WITH(consume(), "generator body failed at 2");
  CHECK(seen == std::vector<int>{0, 1});
  // A body that throws before its first yield throws from begin().
  auto g = throws_after(0);
  CHECK_THROWS_AS(g.begin(), std::runtime_error);
}

TEST_CASE("generators move, leaving the source empty", "[core][generator]") {
  auto a = iota(3);
  auto b = std::move(a);
  CHECK(a.begin() == a.end());  // NOLINT(bugprone-use-after-move): moved-from is empty by contract
  std::vector<int> seen;
  for (int v : b) seen.push_back(v);
  CHECK(seen == std::vector<int>{0, 1, 2});
}
