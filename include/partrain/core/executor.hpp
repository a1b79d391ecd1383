// partrain/core/executor.hpp: background threads that run submitted functions and complete a
// work for each. With one thread (the default) functions run in submission order, which is what
// a process group needs (collectives must be issued in the same order on every rank); with more,
// no function queues behind a blocked one (a receive can complete while an earlier send still
// waits for its peer): threads are started as needed, up to the limit, and reused.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <partrain/core/error.hpp>
#include <partrain/core/work.hpp>

namespace partrain::inline v0::detail {

class executor {
 public:
  static constexpr std::size_t unbounded = std::numeric_limits<std::size_t>::max();
  // waiting::runs (one thread only): a function that has not started when its work is waited on
  // runs on the waiting thread, if nothing runs and nothing is queued before it. Order and
  // one-at-a-time are kept, and a function nobody waits on still starts at once on the worker.
  // What is saved is the worker's wake-up and the waiter's: a blocking Gloo broadcast of 4 KiB
  // went from 0.58-0.84 of raw Gloo's speed to 0.91-1.05 (docs/performance.md).
  enum class waiting { blocks, runs };

  // `abandoned` ends the error message of the functions never started when the executor goes.
  static constexpr const char* abandoned_operation = "process group destroyed before the operation ran";

  explicit executor(std::size_t max_threads = 1, std::string abandoned = abandoned_operation, waiting w = waiting::blocks)
      : core_(std::make_shared<core>()) {
    core_->max_threads = max_threads == 0 ? 1 : max_threads;
    core_->abandoned = std::move(abandoned);
    core_->run_on_wait = w == waiting::runs && core_->max_threads == 1;
  }
  executor(const executor&) = delete;
  executor& operator=(const executor&) = delete;
  ~executor() {
    core& c = *core_;
    {
      // Under the mutex: otherwise the stop can land between a thread's predicate check and its
      // wait, the notify is lost and the join blocks forever.
      std::lock_guard lock(c.mutex);
      c.stopping = true;
    }
    c.cv.notify_all();
    for (auto& t : threads_) t.join();  // each running function is bounded by its own timeout
    std::unique_lock lock(c.mutex);
    c.cv.wait(lock, [&] { return c.running == 0; });  // one running on a waiting thread
    // Functions never started are failed, so nobody waits on them forever.
    auto never = std::move(c.queue);
    lock.unlock();
    for (auto& [state, fn] : never) state->complete(std::make_exception_ptr(communication_error(c.abandoned)));
  }

  // Queues fn; the returned work completes when fn returns (or with what fn threw).
  [[nodiscard]] work submit(std::function<void()> fn) {
    auto state = std::make_shared<work_state>();
    core& c = *core_;
    if (c.run_on_wait) {
      state->set_runner([weak = std::weak_ptr<core>(core_)](work_state& s) {
        if (auto k = weak.lock()) k->run_if_next(s);
      });
    }
    {
      std::lock_guard lock(c.mutex);
      c.queue.emplace_back(state, std::move(fn));
      if (c.idle < c.queue.size() && threads_.size() < c.max_threads) {
        threads_.emplace_back([k = core_.get()] { k->run(); });
      }
    }
    c.cv.notify_one();
    return work(state);
  }

 private:
  using item = std::pair<std::shared_ptr<work_state>, std::function<void()>>;

  // What the threads and the waiters' offers share; an offer may outlive the executor (it then
  // finds `stopping` and leaves the function to the destructor).
  struct core {
    std::size_t max_threads = 1;
    std::string abandoned;
    bool run_on_wait = false;
    std::mutex mutex;
    std::condition_variable cv;
    std::deque<item> queue;
    std::size_t idle = 0;
    std::size_t running = 0;  // functions running now, on a worker or a waiting thread
    bool stopping = false;

    // One thread runs functions in order only if none starts while another runs.
    [[nodiscard]] bool may_start() const noexcept { return !queue.empty() && (max_threads > 1 || running == 0); }

    // With the lock held: takes the front function, runs it unlocked (counted in `running`),
    // completes its work and takes the lock again.
    void run_front(std::unique_lock<std::mutex>& lock) {
      auto it = std::move(queue.front());
      queue.pop_front();
      ++running;
      lock.unlock();
      std::exception_ptr err;
      try {
        it.second();
      } catch (...) {
        err = std::current_exception();
      }
      it.second = nullptr;
      it.first->complete(err);
      lock.lock();
      --running;
    }

    void run() {
      std::unique_lock lock(mutex);
      for (;;) {
        ++idle;
        cv.wait(lock, [&] { return stopping || may_start(); });
        --idle;
        if (stopping) return;
        run_front(lock);
      }
    }

    // On the waiting thread: runs s's function if it is next and nothing runs.
    void run_if_next(work_state& s) {
      std::unique_lock lock(mutex);
      if (stopping || running != 0 || queue.empty() || queue.front().first.get() != &s) return;
      run_front(lock);
      lock.unlock();
      cv.notify_all();  // the worker may start the next one; a destructor may wait for this
    }
  };

  std::shared_ptr<core> core_;
  std::vector<std::thread> threads_;
};

}  // namespace partrain::inline v0::detail
