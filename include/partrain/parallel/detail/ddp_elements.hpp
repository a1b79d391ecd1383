// partrain/parallel/detail/ddp_elements.hpp: the element work of DDP's buckets as functors,
// written once for every path: the division before the all_reduce, the accumulation of gradients
// under no_sync, and the 16-bit casts of the fp16/bf16 compression hooks (core/half.hpp's
// conversion). The host buckets run them through for_each_index(host_exec) (reducer.hpp,
// comm_hooks.hpp, ddp_staging.hpp), the CUDA buckets through parallel/detail/ddp_kernels.cuh,
// and the CPU tier checks them.
#pragma once

#include <cstddef>
#include <type_traits>

#include <partrain/config.hpp>
#include <partrain/core/detail/exact_reciprocal.hpp>
#include <partrain/core/for_each_index.hpp>
#include <partrain/core/half.hpp>
#include <partrain/optim/detail/elements.hpp>

namespace partrain::inline v0::detail::ddp {

// x[i] /= d: PyTorch's hooks divide before the all_reduce (keeps 16-bit sums in range).
template <class T>
struct divide_fn {
  T* x;
  T d;
  PARTRAIN_HOST_DEVICE void operator()(std::size_t i) const { x[i] = x[i] / d; }
};

// x[i] /= d for i < n on exec: a multiplication where it gives the division's bits (a world size
// that is a power of two), the division otherwise.
template <class Exec, class T>
void divide_elements(const Exec& exec, std::size_t n, T* x, T d) {
  if constexpr (std::is_floating_point_v<T>) {
    if (const auto r = exact_reciprocal(d)) {
      for_each_index(exec, n, optim::scale_fn<T>{x, *r});  // x[i] * r: the division's bits
      return;
    }
  }
  for_each_index(exec, n, divide_fn<T>{x, d});
}

// dst[i] += src[i]: a gradient accumulated into its bucket slot (no_sync, or staged from a GPU).
template <class T>
struct accumulate_fn {
  T* dst;
  const T* src;
  PARTRAIN_HOST_DEVICE void operator()(std::size_t i) const { dst[i] = dst[i] + src[i]; }
};

// h[i] = H(x[i]) / d in H: buffer.to(fp16).div_(world_size), cast first, then the division
// rounded to H again, as PyTorch's fp16_compress_hook does.
template <class T, class H>
struct compress_16_fn {
  const T* x;
  H* h;
  float d;
  PARTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    h[i] = H(static_cast<float>(H(static_cast<float>(x[i]))) / d);
  }
};

// x[i] = T(h[i]): the reduced 16-bit bucket back into the gradients' type.
template <class H, class T>
struct decompress_16_fn {
  const H* h;
  T* x;
  PARTRAIN_HOST_DEVICE void operator()(std::size_t i) const { x[i] = static_cast<T>(static_cast<float>(h[i])); }
};

// dst[i] += T(h[i]): 16-bit gradients accumulated into a wider bucket (ZeRO's no_sync).
template <class H, class T>
struct accumulate_widened_fn {
  T* dst;
  const H* h;
  PARTRAIN_HOST_DEVICE void operator()(std::size_t i) const { dst[i] = dst[i] + static_cast<T>(static_cast<float>(h[i])); }
};

}  // namespace partrain::inline v0::detail::ddp
