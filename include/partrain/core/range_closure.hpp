// partrain/core/range_closure.hpp: the pipe machinery for partrain's range adaptors.
// C++20 has no std::ranges::range_adaptor_closure, so adaptors wrap their bound arguments in
// range_closure: `r | views::batched(256)` calls the stored function with r, and two closures
// compose (`views::batched(8) | views::weighted_split(w, rank)`) into one that applies both.
#pragma once

#include <concepts>
#include <ranges>
#include <type_traits>
#include <utility>

namespace partrain::inline v0::detail {

template <class Fn>
struct range_closure {
  Fn fn;

  template <std::ranges::viewable_range R>
    requires std::invocable<const Fn&, R>
  [[nodiscard]] friend constexpr auto operator|(R&& r, const range_closure& c) {
    return c.fn(std::forward<R>(r));
  }
};

template <class Fn>
[[nodiscard]] constexpr range_closure<std::decay_t<Fn>> make_range_closure(Fn&& fn) {
  return {std::forward<Fn>(fn)};
}

// left | right: a closure that applies left, then right.
template <class A, class B>
[[nodiscard]] constexpr auto operator|(range_closure<A> left, range_closure<B> right) {
  return make_range_closure([left = std::move(left), right = std::move(right)]<class R>(R&& r) {
    return std::forward<R>(r) | left | right;
  });
}

}  // namespace partrain::inline v0::detail
