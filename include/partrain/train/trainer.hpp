// partrain/train/trainer.hpp: the training loop every program would otherwise write again. For
// any training_policy (train/policies.hpp) it runs the epochs: learning rate from a schedule,
// training steps (the loop written as ranges, as a coroutine or as a plain for), evaluation,
// checkpoint save and resume (the grad scaler's state included), metrics (with the bytes rank 0
// sent), the progress line and trace spans; rank 0 prints one line per epoch.
//
//   ddp_policy policy(ddp, opt);
//   const train_result r = fit(policy, train_loader, test_loader,
//                              {.epochs = 8, .lr = cosine_lr{.base = 0.05, .epochs = 8},
//                               .checkpoint = "run/model.ckpt", .metrics = "run/metrics.jsonl"});
//
// Resuming from a checkpoint of a run that already finished (its epoch = epochs) trains nothing
// and reports the saved results.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iterator>
#include <system_error>
#include <functional>
#include <iostream>
#include <optional>
#include <ostream>
#include <ranges>
#include <span>
#include <string>
#include <vector>

#include <partrain/comm/process_group.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/generator.hpp>
#include <partrain/core/task.hpp>
#include <partrain/core/work.hpp>
#include <partrain/optim/clip.hpp>
#include <partrain/optim/state_io.hpp>
#include <partrain/parallel/detail/host_staging.hpp>
#include <partrain/train/checkpoint.hpp>
#include <partrain/train/detail/atomic_file.hpp>
#include <partrain/train/epochs.hpp>
#include <partrain/train/every.hpp>
#include <partrain/train/metrics.hpp>
#include <partrain/train/policies.hpp>
#include <partrain/train/progress.hpp>
#include <partrain/train/steps.hpp>
#include <partrain/train/trace.hpp>

