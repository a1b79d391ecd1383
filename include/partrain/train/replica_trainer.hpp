// partrain/train/replica_trainer.hpp: the training loop of a fault-tolerant data-parallel job, the
// loop every program would otherwise write around replica_group::step (as fit() is for the other
// modes). The data order is a function of the global step alone: epoch e's shuffled order
// (views::shuffled(n, seed), epoch e), cut into global batches of batch_size x slots, each shared
// out among the members present (replica_rows). So every example of every epoch is trained
// exactly once whoever is present, and in a fixed world with spares the result is bit-identical
// to a run without failures. The members count the rows and losses of each committed step in the
// step's own all-reduce; those counters move with the state a joining replica receives.
//
//   replica_trainer trainer(model, opt, train_set, {.batch_size = 64, .slots = 4, .epochs = 8});
//   replica_group rg(store, groups, trainer.state(), {.replica = r});
//   const bool finished = trainer.run(rg, [&](const replica_epoch& e) {
//     if (e.slot == 0) std::printf("epoch %zu: %llu rows, loss %.4f\n", e.epoch, e.trained, e.train_loss);
//   });
//   rg.finish();
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <partrain/comm/process_group.hpp>
#include <partrain/comm/reduce_op.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/data/batch.hpp>
#include <partrain/data/dataset.hpp>
#include <partrain/data/shuffled.hpp>
#include <partrain/model/concepts.hpp>
#include <partrain/optim/optimizer.hpp>
#include <partrain/parallel/replica_group.hpp>
#include <partrain/train/checkpoint.hpp>
#include <partrain/train/replica_state.hpp>

namespace partrain::inline v0 {

// An epoch that ended: what every member of the quorum that committed its last step reports.
struct replica_epoch {
  std::size_t epoch = 0;      // 1-based
  std::uint64_t trained = 0;  // rows the epoch's committed steps trained (all the examples: each once)
  double train_loss = 0;      // their mean loss
  int slot = 0;               // this replica's slot (slot 0 is where a program evaluates and prints)
};

struct replica_trainer_options {
  std::size_t batch_size = 0;  // rows per slot: a global batch is batch_size x slots
  std::size_t slots = 0;       // a fixed world's slots; a dynamic world's replicas
  std::size_t epochs = 1;
  std::uint64_t seed = 0;      // the shuffled order's
  std::size_t examples = 0;    // train on the dataset's first `examples` (0: all of it)
  // The learning rate of each global step (set through the optimizer's set_lr); empty: left as is.
  std::function<double(std::size_t step, std::size_t epoch)> lr{};
  // Called at every try of a step, before its compute (where a test or a program injects a fault).
  std::function<void(std::int64_t step)> before_step{};
};

template <class M, class O, class D>
  requires trainable_on<M, batch> && stateful_optimizer<O> && dataset<D>
class replica_trainer {
 public:
  // model, opt and train must outlive the trainer; the trainer must outlive the replica_group
  // built on its state().
  replica_trainer(M& model, O& opt, const D& train, replica_trainer_options o)
      : model_(model), opt_(opt), train_(train), o_(std::move(o)), n_(o_.examples ? o_.examples : train.size()),
        order_(n_, o_.seed) {
    auto bad = [](const std::string& what) { throw invalid_argument_error("replica_trainer: " + what); };
    if (train.size() == 0) bad("the training set is empty (expected at least one example)");
    if (n_ > train.size()) {
      bad("examples is " + std::to_string(n_) + " but the training set holds " + std::to_string(train.size()) +
          " (expected 0, all of them, or at most that many)");
    }
    if (o_.batch_size == 0) bad("batch_size is 0 (expected the rows of each slot, >= 1)");
    if (o_.slots == 0) bad("slots is 0 (expected the job's slots, or a dynamic job's replicas, >= 1)");
    if (o_.epochs == 0) bad("epochs is 0 (expected >= 1)");
    if constexpr (!requires { opt.set_lr(1.0); }) {
      if (o_.lr) bad("a learning-rate schedule was given, but the optimizer has no set_lr(double) to take it");
    }
    global_ = o_.batch_size * o_.slots;
    per_epoch_ = (n_ + global_ - 1) / global_;
  }
  replica_trainer(const replica_trainer&) = delete;
  replica_trainer& operator=(const replica_trainer&) = delete;

  // What replica_group sends a joining replica: the model, the optimizer, and this trainer's
  // counters of the epoch in progress (rows trained, loss sum), as a checkpoint's bytes.
  [[nodiscard]] replica_state_io state() { return replica_state_of(model_, opt_, &extra_); }

  [[nodiscard]] std::size_t steps_per_epoch() const noexcept { return per_epoch_; }
  [[nodiscard]] std::int64_t total_steps() const noexcept { return static_cast<std::int64_t>(per_epoch_ * o_.epochs); }

