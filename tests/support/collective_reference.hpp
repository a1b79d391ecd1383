// Shared by the backend tests: deterministic per-rank inputs and the sequential reference
// of every collective, so each backend is checked against the same oracle.
#pragma once

#include <partrain/comm/reduce_op.hpp>
#include <partrain/core/half.hpp>

#include <algorithm>
#include <cstddef>
#include <vector>

namespace partrain::testing {

// Small integers (exact in every float type, products stay small) that differ per rank and index.
template <class T>
T input_value(int rank, std::size_t i) {
  const int v = static_cast<int>((i * 7 + static_cast<std::size_t>(rank) * 3) % 5) + 1 + rank % 2;
  return T(static_cast<float>(v));
}

template <class T>
std::vector<T> make_input(int rank, std::size_t n) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = input_value<T>(rank, i);
  return v;
}

// Reduction of element i over ranks 0..world-1, in rank order.
template <class T>
T reference_reduce(int world, std::size_t i, reduce_op op) {
  double acc = static_cast<double>(static_cast<float>(input_value<T>(0, i)));
  for (int r = 1; r < world; ++r) {
    const double x = static_cast<double>(static_cast<float>(input_value<T>(r, i)));
    switch (op) {
      case reduce_op::sum: case reduce_op::avg: acc += x; break;
      case reduce_op::prod: acc *= x; break;
      case reduce_op::min: acc = std::min(acc, x); break;
      case reduce_op::max: acc = std::max(acc, x); break;
    }
  }
  if (op == reduce_op::avg) acc /= world;
  return T(static_cast<float>(acc));
}

inline constexpr reduce_op all_reduce_ops[] = {reduce_op::sum, reduce_op::avg, reduce_op::min, reduce_op::max,
                                               reduce_op::prod};

}  // namespace partrain::testing
