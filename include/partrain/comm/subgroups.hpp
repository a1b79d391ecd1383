// partrain/comm/subgroups.hpp: groups made from a group, as torch.distributed.new_group and
// new_subgroups make them. Both are collective over the parent (every rank calls them, in the
// same order as its other collectives) and return a group of the parent's own backend type, so
// policies that take two groups of one type (hierarchical post-local SGD) get one:
//
//   auto host = new_subgroups(*world, 4);   // ranks 0-3, 4-7, ...: this rank's host group
//   post_local_sgd lsgd(model, opt, *world, *host, {.period = 16});
#pragma once

#include <concepts>
#include <memory>
#include <string>
#include <utility>

#include <partrain/comm/process_group.hpp>
#include <partrain/core/error.hpp>

namespace partrain::inline v0 {

// The ranks of g that pass the same color (>= 0) form a new group, ranked in their order in g
// (MPI_Comm_split with the parent's rank as key).
template <std::derived_from<process_group> G>
[[nodiscard]] std::unique_ptr<G> split_group(G& g, int color) {
  auto made = g.split(color);
  auto* typed = dynamic_cast<G*>(made.get());
  if (!typed) {
    throw error(error_kind::internal, "split_group: the " + std::string(g.backend()) +
                                          " backend returned a group of another type (expected its own)");
  }
  (void)made.release();
  return std::unique_ptr<G>(typed);
}

// torch.distributed.new_subgroups(group_size): consecutive ranks of g in groups of group_size
// (ranks 0..group_size-1, then the next group_size, ...); this rank's group. group_size must
// divide g's size (a host's ranks: its local world size).
template <std::derived_from<process_group> G>
[[nodiscard]] std::unique_ptr<G> new_subgroups(G& g, int group_size) {
  if (group_size < 1 || g.size() % group_size != 0) {
    throw invalid_argument_error("rank " + std::to_string(g.rank()) + " new_subgroups: group_size " +
                                 std::to_string(group_size) + " does not divide the group's " + std::to_string(g.size()) +
                                 " ranks (expected a divisor, e.g. the ranks per host)");
  }
  return split_group(g, g.rank() / group_size);
}

}  // namespace partrain::inline v0
