// partrain/comm/detail/host_reduce.hpp: element-wise reduction kernels on host memory, shared
// by the local and gloo backends. 16-bit floats are reduced in float and rounded back.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include <partrain/comm/reduce_op.hpp>
#include <partrain/core/detail/exact_reciprocal.hpp>
#include <partrain/core/dtype.hpp>
#include <partrain/core/error.hpp>

namespace partrain::inline v0::detail {

// The element types reduced in float (16 bits) or in their own floating type.
template <class T>
inline constexpr bool is_16bit_float_v = std::is_same_v<T, half> || std::is_same_v<T, bfloat16>;
template <class T>
inline constexpr bool is_float_element_v = is_16bit_float_v<T> || std::is_floating_point_v<T>;

template <class T>
inline void reduce_typed(T* dst, const T* src, std::size_t n, reduce_op op) noexcept {
  auto apply = [&](auto f) {
    for (std::size_t i = 0; i < n; ++i) dst[i] = f(dst[i], src[i]);
  };
  if constexpr (is_16bit_float_v<T>) {
    auto wrap = [](auto g) { return [g](T a, T b) { return T(g(float(a), float(b))); }; };
    switch (op) {
      case reduce_op::sum: case reduce_op::avg: apply(wrap([](float a, float b) { return a + b; })); break;
      case reduce_op::prod: apply(wrap([](float a, float b) { return a * b; })); break;
      case reduce_op::min: apply(wrap([](float a, float b) { return std::min(a, b); })); break;
      case reduce_op::max: apply(wrap([](float a, float b) { return std::max(a, b); })); break;
    }
  } else {
    switch (op) {
      case reduce_op::sum: case reduce_op::avg: apply([](T a, T b) { return static_cast<T>(a + b); }); break;
      case reduce_op::prod: apply([](T a, T b) { return static_cast<T>(a * b); }); break;
      case reduce_op::min: apply([](T a, T b) { return std::min(a, b); }); break;
      case reduce_op::max: apply([](T a, T b) { return std::max(a, b); }); break;
    }
  }
}

// The element type a sum of T is computed in: float for the 16-bit types, T otherwise.
template <class T>
using float_compute_t = std::conditional_t<is_16bit_float_v<T>, float, T>;

// Calls run(divide), divide(x) = x / divisor in T's compute type: a multiplication by the
// reciprocal where that gives the division's bits (exact_reciprocal), the division otherwise.
// Chosen once per call, so the element loop inside `run` has no branch.
template <class T, class Run>
inline void with_divide(double divisor, const Run& run) noexcept {
  using F = float_compute_t<T>;
  const F d = static_cast<F>(divisor);
  if (const auto r = exact_reciprocal(d)) {
    const F s = *r;
    run([s](F x) { return x * s; });
  } else {
    run([d](F x) { return x / d; });
  }
}

// dst[i] = src[i] / divisor (`first`), or dst[i] + src[i] / divisor: a rank's share of a sum of
// divided inputs added in rank order, with the bits of dividing every input in place, then
// summing (16-bit types: each quotient rounded to the type, the sum in float and rounded, as
// divide_typed and reduce_typed do). The division is a multiplication where that gives its bits.
template <class T>
inline void add_divided_typed(T* dst, const T* src, std::size_t n, double divisor, bool first) noexcept {
  static_assert(is_float_element_v<T>, "add_divided_typed: floating-point elements only");
  using F = float_compute_t<T>;
  with_divide<T>(divisor, [&](auto divide) {
    if (first) {
      for (std::size_t i = 0; i < n; ++i) dst[i] = T(divide(static_cast<F>(src[i])));
    } else {
      for (std::size_t i = 0; i < n; ++i) {
        dst[i] = T(static_cast<F>(dst[i]) + static_cast<F>(T(divide(static_cast<F>(src[i])))));
      }
    }
  });
}

// The first two inputs of such a sum in one pass: dst[i] = a[i] / divisor + b[i] / divisor, the
// bits of add_divided_typed(dst, a, first) then add_divided_typed(dst, b, added), without writing
// dst and reading it back in between (with two ranks, the whole sum: 7% of the shared-memory ZeRO
// step in a harness of that step alone).
template <class T>
inline void add_divided_pair_typed(T* dst, const T* a, const T* b, std::size_t n, double divisor) noexcept {
  static_assert(is_float_element_v<T>, "add_divided_pair_typed: floating-point elements only");
  using F = float_compute_t<T>;
  with_divide<T>(divisor, [&](auto divide) {
    for (std::size_t i = 0; i < n; ++i) {
      const T first = T(divide(static_cast<F>(a[i])));
      dst[i] = T(static_cast<F>(first) + static_cast<F>(T(divide(static_cast<F>(b[i])))));
    }
  });
}

// dst[i] = the sum over q of srcs(q)[i] / divisor, in q order (count >= 1): the first two in one
// pass, each further input added by add_divided_typed.
template <class T, class Sources>
inline void sum_divided_typed(T* dst, const Sources& srcs, std::size_t count, std::size_t n, double divisor) noexcept {
  if (count == 1) {
    add_divided_typed(dst, srcs(0), n, divisor, true);
    return;
  }
  add_divided_pair_typed(dst, srcs(0), srcs(1), n, divisor);
  for (std::size_t q = 2; q < count; ++q) add_divided_typed(dst, srcs(q), n, divisor, false);
}

// data[i] /= divisor: floating types as add_divided_typed divides them, integers by integer division.
template <class T>
inline void divide_typed(T* data, std::size_t n, int divisor) noexcept {
  if constexpr (is_float_element_v<T>) {
    add_divided_typed(data, data, n, static_cast<double>(divisor), true);
  } else {
    for (std::size_t i = 0; i < n; ++i) data[i] = static_cast<T>(data[i] / static_cast<T>(divisor));
  }
}

[[nodiscard]] constexpr bool is_floating(dtype t) noexcept {
  return t == dtype::float32 || t == dtype::float64 || t == dtype::float16 || t == dtype::bfloat16;
}

// add_divided_typed on a dtype-tagged buffer (floating types; others are left alone: callers check).
inline void host_add_divided(void* dst, const void* src, std::size_t n, dtype t, double divisor, bool first) {
  visit_dtype(t, [&]<class T>(std::type_identity<T>) {
    if constexpr (is_float_element_v<T>) {
      add_divided_typed(static_cast<T*>(dst), static_cast<const T*>(src), n, divisor, first);
    }
  });
}

// sum_divided_typed on dtype-tagged buffers, srcs(q) a `const void*` (floating types; others are
// left alone: callers check).
template <class Sources>
inline void host_sum_divided(void* dst, const Sources& srcs, std::size_t count, std::size_t n, dtype t, double divisor) {
  visit_dtype(t, [&]<class T>(std::type_identity<T>) {
    if constexpr (is_float_element_v<T>) {
      sum_divided_typed(static_cast<T*>(dst), [&](std::size_t q) { return static_cast<const T*>(srcs(q)); }, count, n,
                        divisor);
    }
  });
}

// dst[i] = dst[i] op src[i]
inline void host_reduce(void* dst, const void* src, std::size_t n, dtype t, reduce_op op) {
  visit_dtype(t, [&]<class T>(std::type_identity<T>) { reduce_typed(static_cast<T*>(dst), static_cast<const T*>(src), n, op); });
}

// Finishes an avg: data[i] /= divisor (after a sum).
inline void host_divide(void* data, std::size_t n, dtype t, int divisor) {
  visit_dtype(t, [&]<class T>(std::type_identity<T>) { divide_typed(static_cast<T*>(data), n, divisor); });
}

}  // namespace partrain::inline v0::detail
