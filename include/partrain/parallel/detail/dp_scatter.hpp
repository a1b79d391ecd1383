// partrain/parallel/detail/dp_scatter.hpp: how data_parallel cuts a batch along its first
// dimension, and how it turns shares into whole examples per device.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <numeric>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <partrain/core/error.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/core/weighted_shares.hpp>

namespace partrain::inline v0 {

namespace detail::dp {

template <class T>
inline constexpr bool is_tensor_view_v = false;
template <class T, class S>
inline constexpr bool is_tensor_view_v<tensor_view<T, S>> = true;

// A batch that slices itself: b.slice(first, last) -> rows [first, last).
template <class B>
concept member_sliceable_batch = requires(const B& b, std::size_t i) {
  { b.size() } -> std::convertible_to<std::size_t>;
  b.slice(i, i);
};

// A batch found by ADL customisation: slice_batch(b, first, last).
template <class B>
concept adl_sliceable_batch = requires(const B& b, std::size_t i) {
  { b.size() } -> std::convertible_to<std::size_t>;
  slice_batch(b, i, i);
};

// The shape of partrain::batch (data/batch.hpp): features [n, ...], labels [n], optional
// indices (a span). A copy with every member cut to the same rows is a valid sub-batch.
template <class B>
concept feature_label_batch = std::copy_constructible<B> && requires(const B& b, std::size_t i) {
  { b.size() } -> std::convertible_to<std::size_t>;
  { b.features.slice(i, i) } -> std::convertible_to<decltype(b.features)>;
  { b.labels.slice(i, i) } -> std::convertible_to<decltype(b.labels)>;
};

template <class B>
concept has_indices_span = requires(B& b, std::size_t i) { b.indices = b.indices.subspan(i, i); };

}  // namespace detail::dp

// What data_parallel can scatter: a tensor_view (rows of its first dimension), a type with
// `size()` and `slice(first, last)`, one with `size()` and an ADL `slice_batch(b, first, last)`,
// or a partrain::batch-shaped aggregate (`features`, `labels`, optional `indices`).
template <class B>
concept splittable_batch = detail::dp::is_tensor_view_v<B> || detail::dp::member_sliceable_batch<B> ||
                           detail::dp::adl_sliceable_batch<B> || detail::dp::feature_label_batch<B>;

// Examples in a batch (its first dimension).
template <splittable_batch B>
[[nodiscard]] std::size_t batch_size_of(const B& b) {
  if constexpr (detail::dp::is_tensor_view_v<B>) {
    return b.rank() == 0 ? 0 : b.extent(0);
  } else {
    return static_cast<std::size_t>(b.size());
  }
}

// Rows [first, last) of a batch, as a batch of the same kind (a view, no copy of the data).
template <splittable_batch B>
[[nodiscard]] auto split_batch(const B& b, std::size_t first, std::size_t last) {
  if constexpr (detail::dp::is_tensor_view_v<B>) {
    return b.slice(first, last);
  } else if constexpr (detail::dp::member_sliceable_batch<B>) {
    return b.slice(first, last);
  } else if constexpr (detail::dp::adl_sliceable_batch<B>) {
    return slice_batch(b, first, last);
  } else {
    const std::size_t n = batch_size_of(b);
    if (first > last || last > n) {
      throw invalid_argument_error("split_batch(" + std::to_string(first) + ", " + std::to_string(last) +
                                   "): out of range for a batch of " + std::to_string(n) + " examples");
    }
    B part = b;
    part.features = b.features.slice(first, last);
    part.labels = b.labels.slice(first, last);
    if constexpr (detail::dp::has_indices_span<B>) {
      if (!b.indices.empty()) part.indices = b.indices.subspan(first, last - first);
    }
    return part;
  }
}

namespace detail::dp {

// Whole examples per device: core/weighted_shares.hpp's rule (with n smaller than the device
// count, the devices with the largest weights get one each; the rest idle).
[[nodiscard]] inline std::vector<std::size_t> split_counts(std::size_t n, std::span<const double> weights) {
  if (weights.empty()) throw invalid_argument_error("data_parallel: no devices to split a batch over");
  return weighted_shares(n, weights, "data_parallel");
}

// Prefix sums: device i takes rows [offsets[i], offsets[i + 1]).
[[nodiscard]] inline std::vector<std::size_t> split_offsets(std::span<const std::size_t> counts) {
  std::vector<std::size_t> off(counts.size() + 1, 0);
  std::partial_sum(counts.begin(), counts.end(), off.begin() + 1);
  return off;
}

}  // namespace detail::dp

}  // namespace partrain::inline v0
