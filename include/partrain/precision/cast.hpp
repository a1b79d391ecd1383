// partrain/precision/cast.hpp: element-wise conversion between fp32 and the 16-bit types
// (half, bfloat16), rounding to nearest even, for views in host memory and, in translation units
// compiled by nvcc, in CUDA memory.
#pragma once

#include <span>

#include <partrain/core/half.hpp>
#include <partrain/core/memory_space.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/precision/detail/host_kernels.hpp>
#include <partrain/precision/precision.hpp>

#if defined(__CUDACC__)
#include <partrain/precision/detail/kernels.cuh>
#endif

namespace partrain::inline v0 {

namespace detail::amp {
template <class From, class To>
concept castable_pair = (std::same_as<From, float> && low_precision_element<To>) ||
                        (low_precision_element<From> && std::same_as<To, float>);
}  // namespace detail::amp

// dst = src converted element by element; both views the same size and in the same memory.
template <class From, class To, class S>
  requires detail::amp::castable_pair<std::remove_const_t<From>, To>
void cast(tensor_view<From, S> src, tensor_view<To, S> dst) {
  using F = std::remove_const_t<From>;
  static_assert(std::same_as<S, host> || detail::amp::is_nvcc_compiled,
                "partrain: casting CUDA memory needs the translation unit compiled by nvcc "
                "(the kernels are in partrain/precision/detail/kernels.cuh)");
  const tensor_view<const F, S> s(src);
  detail::amp::cast_views<F, To>(std::span<const tensor_view<const F, S>>(&s, 1), std::span<const tensor_view<To, S>>(&dst, 1));
}

}  // namespace partrain::inline v0
