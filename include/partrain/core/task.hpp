// partrain/core/task.hpp: `task<T>`, a lazy coroutine that produces one T (cppcoro's shape), and
// `sync_wait(task)`, which drives a task to completion from ordinary code.
//
// - Lazy: the body starts when the task is co_awaited (or sync_wait'ed), never at the call.
// - Symmetric transfer: starting a child and resuming the parent are tail calls, so a loop of
//   a million co_awaits of finished tasks does not grow the stack.
// - Exceptions thrown in the body propagate to whoever co_awaits the task.
// - A task resumes on the thread that drives it: inside sync_wait, co_await on anything with a
//   `then(callback)` member (a collective's `work`) posts the continuation back to sync_wait's
//   thread instead of running the rest of the body on the backend's worker thread. That keeps
//   the training loop on its own thread (one BLAS thread per rank) and lets it issue further
//   collectives without deadlocking the backend's worker.
#pragma once

#include <concepts>
#include <condition_variable>
#include <coroutine>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>

#include <partrain/core/error.hpp>

namespace partrain::inline v0 {

template <class T = void>
class task;

namespace detail {

// The queue of coroutines sync_wait resumes on its own thread.
class run_loop {
 public:
  // Both notify under the lock: the moment the loop thread sees the change it may return and
  // destroy the loop, so the poster must be done with cv_ before it releases the mutex.
  void post(std::coroutine_handle<> h) {
    std::lock_guard lock(mutex_);
    queue_.push_back(h);
    cv_.notify_one();
  }
  void finish() noexcept {
    std::lock_guard lock(mutex_);
    finished_ = true;
    cv_.notify_one();
  }
  // Resumes posted coroutines until finish(). Waiting has no deadline of its own: whatever the
  // task awaits (a collective) is bounded by its backend's timeout and then completes with an error.
  void run() {
    for (;;) {
      std::coroutine_handle<> next;
      {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [&] { return finished_ || !queue_.empty(); });
        if (queue_.empty()) return;
        next = queue_.front();
        queue_.pop_front();
      }
      next.resume();
    }
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::coroutine_handle<>> queue_;
  bool finished_ = false;
};

// Something that can tell us when it is done (partrain::work): resumed through the run loop.
template <class A>
concept completion_notifier = requires(A& a, std::function<void()> f) {
  a.then(std::move(f));
  { a.is_completed() } -> std::convertible_to<bool>;
  a.await_resume();
};

template <class A>
class resume_on_loop_awaiter {
 public:
  template <class U>
  resume_on_loop_awaiter(U&& a, run_loop* loop) : a_(std::forward<U>(a)), loop_(loop) {}

  [[nodiscard]] bool await_ready() { return a_.is_completed(); }
  bool await_suspend(std::coroutine_handle<> h) {
    if (!loop_) return a_.await_suspend(h);  // no driver thread to go back to: resume inline
    a_.then([loop = loop_, h] { loop->post(h); });
    return true;
  }
  decltype(auto) await_resume() { return a_.await_resume(); }

 private:
  A a_;  // a copy of the handle (work is a shared_ptr), so the temporary may go away
  run_loop* loop_;
};

class task_promise_base {
 public:
  struct final_awaiter {
    [[nodiscard]] bool await_ready() const noexcept { return false; }
    template <class P>
    std::coroutine_handle<> await_suspend(std::coroutine_handle<P> h) noexcept {
      if (auto c = h.promise().continuation_) return c;
      return std::noop_coroutine();
    }
    void await_resume() const noexcept {}
  };

  [[nodiscard]] std::suspend_always initial_suspend() const noexcept { return {}; }
  [[nodiscard]] final_awaiter final_suspend() const noexcept { return {}; }

  template <class A>
  decltype(auto) await_transform(A&& a) {
    if constexpr (completion_notifier<std::remove_cvref_t<A>>) {
      return resume_on_loop_awaiter<std::remove_cvref_t<A>>(std::forward<A>(a), loop_);
    } else {
      return std::forward<A>(a);
    }
  }

  void set_continuation(std::coroutine_handle<> c, run_loop* loop) noexcept {
    continuation_ = c;
    loop_ = loop;
  }
  [[nodiscard]] run_loop* loop() const noexcept { return loop_; }

 private:
  std::coroutine_handle<> continuation_;
  run_loop* loop_ = nullptr;
};

template <class T>
class task_promise final : public task_promise_base {
 public:
  task<T> get_return_object() noexcept;
  void unhandled_exception() noexcept { error_ = std::current_exception(); }
  template <class U>
    requires std::convertible_to<U&&, T>
  void return_value(U&& v) noexcept(std::is_nothrow_constructible_v<T, U&&>) {
    value_.emplace(std::forward<U>(v));
  }
  T& result() & {
    if (error_) std::rethrow_exception(error_);
    return *value_;
  }
  T&& result() && {
    if (error_) std::rethrow_exception(error_);
    return std::move(*value_);
  }

 private:
  std::optional<T> value_;
  std::exception_ptr error_;
};

template <class T>
class task_promise<T&> final : public task_promise_base {
 public:
  task<T&> get_return_object() noexcept;
  void unhandled_exception() noexcept { error_ = std::current_exception(); }
  void return_value(T& v) noexcept { value_ = std::addressof(v); }
  T& result() const {
    if (error_) std::rethrow_exception(error_);
    return *value_;
  }

