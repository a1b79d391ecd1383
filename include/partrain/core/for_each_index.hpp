// partrain/core/for_each_index.hpp: the host half of the one launch helper. An element loop is a
// function object f with `PARTRAIN_HOST_DEVICE void operator()(std::size_t i) const`;
// for_each_index(exec, n, f) runs f(i) for every i in [0, n). With host_exec it is a plain loop
// (GCC vectorizes it once f is inlined); partrain/cuda/launch.cuh gives the same call with
// cuda_exec a grid-stride kernel. Every device kernel's element logic is written once this way,
// so the host path and the CPU tier run the code the GPU runs.
#pragma once

#include <cstddef>

#include <partrain/config.hpp>

namespace partrain::inline v0::detail {

// Runs on the calling thread; finished on return.
struct host_exec {};

template <class F>
inline void for_each_index(host_exec, std::size_t n, const F& f) {
  for (std::size_t i = 0; i < n; ++i) f(i);
}

// combine(...combine(combine(init, map(0)), map(1))..., map(n - 1)): a left fold in index order,
// so the result is the same on every run. map may also write (the fused unscale + check does).
// The CUDA twin folds per block, then the blocks' partials in block order: deterministic too,
// though not bit for bit the host's order for a non-associative combine (floating-point sums).
template <class T, class Map, class Combine>
[[nodiscard]] inline T transform_reduce_index(host_exec, std::size_t n, T init, const Map& map,
                                              const Combine& combine) {
  T acc = init;
  for (std::size_t i = 0; i < n; ++i) acc = combine(acc, map(i));
  return acc;
}

// The combines the library uses, callable in device code.
struct plus_fn {
  template <class T>
  PARTRAIN_HOST_DEVICE constexpr T operator()(T a, T b) const {
    return a + b;
  }
};
struct bit_or_fn {
  template <class T>
  PARTRAIN_HOST_DEVICE constexpr T operator()(T a, T b) const {
    return a | b;
  }
};

}  // namespace partrain::inline v0::detail
