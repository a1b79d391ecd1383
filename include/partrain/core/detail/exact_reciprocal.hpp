// partrain/core/detail/exact_reciprocal.hpp: when a division may be a multiplication with the same
// bits. Gradients are divided by the world size every step, and a vector division costs several
// multiplies (on this project's Zen 3 machine divps takes 3.5-5 cycles per 4 floats, mulps 0.5):
// DDP's division of the example's 235k gradients took about as long as their all_reduce.
#pragma once

#include <cmath>
#include <optional>
#include <type_traits>

namespace partrain::inline v0::detail {

// 1 / d when d is a power of two whose reciprocal is a normal T. Then x * (1 / d) is the exact
// quotient x / d rounded once, as the division rounds it, for every x (subnormal results,
// infinities and NaNs included). Empty for any other d: its reciprocal is rounded, and so would
// the products be differently.
template <class T>
  requires std::is_floating_point_v<T>
[[nodiscard]] inline std::optional<T> exact_reciprocal(T d) noexcept {
  if (!(d > T(0)) || !std::isfinite(d)) return std::nullopt;
  int exponent = 0;
  if (std::frexp(d, &exponent) != T(0.5)) return std::nullopt;
  const T r = T(1) / d;
  if (!std::isnormal(r)) return std::nullopt;
  return r;
}

}  // namespace partrain::inline v0::detail