namespace partrain::inline v0 {

// Three spellings of the same epoch; they give the same numbers.
enum class loop_style {
  ranges,     // batches | views::steps | views::every
  coroutine,  // each step's loss all_reduced while the next step trains, co_awaited one step later
  plain,      // a for-loop
};

struct trainer_options {
  std::size_t epochs = 1;
  std::function<double(std::size_t epoch)> lr{};  // before each epoch (train/lr_schedule.hpp); empty: untouched
  std::filesystem::path checkpoint{};             // saved after every epoch; resumed from when it exists
  std::filesystem::path metrics{};                // JSON lines: step records every log_every steps, epoch records
  std::size_t log_every = 0;                      // progress line and step records (0: off)
  loop_style loop = loop_style::ranges;
  trace_recorder* trace = nullptr;                // spans step, data_wait, evaluate, checkpoint; started and
                                                  // merged (rank 0 writes the file) by fit
  std::ostream* out = &std::cout;                 // rank 0's epoch lines (null: silent)
  int terminal_fd = STDOUT_FILENO;                // the progress line redraws in place on a terminal
  std::function<void(std::size_t global_step)> before_step{};  // e.g. fault injection, profiling
  // Before every optimizer step, by global step (warmup_cosine_lr in train/lr_schedule.hpp);
  // instead of the per-epoch lr, not with it.
  std::function<double(std::size_t global_step)> step_lr{};
  // Loader batches (micro-batches) per optimizer step: the first N - 1 of each step train inside
  // the mode's no_sync, the last reduces and steps, as one batch N times larger would (the last
  // step of an epoch takes what is left). ddp_policy, zero_policy, fsdp_policy and pipeline_policy.
  std::size_t gradient_accumulation_steps = 1;
  // > 0: the global gradient norm (over every rank's gradients or shards) clipped to this before
  // each step (torch.nn.utils.clip_grad_norm_). ddp_policy, zero_policy, fsdp_policy, pipeline_policy.
  double max_grad_norm = 0;
};

struct train_result {
  double train_loss = 0;     // the last epoch's, averaged over every step of every rank
  double test_loss = 0;
  double test_accuracy = 0;
  std::size_t epochs = 0;    // finished, counting those of the run resumed from
  std::size_t steps = 0;     // global steps
  std::size_t first_epoch = 0;  // where this call started (> 0 when resumed)
  bool resumed_finished = false;  // the checkpoint was already at `epochs`: nothing trained
};

namespace detail::trainer {

struct epoch_sums {
  double loss_sum = 0;       // over all ranks' steps (after reduce)
  double steps = 0;          // steps counted in loss_sum
  std::size_t samples = 0;   // this rank's
};

// The record kept in checkpoint_extra::trainer_state: the last epoch's results and the bytes
// rank 0 had sent (so a resumed run's metrics count on from there).
inline std::vector<std::byte> encode(const train_result& r, std::uint64_t bytes_sent) {
  state_writer w;
  w.put(r.train_loss);
  w.put(r.test_loss);
  w.put(r.test_accuracy);
  w.put(bytes_sent);
  return w.release();
}
// Returns the bytes sent before the checkpoint (0 for a checkpoint written before they were kept).
inline std::uint64_t decode(std::span<const std::byte> bytes, train_result& r) {
  if (bytes.empty()) return 0;  // a checkpoint written without the trainer
  state_reader rd(bytes);
  r.train_loss = rd.get<double>("train loss");
  r.test_loss = rd.get<double>("test loss");
  r.test_accuracy = rd.get<double>("test accuracy");
  return rd.remaining() >= sizeof(std::uint64_t) ? rd.get<std::uint64_t>("bytes sent") : 0;
}

// fit's data must hold something: a training source that gives this rank no batch would train
// nothing and report an untrained model's accuracy; a test set with no sample, an accuracy of 0.
inline void check_train_source(std::size_t batches, int rank) {
  if (batches == 0) {
    throw data_error("fit: the training data gives rank " + std::to_string(rank) +
                     " no batches (an empty training set, or fewer samples than ranks, or than one batch with "
                     "drop_last); expected at least one batch per rank");
  }
}
inline data_error empty_test_error() {
  return data_error("fit: the test data holds no samples (an empty test set); expected at least one sample to "
                    "evaluate on");
}

inline void check_outputs(const trainer_options& o);

inline void check(const trainer_options& o) {
  if (o.epochs == 0) throw invalid_argument_error("fit: epochs must be at least 1, got 0");
  if (o.gradient_accumulation_steps == 0) {
    throw invalid_argument_error("fit: gradient_accumulation_steps must be at least 1 (micro-batches per step), got 0");
  }
  optim::check_max_grad_norm(o.max_grad_norm, "fit: max_grad_norm");
  if (o.lr && o.step_lr) {
    throw invalid_argument_error("fit: both lr (per epoch) and step_lr (per step) are set; set one schedule");
  }
  check_outputs(o);
}

// The user's outputs must be files of their own: a metrics path that names a folder used to be
// removed and replaced by the file, and two outputs on one path overwrote each other.
inline void check_outputs(const trainer_options& o) {
  namespace fs = std::filesystem;
  if (!o.metrics.empty()) {
    std::error_code ec;
    const auto st = fs::status(o.metrics, ec);
    if (!ec && fs::exists(st) && !fs::is_regular_file(st)) {
      throw config_error("fit: the metrics path '" + o.metrics.string() + "' is " +
                         (fs::is_directory(st) ? "a folder" : "not a regular file (a FIFO, device or socket)") +
                         "; expected a file name (a fresh run replaces the file, a resumed one appends to it)");
    }
  }
  const auto same = [](const fs::path& a, const fs::path& b) {
    std::error_code ea, eb;
    const auto ca = fs::weakly_canonical(a, ea), cb = fs::weakly_canonical(b, eb);
    return !ea && !eb && ca == cb;
  };
  const fs::path trace = o.trace && o.trace->enabled() ? o.trace->path() : fs::path();
  const std::pair<const char*, const fs::path*> outputs[] = {
      {"metrics", &o.metrics}, {"checkpoint", &o.checkpoint}, {"trace", &trace}};
  for (std::size_t i = 0; i < std::size(outputs); ++i) {
    for (std::size_t j = i + 1; j < std::size(outputs); ++j) {
      if (!outputs[i].second->empty() && !outputs[j].second->empty() && same(*outputs[i].second, *outputs[j].second)) {
        throw config_error(std::string("fit: the ") + outputs[i].first + " and the " + outputs[j].first +
                           " are the same file '" + outputs[i].second->string() +
                           "' (each would overwrite the other); give each its own path");
      }
    }
  }
}

}  // namespace detail::trainer

template <class Policy, class Train, class Test>
class trainer {
  using batch_type = std::ranges::range_value_t<Train>;
  static constexpr bool accumulates = requires(Policy& p, const batch_type& b) {
    { p.accumulate_step(b) } -> std::convertible_to<double>;
  };

