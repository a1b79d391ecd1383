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

  // `abandoned` ends the error message of the functions never started when the executor goes.
  explicit executor(std::size_t max_threads = 1, std::string abandoned = "process group destroyed before the operation ran")
      : max_threads_(max_threads == 0 ? 1 : max_threads), abandoned_(std::move(abandoned)) {}
  executor(const executor&) = delete;
  executor& operator=(const executor&) = delete;
  ~executor() {
    {
      // Under the mutex: otherwise the stop can land between a thread's predicate check and its
      // wait, the notify is lost and the join blocks forever.
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();  // each running function is bounded by its own timeout
    // Functions never started are failed, so nobody waits on them forever.
    for (auto& [state, fn] : queue_) state->complete(std::make_exception_ptr(communication_error(abandoned_)));
  }

  // Queues fn; the returned work completes when fn returns (or with what fn threw).
  [[nodiscard]] work submit(std::function<void()> fn) {
    auto state = std::make_shared<work_state>();
    {
      std::lock_guard lock(mutex_);
      queue_.emplace_back(state, std::move(fn));
      if (idle_ < queue_.size() && threads_.size() < max_threads_) threads_.emplace_back([this] { run(); });
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

  std::size_t max_threads_;
  std::string abandoned_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::pair<std::shared_ptr<work_state>, std::function<void()>>> queue_;
  std::size_t idle_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace partrain::inline v0::detail
