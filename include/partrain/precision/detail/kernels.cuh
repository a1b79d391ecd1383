// partrain/precision/detail/kernels.cuh: the element loops of mixed precision for views in CUDA
// memory: casts between fp32 and the 16-bit types, and the fused unscale + inf/NaN check over all
// gradients. These are the overloads of precision/detail/host_kernels.hpp's functions for
// tensor_view<T, cuda>; the element work is the segmented functors of precision/detail/elements.hpp
// (the host path and the CPU tier run the same code, so the casts are the host's bit for bit),
// launched through partrain/cuda/launch.cuh: one launch over up to segments_per_launch
// tensors (more take one launch per table), on the calling thread's current device, finished on
// return. nvcc only.
#pragma once

#if !defined(__CUDACC__)
#error "partrain/precision/detail/kernels.cuh must be compiled by nvcc"
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <span>
#include <type_traits>

#include <partrain/core/half.hpp>
#include <partrain/core/memory_space.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/cuda/check.hpp>
#include <partrain/cuda/launch.cuh>
#include <partrain/precision/detail/elements.hpp>
#include <partrain/precision/detail/host_kernels.hpp>

namespace partrain::inline v0::detail::amp {

// dst[k][j] = To(src[k][j]) for every pair of views in CUDA memory (on the current device),
// rounding to nearest even. Queued on `stream` (pass the one that made src: a non-blocking stream
// is not ordered with the legacy default) and finished on return.
template <class From, class To>
void cast_views(std::span<const tensor_view<const From, cuda>> src, std::span<const tensor_view<To, cuda>> dst,
                cudaStream_t stream = cudaStreamLegacy) {
  static_assert((std::is_same_v<From, float> && (std::is_same_v<To, half> || std::is_same_v<To, bfloat16>)) ||
                    ((std::is_same_v<From, half> || std::is_same_v<From, bfloat16>) && std::is_same_v<To, float>),
                "partrain: the CUDA cast converts float to half/bfloat16 or half/bfloat16 to float");
  check_cast_pairs(src, dst);
  const cuda_exec exec{stream, -1};
  bool launched = false;
  for_each_table(
      src.size(), [&](std::size_t k) { return segment{src[k].data(), dst[k].data(), src[k].size(), 0}; },
      [&](const segment_table& t) {
        for_each_index(exec, t.total, segmented_cast_fn<From, To>{t});
        launched = true;
      });
  if (launched) synchronize(exec, "cast_views: cudaStreamSynchronize");
}

// g *= inv_scale over every gradient in CUDA memory, in one pass per table; true when any element
// is inf or NaN (PyTorch's _amp_foreach_non_finite_check_and_unscale_). Queued on `stream` (the
// one that made the gradients) and finished on return.
[[nodiscard]] inline bool unscale_and_check(std::span<const tensor_view<float, cuda>> grads, float inv_scale,
                                            void* stream = nullptr) {
  int found = 0;
  for_each_table(
      grads.size(), [&](std::size_t k) { return segment{grads[k].data(), grads[k].data(), grads[k].size(), 0}; },
      [&](const segment_table& t) {
        found |= transform_reduce_index(cuda_exec{stream_or_legacy(stream), -1}, t.total, 0,
                                        segmented_unscale_check_fn{t, inv_scale},
                                        bit_or_fn{});
      });
  return found != 0;
}

}  // namespace partrain::inline v0::detail::amp