 public:
  trainer(Policy& policy, Train& train, Test& test, trainer_options o)
      : p_(policy), train_(train), test_(test), o_(std::move(o)), leader_(policy.group().rank() == 0),
        prog_(leader_ ? 0 : 1, {.out = o_.out ? o_.out : &std::cout,
                                .terminal_fd = o_.terminal_fd,
                                .epochs = static_cast<std::int64_t>(o_.epochs),
                                .steps_per_epoch = static_cast<std::int64_t>(
                                    (train.size() + o.gradient_accumulation_steps - 1) /
                                    std::max<std::size_t>(1, o.gradient_accumulation_steps)),
                                .world_size = policy.replicas(),
                                .plain_every_steps = static_cast<std::int64_t>(o_.log_every)}) {
    detail::trainer::check(o_);
    detail::trainer::check_train_source(train_.size(), policy.group().rank());
    // A test set may be empty on one rank (a shard of fewer samples than ranks) and not on the
    // others; alone, an empty one is refused now, else when the first evaluation counts none.
    if constexpr (std::ranges::sized_range<Test>) {
      if (std::ranges::size(test_) == 0 && policy.group().size() == 1) throw detail::trainer::empty_test_error();
    }
    if (o_.max_grad_norm > 0) {
      if constexpr (requires(double v) { p_.set_max_grad_norm(v); }) {
        p_.set_max_grad_norm(o_.max_grad_norm);
      } else {
        throw config_error("fit: max_grad_norm needs a policy that clips over every rank's gradients; supported: "
                           "ddp_policy, zero_policy, fsdp_policy, pipeline_policy");
      }
    }
    if constexpr (!accumulates) {
      if (o_.gradient_accumulation_steps > 1) {
        throw config_error("fit: gradient_accumulation_steps = " + std::to_string(o_.gradient_accumulation_steps) +
                           " needs a policy with accumulate_step; supported: ddp_policy, zero_policy, fsdp_policy, "
                           "pipeline_policy, deterministic_policy, deterministic_sharded_policy");
      }
    }
    // A policy that cuts its micro-batches by the count (the deterministic ones) is told it.
    if constexpr (requires(std::size_t a) { p_.set_gradient_accumulation_steps(a); }) {
      p_.set_gradient_accumulation_steps(std::max<std::size_t>(1, o_.gradient_accumulation_steps));
    }
  }

  train_result run() {
    train_result result;
    resume(result);
    if (result.resumed_finished) return report_finished(result);
    start_trace();  // after the check above: a finished run records nothing, so it merges nothing
    bytes_at_start_ = policy_bytes_sent();
    if (!o_.metrics.empty()) {
      // A fresh run starts a fresh file; a resumed one appends to what the earlier run wrote up to
      // its checkpoint (what a killed attempt wrote after it is dropped: no step twice).
      if (leader_ && result.first_epoch == 0) std::filesystem::remove(o_.metrics);
      if (leader_ && result.first_epoch > 0) {
        truncate_metrics_after(o_.metrics, static_cast<std::int64_t>(step_), static_cast<std::int64_t>(result.first_epoch));
      }
      metrics_.emplace(o_.metrics, leader_ ? 0 : 1);
    }
    for (std::size_t e : views::epochs(result.first_epoch, o_.epochs)) {
      epoch_ = e;
      if (o_.lr) p_.set_lr(o_.lr(e));
      train_.set_epoch(e);
      epoch_first_step_ = step_;
      const auto t0 = std::chrono::steady_clock::now();
      detail::trainer::epoch_sums s;
      switch (o_.loop) {
        case loop_style::plain: s = epoch_plain(); break;
        case loop_style::coroutine: s = sync_wait(epoch_coroutine()); break;
        case loop_style::ranges: s = epoch_ranges(); break;
      }
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      prog_.finish();
      auto eval_span = span("evaluate");
      const eval_result ev = p_.evaluate(test_);
      eval_span.end();
      if (ev.count == 0) throw detail::trainer::empty_test_error();  // every rank's count: all ranks throw
      result.train_loss = s.steps > 0 ? s.loss_sum / s.steps : 0.0;
      result.test_loss = ev.mean_loss();
      result.test_accuracy = ev.accuracy();
      result.epochs = e + 1;
      result.steps = step_;
      save(result);
      const double samples_per_s = static_cast<double>(s.samples) * p_.replicas() / seconds;
      if (metrics_) {  // already summed over the ranks: rank 0 writes its values
        metrics_->epoch(static_cast<std::int64_t>(e + 1), {{"step", static_cast<std::int64_t>(step_)},
                                                          {"train_loss", result.train_loss},
                                                          {"test_loss", result.test_loss},
                                                          {"test_accuracy", result.test_accuracy},
                                                          {"samples_per_s", samples_per_s},
                                                          {"bytes_sent", bytes_sent()}});
      }
      print("epoch %zu/%zu  train_loss %.4f  test_loss %.4f  test_accuracy %.4f  samples/s %.0f  (%.1f s)\n", e + 1,
            o_.epochs, result.train_loss, result.test_loss, result.test_accuracy, samples_per_s, seconds);
    }
    print("final test_accuracy %.4f\n", result.test_accuracy);
    finish_trace();
    return result;
  }

