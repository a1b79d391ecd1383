// partrain/parallel/local_sgd.hpp: post-local SGD (PyTorch's PostLocalSGDState hook,
// PeriodicModelAverager and PostLocalSGDOptimizer in one policy): synchronous DDP for
// `warmup_steps` steps, then every rank steps alone on its own gradients (no gradient
// all_reduce) and the parameters are averaged over all ranks every `period` steps.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <partrain/comm/process_group.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/memory_space.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/core/work.hpp>
#include <partrain/model/concepts.hpp>
#include <partrain/optim/optimizer.hpp>
#include <partrain/optim/state_io.hpp>
#include <partrain/parallel/comm_hooks.hpp>
#include <partrain/parallel/ddp.hpp>

namespace partrain::inline v0 {

struct local_sgd_options {
  // Average the parameters every `period` steps once local SGD has started.
  std::int64_t period = 4;
  // Steps of ordinary DDP (gradients all-reduced) before local SGD starts; PyTorch's
  // start_localSGD_iter, which must equal its averager's warmup_steps (one number here).
  std::int64_t warmup_steps = 0;
  // The DDP that runs the warm-up; its hook (allreduce, fp16_compress, ...) is used during the
  // warm-up only.
  ddp_options ddp = {};
};

namespace detail::local_sgd {

inline void validate(const local_sgd_options& o) {
  if (o.period < 1) {
    throw invalid_argument_error("local_sgd_options: period must be >= 1 (steps between parameter averages), got " +
                                 std::to_string(o.period));
  }
  if (o.warmup_steps < 0) {
    throw invalid_argument_error("local_sgd_options: warmup_steps must be >= 0 (synchronous DDP steps before local "
                                 "SGD starts), got " + std::to_string(o.warmup_steps));
  }
  if (!o.ddp.hook) {
    throw invalid_argument_error("local_sgd_options: ddp.hook is empty (expected the warm-up's comm_hook, e.g. "
                                 "comm_hooks::allreduce())");
  }
}

// The warm-up's hook while `*sync` is true; afterwards the bucket keeps this rank's own gradient
// (PyTorch's post_local_gradient_allreduce=False: nothing is communicated, nothing divided).
[[nodiscard]] inline comm_hook gated(comm_hook inner, std::shared_ptr<const bool> sync) {
  return [inner = std::move(inner), sync = std::move(sync)](grad_bucket& b) -> work {
    if (*sync) return inner(b);
    return work::completed();
  };
}

}  // namespace detail::local_sgd

// One training step = the DDP step (gradients averaged during the warm-up, local afterwards),
// the optimizer's step, then the parameter average when one is due. Only parameters are
// averaged; each rank keeps its own optimizer state (momentum), as in PyTorch.
template <model M, optimizer O, communicator C = process_group>
class post_local_sgd {
  using P = param_t<M>;
  using T = param_element_t<P>;
  static_assert(std::same_as<param_space_t<P>, host>,
                "partrain: post_local_sgd averages host parameters (CUDA parameters are not supported yet)");

 public:
  post_local_sgd(M& m, O& opt, C& comm, local_sgd_options o = {})
      : opts_((detail::local_sgd::validate(o), std::move(o))),
        opt_(&opt),
        sync_(std::make_shared<bool>(true)),
        ddp_(m, comm, with_gate(opts_.ddp, sync_)) {}
  post_local_sgd(const post_local_sgd&) = delete;
  post_local_sgd& operator=(const post_local_sgd&) = delete;

  // Returns this rank's loss.
  template <class B>
  double train_step(const B& batch) {
    *sync_ = step_ < opts_.warmup_steps;
    const double loss = ddp_.train_step(batch);
    opt_->step();
    average_if_due();
    return loss;
  }

  // Steps taken (PyTorch's averager step counter); the position in the period follows from it.
  [[nodiscard]] std::int64_t steps() const noexcept { return step_; }
  // Whether the last train_step ended with a parameter average (or was a synchronous warm-up
  // step): every rank then holds the same parameters, bit for bit.
  [[nodiscard]] bool synced_last_step() const noexcept { return synced_last_; }
  [[nodiscard]] bool in_warmup() const noexcept { return step_ < opts_.warmup_steps; }

