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

#include <filesystem>
#include <utility>

#include <partrain/comm/process_group.hpp>
#include <partrain/parallel/deterministic.hpp>
#include <partrain/train/checkpoint.hpp>

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

}  // namespace partrain::inline v0