 private:
  // Collective: aligns the ranks' clocks. The exchange needs a host group (not NCCL's).
  void start_trace() {
    if (!o_.trace || !o_.trace->enabled()) return;
    if (!p_.group().accepts(device_kind::cpu)) {
      print("trace: the %s backend carries device memory only; tracing is off\n", std::string(p_.group().backend()).c_str());
      o_.trace->disable();
      return;
    }
    o_.trace->start(p_.group());
  }
  // Collective: rank 0 merges every rank's spans into one Chrome-trace file.
  void finish_trace() {
    if (o_.trace && o_.trace->enabled() && o_.trace->finish(p_.group())) {
      print("trace written to %s (open it in https://ui.perfetto.dev or chrome://tracing)\n", o_.trace->path().c_str());
    }
  }

  template <class... A>
  void print(const char* fmt, A... a) {
    if (!leader_ || !o_.out) return;
    char line[512];
    std::snprintf(line, sizeof line, fmt, a...);
    *o_.out << line << std::flush;
  }
  trace_span span(const char* name) { return o_.trace ? o_.trace->span(name) : trace_span{}; }

  void resume(train_result& r) {
    if (o_.checkpoint.empty()) return;
    if constexpr (!checkpointable_policy<Policy>) {
      throw config_error("fit: checkpoints (" + o_.checkpoint.string() +
                         ") need a policy with save_checkpoint and load_checkpoint; supported: ddp_policy, zero_policy, "
                         "fsdp_policy, local_sgd_policy, pipeline_policy");
    } else {
      // Fail before training, not after the first epoch: the folder must be writable.
      check_writable(o_.checkpoint.has_parent_path() ? o_.checkpoint.parent_path() : std::filesystem::path("."));
      if (!std::filesystem::exists(o_.checkpoint)) return;
      const checkpoint_extra extra = p_.load_checkpoint(o_.checkpoint);
      r.first_epoch = static_cast<std::size_t>(extra.epoch);
      step_ = static_cast<std::size_t>(extra.step);
      r.steps = step_;
      r.epochs = r.first_epoch;
      bytes_resumed_ = detail::trainer::decode(extra.trainer_state, r);
      if (r.first_epoch > o_.epochs) {
        throw config_error("fit: the checkpoint " + o_.checkpoint.string() + " is at epoch " + std::to_string(r.first_epoch) +
                           ", past epochs = " + std::to_string(o_.epochs));
      }
      r.resumed_finished = r.first_epoch == o_.epochs;
      print("resumed from %s at epoch %zu, step %zu\n", o_.checkpoint.c_str(), r.first_epoch, step_);
    }
  }
  void check_writable(const std::filesystem::path& dir) {
    if (leader_) detail::ckpt::ensure_writable_folder(dir, "fit: cannot write checkpoints");
  }
  train_result report_finished(train_result& r) {
    if (r.first_epoch > 0 && !o_.checkpoint.empty()) {
      print("the run in %s had already finished (epoch %zu of %zu): nothing to train\n", o_.checkpoint.c_str(),
            r.first_epoch, o_.epochs);
    }
    print("final test_accuracy %.4f\n", r.test_accuracy);
    return r;
  }
  void save(const train_result& r) {
    if constexpr (checkpointable_policy<Policy>) {
      if (o_.checkpoint.empty()) return;
      auto ck = span("checkpoint");
      checkpoint_extra extra;
      extra.epoch = epoch_ + 1;  // epochs finished: where a resumed run starts
      extra.step = step_;
      extra.trainer_state = detail::trainer::encode(r, static_cast<std::uint64_t>(bytes_sent()));
      p_.save_checkpoint(o_.checkpoint, extra);
    }
  }

