// partrain/cuda/launch.cuh: the CUDA half of the one launch helper (the host half is
// partrain/core/for_each_index.hpp). for_each_index(cuda_exec{stream, device}, n, f) calls f(i) for
// every i in [0, n) on `stream` of `device` through thrust::for_each_n (CUB's device-wide for, tuned
// per architecture), queued and not waited for; transform_reduce_index is thrust::transform_reduce
// (CUB's device reduction: the same result run to run on one GPU model). Both are
// core/detail/thrust_index.hpp's calls, which the CPU tier runs on Thrust's host system. The
// element functors are the library's plain headers (optim/detail/elements.hpp, ...). nvcc only.
#pragma once

#if !defined(__CUDACC__)
#error "partrain/cuda/launch.cuh must be compiled by nvcc"
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <type_traits>

#include <thrust/system/cuda/execution_policy.h>
#include <thrust/system_error.h>

#include <partrain/config.hpp>
#include <partrain/core/detail/thrust_index.hpp>
#include <partrain/core/for_each_index.hpp>
#include <partrain/cuda/check.hpp>
#include <partrain/cuda/device_guard.hpp>

namespace partrain::inline v0::detail {

// Where a launch goes. device < 0 leaves the calling thread's current device as it is (for
// callers that already hold a cuda_device_guard); otherwise it is made current for the launch.
struct cuda_exec {
  cudaStream_t stream = cudaStreamLegacy;
  int device = -1;
};

// A stream handed through host code type-erased (model_stream, a communicator's input stream),
// or the legacy default stream when there is none.
[[nodiscard]] inline cudaStream_t stream_or_legacy(void* stream) noexcept {
  return stream ? static_cast<cudaStream_t>(stream) : cudaStreamLegacy;
}

// Thrust's temporary storage (a reduction's partials) in stream-ordered memory: its default,
// cudaMalloc and cudaFree, would synchronise the whole device at every reduction.
struct stream_ordered_allocator {
  using value_type = char;
  cudaStream_t stream;
  char* allocate(std::ptrdiff_t bytes) {
    void* p = nullptr;
    PARTRAIN_CUDA_CHECK(cudaMallocAsync(&p, static_cast<std::size_t>(bytes), stream));
    return static_cast<char*>(p);
  }
  void deallocate(char* p, std::size_t) noexcept { (void)cudaFreeAsync(p, stream); }
};

// A Thrust failure (it throws thrust::system_error carrying the CUDA code) as partrain's
// cuda_error, naming the loop by its functor's type and the element count.
template <class F>
[[noreturn]] void throw_launch_failure(const thrust::system_error& e, const char* what, std::size_t n) {
  const std::string call = std::string(what) + " (" + __PRETTY_FUNCTION__ + ") over " + std::to_string(n) +
                           " elements: " + e.what();
  const auto rc = static_cast<cudaError_t>(e.code().value());
  cuda_check(rc == cudaSuccess ? cudaErrorUnknown : rc, call.c_str(), __FILE__, __LINE__);
  throw;  // not reached: cuda_check threw
}

template <class F>
inline constexpr bool launchable_functor = std::is_trivially_copyable_v<F>;

// Queued on exec.stream; not waited for (the caller synchronises, or orders later work on the
// same stream). n == 0 launches nothing.
template <class F>
void for_each_index(cuda_exec exec, std::size_t n, const F& f) {
  static_assert(launchable_functor<F>,
                "partrain: an element functor passed to a CUDA launch must be trivially copyable (it is copied into "
                "the kernel's parameters): hold pointers and values, not containers");
  if (n == 0) return;
  cuda_device_guard guard(exec.device >= 0 ? exec.device : cuda_current_device());
  try {
    thrust_for_each_index(thrust::cuda::par_nosync.on(exec.stream), n, f);
  } catch (const thrust::system_error& e) {
    throw_launch_failure<F>(e, "for_each_index", n);
  }
}

// Returns with exec.stream synchronised (the result is on the host).
template <class T, class Map, class Combine>
[[nodiscard]] T transform_reduce_index(cuda_exec exec, std::size_t n, T init, const Map& map, const Combine& combine) {
  static_assert(std::is_trivially_copyable_v<T>,
                "partrain: transform_reduce_index on CUDA needs a trivially copyable result type (it is copied "
                "between the device and the host)");
  static_assert(launchable_functor<Map> && launchable_functor<Combine>,
                "partrain: the map and combine of a CUDA reduction must be trivially copyable");
  if (n == 0) return init;
  cuda_device_guard guard(exec.device >= 0 ? exec.device : cuda_current_device());
  stream_ordered_allocator temporary{exec.stream};
  try {
    return thrust_transform_reduce_index(thrust::cuda::par(temporary).on(exec.stream), n, init, map, combine);
  } catch (const thrust::system_error& e) {
    throw_launch_failure<Map>(e, "transform_reduce_index", n);
  }
}

// Waits until everything queued on exec.stream has run (errors of the kernels surface here).
inline void synchronize(cuda_exec exec, const char* what) {
  cuda_check(cudaStreamSynchronize(exec.stream), what, __FILE__, __LINE__);
}

}  // namespace partrain::inline v0::detail
