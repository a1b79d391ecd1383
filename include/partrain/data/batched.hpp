// partrain/data/batched.hpp: `indices | views::batched(batch_size, drop_last)` cuts a random-access
// sized range of indices into consecutive batches of batch_size (the last one partial, or dropped
// with drop_last, as PyTorch's BatchSampler). Each element is a subrange of the underlying range;
// set_epoch on the batched view reaches the sampler underneath.
//
//   for (auto batch : views::distributed(n, W, r).set_epoch(e) | views::batched(256)) ...
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <ranges>
#include <string>
#include <utility>

#include <partrain/core/error.hpp>
#include <partrain/core/range_closure.hpp>
#include <partrain/data/detail/indexed_view.hpp>
#include <partrain/data/detail/set_epoch.hpp>

namespace partrain::inline v0 {

// What samplers produce and adaptors consume: random access, sized, integral elements.
template <class R>
concept index_range = std::ranges::random_access_range<const R> && std::ranges::sized_range<const R> &&
                      std::integral<std::remove_cvref_t<std::ranges::range_reference_t<const R>>>;

template <std::ranges::view V>
  requires index_range<V>
class batched_view : public detail::data::indexed_view_base<batched_view<V>> {
  using base_iterator = std::ranges::iterator_t<const V>;

 public:
  batched_view() = default;
  batched_view(V base, std::size_t batch_size, bool drop_last)
      : base_(std::move(base)), batch_size_(batch_size), drop_last_(drop_last) {
    if (batch_size == 0) throw invalid_argument_error("views::batched: batch_size is 0, expected at least 1");
  }

  [[nodiscard]] std::size_t size() const noexcept {
    const auto n = static_cast<std::size_t>(std::ranges::size(base_));
    return drop_last_ ? n / batch_size_ : (n + batch_size_ - 1) / batch_size_;
  }
  [[nodiscard]] std::ranges::subrange<base_iterator> element(std::size_t k) const {
    const auto n = static_cast<std::size_t>(std::ranges::size(base_));
    const std::size_t first = k * batch_size_;
    const std::size_t last = std::min(first + batch_size_, n);
    const auto b = std::ranges::begin(base_);
    using diff = std::iter_difference_t<base_iterator>;
    return {b + static_cast<diff>(first), b + static_cast<diff>(last)};
  }
  [[nodiscard]] std::size_t batch_size() const noexcept { return batch_size_; }
  [[nodiscard]] bool drop_last() const noexcept { return drop_last_; }
  [[nodiscard]] const V& base() const& noexcept { return base_; }
  [[nodiscard]] V& base() & noexcept { return base_; }

  batched_view& set_epoch(std::uint64_t epoch) & {
    (void)detail::data::forward_set_epoch(base_, epoch);
    return *this;
  }
  batched_view set_epoch(std::uint64_t epoch) && {
    set_epoch(epoch);
    return std::move(*this);
  }

 private:
  V base_{};
  std::size_t batch_size_ = 1;
  bool drop_last_ = false;
};

namespace views {
struct batched_t {
  template <std::ranges::viewable_range R>
  [[nodiscard]] auto operator()(R&& indices, std::size_t batch_size, bool drop_last = false) const {
    static_assert(index_range<std::views::all_t<R>>,
                  "views::batched needs a random-access, sized range of integral indices "
                  "(a sampler such as views::sequential(n), or a std::vector<std::size_t>)");
    return batched_view<std::views::all_t<R>>(std::views::all(std::forward<R>(indices)), batch_size, drop_last);
  }
  [[nodiscard]] auto operator()(std::size_t batch_size, bool drop_last = false) const {
    if (batch_size == 0) throw invalid_argument_error("views::batched: batch_size is 0, expected at least 1");
    return detail::make_range_closure([batch_size, drop_last]<std::ranges::viewable_range R>(R&& r) {
      return batched_t{}(std::forward<R>(r), batch_size, drop_last);
    });
  }
};
inline constexpr batched_t batched{};
}  // namespace views

}  // namespace partrain::inline v0
