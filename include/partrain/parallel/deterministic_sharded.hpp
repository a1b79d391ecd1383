// partrain/parallel/deterministic_sharded.hpp: deterministic data parallel (deterministic.hpp)
// with the optimizer state sharded over the ranks, as ZeRO-1 shards it: the same bits at any
// world size, and 1/world of the optimizer's state per rank.
//
// The exact gradient is deterministic_data_parallel's (fixed shards of the global batch, summed in
// fixed point by an int64 reduce_scatter), of which rank r takes only its contiguous slice of the
// flattened parameters (no all_gather of gradients). It steps that slice with the optimizer's own
// element rules (SGD's momentum, AdamW's moments over that slice), and an all_gather of the slices
// gives every rank the new values. The update is element by element, so who steps an element does not change its bits: the
// result equals deterministic_data_parallel plus the replicated optimizer, at any world size.
//
//   deterministic_sharded_data_parallel zero(model, group, sgd_options{.lr = 0.1, .momentum = 0.9}, {.shards = 8});
//   double loss = zero.train_step(global_batch);   // gradient, this rank's slice stepped, parameters gathered
//
// Checkpoints hold the whole optimizer state (gather_state: every rank's slice, collective), so a
// run resumes at another world size (load_state takes this rank's new slice).
//
// ZeRO-2: with deterministic_options::bucket_elements the exact sum is reduce-scattered a bucket
// at a time, so the reduced gradient exists only as this rank's block and the int64 scratch is a
// bucket plus that block instead of the whole gradient (reduction_scratch_bytes()). The bits do
// not change. The model's own gradients stay whole (each shard's backward writes them, as ZeRO-2's
// backward does), and a rank computing several shards keeps all but its last shard's gradient
// until the step's sum.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <partrain/comm/process_group.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/data/batch.hpp>
#include <partrain/model/concepts.hpp>
#include <partrain/parallel/deterministic.hpp>
#include <partrain/parallel/detail/zero_optimizer.hpp>

namespace partrain::inline v0 {

template <class M, class C>
class deterministic_sharded_data_parallel {
  static_assert(std::same_as<model_element_t<M>, float>, "partrain: deterministic_sharded_data_parallel steps float parameters");

 public:
  deterministic_sharded_data_parallel(M& m, C& comm, shard_optimizer_options opt, deterministic_options o)
      : det_(m, comm, o), block_(det_.block()), opt_(opt, block_.last - block_.first) {}

  [[nodiscard]] M& module() noexcept { return det_.module(); }
  [[nodiscard]] C& comm() noexcept { return det_.comm(); }
  [[nodiscard]] std::size_t shards() const noexcept { return det_.shards(); }
  // This rank's slice of the flattened parameters: [first, last).
  [[nodiscard]] std::pair<std::size_t, std::size_t> slice() const noexcept { return {block_.first, block_.last}; }
  [[nodiscard]] std::size_t optimizer_state_bytes() const noexcept { return opt_.state_bytes(); }
  [[nodiscard]] std::size_t reduction_scratch_bytes() const noexcept { return det_.reduction_scratch_bytes(); }
  [[nodiscard]] double lr() const noexcept { return opt_.lr(); }
  void set_lr(double lr) { opt_.set_lr(lr); }
  template <class Range>
  [[nodiscard]] eval_result evaluate(Range&& batches) {
    return det_.evaluate(std::forward<Range>(batches));
  }

  // Gradient accumulation, as deterministic_data_parallel's: A micro-batches a step, A dividing S.
  void set_gradient_accumulation_steps(std::size_t a) { det_.set_gradient_accumulation_steps(a); }
  // A micro-batch before a step's last: its shards' gradients kept; its mean loss.
  double accumulate_step(const batch& micro) { return det_.accumulate_step(micro); }

  // The global batch's mean loss (under accumulation: the step's last micro-batch, its loss); the
  // parameters stepped, the same on every rank and at every world size. Every rank passes the
  // same batch.
  double train_step(const batch& global) {
    const double loss = det_.train_step_block(global);  // this rank's slice of the mean gradient
    // This rank's slice: the optimizer's element rules over the parameters' pieces in it.
    opt_.begin_step();
    for_each_piece([&](float* v, const float* g, std::size_t at, std::size_t n) { opt_.update(v, g, at, n); });
    // Every slice to every rank (padded to equal blocks).
    mine_.assign(block_.width, 0.0f);
    for_each_piece([&](float* v, const float*, std::size_t at, std::size_t n) { std::copy(v, v + n, mine_.begin() + static_cast<std::ptrdiff_t>(at)); });
    all_.resize(block_.width * static_cast<std::size_t>(comm().size()));
    comm().all_gather(tensor_view<const float>(mine_), tensor_view<float>(all_)).wait();
    std::size_t at = 0;
    for (auto&& p : module().parameters()) {
      auto v = p.value();
      std::copy(all_.begin() + static_cast<std::ptrdiff_t>(at), all_.begin() + static_cast<std::ptrdiff_t>(at + v.size()), v.begin());
      at += v.size();
    }
    return loss;
  }

  // Collective: the whole optimizer state, every rank's slice gathered (what a checkpoint holds).
  [[nodiscard]] shard_optimizer_state<float> gather_state() {
    shard_optimizer_state<float> mine = opt_.state();
    // Ranks agree on whether there is state (every rank stepped the same steps, so they do).
    shard_optimizer_state<float> whole{mine.kind, mine.steps, {}};
    for (const auto& a : mine.arrays) {
      std::vector<float> padded(block_.width, 0.0f);
      std::copy(a.begin(), a.end(), padded.begin());
      std::vector<float> gathered(block_.width * static_cast<std::size_t>(comm().size()));
      comm().all_gather(tensor_view<const float>(padded), tensor_view<float>(gathered)).wait();
      gathered.resize(block_.total);
      whole.arrays.push_back(std::move(gathered));
    }
    return whole;
  }
  // Restores this rank's slice of a whole state (saved at any world size).
  void load_state(const shard_optimizer_state<float>& whole, const std::string& source) {
    shard_optimizer_state<float> mine{whole.kind, whole.steps, {}};
    for (const auto& a : whole.arrays) {
      if (a.size() != block_.total) {
        throw checkpoint_error(source + " holds optimizer state of " + std::to_string(a.size()) + " elements, this model has " +
                               std::to_string(block_.total) + " parameters");
      }
      mine.arrays.emplace_back(a.begin() + static_cast<std::ptrdiff_t>(block_.first), a.begin() + static_cast<std::ptrdiff_t>(block_.last));
    }
    opt_.load(mine, source);
  }

 private:
  // f(value, grad, offset in this rank's slice, n) for each parameter's piece inside the slice.
  template <class F>
  void for_each_piece(F&& f) {
    std::size_t begin = 0;
    for (auto&& p : module().parameters()) {
      auto v = p.value();
      auto g = p.grad();
      const std::size_t end = begin + v.size();
      const std::size_t lo = std::max(begin, block_.first), hi = std::min(end, block_.last);
      if (lo < hi) f(v.data() + (lo - begin), g.data() + (lo - begin), lo - block_.first, hi - lo);
      begin = end;
    }
  }

  deterministic_data_parallel<M, C> det_;
  typename deterministic_data_parallel<M, C>::block_layout block_;  // this rank's slice, the same as its gradient block
  detail::zero::shard_optimizer<float> opt_;
  std::vector<float> mine_, all_;
};

}  // namespace partrain::inline v0
