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

#include <cmath>
#include <cstddef>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include <partrain/comm/process_group.hpp>
#include <partrain/comm/reduce_op.hpp>
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
