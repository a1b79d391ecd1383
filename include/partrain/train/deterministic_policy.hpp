// partrain/train/deterministic_policy.hpp: deterministic_data_parallel (parallel/deterministic.hpp)
// and its optimizer as a training policy, so fit() trains with results that do not depend on the
// world size. Every rank takes the whole global batch (a loader that is not sharded, the same
// seed on every rank); the test set is sharded as for DDP. Checkpoints as DDP's: the ranks hold
// the same model and optimizer state, rank 0 writes it.
//
//   deterministic_data_parallel ddp(model, group, {.shards = 4});
//   deterministic_policy policy(ddp, opt);
//   fit(policy, whole_batches, test_shard, {.epochs = 8});
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <utility>

#include <partrain/comm/process_group.hpp>
#include <partrain/parallel/deterministic.hpp>
#include <partrain/parallel/deterministic_sharded.hpp>
#include <partrain/train/checkpoint.hpp>
#include <partrain/train/detail/shard_state_slot.hpp>

namespace partrain::inline v0 {

template <class Det, class Opt>
class deterministic_policy {
 public:
  deterministic_policy(Det& det, Opt& opt) : det_(&det), opt_(&opt) {}

  template <class B>
  double train_step(const B& b) {
    const double loss = det_->train_step(b);
    opt_->step();
    return loss;
  }
  // Gradient accumulation (fit's gradient_accumulation_steps, which it passes here): every shard
  // of the step's micro-batches in one exact sum, the same bits as one call on the whole batch.
  template <class B>
  double accumulate_step(const B& b) {
    return det_->accumulate_step(b);
  }
  void set_gradient_accumulation_steps(std::size_t a) { det_->set_gradient_accumulation_steps(a); }
  template <class R>
  eval_result evaluate(R&& batches) {
    return det_->evaluate(std::forward<R>(batches));
  }
  void set_lr(double lr) { opt_->set_lr(lr); }
  process_group& group() { return det_->comm(); }
  // Every rank's loss is the whole batch's: averaging them changes nothing.
  process_group& loss_group() { return det_->comm(); }
  // One copy of the data per step, however many ranks compute its shards.
  [[nodiscard]] int replicas() { return 1; }
  auto parameters() { return det_->module().parameters(); }

  void save_checkpoint(const std::filesystem::path& file, const checkpoint_extra& extra) {
    if (group().rank() == 0 && file.has_parent_path()) std::filesystem::create_directories(file.parent_path());
    partrain::save_checkpoint(group(), file, det_->module(), *opt_, extra);
  }
  checkpoint_extra load_checkpoint(const std::filesystem::path& file) {
    return partrain::load_checkpoint(file, det_->module(), *opt_);
  }

 private:
  Det* det_;
  Opt* opt_;
};

// deterministic_sharded_data_parallel (parallel/deterministic_sharded.hpp) as a training policy:
// its step includes the optimizer's (each rank its slice). Checkpoints: rank 0 writes the model
// and the whole optimizer state (every rank's slice gathered first), so a run resumes at another
// world size, each rank taking its new slice.
template <class Det>
class deterministic_sharded_policy {
 public:
  explicit deterministic_sharded_policy(Det& det) : det_(&det) {}

  template <class B>
  double train_step(const B& b) {
    return det_->train_step(b);
  }
  template <class B>
  double accumulate_step(const B& b) {
    return det_->accumulate_step(b);
  }
  void set_gradient_accumulation_steps(std::size_t a) { det_->set_gradient_accumulation_steps(a); }
  template <class R>
  eval_result evaluate(R&& batches) {
    return det_->evaluate(std::forward<R>(batches));
  }
  void set_lr(double lr) { det_->set_lr(lr); }
  process_group& group() { return det_->comm(); }
  process_group& loss_group() { return det_->comm(); }
  [[nodiscard]] int replicas() { return 1; }
  auto parameters() { return det_->module().parameters(); }

  void save_checkpoint(const std::filesystem::path& file, const checkpoint_extra& extra) {
    auto whole = det_->gather_state();  // collective
    if (group().rank() == 0 && file.has_parent_path()) std::filesystem::create_directories(file.parent_path());
    partrain::save_checkpoint(group(), file, det_->module(), detail::ckpt::shard_state_slot{&whole, "deterministic ZeRO-1"}, extra);
  }
  checkpoint_extra load_checkpoint(const std::filesystem::path& file) {
    shard_optimizer_state<float> whole;
    detail::ckpt::shard_state_slot slot{&whole, "deterministic ZeRO-1"};
    const checkpoint_extra extra = partrain::load_checkpoint(file, det_->module(), slot);
    det_->load_state(whole, "checkpoint '" + file.string() + "'");
    return extra;
  }

 private:
  Det* det_;
};

}  // namespace partrain::inline v0
