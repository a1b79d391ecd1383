// partrain/parallel/mesh_clip.hpp: global-norm gradient clipping of a model split over a device
// mesh (torch's clip_grad_norm_ over DTensors), every parameter counted exactly once:
// - a parameter that names a shard_group() (tensor parallel: each rank of the group holds a slice)
//   adds its slice's squares summed over that group;
// - a replicated one (a LayerNorm, a row-parallel bias) adds its squares once;
// - `disjoint` are the groups whose ranks hold different parts of the model (pipeline stages;
//   ZeRO or FSDP shards): the totals add up over each.
// Data-parallel replicas under DDP hold the same gradients after its all-reduce: leave them out.
//
//   clip_grad_norm(model, 1.0, std::array{&mesh.group("pp")});   // PP x TP (x DP under DDP)
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <partrain/comm/process_group.hpp>
#include <partrain/comm/reduce_op.hpp>
#include <partrain/core/error.hpp>
#include <partrain/model/concepts.hpp>
#include <partrain/model/traits.hpp>
#include <partrain/optim/clip.hpp>
#include <partrain/parallel/detail/host_staging.hpp>

namespace partrain::inline v0 {

namespace detail::mesh_clip {

template <class P>
[[nodiscard]] process_group* shard_group_of(const P& p) {
  if constexpr (requires { p.shard_group(); }) {
    return p.shard_group();
  } else {
    return nullptr;
  }
}

inline void sum_over(process_group& g, double& v) {
  host_collective(
      g, std::span<double>(&v, 1), [&](auto view) { return g.all_reduce(view, reduce_op::sum); }, [](auto&& w) { w.wait(); });
}

// For the sharded modes (ZeRO, FSDP), whose shards are ranges of a flat parameter space that mix
// elements of split and replicated parameters:

// [begin, end) of a flat parameter space.
struct flat_span {
  std::size_t begin = 0, end = 0;
};
// `group`, or g where group is still null: a model's parameters are split over one
// tensor-parallel group at most.
[[nodiscard]] inline process_group* one_split_group(process_group* group, process_group* g, const std::string& where) {
  if (g && group && g != group) {
    throw invalid_argument_error(where + "parameters split over two different tensor-parallel groups (expected one "
                                 "group for the model)");
  }
  return group ? group : g;
}

// The flat ranges of the parameters that name a shard group of 2 or more ranks, ascending, and
// that group (null when none; one group for all of them, or add throws). add() takes the
// parameters in flat order.
struct split_parameters {
  std::vector<flat_span> ranges;
  process_group* group = nullptr;
  std::size_t at = 0;  // the flat space so far

  template <class P>
  void add(P&& p, const std::string& where) {
    const std::size_t n = p.grad().size();
    process_group* g = shard_group_of(p);
    if (g && g->size() > 1) {
      group = one_split_group(group, g, where);
      ranges.push_back({at, at + n});
    }
    at += n;
  }
};
template <class Params>
[[nodiscard]] split_parameters find_split(Params&& params, const std::string& where) {
  split_parameters out;
  for (auto&& p : params) out.add(p, where);
  return out;
}
// The squares of a shard's gradient elements [begin, end) of that flat space (data: the element
// at begin), as {inside the split ranges, the rest}.
template <class T, class S>
[[nodiscard]] std::array<double, 2> split_squares(const T* data, std::size_t begin, std::size_t end,
                                                  const std::vector<flat_span>& split, void* stream) {
  std::array<double, 2> sum{0.0, 0.0};
  auto squares = [&](std::size_t from, std::size_t to) {
    return to > from ? detail::optim::sum_squares(tensor_view<const T, S>(data + (from - begin), to - from), stream) : 0.0;
  };
  std::size_t at = begin;
  for (const auto& sp : split) {
    const std::size_t lo = std::max(sp.begin, begin), hi = std::min(sp.end, end);
    if (lo >= hi) continue;
    sum[1] += squares(at, lo);
    sum[0] += squares(lo, hi);
    at = hi;
  }
  sum[1] += squares(at, end);
  return sum;
}
// The global norm from every shard's {split, rest} squares: sum_ranks adds them over the shards'
// ranks, then the split part adds over the tensor-parallel group (its ranks hold different
// slices), the rest not (its ranks hold copies).
template <class SumRanks>
[[nodiscard]] double split_norm(std::array<double, 2> sums, SumRanks&& sum_ranks, process_group* group) {
  if (!group) {  // nothing split: one double over the ranks, as before there was tensor parallelism
    sum_ranks(std::span<double>(&sums[1], 1));
    return std::sqrt(sums[1]);
  }
  sum_ranks(std::span<double>(sums));
  sum_over(*group, sums[0]);
  return std::sqrt(sums[0] + sums[1]);
}

}  // namespace detail::mesh_clip

// The squares of every gradient, each parameter counted once across the mesh (collective over
// every shard group met and every group of `disjoint`, in the same order on every rank).
template <class M>
  requires model<M>
[[nodiscard]] double mesh_grad_sum_squares(M& m, std::span<process_group* const> disjoint = {}) {
  void* stream = model_stream(m);
  double replicated = 0;
  std::vector<std::pair<process_group*, double>> sharded;  // in the order the parameters name them
  for (auto&& p : m.parameters()) {
    using T = param_element_t<std::remove_cvref_t<decltype(p)>>;
    using S = param_space_t<std::remove_cvref_t<decltype(p)>>;
    const double s = detail::optim::sum_squares(tensor_view<const T, S>(p.grad()), stream);
    process_group* g = detail::mesh_clip::shard_group_of(p);
    if (!g || g->size() == 1) {
      replicated += s;
      continue;
    }
    auto it = sharded.begin();
    while (it != sharded.end() && it->first != g) ++it;
    if (it == sharded.end()) {
      sharded.emplace_back(g, s);
    } else {
      it->second += s;
    }
  }
  double total = replicated;
  for (auto& [g, s] : sharded) {
    detail::mesh_clip::sum_over(*g, s);
    total += s;
  }
  for (process_group* g : disjoint) {
    if (g && g->size() > 1) detail::mesh_clip::sum_over(*g, total);
  }
  return total;
}

// Clips to a global 2-norm of at most max_norm and returns the norm before clipping (a non-finite
// norm is returned and the gradients are left alone, as clip_grad_norm does).
template <class M>
  requires model<M>
double clip_grad_norm(M& m, double max_norm, std::span<process_group* const> disjoint) {
  detail::optim::check_max_norm(max_norm, "clip_grad_norm");
  const double total = std::sqrt(mesh_grad_sum_squares(m, disjoint));
  detail::optim::clip_to_norm(m.parameters(), total, max_norm, model_stream(m));
  return total;
}

}  // namespace partrain::inline v0
