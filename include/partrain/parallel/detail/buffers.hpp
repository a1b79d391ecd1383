// partrain/parallel/detail/buffers.hpp: a model's buffers (non-trainable state, has_buffers)
// copied from rank 0 to every rank, for the modes that keep them replicated (DDP, ZeRO).
#pragma once

#include <vector>

#include <partrain/core/tensor_view.hpp>
#include <partrain/core/work.hpp>
#include <partrain/model/concepts.hpp>

namespace partrain::inline v0::detail {

// Issues one broadcast from rank 0 per buffer; the caller waits (none for a model without buffers).
template <class C, class M>
[[nodiscard]] std::vector<work> broadcast_buffers(C& comm, M& m) {
  std::vector<work> works;
  if constexpr (has_buffers<M>) {
    for (auto&& b : m.buffers()) {
      const tensor_view<float> v(b);
      if (!v.empty()) works.push_back(comm.broadcast(v, 0));
    }
  }
  return works;
}

}  // namespace partrain::inline v0::detail
