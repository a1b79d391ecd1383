// partrain/cuda/launch.cuh: the CUDA half of the one launch helper (the host half is
// partrain/core/for_each_index.hpp). for_each_index(cuda_exec{stream, device}, n, f) queues a
// grid-stride kernel that calls f(i) for every i in [0, n) on `stream` of `device`;
// transform_reduce_index folds per block, then the blocks' partials in block order on the host, so
// its result is the same on every run. The element functors are the library's plain headers
// (optim/detail/elements.hpp, ...), the ones the host path and the CPU tier run. nvcc only.
#pragma once

#if !defined(__CUDACC__)
#error "partrain/cuda/launch.cuh must be compiled by nvcc"
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <type_traits>
#include <vector>

#include <partrain/config.hpp>
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

// The one launch geometry: 256 threads a block (a power of two: the block reduce halves it), at
// most 2048 blocks (16 per SM on a 132-SM H100, enough to cover the latency of a grid-stride
// loop), never 0 blocks.
inline constexpr unsigned launch_block = 256;
inline constexpr std::size_t launch_max_blocks = 2048;

[[nodiscard]] constexpr unsigned launch_blocks(std::size_t n) noexcept {
  const std::size_t b = (n + launch_block - 1) / launch_block;
  return static_cast<unsigned>(b == 0 ? 1 : (b < launch_max_blocks ? b : launch_max_blocks));
}
static_assert(launch_blocks(0) == 1 && launch_blocks(257) == 2 && launch_blocks(std::size_t{1} << 40) == 2048);

template <class F>
__global__ void for_each_index_kernel(std::size_t n, F f) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(blockDim.x) * gridDim.x) {
    f(i);
  }
}

// Thread t of the grid folds map(t), map(t + stride), ... starting from its first element (no
// identity is needed); a block then folds its threads pairwise in shared memory. Indices below
// n are a prefix, so after each halving the threads holding a value are still a prefix of the
// block: `valid` tracks its length. Every block has at least one index (launch_blocks).
template <class T, class Map, class Combine>
__global__ void transform_reduce_index_kernel(std::size_t n, Map map, Combine combine, T* partial) {
  __shared__ T tile[launch_block];
  const std::size_t first = blockIdx.x * static_cast<std::size_t>(blockDim.x);
  const std::size_t stride = static_cast<std::size_t>(blockDim.x) * gridDim.x;
  const std::size_t start = first + threadIdx.x;
  if (start < n) {
    T acc = map(start);
    for (std::size_t i = start + stride; i < n; i += stride) acc = combine(acc, map(i));
    tile[threadIdx.x] = acc;
  }
  __syncthreads();
  unsigned valid = n - first < blockDim.x ? static_cast<unsigned>(n - first) : blockDim.x;
  for (unsigned s = blockDim.x / 2; s > 0; s /= 2) {
    if (threadIdx.x < s && threadIdx.x + s < valid) tile[threadIdx.x] = combine(tile[threadIdx.x], tile[threadIdx.x + s]);
    __syncthreads();
    if (valid > s) valid = s;
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = tile[0];
}

// The kernel's name in a launch failure: the functor's type, which says which element loop it was.
template <class F>
void check_launch(std::size_t n, unsigned blocks) {
  const cudaError_t rc = cudaGetLastError();
  if (rc == cudaSuccess) return;
  const std::string call = std::string("launch of ") + __PRETTY_FUNCTION__ + " over " + std::to_string(n) +
                           " elements in " + std::to_string(blocks) + " blocks";
  cuda_check(rc, call.c_str(), __FILE__, __LINE__);
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
  const unsigned blocks = launch_blocks(n);
  for_each_index_kernel<F><<<blocks, launch_block, 0, exec.stream>>>(n, f);
  check_launch<F>(n, blocks);
}

// The partials live in stream-ordered memory (cudaMallocAsync: no device-wide synchronisation,
// unlike cudaFree); returns with exec.stream synchronised.
template <class T, class Map, class Combine>
[[nodiscard]] T transform_reduce_index(cuda_exec exec, std::size_t n, T init, const Map& map, const Combine& combine) {
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_default_constructible_v<T>,
                "partrain: transform_reduce_index on CUDA needs a trivially copyable, trivially constructible "
                "result type (it lives in shared memory)");
  static_assert(launchable_functor<Map> && launchable_functor<Combine>,
                "partrain: the map and combine of a CUDA reduction must be trivially copyable");
  if (n == 0) return init;
  cuda_device_guard guard(exec.device >= 0 ? exec.device : cuda_current_device());
  const unsigned blocks = launch_blocks(n);
  T* partial = nullptr;
  PARTRAIN_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&partial), blocks * sizeof(T), exec.stream));
  std::vector<T> host(blocks);
  cudaError_t rc = cudaSuccess;
  transform_reduce_index_kernel<T, Map, Combine><<<blocks, launch_block, 0, exec.stream>>>(n, map, combine, partial);
  rc = cudaGetLastError();
  if (rc == cudaSuccess) {
    rc = cudaMemcpyAsync(host.data(), partial, blocks * sizeof(T), cudaMemcpyDeviceToHost, exec.stream);
  }
  (void)cudaFreeAsync(partial, exec.stream);
  if (rc == cudaSuccess) rc = cudaStreamSynchronize(exec.stream);
  if (rc != cudaSuccess) {
    const std::string call = std::string("transform_reduce_index (") + __PRETTY_FUNCTION__ + ") over " +
                             std::to_string(n) + " elements";
    cuda_check(rc, call.c_str(), __FILE__, __LINE__);
  }
  T acc = init;
  for (const T& p : host) acc = combine(acc, p);
  return acc;
}

// Waits until everything queued on exec.stream has run (errors of the kernels surface here).
inline void synchronize(cuda_exec exec, const char* what) {
  cuda_check(cudaStreamSynchronize(exec.stream), what, __FILE__, __LINE__);
}

}  // namespace partrain::inline v0::detail
