// partrain/data/weighted_split.hpp: load balancing for uneven devices. Every rank walks the same
// global batches (same sampler, same seed) and takes a contiguous share of each batch in
// proportion to its speed, so a device twice as fast gets twice the rows and all ranks finish a
// step together. Shares are whole rows by core/weighted_shares.hpp (ties to the lower rank), so
// each share is within one row of batch_size * weight / sum(weights) and the shares add up
// to the batch exactly. Weights are plain doubles; every rank must pass the same ones.
//
//   auto mine = views::shuffled(n, seed).set_epoch(e) | views::batched(512)
//             | views::weighted_split({3.0, 1.0}, rank);   // rank 0: 384 rows, rank 1: 128
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <numeric>
#include <ranges>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <partrain/core/error.hpp>
#include <partrain/core/range_closure.hpp>
#include <partrain/core/weighted_shares.hpp>
#include <partrain/data/detail/indexed_view.hpp>
#include <partrain/data/detail/set_epoch.hpp>

namespace partrain::inline v0 {

template <std::ranges::view V>
  requires std::ranges::random_access_range<const V> && std::ranges::sized_range<const V> &&
           std::ranges::random_access_range<std::ranges::range_reference_t<const V>> &&
           std::ranges::sized_range<std::ranges::range_reference_t<const V>>
class weighted_split_view : public detail::data::indexed_view_base<weighted_split_view<V>> {
  using batch_type = std::ranges::range_value_t<const V>;

 public:
  weighted_split_view() = default;
  weighted_split_view(V base, std::vector<double> weights, int rank)
      : base_(std::move(base)), weights_(std::make_shared<const std::vector<double>>(std::move(weights))), rank_(rank) {
    (void)weighted_shares(0, *weights_, "weighted_split");  // validates the weights now, not at the first batch
    if (rank < 0 || static_cast<std::size_t>(rank) >= weights_->size()) {
      throw invalid_argument_error("views::weighted_split: rank " + std::to_string(rank) +
                                   " is out of range, expected 0 <= rank < " + std::to_string(weights_->size()) +
                                   " (one weight per rank)");
    }
  }

  [[nodiscard]] std::size_t size() const noexcept { return static_cast<std::size_t>(std::ranges::size(base_)); }
  [[nodiscard]] auto element(std::size_t k) const {
    auto batch = std::ranges::begin(base_)[static_cast<std::ranges::range_difference_t<const V>>(k)];
    const auto shares = weighted_shares(static_cast<std::size_t>(std::ranges::size(batch)), *weights_, "weighted_split");
    const auto r = static_cast<std::size_t>(rank_);
    const std::size_t offset = std::accumulate(shares.begin(), shares.begin() + static_cast<std::ptrdiff_t>(r), std::size_t{0});
    const auto b = std::ranges::begin(batch);
    using diff = std::ranges::range_difference_t<decltype(batch)>;
    return std::ranges::subrange(b + static_cast<diff>(offset), b + static_cast<diff>(offset + shares[r]));
  }
  [[nodiscard]] const std::vector<double>& weights() const noexcept { return *weights_; }
  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] const V& base() const& noexcept { return base_; }
  [[nodiscard]] V& base() & noexcept { return base_; }

  weighted_split_view& set_epoch(std::uint64_t epoch) & {
    (void)detail::data::forward_set_epoch(base_, epoch);
    return *this;
  }
  weighted_split_view set_epoch(std::uint64_t epoch) && {
    set_epoch(epoch);
    return std::move(*this);
  }

 private:
  V base_{};
  std::shared_ptr<const std::vector<double>> weights_ = std::make_shared<const std::vector<double>>(1, 1.0);
  int rank_ = 0;
};

namespace views {
struct weighted_split_t {
  template <std::ranges::viewable_range R>
  [[nodiscard]] auto operator()(R&& batches, std::vector<double> weights, int rank) const {
    using V = std::views::all_t<R>;
    static_assert(std::ranges::random_access_range<const V> && std::ranges::sized_range<const V>,
                  "views::weighted_split needs a random-access, sized range of batches "
                  "(e.g. a sampler | views::batched(global_batch_size))");
    static_assert(std::ranges::random_access_range<std::ranges::range_reference_t<const V>>,
                  "views::weighted_split: each batch must be a random-access, sized range of indices");
    return weighted_split_view<V>(std::views::all(std::forward<R>(batches)), std::move(weights), rank);
  }
  [[nodiscard]] auto operator()(std::vector<double> weights, int rank) const {
    (void)weighted_shares(0, weights, "weighted_split");
    return detail::make_range_closure([weights = std::move(weights), rank]<std::ranges::viewable_range R>(R&& r) {
      return weighted_split_t{}(std::forward<R>(r), weights, rank);
    });
  }
};
inline constexpr weighted_split_t weighted_split{};
}  // namespace views

}  // namespace partrain::inline v0
