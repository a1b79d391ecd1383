// partrain/core/tensor_view.hpp: a non-owning, contiguous, shaped view of elements in one
// memory space. Slicing is along the first (batch) dimension, as scatter and micro-batching need.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <initializer_list>
#include <span>
#include <string>
#include <type_traits>

#include <partrain/core/dtype.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/memory_space.hpp>

namespace partrain::inline v0 {

inline constexpr std::size_t max_rank = 6;

// Extents of a row-major tensor, up to max_rank dimensions.
class shape {
 public:
  constexpr shape() noexcept = default;
  constexpr shape(std::initializer_list<std::size_t> dims) {
    if (dims.size() > max_rank) throw invalid_argument_error("shape: at most 6 dimensions are supported");
    for (auto d : dims) dims_[rank_++] = d;
  }
  constexpr explicit shape(std::span<const std::size_t> dims) {
    if (dims.size() > max_rank) throw invalid_argument_error("shape: at most 6 dimensions are supported");
    for (auto d : dims) dims_[rank_++] = d;
  }
  [[nodiscard]] constexpr std::size_t rank() const noexcept { return rank_; }
  [[nodiscard]] constexpr std::size_t operator[](std::size_t i) const noexcept { return dims_[i]; }
  [[nodiscard]] constexpr std::size_t& operator[](std::size_t i) noexcept { return dims_[i]; }
  [[nodiscard]] constexpr std::size_t numel() const noexcept {
    std::size_t n = 1;
    for (std::size_t i = 0; i < rank_; ++i) n *= dims_[i];
    return n;
  }
  // Elements in one index of the first dimension (a "row" of the batch).
  [[nodiscard]] constexpr std::size_t row_numel() const noexcept {
    std::size_t n = 1;
    for (std::size_t i = 1; i < rank_; ++i) n *= dims_[i];
    return n;
  }
  [[nodiscard]] constexpr std::span<const std::size_t> dims() const noexcept { return {dims_.data(), rank_}; }
  friend constexpr bool operator==(const shape& a, const shape& b) noexcept {
    return std::ranges::equal(a.dims(), b.dims());
  }
  [[nodiscard]] std::string to_string() const {
    std::string s = "[";
    for (std::size_t i = 0; i < rank_; ++i) s += (i ? ", " : "") + std::to_string(dims_[i]);
    return s + "]";
  }

 private:
  std::array<std::size_t, max_rank> dims_{};
  std::size_t rank_ = 0;
};

template <class T, memory_space Space = host>
class tensor_view {
 public:
  using element_type = T;
  using value_type = std::remove_cv_t<T>;
  using space_type = Space;
  using iterator = T*;

  constexpr tensor_view() noexcept = default;
  // A 1-D view of n elements.
  constexpr tensor_view(T* data, std::size_t n) noexcept : data_(data), shape_{n} {}
  constexpr tensor_view(T* data, partrain::shape s) noexcept : data_(data), shape_(s) {}
  // From a contiguous host range (std::vector, std::array, span).
  template <std::ranges::contiguous_range R>
    requires std::same_as<Space, host> && std::convertible_to<std::ranges::range_reference_t<R>, T&> &&
             std::ranges::sized_range<R> &&
             // Not from another view: copying a non-const view must keep its shape, not flatten it.
             (!requires { typename std::remove_cvref_t<R>::space_type; })
  constexpr tensor_view(R&& r) noexcept  // NOLINT: implicit, like span
      : data_(std::ranges::data(r)), shape_{static_cast<std::size_t>(std::ranges::size(r))} {}
  // tensor_view<T> -> tensor_view<const T>
  template <class U>
    requires std::is_convertible_v<U (*)[], T (*)[]>
  constexpr tensor_view(const tensor_view<U, Space>& o) noexcept : data_(o.data()), shape_(o.shape()) {}

  [[nodiscard]] constexpr T* data() const noexcept { return data_; }
  [[nodiscard]] constexpr const partrain::shape& shape() const noexcept { return shape_; }
  [[nodiscard]] constexpr std::size_t rank() const noexcept { return shape_.rank(); }
  [[nodiscard]] constexpr std::size_t extent(std::size_t i) const noexcept { return shape_[i]; }
  [[nodiscard]] constexpr std::size_t size() const noexcept { return shape_.numel(); }
  [[nodiscard]] constexpr std::size_t size_bytes() const noexcept { return size() * sizeof(T); }
  [[nodiscard]] constexpr bool empty() const noexcept { return size() == 0; }
  [[nodiscard]] static constexpr partrain::dtype dtype() noexcept
    requires partrain::element_type<value_type>
  {
    return dtype_of<value_type>;
  }

  // Host-only element access and iteration (a device pointer must not be dereferenced here).
  [[nodiscard]] constexpr T& operator[](std::size_t i) const noexcept
    requires std::same_as<Space, host>
  {
    return data_[i];
  }
  [[nodiscard]] constexpr T* begin() const noexcept
    requires std::same_as<Space, host>
  {
    return data_;
  }
  [[nodiscard]] constexpr T* end() const noexcept
    requires std::same_as<Space, host>
  {
    return data_ + size();
  }

  // Rows [first, last) of the first dimension.
  [[nodiscard]] constexpr tensor_view slice(std::size_t first, std::size_t last) const {
    if (rank() == 0 || first > last || last > shape_[0]) {
      throw invalid_argument_error("tensor_view::slice(" + std::to_string(first) + ", " + std::to_string(last) +
                                   "): out of range for a first dimension of " +
                                   std::to_string(rank() ? shape_[0] : 0));
    }
    partrain::shape s = shape_;
    s[0] = last - first;
    return {data_ + first * shape_.row_numel(), s};
  }
  // The same elements under another shape of equal element count.
  [[nodiscard]] constexpr tensor_view reshape(partrain::shape s) const {
    if (s.numel() != size()) {
      throw invalid_argument_error("tensor_view::reshape: " + s.to_string() + " has " + std::to_string(s.numel()) +
                                   " elements, the view has " + std::to_string(size()));
    }
    return {data_, s};
  }
  // A flat 1-D view of [offset, offset + n).
  [[nodiscard]] constexpr tensor_view flat(std::size_t offset, std::size_t n) const {
    if (offset + n > size()) {
      throw invalid_argument_error("tensor_view::flat(" + std::to_string(offset) + ", " + std::to_string(n) +
                                   "): out of range for " + std::to_string(size()) + " elements");
    }
    return {data_ + offset, n};
  }

 private:
  T* data_ = nullptr;
  partrain::shape shape_{0};  // empty: one dimension of extent 0 (a rank-0 shape is a scalar)
};

template <std::ranges::contiguous_range R>
tensor_view(R&&) -> tensor_view<std::remove_reference_t<std::ranges::range_reference_t<R>>, host>;

template <class V>
concept tensor_view_like = requires(const V& v) {
  typename V::value_type;
  typename V::space_type;
  { v.data() };
  { v.size() } -> std::convertible_to<std::size_t>;
  { v.shape() } -> std::convertible_to<shape>;
};

}  // namespace partrain::inline v0
