// partrain/parallel/detail/evaluate.hpp: the evaluation every data-parallel mode shares (DDP,
// ZeRO, DiLoCo, streaming DiLoCo): this rank's batches through the model's eval_step, then loss,
// correct and count summed over the ranks as three doubles in one all_reduce (exact for counts
// below 2^53). Each mode brings its own all_reduce, so its errors name it.
#pragma once

#include <array>
#include <cstddef>
#include <span>
#include <type_traits>
#include <utility>

#include <partrain/comm/reduce_op.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/model/concepts.hpp>
#include <partrain/parallel/detail/host_staging.hpp>

namespace partrain::inline v0::detail::ddp {

template <class M, class Range>
[[nodiscard]] eval_result evaluate_batches(M& model, Range&& batches) {
  eval_result local;
  for (auto&& b : batches) {
    static_assert(evaluable_on<M, std::remove_cvref_t<decltype(b)>>,
                  "partrain: evaluate needs `eval_result eval_step(const Batch&)` on the model");
    local += model.eval_step(b);
  }
  return local;
}

// all_reduce_sums(std::span<double>) sums its three doubles over the ranks, in place.
template <class AllReduce>
[[nodiscard]] eval_result sum_over_ranks(const eval_result& local, AllReduce&& all_reduce_sums) {
  std::array<double, 3> sums{local.loss_sum, static_cast<double>(local.correct), static_cast<double>(local.count)};
  all_reduce_sums(std::span<double>(sums));
  return {sums[0], static_cast<std::size_t>(sums[1]), static_cast<std::size_t>(sums[2])};
}

// Both on a communicator whose own wait is the whole error handling (DiLoCo's); on a backend
// that takes device memory only (NCCL) the sums go through a device copy.
template <class M, class C, class Range>
[[nodiscard]] eval_result evaluate_summed(M& model, C& comm, Range&& batches) {
  return sum_over_ranks(evaluate_batches(model, std::forward<Range>(batches)), [&](std::span<double> sums) {
    host_collective(
        comm, sums, [&](auto view) { return comm.all_reduce(view, reduce_op::sum); }, [](auto&& w) { w.wait(); });
  });
}

}  // namespace partrain::inline v0::detail::ddp
