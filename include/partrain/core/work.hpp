// partrain/core/work.hpp: the handle a collective returns. It can be waited on, polled,
// chained with then(), or co_awaited, so communication can overlap compute.
#pragma once

#include <chrono>
#include <condition_variable>
#include <coroutine>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace partrain::inline v0 {

namespace detail {

// Shared between the issuing thread and the thread that runs the operation.
class work_state {
 public:
  // Runs the then() callbacks, then marks the operation finished (with an error, if any), wakes
  // waiters and resumes an awaiting coroutine (on this, the completing thread). Callbacks run
  // first so that whatever they do (a comm hook's copy back, a trace span's end) happens before
  // wait() returns anywhere.
  // The error is recorded first: a callback may read it (then_work passes it on).
  void complete(std::exception_ptr err = nullptr) noexcept {
    std::coroutine_handle<> cont;
    std::function<void(work_state&)> runner;  // released outside the lock
    {
      std::lock_guard lock(mutex_);
      error_ = std::move(err);
      runner.swap(runner_);  // nothing left to run here
    }
    for (;;) {
      std::vector<std::function<void()>> callbacks;
      {
        std::lock_guard lock(mutex_);
        if (callbacks_.empty()) {
          done_ = true;
          cont = std::exchange(continuation_, {});
          break;
        }
        callbacks.swap(callbacks_);
      }
      // One registered meanwhile is taken on the next turn. A callback that throws cannot end the
      // process from this thread (often a backend's worker): its exception becomes the work's
      // error, unless the work had failed already, and the other callbacks still run.
      for (auto& cb : callbacks) {
        try {
          cb();
        } catch (...) {
          std::lock_guard lock(mutex_);
          if (!error_) error_ = std::current_exception();
        }
      }
    }
    cv_.notify_all();
    if (cont) cont.resume();
  }
  [[nodiscard]] bool done() const {
    std::lock_guard lock(mutex_);
    return done_;
  }
  void wait() const {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return done_; });
    if (error_) std::rethrow_exception(error_);
  }
  [[nodiscard]] bool wait_for(std::chrono::nanoseconds d) const {
    std::unique_lock lock(mutex_);
    if (!cv_.wait_for(lock, d, [&] { return done_; })) return false;
    if (error_) std::rethrow_exception(error_);
    return true;
  }
  [[nodiscard]] bool set_continuation(std::coroutine_handle<> h) {
    std::lock_guard lock(mutex_);
    if (done_) return false;
    continuation_ = h;
    return true;
  }
  void on_complete(std::function<void()> f) {
    {
      std::lock_guard lock(mutex_);
      if (!done_) {
        callbacks_.push_back(std::move(f));
        return;
      }
    }
    f();
  }
  [[nodiscard]] std::exception_ptr error() const {
    std::lock_guard lock(mutex_);
    return error_;
  }
  // An executor that can run the operation on the thread that waits for it (when it has not
  // started yet) leaves that offer here; work::wait() takes it before blocking.
  void set_runner(std::function<void(work_state&)> r) {
    std::lock_guard lock(mutex_);
    runner_ = std::move(r);
  }
  void run_here_if_waiting() {
    std::function<void(work_state&)> r;
    {
      std::lock_guard lock(mutex_);
      if (done_ || !runner_) return;
      r = std::exchange(runner_, {});
    }
    r(*this);
  }

 private:
  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
  std::coroutine_handle<> continuation_;
  std::vector<std::function<void()>> callbacks_;
  std::function<void(work_state&)> runner_;
};

}  // namespace detail

// Not [[nodiscard]] on the class: the functions returning a work are, and nvcc would also flag
// every assignment (operator= returns work&).
class work {
 public:
  work() : state_(std::make_shared<detail::work_state>()) {}
  explicit work(std::shared_ptr<detail::work_state> s) noexcept : state_(std::move(s)) {}

  // A work that is already finished (a no-op collective, or one the backend ran inline).
  [[nodiscard]] static work completed(std::exception_ptr err = nullptr) {
    work w;
    w.state_->complete(std::move(err));
    return w;
  }

  [[nodiscard]] bool is_completed() const { return state_->done(); }
  // Blocks until the operation finishes; rethrows its error. Backends bound every operation
  // with their timeout, so this never waits forever. An operation queued behind nothing may run
  // here, on the waiting thread, rather than wake a worker and be woken by it.
  void wait() const {
    state_->run_here_if_waiting();
    state_->wait();
  }
  // False when d passed first; rethrows the operation's error if it finished with one.
  [[nodiscard]] bool wait_for(std::chrono::nanoseconds d) const { return state_->wait_for(d); }
  // Runs f (on the completing thread, or now if already done) once the operation finished. An
  // exception f throws on the completing thread becomes the work's error (wait() rethrows it),
  // unless the operation had failed already.
  void then(std::function<void()> f) const { state_->on_complete(std::move(f)); }
  [[nodiscard]] std::exception_ptr error() const { return state_->error(); }
  [[nodiscard]] const std::shared_ptr<detail::work_state>& state() const noexcept { return state_; }

  // Awaitable: a coroutine suspends until completion and resumes on the completing thread.
  [[nodiscard]] bool await_ready() const noexcept { return state_->done(); }
  [[nodiscard]] bool await_suspend(std::coroutine_handle<> h) { return state_->set_continuation(h); }
  void await_resume() const {
    if (auto e = state_->error()) std::rethrow_exception(e);
  }

 private:
  std::shared_ptr<detail::work_state> state_;
};

// Anything a collective may return: waitable and co_awaitable.
template <class W>
concept awaitable_work = requires(W& w, std::coroutine_handle<> h) {
  w.wait();
  { w.is_completed() } -> std::convertible_to<bool>;
  { w.await_ready() } -> std::convertible_to<bool>;
  w.await_suspend(h);
  w.await_resume();
};

// Waits for every work in the range (or list), each through wait_one(w) (which may give a failure
// its context), rethrowing the first error after all finished: none is left reading its buffers.
template <class R, class F>
void wait_all(R&& works, F wait_one) {
  std::exception_ptr first;
  for (auto& w : works) {
    try {
      wait_one(w);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}
template <class R>
void wait_all(R&& works) {
  wait_all(works, [](auto& w) { w.wait(); });
}

}  // namespace partrain::inline v0
