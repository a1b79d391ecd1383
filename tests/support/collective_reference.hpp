// Shared by the backend tests: deterministic per-rank inputs and the sequential reference
// of every collective, so each backend is checked against the same oracle.
#pragma once

#include <partrain/comm/detail/host_reduce.hpp>
#include <partrain/comm/process_group.hpp>
#include <partrain/comm/reduce_op.hpp>
#include <partrain/core/half.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <type_traits>
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

// make_input divided by d with a true division (in float for the 16-bit types): what
// all_reduce_divided must give the same bits as, once summed.
template <class T>
std::vector<T> divided_input(int rank, std::size_t n, double d) {
  auto v = make_input<T>(rank, n);
  for (auto& x : v) {
    if constexpr (std::is_same_v<T, double>) {
      x = x / d;
    } else {
      x = T(static_cast<float>(x) / static_cast<float>(d));
    }
  }
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

// Equal within 16-bit rounding (the reductions of half and bfloat16 round at every step).
template <class T>
bool close(T got, T want) {
  const double g = static_cast<double>(static_cast<float>(got));
  const double w = static_cast<double>(static_cast<float>(want));
  return std::abs(g - w) <= 1e-2 * std::max(1.0, std::abs(w));
}

// Every collective of g on inputs of n elements per rank, each result against the sequential
// reference; returns how many checks failed on this rank (run it on every rank of g).
template <class T>
int collective_failures(process_group& g, std::size_t n) {
  int failures = 0;
  auto expect = [&](bool ok) { failures += ok ? 0 : 1; };
  const int r = g.rank();
  const int world = g.size();
  for (auto op : partrain::testing::all_reduce_ops) {
    auto v = make_input<T>(r, n);
    g.all_reduce(tensor_view<T>(v), op).wait();
    for (std::size_t i = 0; i < n; ++i) expect(close(v[i], reference_reduce<T>(world, i, op)));
  }
  for (int root = 0; root < world; ++root) {
    auto v = make_input<T>(r, n);
    g.broadcast(tensor_view<T>(v), root).wait();
    expect(v == make_input<T>(root, n));
    for (auto op : {reduce_op::sum, reduce_op::avg}) {
      auto red = make_input<T>(r, n);
      g.reduce(tensor_view<T>(red), root, op).wait();
      if (r == root) {
        for (std::size_t i = 0; i < n; ++i) expect(close(red[i], reference_reduce<T>(world, i, op)));
      } else {
        expect(red == make_input<T>(r, n));  // non-root buffers untouched
      }
    }
  }
  {
    auto in = make_input<T>(r, n);
    std::vector<T> out(n * static_cast<std::size_t>(world));
    g.all_gather(tensor_view<T>(in), tensor_view<T>(out)).wait();
    for (int q = 0; q < world; ++q) {
      auto want = make_input<T>(q, n);
      expect(std::equal(want.begin(), want.end(), out.begin() + static_cast<std::ptrdiff_t>(q * n)));
    }
  }
  for (auto op : {reduce_op::sum, reduce_op::avg, reduce_op::max}) {
    const std::size_t total = n * static_cast<std::size_t>(world);
    auto in = make_input<T>(r, total);
    std::vector<T> out(n);
    g.reduce_scatter(tensor_view<T>(in), tensor_view<T>(out), op).wait();
    for (std::size_t i = 0; i < n; ++i) {
      expect(close(out[i], reference_reduce<T>(world, static_cast<std::size_t>(r) * n + i, op)));
    }
  }
  // all_reduce_divided: the bits of dividing each rank's input (a true division here), then
  // summing with the same backend, for a divisor whose division is a multiplication (the world
  // size when a power of two, 0.5) and for 3, whose is not.
  if constexpr (detail::is_float_element_v<T>) {
    for (double d : {static_cast<double>(world), 3.0, 0.5}) {
      auto v = make_input<T>(r, n);
      g.all_reduce_divided(tensor_view<T>(v), d).wait();
      auto w = divided_input<T>(r, n, d);
      g.all_reduce(tensor_view<T>(w), reduce_op::sum).wait();
      expect(v == w);
      for (std::size_t i = 0; i < n; ++i) {
        expect(close(v[i], T(static_cast<float>(reference_reduce<T>(world, i, reduce_op::sum)) / static_cast<float>(d))));
      }
    }
  }
  g.barrier().wait();
  if (world > 1) {  // a ring of send/recv, receive posted after the send
    auto mine = make_input<T>(r, n);
    std::vector<T> got(n);
    auto s = g.send(tensor_view<T>(mine), (r + 1) % world, 7);
    g.recv(tensor_view<T>(got), (r + world - 1) % world, 7).wait();
    s.wait();
    expect(got == make_input<T>((r + world - 1) % world, n));
  }
  return failures;
}

}  // namespace partrain::testing
