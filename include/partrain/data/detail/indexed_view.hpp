// partrain/data/detail/indexed_view.hpp: a random-access iterator over any view that can compute
// its k-th element (`element(k)`) and knows its size. The samplers and batching views use it so
// they are random-access, sized and cheap to copy without materialising their indices.
#pragma once

#include <compare>
#include <cstddef>
#include <iterator>
#include <ranges>
#include <type_traits>

namespace partrain::inline v0::detail::data {

template <class View>
class index_iterator {
 public:
  using value_type = std::remove_cvref_t<decltype(std::declval<const View&>().element(std::size_t{}))>;
  using difference_type = std::ptrdiff_t;
  // Elements are computed (prvalues), so the legacy category is input; C++20 algorithms see
  // random access through iterator_concept.
  using iterator_concept = std::random_access_iterator_tag;
  using iterator_category = std::input_iterator_tag;

  constexpr index_iterator() noexcept = default;
  constexpr index_iterator(const View* view, difference_type pos) noexcept : view_(view), pos_(pos) {}

  [[nodiscard]] constexpr value_type operator*() const { return view_->element(static_cast<std::size_t>(pos_)); }
  [[nodiscard]] constexpr value_type operator[](difference_type n) const {
    return view_->element(static_cast<std::size_t>(pos_ + n));
  }

  constexpr index_iterator& operator++() noexcept { ++pos_; return *this; }
  constexpr index_iterator operator++(int) noexcept { auto t = *this; ++pos_; return t; }
  constexpr index_iterator& operator--() noexcept { --pos_; return *this; }
  constexpr index_iterator operator--(int) noexcept { auto t = *this; --pos_; return t; }
  constexpr index_iterator& operator+=(difference_type n) noexcept { pos_ += n; return *this; }
  constexpr index_iterator& operator-=(difference_type n) noexcept { pos_ -= n; return *this; }

  [[nodiscard]] friend constexpr index_iterator operator+(index_iterator it, difference_type n) noexcept {
    return it += n;
  }
  [[nodiscard]] friend constexpr index_iterator operator+(difference_type n, index_iterator it) noexcept {
    return it += n;
  }
  [[nodiscard]] friend constexpr index_iterator operator-(index_iterator it, difference_type n) noexcept {
    return it -= n;
  }
  [[nodiscard]] friend constexpr difference_type operator-(const index_iterator& a, const index_iterator& b) noexcept {
    return a.pos_ - b.pos_;
  }
  [[nodiscard]] friend constexpr bool operator==(const index_iterator& a, const index_iterator& b) noexcept {
    return a.pos_ == b.pos_;
  }
  [[nodiscard]] friend constexpr auto operator<=>(const index_iterator& a, const index_iterator& b) noexcept {
    return a.pos_ <=> b.pos_;
  }

 private:
  const View* view_ = nullptr;
  difference_type pos_ = 0;
};

// CRTP base: Derived provides `element(k)` and `size()`; this adds begin/end and the
// view_interface conveniences (operator[], front, empty).
template <class Derived>
class indexed_view_base : public std::ranges::view_interface<Derived> {
 public:
  [[nodiscard]] constexpr index_iterator<Derived> begin() const noexcept { return {&derived(), 0}; }
  [[nodiscard]] constexpr index_iterator<Derived> end() const noexcept {
    return {&derived(), static_cast<std::ptrdiff_t>(derived().size())};
  }

 private:
  [[nodiscard]] constexpr const Derived& derived() const noexcept { return static_cast<const Derived&>(*this); }
};

}  // namespace partrain::inline v0::detail::data
