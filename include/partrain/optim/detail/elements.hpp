// partrain/optim/detail/elements.hpp: the optimizers' and clipping's element loops as functors
// (one call per index), written once for every path: the host overloads in state_buffer.hpp run
// them through for_each_index(host_exec), optim/detail/kernels.cuh launches the same functors on
// CUDA, and the CPU tier (tests/cpu_tier) checks them against references of its own.
#pragma once

#include <cstddef>

#include <partrain/config.hpp>
#include <partrain/core/for_each_index.hpp>
#include <partrain/optim/detail/update_rules.hpp>

namespace partrain::inline v0::detail::optim {

// torch.optim.SGD on element i; buf is null without momentum.
template <class T>
struct sgd_update_fn {
  T* v;
  const T* g;
  T* buf;
  sgd_coeffs<T> c;
  bool first;
  PARTRAIN_HOST_DEVICE void operator()(std::size_t i) const { sgd_element(v[i], g[i], buf ? buf + i : nullptr, c, first); }
};

// torch.optim.AdamW on element i.
template <class T>
struct adamw_update_fn {
  T* v;
  const T* g;
  T* m;
  T* s;
  adamw_coeffs<T> c;
  PARTRAIN_HOST_DEVICE void operator()(std::size_t i) const { adamw_element(v[i], g[i], m[i], s[i], c); }
};

// g[i]² in double: the map of clipping's sum of squares (combined with plus_fn).
template <class T>
struct square_as_double_fn {
  const T* g;
  PARTRAIN_HOST_DEVICE double operator()(std::size_t i) const {
    const double x = static_cast<double>(g[i]);
    return x * x;
  }
};

// g[i] *= coef: clipping's rescale.
template <class T>
struct scale_fn {
  T* g;
  T coef;
  PARTRAIN_HOST_DEVICE void operator()(std::size_t i) const { g[i] = g[i] * coef; }
};

template <class T>
struct fill_zero_fn {
  T* g;
  PARTRAIN_HOST_DEVICE void operator()(std::size_t i) const { g[i] = T(0); }
};

}  // namespace partrain::inline v0::detail::optim
