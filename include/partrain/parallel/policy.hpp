// partrain/parallel/policy.hpp: what a training loop needs from a parallel policy, so the same
// loop drives data_parallel (one process, several devices) and distributed_data_parallel (one
// process per device) interchangeably.
#pragma once

#include <concepts>
#include <span>

#include <partrain/model/concepts.hpp>

namespace partrain::inline v0 {

// P trains on batches of type B: one synchronised step (forward, backward, gradient reduction,
// optimizer step where the policy owns the optimizer) returning the mean loss over the whole
// batch; evaluation over a range of batches; and the model the user handed in.
template <class P, class B>
concept parallel_policy = requires(P& p, const B& b, std::span<const B> batches) {
  { p.train_step(b) } -> std::convertible_to<double>;
  { p.evaluate(batches) } -> std::convertible_to<eval_result>;
  p.module();
};

}  // namespace partrain::inline v0
