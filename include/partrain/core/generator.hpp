// partrain/core/generator.hpp: generator<T>, a lazy synchronous coroutine range in the cppcoro
// manner. The body runs only when the consumer advances; `co_yield` hands out a reference to a
// value that lives in the coroutine frame (no copy), valid until the next increment.
//
//   generator<const batch&> batches() { for (const batch& b : source) co_yield b; }
//   for (const batch& b : batches()) ...
//
// An exception thrown by the body propagates out of begin() or operator++ to the consumer.
// `co_await` inside a generator is rejected at compile time (await_transform is deleted).
#pragma once

#include <coroutine>
#include <cstddef>
#include <exception>
#include <iterator>
#include <memory>
#include <ranges>
#include <type_traits>
#include <utility>

namespace partrain::inline v0 {

template <class T>
class generator;

namespace detail {

template <class T>
class generator_promise {
 public:
  using value_type = std::remove_cvref_t<T>;
  using reference = std::conditional_t<std::is_reference_v<T>, T, T&>;
  using pointer = std::add_pointer_t<reference>;

  generator_promise() = default;

  generator<T> get_return_object() noexcept;

  // Lazy: nothing runs until the consumer calls begin().
  std::suspend_always initial_suspend() const noexcept { return {}; }
  std::suspend_always final_suspend() const noexcept { return {}; }

  // The yielded object outlives the suspension (it is a temporary of the co_yield full
  // expression or a named object of the body), so keeping its address is safe until resume.
  std::suspend_always yield_value(std::remove_reference_t<T>& value) noexcept
    requires(!std::is_rvalue_reference_v<T>)
  {
    value_ = std::addressof(value);
    return {};
  }
  std::suspend_always yield_value(std::remove_reference_t<T>&& value) noexcept {
    value_ = std::addressof(value);
    return {};
  }

  void unhandled_exception() noexcept { exception_ = std::current_exception(); }
  void return_void() noexcept {}

  // No co_await inside a generator: it has no scheduler to resume it.
  template <class U>
  std::suspend_never await_transform(U&& value) = delete;

  [[nodiscard]] reference value() const noexcept { return static_cast<reference>(*value_); }

  void rethrow_if_exception() {
    if (exception_) std::rethrow_exception(std::exchange(exception_, nullptr));
  }

 private:
  pointer value_ = nullptr;
  std::exception_ptr exception_;
};

struct generator_sentinel {};

template <class T>
class generator_iterator {
  using coroutine_handle = std::coroutine_handle<generator_promise<T>>;

 public:
  using iterator_category = std::input_iterator_tag;
  using difference_type = std::ptrdiff_t;
  using value_type = typename generator_promise<T>::value_type;
  using reference = typename generator_promise<T>::reference;
  using pointer = typename generator_promise<T>::pointer;

  generator_iterator() noexcept = default;
  explicit generator_iterator(coroutine_handle h) noexcept : coroutine_(h) {}

  friend bool operator==(const generator_iterator& it, generator_sentinel) noexcept {
    return !it.coroutine_ || it.coroutine_.done();
  }

  generator_iterator& operator++() {
    coroutine_.resume();
    if (coroutine_.done()) coroutine_.promise().rethrow_if_exception();
    return *this;
  }
  void operator++(int) { ++*this; }

  [[nodiscard]] reference operator*() const noexcept { return coroutine_.promise().value(); }
  [[nodiscard]] pointer operator->() const noexcept { return std::addressof(**this); }

 private:
  coroutine_handle coroutine_ = nullptr;
};

}  // namespace detail

template <class T>
class [[nodiscard]] generator {
 public:
  using promise_type = detail::generator_promise<T>;
  using iterator = detail::generator_iterator<T>;
  using sentinel = detail::generator_sentinel;

  generator() noexcept = default;
  generator(generator&& o) noexcept : coroutine_(std::exchange(o.coroutine_, nullptr)) {}
  generator& operator=(generator&& o) noexcept {
    if (this != &o) {
      if (coroutine_) coroutine_.destroy();
      coroutine_ = std::exchange(o.coroutine_, nullptr);
    }
    return *this;
  }
  generator(const generator&) = delete;
  generator& operator=(const generator&) = delete;
  // Destroying a suspended generator destroys its frame, running the body's destructors
  // (how a consumer that breaks out of a loop stops the producer).
  ~generator() {
    if (coroutine_) coroutine_.destroy();
  }

  // Starts (or, called again, continues) the body. Single pass: an input range.
  [[nodiscard]] iterator begin() {
    if (coroutine_) {
      coroutine_.resume();
      if (coroutine_.done()) coroutine_.promise().rethrow_if_exception();
    }
    return iterator{coroutine_};
  }
  [[nodiscard]] sentinel end() const noexcept { return {}; }

 private:
  friend class detail::generator_promise<T>;
  explicit generator(std::coroutine_handle<promise_type> h) noexcept : coroutine_(h) {}

  std::coroutine_handle<promise_type> coroutine_ = nullptr;
};

namespace detail {
template <class T>
generator<T> generator_promise<T>::get_return_object() noexcept {
  return generator<T>{std::coroutine_handle<generator_promise<T>>::from_promise(*this)};
}
}  // namespace detail

}  // namespace partrain::inline v0

template <class T>
inline constexpr bool std::ranges::enable_view<partrain::generator<T>> = true;
