// partrain/core/detail/thrust_index.hpp: the launch helper's two loops written once, on Thrust:
// for_each_index is thrust::for_each_n over the indices, transform_reduce_index is
// thrust::transform_reduce over them. cuda/launch.cuh calls these with a CUDA policy on the
// caller's stream; the CPU tier calls them with Thrust's sequential host system (thrust_host_exec
// below), so the host tests run the calls the GPU runs. The host training paths keep the plain
// loops of core/for_each_index.hpp (bench_elementwise compares the two), so a host-only build does
// not need Thrust. With nvcc, CUDA's own CCCL provides Thrust; with g++, the CUDA toolkit's
// include/cccl or Debian's libthrust-dev (tools/setup.sh installs it where CUDA is absent).
#pragma once

#include <cstddef>

#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/system/cpp/execution_policy.h>
#include <thrust/transform_reduce.h>

#include <partrain/core/for_each_index.hpp>

namespace partrain::inline v0::detail {

using index_iterator = thrust::counting_iterator<std::size_t>;

template <class Policy, class F>
void thrust_for_each_index(const Policy& policy, std::size_t n, const F& f) {
  thrust::for_each_n(policy, index_iterator(0), n, f);
}

// Thrust's contract, which CUB's device reduction implements: combine must be associative and
// commutative (plus_fn and bit_or_fn are; a floating-point plus is so up to rounding, and CUB
// then repeats its order run to run on one GPU model); map is called once per index.
template <class Policy, class T, class Map, class Combine>
[[nodiscard]] T thrust_transform_reduce_index(const Policy& policy, std::size_t n, T init, const Map& map,
                                              const Combine& combine) {
  return thrust::transform_reduce(policy, index_iterator(0), index_iterator(n), map, init, combine);
}

// Thrust's sequential host system: runs on the calling thread, finished on return. Its reduction
// is a left fold in index order, as host_exec's is.
struct thrust_host_exec {};

template <class F>
void for_each_index(thrust_host_exec, std::size_t n, const F& f) {
  thrust_for_each_index(thrust::cpp::par, n, f);
}

template <class T, class Map, class Combine>
[[nodiscard]] T transform_reduce_index(thrust_host_exec, std::size_t n, T init, const Map& map, const Combine& combine) {
  return thrust_transform_reduce_index(thrust::cpp::par, n, init, map, combine);
}

}  // namespace partrain::inline v0::detail
