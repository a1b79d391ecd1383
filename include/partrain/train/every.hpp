// partrain/train/every.hpp: `views::every(k, fn)`, "every k steps, do this" as a pass-through
// view: elements flow on unchanged, and fn(element) runs on every k-th one before it is handed
// on. Over views::steps the k-th is decided by the global step number (steps k-1, 2k-1, ...),
// so logging every 100 steps keeps its rhythm across epochs and resumes; over any other range,
// by the element's position in it.
//
//   for (const auto& s : loader | views::steps(train_one, step)
//                               | views::every(100, [](const auto& s) { log(s); }))
//     ...
#pragma once

#include <concepts>
#include <cstddef>
#include <functional>
#include <ranges>
#include <string>
#include <type_traits>
#include <utility>

#include <partrain/core/error.hpp>
#include <partrain/core/generator.hpp>
#include <partrain/core/range_closure.hpp>

namespace partrain::inline v0 {

namespace detail::steps {

template <class T>
concept has_step_number = requires(const T& t) {
  { t.step } -> std::convertible_to<std::size_t>;
};

template <std::ranges::view V, class F>
generator<std::ranges::range_reference_t<V>> run_every(V base, std::size_t k, F fn) {
  std::size_t position = 0;
  for (auto&& item : base) {
    std::size_t n = position++;
    if constexpr (has_step_number<std::remove_cvref_t<decltype(item)>>) n = static_cast<std::size_t>(item.step);
    if ((n + 1) % k == 0) std::invoke(fn, std::as_const(item));
    co_yield static_cast<std::ranges::range_reference_t<V>>(item);
  }
}

}  // namespace detail::steps

namespace views {

struct every_t {
  template <class F>
  [[nodiscard]] auto operator()(std::size_t k, F&& fn) const {
    if (k == 0) throw invalid_argument_error("views::every(0, fn): the period must be at least 1 step");
    return detail::make_range_closure([k, fn = std::forward<F>(fn)]<std::ranges::viewable_range R>(R&& r) {
      using V = std::views::all_t<R>;
      using ref = std::ranges::range_reference_t<V>;
      static_assert(std::invocable<std::decay_t<F>&, const std::remove_reference_t<ref>&>,
                    "partrain: views::every(k, fn) needs fn callable with a const element of the range");
      return detail::steps::run_every<V, std::decay_t<F>>(std::views::all(std::forward<R>(r)), k, fn);
    });
  }
};

inline constexpr every_t every{};

}  // namespace views
}  // namespace partrain::inline v0
