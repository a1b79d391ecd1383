// The loop pieces: views::epochs, views::steps (the step adaptor), views::every, and their
// composition in the shape the examples use.
#include <catch2/catch.hpp>

#include <ranges>
#include <stdexcept>
#include <string>
#include <vector>

#include <partrain/train/epochs.hpp>
#include <partrain/train/every.hpp>
#include <partrain/train/steps.hpp>

using namespace partrain;

TEST_CASE("views::epochs counts epochs and resumes from a later one", "[train][loop]") {
  std::vector<std::size_t> seen;
  for (std::size_t e : views::epochs(3)) seen.push_back(e);
  CHECK(seen == std::vector<std::size_t>{0, 1, 2});
  seen.clear();
  for (std::size_t e : views::epochs(2, 4)) seen.push_back(e);
  CHECK(seen == std::vector<std::size_t>{2, 3});
  CHECK(std::ranges::empty(views::epochs(0)));
  CHECK_THROWS_WITH(views::epochs(5, 3), Catch::Contains("first epoch is past the last"));
}

TEST_CASE("views::steps runs the step once per element, lazily, and numbers it", "[train][loop]") {
  std::vector<int> batches{10, 20, 30};
  int calls = 0;
  auto fn = [&](int b) {
    ++calls;
    return b * 0.5;
  };
  std::size_t counter = 5;  // as a resumed run would set it
  auto r = batches | views::steps(fn, counter);
  CHECK(calls == 0);  // nothing runs until the loop advances
  std::vector<std::size_t> numbers;
  std::vector<double> values;
  for (const auto& s : r) {
    numbers.push_back(s.step);
    values.push_back(s.value);
    CHECK(calls == static_cast<int>(numbers.size()));  // one step per element, no re-evaluation
  }
  CHECK(numbers == std::vector<std::size_t>{5, 6, 7});
  CHECK(values == std::vector<double>{5.0, 10.0, 15.0});
}

TEST_CASE("views::steps with a counter numbers steps across epochs", "[train][loop]") {
  std::vector<int> batches{1, 2};
  std::size_t global = 0;
  std::vector<std::size_t> numbers;
  for (std::size_t e : views::epochs(3)) {
    (void)e;
    for (const auto& s : batches | views::steps([](int b) { return b; }, global)) {
      numbers.push_back(s.step);
      CHECK(global == s.step + 1);  // the counter already includes the step just run
    }
  }
  CHECK(numbers == std::vector<std::size_t>{0, 1, 2, 3, 4, 5});
  CHECK(global == 6);
}

TEST_CASE("views::steps propagates a failing step and stops", "[train][loop]") {
  std::vector<int> batches{1, 2, 3};
  int ran = 0;
  auto fail_second = [&](int b) {
    ++ran;
    if (b == 2) throw std::runtime_error("step 2 failed");
    return b;
  };
  std::vector<int> got;
  CHECK_THROWS_WITH(
      [&] {
        for (const auto& s : batches | views::steps(fail_second)) got.push_back(s.value);
      }(),
      "step 2 failed");
  CHECK(got == std::vector<int>{1});
  CHECK(ran == 2);
}

TEST_CASE("views::every fires on every k-th element and passes all through", "[train][loop]") {
  std::vector<int> xs{1, 2, 3, 4, 5, 6, 7};
  std::vector<int> fired, passed;
  for (int x : xs | views::every(3, [&](int v) { fired.push_back(v); })) passed.push_back(x);
  CHECK(fired == std::vector<int>{3, 6});
  CHECK(passed == xs);
  CHECK_THROWS_WITH(views::every(0, [](int) {}), Catch::Contains("at least 1"));
}

TEST_CASE("views::every over steps follows the global step number across epochs", "[train][loop]") {
  std::vector<int> batches{1, 2, 3};  // 3 steps per epoch, log every 2 steps
  std::size_t global = 0;
  std::vector<std::size_t> logged;
  std::size_t total = 0;
  for (std::size_t e : views::epochs(3)) {
    (void)e;
    for (const auto& s : batches | views::steps([](int b) { return b; }, global) |
                             views::every(2, [&](const auto& st) { logged.push_back(st.step); })) {
      total += static_cast<std::size_t>(s.value);
    }
  }
  CHECK(logged == std::vector<std::size_t>{1, 3, 5, 7});
  CHECK(total == 18);
}

TEST_CASE("composed closures apply in order", "[train][loop]") {
  std::vector<int> xs{1, 2, 3, 4};
  std::vector<std::size_t> every2;
  auto pipeline = views::steps([](int x) { return x * x; }) |
                  views::every(2, [&](const auto& s) { every2.push_back(s.step); });
  std::vector<int> squares;
  for (const auto& s : xs | pipeline) squares.push_back(s.value);
  CHECK(squares == std::vector<int>{1, 4, 9, 16});
  CHECK(every2 == std::vector<std::size_t>{1, 3});
}