 private:
  T* value_ = nullptr;
  std::exception_ptr error_;
};

template <>
class task_promise<void> final : public task_promise_base {
 public:
  task<void> get_return_object() noexcept;
  void unhandled_exception() noexcept { error_ = std::current_exception(); }
  void return_void() noexcept {}
  void result() const {
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::exception_ptr error_;
};

}  // namespace detail

template <class T>
class [[nodiscard]] task {
 public:
  using promise_type = detail::task_promise<T>;
  using value_type = T;

  task() noexcept = default;
  explicit task(std::coroutine_handle<promise_type> h) noexcept : h_(h) {}
  task(task&& o) noexcept : h_(std::exchange(o.h_, {})) {}
  task& operator=(task&& o) noexcept {
    if (this != &o) {
      if (h_) h_.destroy();
      h_ = std::exchange(o.h_, {});
    }
    return *this;
  }
  task(const task&) = delete;
  task& operator=(const task&) = delete;
  ~task() {
    if (h_) h_.destroy();
  }

  // True once the body ran to its end (or threw); a default-constructed task counts as done.
  [[nodiscard]] bool is_ready() const noexcept { return !h_ || h_.done(); }

  auto operator co_await() & noexcept { return awaiter<false>{h_}; }
  auto operator co_await() && noexcept { return awaiter<true>{h_}; }

 private:
  template <bool Move>
  struct awaiter {
    std::coroutine_handle<promise_type> h;
    [[nodiscard]] bool await_ready() const noexcept { return !h || h.done(); }
    template <class P>
    std::coroutine_handle<> await_suspend(std::coroutine_handle<P> awaiting) noexcept {
      detail::run_loop* loop = nullptr;
      if constexpr (std::derived_from<P, detail::task_promise_base>) loop = awaiting.promise().loop();
      h.promise().set_continuation(awaiting, loop);
      return h;  // symmetric transfer: start the body now, as a tail call
    }
    decltype(auto) await_resume() {
      if (!h) throw invalid_argument_error("co_await on an empty task (moved from or default-constructed)");
      if constexpr (std::is_void_v<T>) {
        h.promise().result();
      } else if constexpr (Move && !std::is_reference_v<T>) {
        return std::move(h.promise()).result();
      } else {
        return h.promise().result();
      }
    }
  };

  std::coroutine_handle<promise_type> h_;
};

namespace detail {
template <class T>
task<T> task_promise<T>::get_return_object() noexcept {
  return task<T>{std::coroutine_handle<task_promise<T>>::from_promise(*this)};
}
template <class T>
task<T&> task_promise<T&>::get_return_object() noexcept {
  return task<T&>{std::coroutine_handle<task_promise<T&>>::from_promise(*this)};
}
inline task<void> task_promise<void>::get_return_object() noexcept {
  return task<void>{std::coroutine_handle<task_promise<void>>::from_promise(*this)};
}

// The coroutine sync_wait wraps around the user's task: it awaits it, then stops the loop. Its
// promise is a task promise, so the awaited task learns which loop to resume on.
class sync_wait_driver {
 public:
  struct promise_type : task_promise_base {
    sync_wait_driver get_return_object() noexcept {
      return sync_wait_driver{std::coroutine_handle<promise_type>::from_promise(*this)};
    }
    struct final_awaiter {
      [[nodiscard]] bool await_ready() const noexcept { return false; }
      void await_suspend(std::coroutine_handle<promise_type> h) noexcept { h.promise().loop()->finish(); }
      void await_resume() const noexcept {}
    };
    [[nodiscard]] final_awaiter final_suspend() const noexcept { return {}; }
    void return_void() noexcept {}
    // The awaited task keeps its own exception; nothing else in the driver's body can throw.
    void unhandled_exception() noexcept { std::terminate(); }
  };
  explicit sync_wait_driver(std::coroutine_handle<promise_type> h) noexcept : h_(h) {}
  sync_wait_driver(sync_wait_driver&& o) noexcept : h_(std::exchange(o.h_, {})) {}
  sync_wait_driver(const sync_wait_driver&) = delete;
  sync_wait_driver& operator=(const sync_wait_driver&) = delete;
  sync_wait_driver& operator=(sync_wait_driver&&) = delete;
  ~sync_wait_driver() {
    if (h_) h_.destroy();
  }
  void run(run_loop& loop) {
    h_.promise().set_continuation({}, &loop);
    loop.post(h_);
    loop.run();
  }

 private:
  std::coroutine_handle<promise_type> h_;
};

// Starts the task and waits for its end without fetching the result (sync_wait fetches it
// outside, so an exception never escapes into the driver).
template <class T>
struct start_awaiter {
  task<T>& t;
  [[nodiscard]] bool await_ready() const noexcept { return t.is_ready(); }
  template <class P>
  std::coroutine_handle<> await_suspend(std::coroutine_handle<P> h) noexcept {
    return t.operator co_await().await_suspend(h);
  }
  void await_resume() const noexcept {}
};

template <class T>
sync_wait_driver make_sync_wait_driver(task<T>& t) {
  co_await start_awaiter<T>{t};
}
}  // namespace detail

// Runs the task on the calling thread until it finishes; returns its value or rethrows its error.
template <class T>
T sync_wait(task<T>&& t) {
  if (t.is_ready()) {
    // Either empty (await_resume reports it) or already finished.
    return std::move(t).operator co_await().await_resume();
  }
  detail::run_loop loop;
  {
    auto driver = detail::make_sync_wait_driver(t);
    driver.run(loop);
  }
  return std::move(t).operator co_await().await_resume();
}

}  // namespace partrain::inline v0
