// partrain/train/fsdp_policy.hpp: fully sharded data parallel (ZeRO-3, parallel/fsdp.hpp) as a
// training policy, so fit() drives it like DDP. Its train_step already holds the optimizer step;
// checkpoints are sharded (train/sharded_checkpoint.hpp: every rank writes its chunks) and load
// at any world size, into ZeRO, or into a replicated model. With a grad scaler (for
// fsdp_options::reduce_dtype float16), each step is amp_step and the scaler's state is checkpointed.
// Over a tensor-parallel mesh, rank_sections: one file with a section per rank (its shards).
//
//   fully_sharded_data_parallel fsdp(layers, group, softmax_cross_entropy{}, sgd_options{.lr = 0.1});
//   fsdp_policy policy(fsdp);
//   fit(policy, train_loader, test_loader, {.epochs = 8, .checkpoint = "run/model.ckpt"});
#pragma once

#include <cstddef>
#include <filesystem>
#include <utility>
#include <vector>

#include <partrain/comm/process_group.hpp>
#include <partrain/model/concepts.hpp>
#include <partrain/precision/grad_scaler.hpp>
#include <partrain/train/checkpoint.hpp>
#include <partrain/train/detail/shard_state_slot.hpp>
#include <partrain/train/detail/sharded_scaler.hpp>
#include <partrain/train/rank_checkpoint.hpp>
#include <partrain/train/sharded_checkpoint.hpp>
#include <partrain/train/trace.hpp>

namespace partrain::inline v0 {

struct fsdp_policy_options {
  grad_scaler* scaler = nullptr;    // loss scaling: amp_step (precision/sharded_amp.hpp) with it
  trace_recorder* trace = nullptr;  // one span per step ("fsdp_step": gathers, forward, backward, reduce_scatters, step)
  // Checkpoints as a section per rank of this group (each rank's shard of the parameters and of
  // the optimizer state), not sharded files: over a tensor-parallel mesh, where each tp
  // coordinate's dp group shards a different slice of the model. Resumed on the same mesh.
  process_group* rank_sections = nullptr;
};

template <class Fsdp>
class fsdp_policy {
 public:
  explicit fsdp_policy(Fsdp& fsdp, fsdp_policy_options o = {}) : fsdp_(&fsdp), o_(o) {}

  template <class B>
  double train_step(const B& b) {
    auto span = o_.trace ? o_.trace->span("fsdp_step") : trace_span{};
    return scaler_.step(*fsdp_, b);
  }
  [[nodiscard]] std::size_t skipped_steps() const noexcept { return scaler_.skipped(); }
  // One micro-batch of a step fit accumulates (gradient_accumulation_steps): inside no_sync, the
  // gradients kept whole on this rank; the step's last micro-batch is train_step, which reduces
  // them all (averaged over the micro-batches) and steps. In the deterministic mode its shards
  // join the step's exact sum instead.
  template <class B>
  double accumulate_step(const B& b) {
    if (!fsdp_->deterministic()) return scaler_.accumulate(*fsdp_, b, "fsdp_policy");
    detail::refuse_scaled_accumulation(o_.scaler && o_.scaler->enabled(), "fsdp_policy");
    return fsdp_->accumulate_step(b);
  }
  // fit's gradient_accumulation_steps: the deterministic mode cuts each micro-batch by it.
  void set_gradient_accumulation_steps(std::size_t a) { fsdp_->set_gradient_accumulation_steps(a); }
  // Clipping of the global gradient norm, over every rank's shard, from the next step on.
  void set_max_grad_norm(double v) { fsdp_->set_max_grad_norm(v); }
  template <class R>
  eval_result evaluate(R&& batches) {
    return fsdp_->evaluate(std::forward<R>(batches));
  }
  void set_lr(double lr) { fsdp_->set_lr(lr); }
  process_group& group() { return fsdp_->comm(); }
  process_group& loss_group() { return fsdp_->comm(); }  // each rank's loss is its own batch's (or all the global batch's)
  // The copies of the data a step reads: one per rank, or one in the deterministic mode (every
  // rank takes the global batch).
  [[nodiscard]] int replicas() { return fsdp_->deterministic() ? 1 : fsdp_->comm().size(); }

  // Collective: every rank writes its chunks, rank 0 the index at `file` (with rank_sections,
  // rank 0 of that group the one file).
  void save_checkpoint(const std::filesystem::path& file, checkpoint_extra extra) {
    scaler_.save(extra);
    if (o_.rank_sections) {
      detail::zero_ckpt::check_no_buffers(*fsdp_, "fsdp_policy");
      std::vector<float> values = fsdp_->shard_values();
      detail::ckpt::shard_values_model shard{{{&values}}};
      auto state = fsdp_->optimizer_state();
      save_rank_checkpoint(*o_.rank_sections, file, shard, detail::ckpt::shard_state_slot{&state, "FSDP"}, extra);
      return;
    }
    save_sharded_checkpoint(*fsdp_, file, extra);
  }
  checkpoint_extra load_checkpoint(const std::filesystem::path& file) {
    if (o_.rank_sections) {
      std::vector<float> values(fsdp_->shard_values().size());
      detail::ckpt::shard_values_model shard{{{&values}}};
      shard_optimizer_state<float> state;
      detail::ckpt::shard_state_slot slot{&state, "FSDP"};
      checkpoint_extra extra = load_rank_checkpoint(*o_.rank_sections, file, shard, slot);
      fsdp_->load_optimizer_state(state, "rank checkpoint '" + file.string() + "'");
      fsdp_->load_shard_values(values);
      scaler_.load(extra);
      return extra;
    }
    checkpoint_extra extra = load_sharded_checkpoint(*fsdp_, file);
    scaler_.load(extra);
    return extra;
  }

 private:
  Fsdp* fsdp_;
  fsdp_policy_options o_;
  detail::sharded_scaler scaler_{o_.scaler};
};

}  // namespace partrain::inline v0
