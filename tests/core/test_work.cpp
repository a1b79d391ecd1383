#include <catch2/catch.hpp>

#include <partrain/core/affinity.hpp>
#include <partrain/core/executor.hpp>
#include <partrain/core/work.hpp>

#include <algorithm>
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

TEST_CASE("a then() callback that throws on the completing thread fails the work, not the process", "[comm][work]") {
  work w;
  int later = 0;
  w.then([] { throw communication_error("rank 1 comm hook: copy back failed"); });
  w.then([&] { ++later; });
  std::thread t([s = w.state()] { s->complete(); });  // where nothing could catch it
  t.join();
  CHECK_THROWS_WITH(w.wait(), Catch::Contains("copy back failed"));
  CHECK(later == 1);  // the other callbacks still ran
  // An operation's own error stays the one reported.
  work failed;
  failed.then([] { throw communication_error("the callback's"); });
  std::thread u([s = failed.state()] { s->complete(std::make_exception_ptr(timeout_error("the operation's"))); });
  u.join();
  CHECK_THROWS_WITH(failed.wait(), Catch::Contains("the operation's"));
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

TEST_CASE("an executor that lets waiters run keeps order and one-at-a-time, and runs on the waiter",
          "[comm][work]") {
  using waiting = detail::executor::waiting;
  // Waited on at once, a function runs on the waiting thread unless the worker took it first.
  // A fresh executor's worker is still starting (thread creation), so the waiter usually wins,
  // but under TSan on a busy machine the worker has won 50 in a row: a waiting::runs executor
  // gets up to 2000 tries to show the waiter winning one; a blocking one, 50 to show it never does.
  for (const waiting mode : {waiting::runs, waiting::blocks}) {
    CAPTURE(mode == waiting::runs);
    int here = 0;
    const int tries = mode == waiting::runs ? 2000 : 50;
    for (int i = 0; i < tries && !(mode == waiting::runs && here > 0); ++i) {
      detail::executor ex(1, detail::executor::abandoned_operation, mode);
      std::thread::id ran_on;
      ex.submit([&] { ran_on = std::this_thread::get_id(); }).wait();
      here += ran_on == std::this_thread::get_id() ? 1 : 0;
    }
    if (mode == waiting::runs) {
      CHECK(here > 0);
    } else {
      CHECK(here == 0);
    }
  }

  // Order and one at a time, with waits on some of the works from several threads.
  std::vector<int> order;
  std::atomic<int> in_flight{0}, most{0};
  {
    detail::executor ex(1, detail::executor::abandoned_operation, waiting::runs);
    std::vector<work> ws;
    for (int i = 0; i < 300; ++i) {
      ws.push_back(ex.submit([&, i] {
        const int now = ++in_flight;
        int m = most.load();
        while (now > m && !most.compare_exchange_weak(m, now)) {
        }
        order.push_back(i);
        --in_flight;
      }));
    }
    std::thread other([&] {
      for (std::size_t i = 1; i < ws.size(); i += 3) ws[i].wait();
    });
    for (std::size_t i = 0; i < ws.size(); i += 2) ws[i].wait();
    other.join();
    wait_all(ws);
  }
  CHECK(most.load() == 1);
  REQUIRE(order.size() == 300);
  for (std::size_t i = 0; i < order.size(); ++i) CHECK(order[i] == static_cast<int>(i));

  // An error thrown on the waiting thread reaches wait() as from the worker.
  detail::executor ex(1, detail::executor::abandoned_operation, waiting::runs);
  for (int i = 0; i < 20; ++i) CHECK_THROWS_WITH(ex.submit([] { throw std::runtime_error("boom"); }).wait(), "boom");
}

TEST_CASE("an executor that lets waiters run finishes the running function before it goes", "[comm][work]") {
  // Destruction waits for the function that runs, on the worker or on the waiter that took it,
  // then fails what never started.
  std::atomic<bool> started{false}, release{false}, finished{false};
  work queued;
  std::thread waiter;
  {
    detail::executor ex(1, detail::executor::abandoned_operation, detail::executor::waiting::runs);
    work first = ex.submit([&] {
      started = true;
      while (!release) std::this_thread::yield();
      finished = true;
    });
    queued = ex.submit([] {});
    waiter = std::thread([first] { first.wait(); });
    while (!started) std::this_thread::yield();
    release = true;
  }
  CHECK(finished.load());
  waiter.join();
  // `queued` either ran (the worker reached it before the stop) or failed as abandoned; either
  // way its wait returns.
  try {
    queued.wait();
    SUCCEED("ran before the executor stopped");
  } catch (const communication_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("destroyed before the operation ran"));
  }
}

TEST_CASE("allowed_cpus lists the calling thread's CPUs, and a pinned thread sees only its own", "[core][affinity]") {
  const std::vector<int> cpus = allowed_cpus();
#if defined(__linux__)
  REQUIRE_FALSE(cpus.empty());
  CHECK(std::is_sorted(cpus.begin(), cpus.end()));
  CHECK(std::adjacent_find(cpus.begin(), cpus.end()) == cpus.end());
  // A thread started here inherits the mask; pinned, it sees one CPU, and its parent keeps all.
  std::vector<int> inherited, pinned;
  std::thread([&] {
    inherited = allowed_cpus();
    detail::pin_this_thread(cpus.back());
    pinned = allowed_cpus();
  }).join();
  CHECK(inherited == cpus);
  CHECK(pinned == std::vector<int>{cpus.back()});
  CHECK(allowed_cpus() == cpus);
#else
  CHECK(cpus.empty());
#endif
}
