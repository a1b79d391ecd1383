// partrain/train/local_sgd_policy.hpp: post-local SGD and (streaming) DiLoCo as training
// policies, so fit() (train/trainer.hpp) drives them like DDP:
//
//   post_local_sgd lsgd(model, opt, group, {.period = 8, .warmup_steps = 100});
//   local_sgd_policy policy(lsgd);             // or: diloco dl(...); local_sgd_policy policy(dl);
//   fit(policy, train_loader, test_loader, {.checkpoint = "run/model.ckpt", ...});
//
// The learning-rate schedule sets the inner optimizer's lr (DiLoCo's outer lr stays fixed, as in
// the paper). Evaluation sums each rank's current model over its batches. Checkpoints are rank
// checkpoints (train/rank_checkpoint.hpp): between syncs every rank holds other parameters and
// optimizer state, so each rank's parameters and the algorithm's whole state (position in the
// period or round, inner and outer optimizer state) are saved, and a resumed run continues bit
// for bit as the uninterrupted one.
#pragma once

#include <concepts>
#include <cstdint>
#include <filesystem>
#include <type_traits>
#include <utility>

#include <partrain/comm/process_group.hpp>
#include <partrain/model/concepts.hpp>
#include <partrain/parallel/diloco.hpp>
#include <partrain/parallel/local_sgd.hpp>
#include <partrain/parallel/streaming_diloco.hpp>
#include <partrain/train/checkpoint.hpp>
#include <partrain/train/rank_checkpoint.hpp>

namespace partrain::inline v0 {

template <class Algo>
class local_sgd_policy {
  static_assert(std::derived_from<std::remove_cvref_t<decltype(std::declval<Algo&>().comm())>, process_group>,
                "partrain: local_sgd_policy needs the algorithm's communicator to be a process_group (fit's group())");

 public:
  explicit local_sgd_policy(Algo& a) noexcept : a_(&a) {}

  template <class B>
  double train_step(const B& b) {
    return a_->train_step(b);
  }
  template <class R>
  eval_result evaluate(R&& batches) {
    return a_->evaluate(std::forward<R>(batches));
  }
  void set_lr(double lr) { a_->optimizer().set_lr(lr); }
  process_group& group() { return a_->comm(); }
  process_group& loss_group() { return a_->comm(); }  // every rank's loss is of its own batch
  [[nodiscard]] int replicas() { return a_->comm().size(); }
  auto parameters() { return a_->module().parameters(); }
  [[nodiscard]] Algo& algorithm() noexcept { return *a_; }
  // What this rank sent (ring-algorithm bytes): the job's group, plus the host's when
  // hierarchical (fit's metrics record it).
  [[nodiscard]] std::uint64_t bytes_sent() {
    std::uint64_t b = a_->comm().traffic().bytes_sent;
    if constexpr (requires { a_->intra_host(); }) {
      if (auto* h = a_->intra_host()) b += h->traffic().bytes_sent;
    }
    return b;
  }

  // Collective. Every rank's parameters and the algorithm's state, one section per rank.
  void save_checkpoint(const std::filesystem::path& file, const checkpoint_extra& extra) {
    save_rank_checkpoint(a_->comm(), file, a_->module(), *a_, extra);
  }
  checkpoint_extra load_checkpoint(const std::filesystem::path& file) {
    return load_rank_checkpoint(a_->comm(), file, a_->module(), *a_);
  }

 private:
  Algo* a_;
};

}  // namespace partrain::inline v0
