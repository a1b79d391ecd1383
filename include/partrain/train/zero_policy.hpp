// partrain/train/zero_policy.hpp: sharded data parallel (ZeRO-1/2, parallel/zero.hpp) as a
// training policy, so fit() drives it like DDP. Its train_step already holds the optimizer step;
// checkpoints are sharded (every rank writes its own slice, train/sharded_checkpoint.hpp) and load
// at any world size. With a grad scaler, each step is amp_step (the scaler's state is checkpointed).
// Over a tensor-parallel mesh (the ZeRO group is the mesh's dp dimension, each tp coordinate a
// different slice of the model), rank_sections = the whole job's group: one file with a section
// per rank (train/rank_checkpoint.hpp: its parameters and its optimizer shard), resumed by a job of
// the same mesh.
//
//   sharded_data_parallel zero(model, group, adamw_options{.lr = 1e-3}, {.stage = 2});
//   zero_policy policy(zero);
//   fit(policy, train_loader, test_loader, {.epochs = 8, .checkpoint = "run/model.ckpt"});
#pragma once

#include <concepts>
#include <cstddef>
#include <filesystem>
#include <type_traits>
#include <utility>

#include <partrain/comm/process_group.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/memory_space.hpp>
#include <partrain/model/concepts.hpp>
#include <partrain/model/traits.hpp>
#include <partrain/precision/grad_scaler.hpp>
#include <partrain/precision/mixed_precision.hpp>
#include <partrain/train/checkpoint.hpp>
#include <partrain/train/detail/shard_state_slot.hpp>
#include <partrain/train/detail/sharded_scaler.hpp>
#include <partrain/train/rank_checkpoint.hpp>
#include <partrain/train/sharded_checkpoint.hpp>
#include <partrain/train/trace.hpp>

namespace partrain::inline v0 {

struct zero_policy_options {
  grad_scaler* scaler = nullptr;    // mixed precision: amp_step (precision/sharded_amp.hpp) with it
  trace_recorder* trace = nullptr;  // one span per step ("zero_step": forward, backward, reduce, step, gather)
  // Checkpoints as a section per rank of this group (host fp32 parameters), not sharded files.
  process_group* rank_sections = nullptr;
};

template <class Zero>
class zero_policy {
 public:
  explicit zero_policy(Zero& zero, zero_policy_options o = {}) : zero_(&zero), o_(o) {
    detail::amp::require_loss_scale<std::remove_cvref_t<decltype(zero.module())>>(o_.scaler, "zero_policy");
  }

  template <class B>
  double train_step(const B& b) {
    auto span = o_.trace ? o_.trace->span("zero_step") : trace_span{};
    return scaler_.step(*zero_, b);
  }
  [[nodiscard]] std::size_t skipped_steps() const noexcept { return scaler_.skipped(); }
  // One micro-batch of a step fit accumulates (gradient_accumulation_steps): inside no_sync, the
  // gradients kept whole on this rank; the step's last micro-batch is train_step, which reduces
  // them all (averaged over the micro-batches) and steps.
  template <class B>
  double accumulate_step(const B& b) {
    return scaler_.accumulate(*zero_, b, "zero_policy");
  }
  // Clipping of the global gradient norm, over every rank's shard, from the next step on.
  void set_max_grad_norm(double v) { zero_->set_max_grad_norm(v); }
  template <class R>
  eval_result evaluate(R&& batches) {
    return zero_->evaluate(std::forward<R>(batches));
  }
  void set_lr(double lr) { zero_->set_lr(lr); }
  process_group& group() { return zero_->comm(); }
  process_group& loss_group() { return zero_->comm(); }
  [[nodiscard]] int replicas() { return zero_->comm().size(); }
  auto parameters() { return zero_->module().parameters(); }

  // Collective: every rank writes its shard, rank 0 the index at `file` (with rank_sections, rank
  // 0 of that group the one file).
  void save_checkpoint(const std::filesystem::path& file, checkpoint_extra extra) {
    scaler_.save(extra);
    if (o_.rank_sections) {
      if constexpr (sections_possible) {
        auto state = zero_->optimizer_state();
        save_rank_checkpoint(*o_.rank_sections, file, zero_->module(), detail::ckpt::shard_state_slot{&state, "ZeRO"}, extra);
        return;
      } else {
        refuse_sections();
      }
    }
    save_sharded_checkpoint(*zero_, file, extra);
  }
  checkpoint_extra load_checkpoint(const std::filesystem::path& file) {
    if (o_.rank_sections) {
      if constexpr (sections_possible) {
        shard_optimizer_state<float> state;
        detail::ckpt::shard_state_slot slot{&state, "ZeRO"};
        checkpoint_extra extra = load_rank_checkpoint(*o_.rank_sections, file, zero_->module(), slot);
        zero_->load_optimizer_state(state, "rank checkpoint '" + file.string() + "'");
        scaler_.load(extra);
        return extra;
      } else {
        refuse_sections();
      }
    }
    checkpoint_extra extra = load_sharded_checkpoint(*zero_, file);
    scaler_.load(extra);
    if constexpr (has_low_precision_copy<std::remove_cvref_t<decltype(zero_->module())>>) {
      zero_->module().refresh_low_precision();  // the 16-bit copy of the loaded masters
    }
    return extra;
  }

 private:
  using module_type = std::remove_cvref_t<decltype(std::declval<Zero&>().module())>;
  // A section holds the model's parameters, which are the optimizer's values only for host fp32
  // parameters (16-bit ones have fp32 masters in shards).
  static constexpr bool sections_possible = std::same_as<model_space_t<module_type>, host> &&
                                            std::same_as<model_element_t<module_type>, float> &&
                                            std::same_as<typename Zero::master_type, float>;
  [[noreturn]] static void refuse_sections() {
    throw config_error("zero_policy: rank_sections checkpoints need host fp32 parameters (this model's live on a device "
                       "or in 16 bits); leave rank_sections unset for sharded checkpoints");
  }

  Zero* zero_;
  zero_policy_options o_;
  detail::sharded_scaler scaler_{o_.scaler};
};

}  // namespace partrain::inline v0
