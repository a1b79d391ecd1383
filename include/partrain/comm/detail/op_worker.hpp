// partrain/comm/detail/op_worker.hpp: one background thread per process group that runs its
// operations in issue order (collectives must be issued in the same order on every rank).
// This is what makes collectives asynchronous: the caller gets a work and goes on computing.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <stop_token>
#include <thread>
#include <utility>

#include <partrain/comm/work.hpp>
#include <partrain/core/error.hpp>

namespace partrain::inline v0::detail {

class op_worker {
 public:
  op_worker() : thread_([this](std::stop_token st) { run(st); }) {}
  op_worker(const op_worker&) = delete;
  op_worker& operator=(const op_worker&) = delete;
  ~op_worker() {
    {
      // Under the mutex: otherwise the stop can land between the worker's predicate check and
      // its wait, the notify is lost and join() blocks forever.
      std::lock_guard lock(mutex_);
      thread_.request_stop();
    }
    cv_.notify_all();
    thread_.join();
    // Operations never started are failed, so nobody waits on them forever.
    for (auto& [state, fn] : queue_) {
      state->complete(std::make_exception_ptr(communication_error("process group destroyed before the operation ran")));
    }
  }

  // Queues fn; the returned work completes when fn returns (or with what fn threw).
  [[nodiscard]] work submit(std::function<void()> fn) {
    auto state = std::make_shared<work_state>();
    {
      std::lock_guard lock(mutex_);
      queue_.emplace_back(state, std::move(fn));
    }
    cv_.notify_one();
    return work(state);
  }

 private:
  void run(std::stop_token st) {
    for (;;) {
      std::pair<std::shared_ptr<work_state>, std::function<void()>> item;
      {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [&] { return st.stop_requested() || !queue_.empty(); });
        if (st.stop_requested()) return;
        item = std::move(queue_.front());
        queue_.pop_front();
      }
      std::exception_ptr err;
      try {
        item.second();
      } catch (...) {
        err = std::current_exception();
      }
      item.second = nullptr;
      item.first->complete(err);
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::pair<std::shared_ptr<work_state>, std::function<void()>>> queue_;
  std::jthread thread_;
};

}  // namespace partrain::inline v0::detail
