// partrain/train/zero_policy.hpp: sharded data parallel (ZeRO-1/2, parallel/zero.hpp) as a
// training policy, so fit() drives it like DDP. Its train_step already holds the optimizer step;
// checkpoints are sharded (every rank writes its own slice, train/sharded_checkpoint.hpp) and load
// at any world size. With a grad scaler, each step is amp_step (the scaler's state is checkpointed).
//
//   sharded_data_parallel zero(model, group, adamw_options{.lr = 1e-3}, {.stage = 2});
//   zero_policy policy(zero);
//   fit(policy, train_loader, test_loader, {.epochs = 8, .checkpoint = "run/model.ckpt"});
#pragma once

#include <cstddef>
#include <filesystem>
#include <type_traits>
#include <utility>

#include <partrain/comm/process_group.hpp>
#include <partrain/model/concepts.hpp>
#include <partrain/precision/grad_scaler.hpp>
#include <partrain/precision/mixed_precision.hpp>
#include <partrain/train/checkpoint.hpp>
#include <partrain/train/detail/sharded_scaler.hpp>
#include <partrain/train/sharded_checkpoint.hpp>
#include <partrain/train/trace.hpp>

namespace partrain::inline v0 {

struct zero_policy_options {
  grad_scaler* scaler = nullptr;    // mixed precision: amp_step (precision/sharded_amp.hpp) with it
  trace_recorder* trace = nullptr;  // one span per step ("zero_step": forward, backward, reduce, step, gather)
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

  // Collective: every rank writes its shard, rank 0 the index at `file`.
  void save_checkpoint(const std::filesystem::path& file, checkpoint_extra extra) {
    scaler_.save(extra);
    save_sharded_checkpoint(*zero_, file, extra);
  }
  checkpoint_extra load_checkpoint(const std::filesystem::path& file) {
    checkpoint_extra extra = load_sharded_checkpoint(*zero_, file);
    scaler_.load(extra);
    if constexpr (has_low_precision_copy<std::remove_cvref_t<decltype(zero_->module())>>) {
      zero_->module().refresh_low_precision();  // the 16-bit copy of the loaded masters
    }
    return extra;
  }

 private:
  Zero* zero_;
  zero_policy_options o_;
  detail::sharded_scaler scaler_{o_.scaler};
};

}  // namespace partrain::inline v0