  // Averages the parameters now (e.g. before evaluating or saving a final model).
  void average_parameters() {
    auto& comm = ddp_.comm();
    const int world = comm.size();
    flat_.clear();
    for (auto&& p : ddp_.module().parameters()) {
      const auto v = p.value();
      flat_.insert(flat_.end(), v.begin(), v.end());
    }
    // PyTorch's average_parameters: divide first, then one all_reduce (sum) of the flat buffer.
    const T inv = T(1) / static_cast<T>(world);
    if (world > 1) {
      for (auto& x : flat_) x *= inv;
      comm.all_reduce(tensor_view<T>(flat_), reduce_op::sum).wait();
    }
    std::size_t off = 0;
    for (auto&& p : ddp_.module().parameters()) {
      auto v = p.value();
      std::copy(flat_.begin() + static_cast<std::ptrdiff_t>(off), flat_.begin() + static_cast<std::ptrdiff_t>(off + v.size()),
                v.begin());
      off += v.size();
    }
  }

  // Each rank evaluates its own current parameters on its batches; the sums over all ranks (as
  // DDP's evaluate). Between averages the ranks' models differ: average_parameters() first for
  // the one model.
  template <class Range>
  [[nodiscard]] eval_result evaluate(Range&& batches) {
    return ddp_.evaluate(std::forward<Range>(batches));
  }

  // State: kind tag, options, step counter, then the optimizer's own state when it has one.
  void save_state(state_writer& w) const {
    w.put_string("post_local_sgd");
    w.put(opts_.period);
    w.put(opts_.warmup_steps);
    w.put(step_);
    w.put(static_cast<std::uint8_t>(synced_last_));
    if constexpr (stateful_optimizer<O>) opt_->save_state(w);
  }
  void load_state(state_reader& r) {
    const auto kind = r.get_string("local SGD state kind");
    if (kind != "post_local_sgd") throw checkpoint_error("local SGD state is for '" + kind + "', expected 'post_local_sgd'");
    const auto period = r.get<std::int64_t>("local SGD period");
    const auto warmup = r.get<std::int64_t>("local SGD warmup_steps");
    if (period != opts_.period || warmup != opts_.warmup_steps) {
      throw checkpoint_error("local SGD state was saved with period " + std::to_string(period) + " and warmup_steps " +
                             std::to_string(warmup) + ", this run has period " + std::to_string(opts_.period) +
                             " and warmup_steps " + std::to_string(opts_.warmup_steps) + " (expected the same)");
    }
    const auto step = r.get<std::int64_t>("local SGD step counter");
    const auto synced = r.get<std::uint8_t>("local SGD sync flag");
    if constexpr (stateful_optimizer<O>) opt_->load_state(r);
    step_ = step;
    synced_last_ = synced != 0;
  }

  [[nodiscard]] distributed_data_parallel<M, C>& ddp() noexcept { return ddp_; }
  [[nodiscard]] O& optimizer() noexcept { return *opt_; }
  [[nodiscard]] M& module() noexcept { return ddp_.module(); }
  [[nodiscard]] C& comm() noexcept { return ddp_.comm(); }
  [[nodiscard]] const local_sgd_options& options() const noexcept { return opts_; }

 private:
  [[nodiscard]] static ddp_options with_gate(ddp_options o, const std::shared_ptr<bool>& sync) {
    o.hook = detail::local_sgd::gated(std::move(o.hook), sync);
    return o;
  }

  // PeriodicModelAverager.average_parameters: average when step >= warmup_steps and
  // (step - warmup_steps) % period == 0, then count the step.
  void average_if_due() {
    const bool warmup = step_ < opts_.warmup_steps;
    const bool due = !warmup && (step_ - opts_.warmup_steps) % opts_.period == 0;
    if (due) average_parameters();
    synced_last_ = warmup || due;
    ++step_;
  }

  local_sgd_options opts_;
  O* opt_;
  std::shared_ptr<bool> sync_;  // read by the gated hook, on the training thread
  distributed_data_parallel<M, C> ddp_;
  std::int64_t step_ = 0;
  bool synced_last_ = false;
  std::vector<T> flat_;
};

}  // namespace partrain::inline v0
