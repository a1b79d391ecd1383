// partrain/precision/detail/host_kernels.hpp: the element loops of mixed precision for views in
// host memory: casts between fp32 and the 16-bit types (round to nearest even), and the fused
// unscale + inf/NaN check over all gradients, each the functor of precision/detail/elements.hpp
// run per tensor through for_each_index(host_exec). partrain/precision/detail/kernels.cuh has the
// same functions for views in CUDA memory (the same functors, one launch over all the tensors).
#pragma once

#include <cstddef>
#include <span>
#include <string>

#include <partrain/core/error.hpp>
#include <partrain/core/for_each_index.hpp>
#include <partrain/core/half.hpp>
#include <partrain/core/memory_space.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/precision/detail/elements.hpp>

namespace partrain::inline v0::detail::amp {

#if defined(__CUDACC__)
inline constexpr bool is_nvcc_compiled = true;
#else
inline constexpr bool is_nvcc_compiled = false;
#endif

// One destination per source, each the source's size (shared by the host and CUDA casts).
template <class Src, class Dst>
void check_cast_pairs(std::span<const Src> src, std::span<const Dst> dst) {
  if (src.size() != dst.size()) {
    throw invalid_argument_error("cast: " + std::to_string(src.size()) + " source views but " +
                                 std::to_string(dst.size()) + " destinations (expected one destination per source)");
  }
  for (std::size_t k = 0; k < src.size(); ++k) {
    if (src[k].size() != dst[k].size()) {
      throw invalid_argument_error("cast: view #" + std::to_string(k) + " has " + std::to_string(src[k].size()) +
                                   " source elements but " + std::to_string(dst[k].size()) +
                                   " destination elements (expected the same size)");
    }
  }
}

// dst[k][j] = To(src[k][j]) for every pair of views.
template <class From, class To>
void cast_views(std::span<const tensor_view<const From>> src, std::span<const tensor_view<To>> dst) {
  check_cast_pairs(src, dst);
  for (std::size_t k = 0; k < src.size(); ++k) {
    for_each_index(host_exec{}, src[k].size(), cast_fn<From, To>{src[k].data(), dst[k].data()});
  }
}

// g *= inv_scale over every gradient, in one pass; true when any element is inf or NaN
// (PyTorch's _amp_foreach_non_finite_check_and_unscale_). Non-finite values stay non-finite.
[[nodiscard]] inline bool unscale_and_check(std::span<const tensor_view<float>> grads, float inv_scale,
                                            void* /*stream: the CUDA twin's*/ = nullptr) {
  int found = 0;
  for (const auto& g : grads) {
    found |= transform_reduce_index(host_exec{}, g.size(), 0, unscale_check_fn{g.data(), inv_scale}, bit_or_fn{});
  }
  return found != 0;
}

}  // namespace partrain::inline v0::detail::amp
