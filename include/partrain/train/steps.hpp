// partrain/train/steps.hpp: `views::steps(fn)`, the step adaptor of the training loop. Over a
// range of batches it runs `fn(batch)` once per batch, as the consumer advances, and yields a
// `step_result` with the step number and what fn returned (typically the loss):
//
//   std::size_t step = 0;
//   for (const auto& s : loader | views::steps(train_one, step)) log(s.step, s.value);
//
// Without a counter steps are numbered from 0; with a std::size_t& counter they are numbered
// globally across epochs (the counter advances as steps run, so a checkpoint reads the step from
// it, and a resumed run sets it to the checkpoint's step). The range is single pass, like the loader under it.
#pragma once

#include <concepts>
#include <cstddef>
#include <functional>
#include <ranges>
#include <type_traits>
#include <utility>

#include <partrain/core/generator.hpp>
#include <partrain/core/range_closure.hpp>

namespace partrain::inline v0 {

template <class R>
struct step_result {
  std::size_t step = 0;  // 0-based, counted over every range the same counter numbered
  R value{};
};

namespace detail::steps {

template <std::ranges::view V, class F>
generator<const step_result<std::invoke_result_t<F&, std::ranges::range_reference_t<V>>>&> run(
    V base, F fn, std::size_t* counter, std::size_t first) {
  using result = std::invoke_result_t<F&, std::ranges::range_reference_t<V>>;
  std::size_t own = first;
  std::size_t& n = counter ? *counter : own;
  for (auto&& item : base) {
    step_result<result> s{n, std::invoke(fn, std::forward<decltype(item)>(item))};
    ++n;  // counted once the step ran, so a checkpoint taken in the body sees the finished count
    co_yield s;
  }
}

template <class F>
[[nodiscard]] auto make_closure(F&& fn, std::size_t* counter, std::size_t first) {
  return make_range_closure([fn = std::forward<F>(fn), counter, first]<std::ranges::viewable_range R>(R&& r) {
    using V = std::views::all_t<R>;
    static_assert(std::invocable<std::decay_t<F>&, std::ranges::range_reference_t<V>>,
                  "partrain: views::steps(fn) needs fn callable with an element of the range (a batch)");
    static_assert(!std::is_void_v<std::invoke_result_t<std::decay_t<F>&, std::ranges::range_reference_t<V>>>,
                  "partrain: views::steps(fn): fn must return what the step produced (e.g. the loss), not void");
    return steps::run<V, std::decay_t<F>>(std::views::all(std::forward<R>(r)), fn, counter, first);
  });
}

}  // namespace detail::steps

namespace views {

struct steps_t {
  // Numbers steps through `counter`, which it advances (a global step across epochs).
  template <class F>
  [[nodiscard]] auto operator()(F&& fn, std::size_t& counter) const {
    return detail::steps::make_closure(std::forward<F>(fn), &counter, 0);
  }
  // Numbers steps from 0.
  template <class F>
  [[nodiscard]] auto operator()(F&& fn) const {
    return detail::steps::make_closure(std::forward<F>(fn), nullptr, 0);
  }
};

inline constexpr steps_t steps{};

}  // namespace views
}  // namespace partrain::inline v0