  // One optimizer step, b its last micro-batch (the others went through accumulate): the mean
  // loss of its micro-batches.
  double one_step(const auto& b, detail::trainer::epoch_sums& s) {
    if (o_.before_step) o_.before_step(step_);
    auto sp = o_.trace ? o_.trace->span("step", trace_track::step, "step", static_cast<std::int64_t>(step_)) : trace_span{};
    if (o_.step_lr) p_.set_lr(o_.step_lr(step_));
    const double loss = check_finite(p_.train_step(b));
    const double mean = (micro_.loss_sum + loss) / (micro_.steps + 1);
    s.samples += micro_.samples + b.size();
    micro_ = {};
    return mean;
  }
  // A micro-batch before a step's last (gradient accumulation).
  void accumulate(const auto& b) {
    if constexpr (accumulates) {
      micro_.loss_sum += check_finite(p_.accumulate_step(b));
      micro_.steps += 1;
      micro_.samples += b.size();
    }
  }
  double check_finite(double loss) const {
    if (!std::isfinite(loss)) {  // every rank sees it: DDP's loss is its own, the others' the batch's
      throw invalid_argument_error("fit: the training loss at step " + std::to_string(step_ + 1) + " (epoch " +
                                   std::to_string(epoch_ + 1) + ") is " + std::to_string(loss) +
                                   ": training diverged (lower the learning rate, or clip the gradients)");
    }
    return loss;
  }
  // The progress line: fed every step (it decides when to print).
  void show(std::size_t step, double loss, std::size_t samples) {
    if (o_.log_every) {
      prog_.update(static_cast<std::int64_t>(epoch_), static_cast<std::int64_t>(step - epoch_first_step_), loss,
                   static_cast<std::int64_t>(samples));
    }
  }
  // A step record every log_every steps. `reduced`: loss is already the mean over the ranks;
  // otherwise the record is collective (every rank calls it) and averages it.
  void log_step(std::size_t step, double loss, bool reduced = false) {
    if (!metrics_) return;
    std::vector<metric_field> f{{"epoch", static_cast<std::int64_t>(epoch_ + 1)},
                                {"loss", loss, reduced ? across_ranks::rank0 : across_ranks::mean},
                                {"bytes_sent", bytes_sent()}};
    if (reduced) {
      metrics_->step(static_cast<std::int64_t>(step + 1), std::move(f));
    } else {
      metrics_->step(p_.loss_group(), static_cast<std::int64_t>(step + 1), std::move(f));
    }
  }
  void reduce_loss(detail::trainer::epoch_sums& s) {
    std::array<double, 2> sums{s.loss_sum, s.steps};
    sum_over_ranks(sums);
    s.loss_sum = sums[0];
    s.steps = sums[1];
  }
  // The loss sums are host numbers: a backend that takes device memory only (nccl) sums them on
  // a device copy, synchronously.
  void sum_over_ranks(std::span<double> v) {
    auto& g = p_.loss_group();
    detail::host_collective(g, v, [&](auto view) { return g.all_reduce(view, reduce_op::sum); }, [](work w) { w.wait(); });
  }
  // The batches that end a step. With gradient accumulation, the micro-batches before each are
  // trained (accumulated) here as the loop advances, so the three loop spellings stay one step
  // per element.
  generator<const batch_type&> batches() {
    const std::size_t n = o_.gradient_accumulation_steps, total = train_.size();
    std::size_t k = 0;
    for (const auto& b : traced_batches(train_, o_.trace ? *o_.trace : untraced_)) {
      ++k;
      if (n > 1 && k % n != 0 && k != total) {
        accumulate(b);
        continue;
      }
      co_yield b;
    }
  }

  // What this rank has sent (process_group::traffic()'s ring-algorithm bytes): the policy's own
  // count where it has one (a mode over several groups), else its group's.
  [[nodiscard]] std::uint64_t policy_bytes_sent() {
    if constexpr (requires { { p_.bytes_sent() } -> std::convertible_to<std::uint64_t>; }) {
      return p_.bytes_sent();
    } else {
      return p_.group().traffic().bytes_sent;
    }
  }
  // The metrics records' bytes_sent: rank 0's bytes since the run started (evaluation and
  // checkpoints included; a resumed run counts on from its checkpoint), the same on every rank of
  // a symmetric mode.
  [[nodiscard]] std::int64_t bytes_sent() {
    return static_cast<std::int64_t>(bytes_resumed_ + policy_bytes_sent() - bytes_at_start_);
  }

