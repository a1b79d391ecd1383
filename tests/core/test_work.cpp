#include <catch2/catch.hpp>

#include <partrain/core/executor.hpp>
#include <partrain/core/work.hpp>

#include <atomic>
#include <coroutine>
#include <thread>

using namespace partrain;
using namespace std::chrono_literals;

namespace {
// The smallest eager coroutine, enough to co_await a work.
struct fire_and_forget {
  struct promise_type {
    fire_and_forget get_return_object() noexcept { return {}; }
    std::suspend_never initial_suspend() noexcept { return {}; }
    std::suspend_never final_suspend() noexcept { return {}; }
    void return_void() noexcept {}
    void unhandled_exception() noexcept { std::terminate(); }
  };
};
}  // namespace

TEST_CASE("work completes once, wakes waiters and runs callbacks", "[comm][work]") {
  work w;
  CHECK_FALSE(w.is_completed());
  CHECK_FALSE(w.wait_for(1ms));
  int called = 0;
  w.then([&] { ++called; });
  std::thread t([s = w.state()] { s->complete(); });
  w.wait();
  t.join();
  CHECK(called == 1);
  w.then([&] { ++called; });  // already done: runs now
  CHECK(called == 2);
}

TEST_CASE("work rethrows the operation's error", "[comm][work]") {
  auto w = work::completed(std::make_exception_ptr(timeout_error("rank 3 barrier: timed out")));
  CHECK_THROWS_AS(w.wait(), timeout_error);
  CHECK_THROWS_WITH(w.await_resume(), Catch::Contains("rank 3 barrier"));
}

TEST_CASE("a coroutine co_awaits a work and resumes on completion", "[comm][work]") {
  work w;
  std::atomic<int> stage{0};
  [](work w, std::atomic<int>& stage) -> fire_and_forget {
    stage = 1;
    co_await w;
    stage = 2;
  }(w, stage);
  CHECK(stage == 1);
  w.state()->complete();
  CHECK(stage == 2);
}

TEST_CASE("an executor runs operations in order and fails the unstarted ones on destruction", "[comm][work]") {
  std::vector<int> order;
  std::vector<work> ws;
  {
    detail::executor worker;
    for (int i = 0; i < 5; ++i) ws.push_back(worker.submit([&order, i] { order.push_back(i); }));
    ws.back().wait();
    auto failing = worker.submit([] { throw std::runtime_error("boom"); });
    CHECK_THROWS_WITH(failing.wait(), "boom");
  }
  CHECK(order == std::vector<int>{0, 1, 2, 3, 4});
}
