// partrain/data/weighted_split.hpp: load balancing for uneven devices. Every rank walks the same
// global batches (same sampler, same seed) and takes a contiguous share of each batch in
// proportion to its speed, so a device twice as fast gets twice the rows and all ranks finish a
// step together. Shares are whole rows by the largest-remainder rule (ties to the lower rank),
// so each share is within one row of batch_size * weight / sum(weights) and the shares add up
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
#include <partrain/data/detail/indexed_view.hpp>
#include <partrain/data/detail/range_closure.hpp>
#include <partrain/data/detail/set_epoch.hpp>

namespace partrain::inline v0 {

namespace detail {
inline void check_weights(std::span<const double> weights) {
  if (weights.empty()) throw invalid_argument_error("weighted_split: no weights given, expected one per rank");
  double sum = 0;
  for (std::size_t i = 0; i < weights.size(); ++i) {
    if (!std::isfinite(weights[i]) || weights[i] < 0) {
      throw invalid_argument_error("weighted_split: weight " + std::to_string(i) + " is " +
                                   std::to_string(weights[i]) + ", expected a finite value >= 0");
    }
    sum += weights[i];
  }
  if (!(sum > 0)) throw invalid_argument_error("weighted_split: the weights sum to 0, expected a positive sum");
}
}  // namespace detail

// Rows of a batch of `total` for each weight: floor of the exact quota, then one more row to the
// largest fractional remainders (ties to the lower index) until the shares sum to `total`.
[[nodiscard]] inline std::vector<std::size_t> weighted_shares(std::size_t total, std::span<const double> weights) {
  detail::check_weights(weights);
  const double sum = std::accumulate(weights.begin(), weights.end(), 0.0);
  std::vector<std::size_t> share(weights.size());
  std::vector<double> remainder(weights.size());
  std::size_t given = 0;
  for (std::size_t i = 0; i < weights.size(); ++i) {
    const double quota = static_cast<double>(total) * (weights[i] / sum);
    share[i] = std::min(static_cast<std::size_t>(std::floor(quota)), total - given);
    remainder[i] = quota - static_cast<double>(share[i]);
    given += share[i];
  }
  std::vector<std::size_t> order(weights.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return remainder[a] > remainder[b]; });
  for (std::size_t k = 0; given < total; k = (k + 1) % order.size(), ++given) ++share[order[k]];
  return share;
}

template <std::ranges::view V>
  requires std::ranges::random_access_range<const V> && std::ranges::sized_range<const V> &&
           std::ranges::random_access_range<std::ranges::range_reference_t<const V>> &&
           std::ranges::sized_range<std::ranges::range_reference_t<const V>>
class weighted_split_view : public detail::indexed_view_base<weighted_split_view<V>> {
  using batch_type = std::ranges::range_value_t<const V>;

 public:
  weighted_split_view() = default;
  weighted_split_view(V base, std::vector<double> weights, int rank)
      : base_(std::move(base)), weights_(std::make_shared<const std::vector<double>>(std::move(weights))), rank_(rank) {
    detail::check_weights(*weights_);
    if (rank < 0 || static_cast<std::size_t>(rank) >= weights_->size()) {
      throw invalid_argument_error("views::weighted_split: rank " + std::to_string(rank) +
                                   " is out of range, expected 0 <= rank < " + std::to_string(weights_->size()) +
                                   " (one weight per rank)");
    }
  }

  [[nodiscard]] std::size_t size() const noexcept { return static_cast<std::size_t>(std::ranges::size(base_)); }
  [[nodiscard]] auto element(std::size_t k) const {
    auto batch = std::ranges::begin(base_)[static_cast<std::ranges::range_difference_t<const V>>(k)];
    const auto shares = weighted_shares(static_cast<std::size_t>(std::ranges::size(batch)), *weights_);
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
    (void)detail::forward_set_epoch(base_, epoch);
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
    detail::check_weights(weights);
    return detail::make_range_closure([weights = std::move(weights), rank]<std::ranges::viewable_range R>(R&& r) {
      return weighted_split_t{}(std::forward<R>(r), weights, rank);
    });
  }
};
inline constexpr weighted_split_t weighted_split{};
}  // namespace views

}  // namespace partrain::inline v0