  detail::trainer::epoch_sums epoch_plain() {
    detail::trainer::epoch_sums s;
    for (const auto& b : batches()) {
      const double loss = one_step(b, s);
      s.loss_sum += loss;
      s.steps += 1;
      show(step_, loss, b.size());
      if (o_.log_every && (step_ + 1) % o_.log_every == 0) log_step(step_, loss);
      ++step_;
    }
    reduce_loss(s);
    return s;
  }

  detail::trainer::epoch_sums epoch_ranges() {
    detail::trainer::epoch_sums s;
    std::size_t samples = 0;
    auto step = [&](const auto& b) {
      samples = b.size();
      return one_step(b, s);
    };
    auto log = [&](const step_result<double>& r) { log_step(r.step, r.value); };
    for (const auto& r : batches() | views::steps(step, step_) | views::every(o_.log_every ? o_.log_every : ~std::size_t{0}, log)) {
      s.loss_sum += r.value;
      s.steps += 1;
      show(r.step, r.value, samples);
    }
    reduce_loss(s);
    return s;
  }

  // Each step's loss is summed over the ranks by an all_reduce that runs while the next batch
  // trains; the loop co_awaits it one step later (a global running loss without blocking a step).
  task<detail::trainer::epoch_sums> epoch_coroutine() {
    detail::trainer::epoch_sums s;
    std::array<std::array<double, 2>, 2> slots{};  // [loss, 1] of the two steps in flight
    work pending = work::completed();
    std::size_t k = 0, samples = 0;
    auto settle = [&](const std::array<double, 2>& done) {
      s.loss_sum += done[0];
      s.steps += done[1];
      show(step_ - 1, done[0] / done[1], samples);  // the mean over the ranks
      if (o_.log_every && step_ % o_.log_every == 0) log_step(step_ - 1, done[0] / done[1], true);
    };
    for (const auto& b : batches()) {
      samples = b.size();
      auto& slot = slots[k % 2];
      slot = {one_step(b, s), 1.0};
      work w = work::completed();
      if (detail::takes_host_memory(p_.loss_group())) {
        w = p_.loss_group().all_reduce(tensor_view<double>(slot), reduce_op::sum);
      } else {
        sum_over_ranks(slot);  // nccl: not overlapped with the next step
      }
      if (k > 0) {
        co_await pending;  // the previous step's sums, reduced while this step computed
        settle(slots[(k - 1) % 2]);
      }
      pending = std::move(w);
      ++k;
      ++step_;
    }
    if (k > 0) {
      co_await pending;
      settle(slots[(k - 1) % 2]);
    }
    co_return s;
  }

  Policy& p_;
  Train& train_;
  Test& test_;
  trainer_options o_;
  bool leader_;
  progress prog_;
  std::optional<metrics_writer> metrics_;
  trace_recorder untraced_;  // traced_batches needs a recorder; a disabled one records nothing
  std::size_t epoch_ = 0, epoch_first_step_ = 0, step_ = 0;
  detail::trainer::epoch_sums micro_;  // the accumulated micro-batches of the step under way
  std::uint64_t bytes_at_start_ = 0;
  std::uint64_t bytes_resumed_ = 0;  // sent by the run this one resumed, up to its checkpoint
};

// Runs the epochs of `o` for `policy` over the train and test batch ranges (the train range
// needs set_epoch(e) and size(), as partrain::loader has). Collective: every rank calls it.
template <class Policy, class Train, class Test>
train_result fit(Policy& policy, Train& train, Test& test, trainer_options o) {
  static_assert(training_policy<Policy, std::ranges::range_value_t<Train>>,
                "partrain::fit: the policy needs train_step(batch), evaluate(batches), set_lr(lr), group(), "
                "loss_group() and replicas() (wrap DDP, data_parallel or a pipeline stage in train/policies.hpp's "
                "ddp_policy, data_parallel_policy or pipeline_policy)");
  return trainer<Policy, Train, Test>(policy, train, test, std::move(o)).run();
}

}  // namespace partrain::inline v0
