// partrain/comm/detail/wait_pool.hpp: threads that each block on one pending transfer. Unlike
// op_worker (one thread, issue order), a wait here never queues behind another: a receive can
// complete while an earlier send still waits for its peer. Threads are reused and the pool grows
// to the number of transfers pending at once.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <partrain/comm/work.hpp>
#include <partrain/core/error.hpp>

namespace partrain::inline v0::detail {

class wait_pool {
 public:
  wait_pool() = default;
  wait_pool(const wait_pool&) = delete;
  wait_pool& operator=(const wait_pool&) = delete;
  ~wait_pool() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    threads_.clear();  // joins; each running wait is bounded by its own timeout
    for (auto& [state, fn] : queue_) {
      state->complete(std::make_exception_ptr(communication_error("process group destroyed before the transfer was waited on")));
    }
  }

  // Runs fn on a free thread (starting one if none is idle); the work completes when fn returns.
  [[nodiscard]] work submit(std::function<void()> fn) {
    auto state = std::make_shared<work_state>();
    {
      std::lock_guard lock(mutex_);
      queue_.emplace_back(state, std::move(fn));
      if (idle_ < queue_.size()) threads_.emplace_back([this] { run(); });
    }
    cv_.notify_one();
    return work(state);
  }

 private:
  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      ++idle_;
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      --idle_;
      if (stopping_) return;
      auto item = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      std::exception_ptr err;
      try {
        item.second();
      } catch (...) {
        err = std::current_exception();
      }
      item.second = nullptr;
      item.first->complete(err);
      lock.lock();
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::pair<std::shared_ptr<work_state>, std::function<void()>>> queue_;
  std::size_t idle_ = 0;
  bool stopping_ = false;
  std::vector<std::jthread> threads_;  // last: joined first
};

}  // namespace partrain::inline v0::detail
