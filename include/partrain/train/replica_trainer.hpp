// partrain/train/replica_trainer.hpp: the training loop of a fault-tolerant data-parallel job, the
// loop every program would otherwise write around replica_group::step (as fit() is for the other
// modes). The data order is a function of the global step alone: epoch e's shuffled order
// (views::shuffled(n, seed), epoch e), cut into global batches of batch_size x slots, each shared
// out among the members present (replica_rows). So every example of every epoch is trained
// exactly once whoever is present, and in a fixed world with spares the result is bit-identical
// to a run without failures. The members count the rows and losses of each committed step in the
// step's own all-reduce; those counters move with the state a joining replica receives.
//
// Local SGD and DiLoCo (sync_every = H > 1): a replica_group step is a round of H global batches,
// in which each slot steps alone on its rows of each batch; the round ends in one all-reduce of
// the parameters, weighted by the rows each slot trained (local SGD takes the average; DiLoCo's
// outer SGD steps on the round's start minus it). A failed round is rolled back to its start
// (torchft's backup of the parameters) and run again. The slots' inner optimizer states, which
// differ, are all-gathered at every round's end and kept by every member, so a spare that takes
// a lost slot resumes with that slot's own state and the result stays bit-identical.
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
#include <optional>
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
#include <partrain/optim/sgd.hpp>
#include <partrain/optim/state_io.hpp>
#include <partrain/parallel/diloco.hpp>
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
  // The learning rate of each global batch (set through the optimizer's set_lr; with sync_every > 1,
  // the inner optimizer's at each of its steps); empty: left as is.
  std::function<double(std::size_t step, std::size_t epoch)> lr{};
  // Called at every try of a step, before its compute (where a test or a program injects a fault).
  std::function<void(std::int64_t step)> before_step{};
  // Local SGD / DiLoCo: global batches per round (H), each slot stepping alone on its rows; the
  // round ends in a weighted average of the parameters. 1: the gradients are summed every batch.
  // A round never spans two epochs (an epoch's last round may be shorter).
  std::size_t sync_every = 1;
  // DiLoCo (needs sync_every > 1): the round's start minus the average is the outer gradient of
  // this SGD (torch.optim.SGD's rule; DiLoCo's is lr 0.7, momentum 0.9, Nesterov). Empty: the
  // parameters take the average (local SGD).
  std::optional<sgd_options> outer{};
};

template <class M, class O, class D>
  requires trainable_on<M, batch> && stateful_optimizer<O> && dataset<D>
