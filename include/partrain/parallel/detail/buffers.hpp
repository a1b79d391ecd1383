// partrain/parallel/detail/buffers.hpp: a model's buffers (non-trainable state, has_buffers)
// copied from rank 0 to every rank, for the modes that keep them replicated (DDP, ZeRO).
#pragma once

#include <vector>

#include <partrain/core/tensor_view.hpp>
#include <partrain/core/work.hpp>
#include <partrain/model/concepts.hpp>

namespace partrain::inline v0::detail {

// One broadcast from rank 0 per buffer, each waited through wait_one(work&) (the mode's waits
// name the rank and the operation); nothing for a model (or layer) without buffers.
template <class C, class M, class Wait>
void broadcast_buffers(C& comm, M& m, Wait wait_one) {
  if constexpr (has_buffers<M>) {
    std::vector<work> works;
    for (auto&& b : m.buffers()) {
      const tensor_view<float> v(b);
      if (!v.empty()) works.push_back(comm.broadcast(v, 0));
    }
    wait_all(works, wait_one);
  }
}

}  // namespace partrain::inline v0::detail
