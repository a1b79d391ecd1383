// task<T> and sync_wait: laziness, results, exception propagation, frame lifetime, symmetric
// transfer, and resuming on the driving thread after a collective completes elsewhere.
#include <catch2/catch.hpp>

#include <array>
#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <partrain/comm/local.hpp>
#include <partrain/core/task.hpp>
#include <partrain/core/work.hpp>

using namespace partrain;

namespace {

// Lifetime counter in the cppcoro manner: every construction is matched by a destruction.
struct counted {
  static inline std::atomic<int> alive{0};
  static inline std::atomic<int> constructed{0};
  int value = 0;
  explicit counted(int v = 0) : value(v) { ++alive, ++constructed; }
  counted(const counted& o) : value(o.value) { ++alive, ++constructed; }
  counted(counted&& o) noexcept : value(o.value) { ++alive, ++constructed; }
  counted& operator=(const counted&) = default;
  counted& operator=(counted&&) noexcept = default;
  ~counted() { --alive; }
  static void reset() { alive = 0, constructed = 0; }
};

task<int> forty_two() { co_return 42; }
task<int> add(int a, int b) { co_return co_await forty_two() - 42 + a + b; }
task<void> throws_after(int& reached) {
  reached = 1;
  co_await forty_two();
  throw std::runtime_error("boom in task");
}
task<int> rethrows(int& reached) {
  co_await throws_after(reached);
  co_return 1;
}
task<counted> make_counted(counted arg) { co_return counted{arg.value + 1}; }
task<int&> ref_to(int& x) { co_return x; }

task<int> started_flag(bool& started) {
  started = true;
  co_return 7;
}

}  // namespace

TEST_CASE("task is lazy: the body runs only when awaited", "[train][task]") {
  bool started = false;
  auto t = started_flag(started);
  CHECK_FALSE(started);
  CHECK_FALSE(t.is_ready());
  CHECK(sync_wait(std::move(t)) == 7);
  CHECK(started);
}

TEST_CASE("task returns values, references and nested results", "[train][task]") {
  CHECK(sync_wait(add(2, 3)) == 5);
  int x = 1;
  int& r = sync_wait(ref_to(x));
  r = 9;
  CHECK(x == 9);
}

TEST_CASE("task propagates exceptions through co_await chains", "[train][task]") {
  int reached = 0;
  CHECK_THROWS_WITH(sync_wait(rethrows(reached)), "boom in task");
  CHECK(reached == 1);
}

TEST_CASE("task frames are destroyed whether or not they ran (no leaks)", "[train][task]") {
  counted::reset();
  {
    auto never_run = make_counted(counted{1});  // the argument was copied into the frame
    CHECK(counted::alive.load() >= 1);
  }
  CHECK(counted::alive.load() == 0);
  {
    counted out = sync_wait(make_counted(counted{4}));
    CHECK(out.value == 5);
    CHECK(counted::alive.load() == 1);
  }
  CHECK(counted::alive.load() == 0);
  CHECK(counted::constructed.load() > 0);
}

TEST_CASE("moved-from and empty tasks report a clear error", "[train][task]") {
  auto t = forty_two();
  auto u = std::move(t);
  CHECK_THROWS_WITH(sync_wait(std::move(t)), Catch::Contains("empty task"));
  CHECK(sync_wait(std::move(u)) == 42);
}

namespace {
task<long> sum_many(int n) {
  long s = 0;
  for (int i = 0; i < n; ++i) s += co_await forty_two();
  co_return s;
}
}  // namespace

TEST_CASE("a long loop of co_awaits on synchronously finishing tasks completes", "[train][task]") {
  // Optimised builds turn the symmetric transfer into a tail call (no stack growth at all);
  // -O0 and sanitizer builds may not, and ASan's frames are several times larger, so the count
  // stays within a default 8 MiB stack there.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  constexpr int n = 1'000;
#else
  constexpr int n = 10'000;
#endif
  CHECK(sync_wait(sum_many(n)) == 42L * n);
}

namespace {
task<std::thread::id> await_collective(local_group& g, std::vector<float>& data) {
  work w = g.all_reduce(tensor_view<float>(data), reduce_op::sum);
  co_await w;
  co_return std::this_thread::get_id();  // where the body continues after the collective
}
task<int> await_failed_collective(local_group& g, std::vector<float>& data) {
  co_await g.all_reduce(tensor_view<float>(data), reduce_op::sum);
  co_return 0;
}
}  // namespace

TEST_CASE("co_await on a collective resumes on the thread that drives the task", "[train][task][threads]") {
  // Catch2 assertions are not thread-safe: the ranks record, the test thread checks.
  std::array<bool, 2> same_thread{};
  std::array<std::vector<float>, 2> results;
  run_local(2, [&](local_group& g) {
    const auto r = static_cast<std::size_t>(g.rank());
    std::vector<float> data{1.0f + static_cast<float>(g.rank()), 10.0f};
    same_thread[r] = sync_wait(await_collective(g, data)) == std::this_thread::get_id();
    results[r] = data;
  });
  for (std::size_t r = 0; r < 2; ++r) {
    CHECK(same_thread[r]);  // not the backend's worker thread
    CHECK(results[r] == std::vector<float>{3.0f, 20.0f});
  }
}

TEST_CASE("a collective's error propagates out of sync_wait", "[train][task][threads]") {
  // Rank 1 never joins: rank 0's all_reduce times out and the task rethrows it.
  auto world = make_local_world(2, {.timeout = std::chrono::milliseconds(200)});
  std::vector<float> data{1.0f};
  CHECK_THROWS_AS(sync_wait(await_failed_collective(*world[0], data)), timeout_error);
}