class replica_trainer {
  using outer_model = detail::diloco::outer_model<float>;

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
    if (o_.sync_every == 0) bad("sync_every is 0 (expected the global batches per round, >= 1; 1: every batch)");
    if (o_.outer && o_.sync_every == 1) {
      bad("an outer optimizer (DiLoCo) was given with sync_every 1 (expected sync_every > 1: the rounds of local "
          "steps whose average it steps on)");
    }
    if constexpr (!requires { opt.set_lr(1.0); }) {
      if (o_.lr) bad("a learning-rate schedule was given, but the optimizer has no set_lr(double) to take it");
    }
    global_ = o_.batch_size * o_.slots;
    batches_ = (n_ + global_ - 1) / global_;
    rounds_ = (batches_ + o_.sync_every - 1) / o_.sync_every;
    if (local()) {
      for (auto&& p : model_.parameters()) committed_.resize(committed_.size() + p.value().size());
      keep_values();
      state_writer w;
      opt_.save_state(w);
      initial_inner_ = w.release();
      if (o_.outer) {
        std::vector<tensor_view<float>> values;
        for (auto&& p : model_.parameters()) values.push_back(p.value());
        outer_model_ = detail::diloco::outer_model_over(values, delta_);
        outer_.emplace(outer_model_, *o_.outer);
      }
    }
  }
  replica_trainer(const replica_trainer&) = delete;
  replica_trainer& operator=(const replica_trainer&) = delete;

  // What replica_group sends a joining replica, as a checkpoint's bytes: the model and the
  // optimizer, this trainer's counters of the epoch in progress (rows trained, loss sum) and, in
  // rounds, the outer optimizer's state and every slot's inner optimizer state, all as committed.
  // replica_state_of's bytes, with this trainer's part in their extra.
  [[nodiscard]] replica_state_io state() {
    replica_state_io io = replica_state_of(model_, opt_, &extra_);
    return {.save =
                [this, save = std::move(io.save)] {
                  roll_back();  // a failed round's local steps are not the job's state
                  extra_ = {};
                  extra_.sampler_position = epoch_rows_;
                  extra_.user = pack();
                  return save();
                },
            .load =
                [this, load = std::move(io.load)](std::span<const std::byte> bytes) {
                  load(bytes);
                  epoch_rows_ = extra_.sampler_position;
                  unpack(extra_.user);
                  if (local()) {
                    keep_values();
                    dirty_ = false;
                    holder_ = -1;  // the optimizer holds the sender's slot's state: the next round loads this slot's
                  }
                }};
  }

  // replica_group steps per epoch: global batches, or rounds of sync_every of them.
  [[nodiscard]] std::size_t steps_per_epoch() const noexcept { return rounds_; }
  [[nodiscard]] std::size_t batches_per_epoch() const noexcept { return batches_; }
  [[nodiscard]] std::int64_t total_steps() const noexcept { return static_cast<std::int64_t>(rounds_ * o_.epochs); }

  // Runs rg's steps up to total_steps(); on_epoch(e) on every member at each epoch's end. Returns
  // true when this replica trained the job to its end, false when rg gave it up (it waited as a
  // spare, or the job finished without it): then its state is not the job's.
  bool run(replica_group& rg, const std::function<void(const replica_epoch&)>& on_epoch = {}) {
    while (rg.current_step() < total_steps()) {
      const bool more = rg.step(
          [&](process_group& g, int slot, std::int64_t step) {
            if (o_.before_step) o_.before_step(step);
            if (local()) {
              compute_round(g, slot, step);
            } else {
              compute(g, slot, step);
            }
          },
          [&] { apply(rg, on_epoch); });
      if (!more) return false;
    }
    return true;
  }

 private:
  [[nodiscard]] bool local() const noexcept { return o_.sync_every > 1; }

  // Global batch b (of the epoch's batches_): its first row in the epoch's order and its rows.
  struct global_batch {
    std::size_t epoch = 0, index = 0, first = 0, rows = 0;
  };
  [[nodiscard]] global_batch batch_at(std::size_t epoch, std::size_t b) const noexcept {
    const std::size_t first = b * global_;
    return {epoch, epoch * batches_ + b, first, std::min(global_, n_ - first)};
  }

  // The rows `mine` of global batch gb through the model's train_step (returns their mean loss);
  // the gradients are zeroed when there are none.
  double train_rows(const global_batch& gb, replica_rows_range mine) {
    if constexpr (requires { opt_.set_lr(1.0); }) {
      if (o_.lr) opt_.set_lr(o_.lr(gb.index, gb.epoch));
    }
    if (mine.count == 0) {
      for (auto&& p : model_.parameters()) {
        auto gr = p.grad();
        std::fill(gr.begin(), gr.end(), 0.0f);
      }
      return 0;
    }
    if (order_.epoch() != gb.epoch) order_.set_epoch(gb.epoch);
    rows_.resize(mine.count);
    for (std::size_t i = 0; i < mine.count; ++i) rows_[i] = order_.element(gb.first + mine.first + i);
    const shape one = train_.example_shape();
    const std::size_t width = one.numel();
    features_.resize(mine.count * width);
    labels_.resize(mine.count);
    train_.fetch(rows_, tensor_view<float>(features_.data(), shape{mine.count, width}),
                 tensor_view<std::int32_t>(labels_.data(), mine.count));
    return model_.train_step(batch{tensor_view<const float>(features_.data(), shape{mine.count, width}),
                                   tensor_view<const std::int32_t>(labels_.data(), mine.count), rows_});
  }

  // Copies every parameter's values (or gradients) times `scale` into reduced_, then the step's loss
  // sum and rows, which ride along in the same all-reduce.
  template <class Get>
  void gather_scaled(Get get, float scale, double loss_sum, std::size_t rows) {
    std::size_t n = 0;
    for (auto&& p : model_.parameters()) n += get(p).size();
    reduced_.resize(n + 2);
    auto out = reduced_.begin();
    for (auto&& p : model_.parameters()) {
      const auto t = get(p);
      out = std::transform(t.begin(), t.end(), out, [scale](float v) { return v * scale; });  // vectorized, unlike push_back
    }
    reduced_[n] = static_cast<float>(loss_sum);
    reduced_[n + 1] = static_cast<float>(rows);
  }
  // The all-reduced values back into every parameter's values (or gradients); the loss and rows.
  template <class Get>
  void scatter_reduced(Get get) {
    std::size_t at = 0;
    for (auto&& p : model_.parameters()) {
      auto t = get(p);
      std::copy_n(reduced_.begin() + static_cast<std::ptrdiff_t>(at), t.size(), t.begin());
      at += t.size();
    }
    step_loss_ = reduced_[at];
    step_rows_ = reduced_[at + 1];
  }
  static constexpr auto grads = [](auto&& p) { return p.grad(); };
  static constexpr auto values = [](auto&& p) { return p.value(); };

  // This slot's gradient of global batch `step`, weighted by its share of the batch's rows and
  // summed over the group: the global batch's mean gradient, whoever is present.
  void compute(process_group& g, int slot, std::int64_t step) {
    const auto s = static_cast<std::size_t>(step);
    const global_batch gb = batch_at(s / batches_, s % batches_);
    const replica_rows_range mine = replica_rows(gb.rows, slot, g.size());
    const double loss = train_rows(gb, mine);
    gather_scaled(grads, static_cast<float>(mine.count) / static_cast<float>(gb.rows),
                  loss * static_cast<double>(mine.count), mine.count);
    g.all_reduce(tensor_view<float>(reduced_), reduce_op::sum).wait();
    scatter_reduced(grads);
  }

  // Round `step`: from the committed parameters and this slot's inner optimizer state, a step of
  // the inner optimizer on this slot's rows of each of the round's global batches; then the
  // parameters averaged, weighted by the rows each slot trained, and every slot's inner state
  // gathered. The parameters stay local until apply() (a failed round is rolled back).
  void compute_round(process_group& g, int slot, std::int64_t step) {
    roll_back();
    if (holder_ != slot) {
      const auto& inner = inner_.empty() ? initial_inner_ : inner_[static_cast<std::size_t>(slot) % inner_.size()];
      state_reader r(inner, "slot " + std::to_string(slot) + "'s inner optimizer state");
      opt_.load_state(r);
      holder_ = slot;
    }
    const auto s = static_cast<std::size_t>(step);
    const std::size_t epoch = s / rounds_, first = (s % rounds_) * o_.sync_every;
    const std::size_t last = std::min(first + o_.sync_every, batches_);
    double loss_sum = 0;
    std::size_t mine_rows = 0, round_rows = 0;
    dirty_ = true;
    for (std::size_t b = first; b < last; ++b) {
      const global_batch gb = batch_at(epoch, b);
      const replica_rows_range mine = replica_rows(gb.rows, slot, g.size());
      round_rows += gb.rows;
      if (mine.count == 0) continue;  // no rows of this batch: no step (its weight below counts none)
      loss_sum += train_rows(gb, mine) * static_cast<double>(mine.count);
      opt_.step();
      mine_rows += mine.count;
    }
    gather_scaled(values, static_cast<float>(mine_rows) / static_cast<float>(round_rows), loss_sum, mine_rows);
    g.all_reduce(tensor_view<float>(reduced_), reduce_op::sum).wait();
    gather_inner(g);
  }

  // Every slot's inner optimizer state after the round, on every member (sizes, then the bytes
  // padded to the largest).
  void gather_inner(process_group& g) {
    state_writer w;
    opt_.save_state(w);
    const std::vector<std::byte> mine = w.release();
    const auto members = static_cast<std::size_t>(g.size());
    std::int64_t size = static_cast<std::int64_t>(mine.size());
    std::vector<std::int64_t> sizes(members);
    g.all_gather(tensor_view<const std::int64_t>(&size, 1), tensor_view<std::int64_t>(sizes)).wait();
    const auto widest = static_cast<std::size_t>(*std::ranges::max_element(sizes));
    std::vector<std::uint8_t> padded(widest), all(widest * members);
    if (widest > 0) {  // an optimizer without state (plain SGD) has nothing to send
      std::memcpy(padded.data(), mine.data(), mine.size());
      g.all_gather(tensor_view<const std::uint8_t>(padded), tensor_view<std::uint8_t>(all)).wait();
    }
    gathered_.resize(members);
    for (std::size_t k = 0; k < members; ++k) {
      const auto* from = reinterpret_cast<const std::byte*>(all.data() + k * widest);
      gathered_[k].assign(from, from + sizes[k]);
    }
  }

  // The parameters' values into committed_, and back.
  void keep_values() {
    std::size_t at = 0;
    for (auto&& p : model_.parameters()) {
      const auto v = p.value();
      std::copy(v.begin(), v.end(), committed_.begin() + static_cast<std::ptrdiff_t>(at));
      at += v.size();
    }
  }
  void restore_values() {
    std::size_t at = 0;
    for (auto&& p : model_.parameters()) {
      auto v = p.value();
      std::copy_n(committed_.begin() + static_cast<std::ptrdiff_t>(at), v.size(), v.begin());
      at += v.size();
    }
  }

  // Back to the last committed round's parameters when a round's local steps changed them.
  void roll_back() {
    if (!dirty_) return;
    restore_values();
    dirty_ = false;
    holder_ = -1;  // the optimizer stepped too
  }

  // A round commits: local SGD takes the average; DiLoCo steps its outer SGD on start - average.
  void commit_round() {
    if (!o_.outer) {
      scatter_reduced(values);
    } else {
      const std::size_t n = committed_.size();  // reduced_: the average, then the loss sum and rows
      for (std::size_t i = 0; i < n; ++i) delta_[i] = committed_[i] - reduced_[i];  // old minus new
      step_loss_ = reduced_[n];
      step_rows_ = reduced_[n + 1];
      restore_values();
      outer_->step();
    }
    keep_values();
    inner_.swap(gathered_);
    dirty_ = false;  // holder_ stays: the optimizer holds this slot's state, as gathered
  }

  void apply(replica_group& rg, const std::function<void(const replica_epoch&)>& on_epoch) {
    if (local()) {
      commit_round();
    } else {
      opt_.step();
    }
    epoch_rows_ += static_cast<std::uint64_t>(step_rows_);
    epoch_loss_ += step_loss_;
    const auto done = static_cast<std::size_t>(rg.current_step() + 1);  // the step just applied, counted
    if (done % rounds_ != 0) return;
    if (on_epoch) {
      on_epoch({.epoch = done / rounds_,
                .trained = epoch_rows_,
                .train_loss = epoch_loss_ / static_cast<double>(std::max<std::uint64_t>(1, epoch_rows_)),
                .slot = rg.slot()});
    }
    epoch_rows_ = 0;  // every member starts the next epoch's count
    epoch_loss_ = 0;
  }

  // The epoch's loss sum and, in rounds, the outer optimizer's state and every slot's inner one.
  [[nodiscard]] std::vector<std::byte> pack() const {
    state_writer w;
    w.put(epoch_loss_);
    if (local()) {
      state_writer ow;
      if (outer_) outer_->save_state(ow);
      w.put_bytes(ow.bytes());
      w.put(static_cast<std::uint64_t>(inner_.size()));
      for (const auto& b : inner_) w.put_bytes(b);
    }
    return w.release();
  }
  void unpack(std::span<const std::byte> user) {
    state_reader r(user, "a healthy replica's trainer state");
    epoch_loss_ = r.get<double>("the epoch's loss sum");
    if (!local()) return;
    const auto outer = r.get_bytes("the outer optimizer's state");
    if (outer_) {
      state_reader orr(outer, "a healthy replica's outer optimizer state");
      outer_->load_state(orr);
    }
    inner_.resize(r.get<std::uint64_t>("the slots' inner optimizer states"));
    for (auto& b : inner_) {
      const auto bytes = r.get_bytes("a slot's inner optimizer state");
      b.assign(bytes.begin(), bytes.end());
    }
  }

  M& model_;
  O& opt_;
  const D& train_;
  replica_trainer_options o_;
  std::size_t n_;  // the examples trained each epoch
  shuffled_view order_;
  std::size_t global_ = 0, batches_ = 0, rounds_ = 0;
  std::uint64_t epoch_rows_ = 0;  // the epoch's committed steps: rows trained, and their loss sum
  double epoch_loss_ = 0;
  checkpoint_extra extra_;  // those counters and pack()'s bytes, as a joiner's state carries them
  std::vector<std::size_t> rows_;
  std::vector<float> features_, reduced_;
  std::vector<std::int32_t> labels_;
  double step_loss_ = 0, step_rows_ = 0;
  // Rounds (sync_every > 1): the committed parameters, every slot's inner optimizer state as
  // committed (and as gathered by a round not yet committed), the optimizer's state at the start.
  std::vector<float> committed_, delta_;
  std::vector<std::vector<std::byte>> inner_, gathered_;
  std::vector<std::byte> initial_inner_;
  int holder_ = -1;     // the slot whose committed inner state the optimizer holds (-1: none)
  bool dirty_ = false;  // the parameters and optimizer moved since the last commit
  outer_model outer_model_;
  std::optional<sgd<outer_model>> outer_;
};

}  // namespace partrain::inline v0