  // Runs rg's steps up to total_steps(); on_epoch(e) on every member at each epoch's end. Returns
  // true when this replica trained the job to its end, false when rg gave it up (it waited as a
  // spare, or the job finished without it): then its state is not the job's.
  bool run(replica_group& rg, const std::function<void(const replica_epoch&)>& on_epoch = {}) {
    while (rg.current_step() < total_steps()) {
      const bool more = rg.step([&](process_group& g, int slot, std::int64_t step) { compute(g, slot, step); },
                                [&] { apply(rg, on_epoch); });
      if (!more) return false;
    }
    return true;
  }

 private:
  // This slot's gradient of global step `step`, weighted by its share of the batch's rows and
  // summed over the group: the global batch's mean gradient, whoever is present.
  void compute(process_group& g, int slot, std::int64_t step) {
    if (o_.before_step) o_.before_step(step);
    const auto s = static_cast<std::size_t>(step);
    const std::size_t epoch = s / per_epoch_, first = (s % per_epoch_) * global_;
    const std::size_t n = std::min(global_, n_ - first);
    if constexpr (requires { opt_.set_lr(1.0); }) {
      if (o_.lr) opt_.set_lr(o_.lr(s, epoch));
    }
    if (order_.epoch() != epoch) order_.set_epoch(epoch);
    const replica_rows_range mine = replica_rows(n, slot, g.size());
    double loss = 0;
    if (mine.count == 0) {
      for (auto&& p : model_.parameters()) {
        auto gr = p.grad();
        std::fill(gr.begin(), gr.end(), 0.0f);
      }
    } else {
      rows_.resize(mine.count);
      for (std::size_t i = 0; i < mine.count; ++i) rows_[i] = order_.element(first + mine.first + i);
      const shape one = train_.example_shape();
      const std::size_t width = one.numel();
      features_.resize(mine.count * width);
      labels_.resize(mine.count);
      train_.fetch(rows_, tensor_view<float>(features_.data(), shape{mine.count, width}),
                   tensor_view<std::int32_t>(labels_.data(), mine.count));
      loss = model_.train_step(batch{tensor_view<const float>(features_.data(), shape{mine.count, width}),
                                     tensor_view<const std::int32_t>(labels_.data(), mine.count), rows_});
    }
    const float share = static_cast<float>(mine.count) / static_cast<float>(n);
    reduced_.clear();
    for (auto&& p : model_.parameters()) {
      for (const float v : p.grad()) reduced_.push_back(v * share);
    }
    // The step's loss sum and rows ride along in the same all-reduce.
    reduced_.push_back(static_cast<float>(loss * static_cast<double>(mine.count)));
    reduced_.push_back(static_cast<float>(mine.count));
    g.all_reduce(tensor_view<float>(reduced_), reduce_op::sum).wait();
    std::size_t at = 0;
    for (auto&& p : model_.parameters()) {
      auto gr = p.grad();
      std::copy_n(reduced_.begin() + static_cast<std::ptrdiff_t>(at), gr.size(), gr.begin());
      at += gr.size();
    }
    step_loss_ = reduced_[at];
    step_rows_ = reduced_[at + 1];
  }

  void apply(replica_group& rg, const std::function<void(const replica_epoch&)>& on_epoch) {
    opt_.step();
    extra_.sampler_position += static_cast<std::uint64_t>(step_rows_);
    double loss_sum = 0;
    if (extra_.user.size() == sizeof loss_sum) std::memcpy(&loss_sum, extra_.user.data(), sizeof loss_sum);
    loss_sum += step_loss_;
    extra_.user.resize(sizeof loss_sum);
    std::memcpy(extra_.user.data(), &loss_sum, sizeof loss_sum);
    const auto done = static_cast<std::size_t>(rg.current_step() + 1);  // the step just applied, counted
    if (done % per_epoch_ != 0) return;
    if (on_epoch) {
      on_epoch({.epoch = done / per_epoch_,
                .trained = extra_.sampler_position,
                .train_loss = loss_sum / static_cast<double>(std::max<std::uint64_t>(1, extra_.sampler_position)),
                .slot = rg.slot()});
    }
    extra_.sampler_position = 0;  // every member starts the next epoch's count
    extra_.user.clear();
  }

  M& model_;
  O& opt_;
  const D& train_;
  replica_trainer_options o_;
  std::size_t n_;  // the examples trained each epoch
  shuffled_view order_;
  std::size_t global_ = 0, per_epoch_ = 0;
  checkpoint_extra extra_;  // sampler_position: this epoch's trained rows; user: their loss sum
  std::vector<std::size_t> rows_;
  std::vector<float> features_, reduced_;
  std::vector<std::int32_t> labels_;
  double step_loss_ = 0, step_rows_ = 0;
};

}  // namespace partrain::inline v0
