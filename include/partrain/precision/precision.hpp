// partrain/precision/precision.hpp: the three compute precisions a model can train in, and the
// 16-bit storage type behind each. fp32 is plain training; fp16 and bf16 are mixed precision:
// fp32 master weights, a 16-bit copy for the model's compute (precision/low_precision_copy.hpp).
#pragma once

#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include <partrain/core/error.hpp>
#include <partrain/core/half.hpp>

namespace partrain::inline v0 {

enum class precision : std::uint8_t { fp32, fp16, bf16 };

[[nodiscard]] constexpr std::string_view to_string(precision p) noexcept {
  switch (p) {
    case precision::fp32: return "fp32";
    case precision::fp16: return "fp16";
    case precision::bf16: return "bf16";
  }
  return "?";
}

// "fp32" | "fp16" | "bf16" (also PyTorch's spellings "float32", "float16", "half", "bfloat16").
[[nodiscard]] inline precision parse_precision(std::string_view s) {
  if (s == "fp32" || s == "float32" || s == "float") return precision::fp32;
  if (s == "fp16" || s == "float16" || s == "half") return precision::fp16;
  if (s == "bf16" || s == "bfloat16") return precision::bf16;
  throw invalid_argument_error("precision: '" + std::string(s) + "' is not one of fp32, fp16, bf16");
}

// The two 16-bit storage types of mixed precision.
template <class T>
concept low_precision_element = std::same_as<T, half> || std::same_as<T, bfloat16>;

// The element type a precision stores its compute copy in.
template <precision P>
using storage_t = std::conditional_t<P == precision::fp16, half, std::conditional_t<P == precision::bf16, bfloat16, float>>;

// Calls f with a value of the precision's storage type (float, half or bfloat16): the one place a
// runtime precision becomes a template argument.
template <class F>
decltype(auto) visit_precision(precision p, F&& f) {
  switch (p) {
    case precision::fp16: return f(half{});
    case precision::bf16: return f(bfloat16{});
    case precision::fp32: break;
  }
  return f(float{});
}

}  // namespace partrain::inline v0
