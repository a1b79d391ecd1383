// partrain/core/dtype.hpp: element types known to the collectives and files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include <partrain/core/error.hpp>
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

// The one switch from a runtime dtype to its C++ type: calls f(std::type_identity<T>{}) and
// returns what f returns (every branch must return the same type).
//   visit_dtype(t, [&]<class T>(std::type_identity<T>) { reduce(static_cast<T*>(p), n); });
template <class F>
decltype(auto) visit_dtype(dtype t, F&& f) {
  switch (t) {
    case dtype::float32: return f(std::type_identity<float>{});
    case dtype::float64: return f(std::type_identity<double>{});
    case dtype::int32: return f(std::type_identity<std::int32_t>{});
    case dtype::int64: return f(std::type_identity<std::int64_t>{});
    case dtype::uint8: return f(std::type_identity<std::uint8_t>{});
    case dtype::float16: return f(std::type_identity<half>{});
    case dtype::bfloat16: return f(std::type_identity<bfloat16>{});
  }
  throw invalid_argument_error("unknown dtype code " + std::to_string(static_cast<int>(t)) +
                               " (expected float32, float64, int32, int64, uint8, float16 or bfloat16)");
}

}  // namespace partrain::inline v0
