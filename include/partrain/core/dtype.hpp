// partrain/core/dtype.hpp: element types known to the collectives and files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include <partrain/core/half.hpp>

namespace partrain::inline v0 {

enum class dtype : std::uint8_t { float32, float64, int32, int64, uint8, float16, bfloat16 };

[[nodiscard]] constexpr std::size_t size_of(dtype t) noexcept {
  switch (t) {
    case dtype::float32: case dtype::int32: return 4;
    case dtype::float64: case dtype::int64: return 8;
    case dtype::uint8: return 1;
    case dtype::float16: case dtype::bfloat16: return 2;
  }
  return 0;
}

[[nodiscard]] constexpr std::string_view to_string(dtype t) noexcept {
  switch (t) {
    case dtype::float32: return "float32";
    case dtype::float64: return "float64";
    case dtype::int32: return "int32";
    case dtype::int64: return "int64";
    case dtype::uint8: return "uint8";
    case dtype::float16: return "float16";
    case dtype::bfloat16: return "bfloat16";
  }
  return "unknown";
}

namespace detail {
template <class T> struct dtype_of_impl;
template <> struct dtype_of_impl<float> : std::integral_constant<dtype, dtype::float32> {};
template <> struct dtype_of_impl<double> : std::integral_constant<dtype, dtype::float64> {};
template <> struct dtype_of_impl<std::int32_t> : std::integral_constant<dtype, dtype::int32> {};
template <> struct dtype_of_impl<std::int64_t> : std::integral_constant<dtype, dtype::int64> {};
template <> struct dtype_of_impl<std::uint8_t> : std::integral_constant<dtype, dtype::uint8> {};
template <> struct dtype_of_impl<half> : std::integral_constant<dtype, dtype::float16> {};
template <> struct dtype_of_impl<bfloat16> : std::integral_constant<dtype, dtype::bfloat16> {};
}  // namespace detail

// An element type partrain can move and reduce.
template <class T>
concept element_type = requires { detail::dtype_of_impl<std::remove_cv_t<T>>::value; };

template <element_type T>
inline constexpr dtype dtype_of = detail::dtype_of_impl<std::remove_cv_t<T>>::value;

}  // namespace partrain::inline v0
