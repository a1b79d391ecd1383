// partrain/train/replica_state.hpp: what a fault-tolerant replica sends one that joins, for a
// model and its optimizer: a checkpoint's bytes (parameters, buffers, the optimizer's state, and
// `extra`: the step, the sampler's position, random and scaler state), sent over the quorum's
// group instead of through a file, and checked as a checkpoint is (names, shapes, checksum)
// before anything is changed.
//
//   checkpoint_extra extra;   // what the program keeps in it moves with the state
//   replica_group rg(store, groups, replica_state_of(model, opt, &extra), {.replica = r});
#pragma once

#include <cstddef>
#include <span>
#include <utility>

#include <partrain/model/concepts.hpp>
#include <partrain/optim/optimizer.hpp>
#include <partrain/parallel/replica_group.hpp>
#include <partrain/train/checkpoint.hpp>

namespace partrain::inline v0 {

// model, opt and extra (when given) must outlive the replica_group.
template <model M, stateful_optimizer O>
[[nodiscard]] replica_state_io replica_state_of(M& m, O& opt, checkpoint_extra* extra = nullptr) {
  return {.save = [&m, &opt, extra] { return checkpoint_bytes(m, opt, extra ? *extra : checkpoint_extra{}); },
          .load =
              [&m, &opt, extra](std::span<const std::byte> bytes) {
                auto e = load_checkpoint_bytes(bytes, m, opt, "a healthy replica's state");
                if (extra) *extra = std::move(e);
              }};
}

}  // namespace partrain::inline v0
