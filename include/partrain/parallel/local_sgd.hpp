// partrain/parallel/local_sgd.hpp: post-local SGD (PyTorch's PostLocalSGDState hook,
// PeriodicModelAverager and PostLocalSGDOptimizer in one policy): synchronous DDP for
// `warmup_steps` steps, then every rank steps alone on its own gradients (no gradient
// all_reduce) and the parameters are averaged over all ranks every `period` steps.
// Hierarchical (give it an intra-host group too, PyTorch's subgroup): after the warm-up the
// gradients are still averaged every step, inside the host only, so the ranks of a host hold
// the same model at every step, and the models of the hosts are averaged every `period` steps.
// Join (uneven inputs): a rank out of batches calls join() and takes part in the others'
// averages (and, hierarchical, its host's gradient all_reduces) until every rank has joined.
// CUDA parameters: DDP's steps as DDP runs them; the averages on a host mirror of the parameters.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
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
#include <partrain/parallel/detail/host_staging.hpp>

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
  // Uneven inputs: a rank that runs out of batches calls join() and takes part in the others'
  // warm-up gradient all_reduces (zero gradients, DDP's join) and parameter averages (with its
  // own parameters, i.e. no progress: the mean stays over all ranks, as DDP divides by the
  // initial world size) until every rank has joined. Costs one small all_reduce per average.
  bool join = false;
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

// The warm-up's DDP: the caller's options, with DDP's own join when ours is on.
[[nodiscard]] inline ddp_options warmup_ddp(const local_sgd_options& o) {
  ddp_options d = o.ddp;
  d.join = d.join || o.join;
  return d;
}

// The intra-host DDP of the hierarchical mode: plain all_reduce (the link inside a host is the
// fast one, and a stateful hook such as PowerSGD must not serve two DDPs), no broadcast (the
// warm-up's DDP already gave every rank rank 0's parameters), DDP's join when ours is on.
[[nodiscard]] inline ddp_options intra_ddp(const local_sgd_options& o) {
  ddp_options d = o.ddp;
  d.hook = comm_hooks::allreduce();
  d.broadcast_parameters = false;
  d.join = o.join;
  d.on_bucket_launch = {};
  return d;
}

}  // namespace detail::local_sgd

// One training step = the rank's gradient (averaged over all ranks during the warm-up, over the
// host afterwards when hierarchical, its own otherwise), the optimizer's step, then the
// parameter average when one is due. Only parameters are averaged; each rank (each host, when
// hierarchical) keeps its own optimizer state (momentum), as in PyTorch.
template <class M, optimizer O, communicator C = process_group>
class post_local_sgd {
  static_assert(check_model<M>(), "partrain: post_local_sgd takes a model");
  using P = param_t<M>;
  using T = param_element_t<P>;

 public:
  post_local_sgd(M& m, O& opt, C& comm, local_sgd_options o = {})
      : opts_((detail::local_sgd::validate(o), std::move(o))),
        opt_(&opt),
        ddp_(m, comm, detail::local_sgd::warmup_ddp(opts_)),
        values_(m),
        warmup_closed_(opts_.warmup_steps == 0) {}

  // Hierarchical post-local SGD: `comm` holds every rank of the job, `intra_host` the ranks of
  // this rank's host (the same model at every step: its gradients are averaged there), and the
  // parameters are averaged over `comm` every `period` steps. PyTorch's PostLocalSGDState with a
  // subgroup and post_local_gradient_allreduce=True, plus PeriodicModelAverager.
  post_local_sgd(M& m, O& opt, C& comm, C& intra_host, local_sgd_options o = {})
      : post_local_sgd(m, opt, comm, check_hierarchical(comm, intra_host, std::move(o))) {
    intra_ = std::make_unique<distributed_data_parallel<M, C>>(m, intra_host, detail::local_sgd::intra_ddp(opts_));
  }
  post_local_sgd(const post_local_sgd&) = delete;
  post_local_sgd& operator=(const post_local_sgd&) = delete;

  // Returns this rank's loss.
  template <class B>
  double train_step(const B& batch) {
    static_assert(check_trainable<M, B>());
    if (joined_) throw invalid_argument_error(where() + "train_step after join() on this rank");
    double loss = 0;
    if (step_ < opts_.warmup_steps) {
      loss = ddp_.train_step(batch);
    } else {
      if (opts_.join && !warmup_closed_) close_warmup();
      // No gradient communication, or inside the host only.
      loss = intra_ ? intra_->train_step(batch) : ddp_.module().train_step(batch);
    }
    opt_->step();
    average_if_due();
    return loss;
  }

  // Uneven inputs (needs local_sgd_options::join): call once this rank has no more batches. It
  // takes part in the other ranks' warm-up steps and parameter averages until every rank has
  // joined, then every rank's step counter is set to the most steps any rank took, so the next
  // epoch averages at the same steps everywhere. Each rank keeps its own parameters (they agree
  // when the last rank's last step ended with an average). Returns true when this rank took part
  // in at least one step of the others.
  bool join() {
    if (!opts_.join) {
      throw config_error(where() + "join() needs join enabled: construct with local_sgd_options{.join = true} (every "
                                   "average then starts with a count of the ranks that still have data)");
    }
    joined_ = true;
    bool shadowed = false;
    // The warm-up: DDP's join shadows the gradient all_reduces of the ranks still in it, and
    // every rank leaves the warm-up through it (train_step at the first local step, or here).
    // The warm-up steps it shadowed count as this rank's steps: the averages fall on step counts.
    if (!warmup_closed_) {
      const auto before = ddp_.stats().shadow_steps;
      shadowed = close_warmup();
      step_ += static_cast<std::int64_t>(ddp_.stats().shadow_steps - before);
    }
    if (intra_) {
      // Hierarchical: while a rank of this host has data, shadow the host's gradient all_reduces
      // (zero gradients, DDP's join) and take part in the job's averages at the steps they fall
      // on; the host's join then gives its ranks the parameters of the one that stepped most.
      shadowed = intra_->join([this] {
        const bool due = step_ >= opts_.warmup_steps && (step_ - opts_.warmup_steps) % opts_.period == 0;
        if (due) {
          std::array<std::int64_t, 1> active{0};
          small_all_reduce(std::span<std::int64_t>(active), reduce_op::sum, "join active-rank all_reduce");
          average_parameters();
        }
        ++step_;
      }) || shadowed;
    }
    for (;;) {
      std::array<std::int64_t, 1> active{0};
      small_all_reduce(std::span<std::int64_t>(active), reduce_op::sum, "join active-rank all_reduce");
      if (active[0] == 0) break;
      shadowed = true;
      average_parameters();
    }
    std::array<std::int64_t, 1> steps{step_};
    small_all_reduce(std::span<std::int64_t>(steps), reduce_op::max, "join step-count all_reduce");
    step_ = steps[0];
    warmup_closed_ = opts_.warmup_steps == 0 || (step_ >= opts_.warmup_steps && warmup_closed_);
    joined_ = false;
    return shadowed;
  }

  // Steps taken (PyTorch's averager step counter); the position in the period follows from it.
  [[nodiscard]] std::int64_t steps() const noexcept { return step_; }
  // Whether the last train_step ended with a parameter average (or was a synchronous warm-up
  // step): every rank then holds the same parameters, bit for bit.
  [[nodiscard]] bool synced_last_step() const noexcept { return synced_last_; }
  [[nodiscard]] bool in_warmup() const noexcept { return step_ < opts_.warmup_steps; }
  [[nodiscard]] bool hierarchical() const noexcept { return intra_ != nullptr; }

  // Averages the parameters over every rank now (e.g. before evaluating or saving a final model).
  void average_parameters() {
    auto& comm = ddp_.comm();
    const int world = comm.size();
    values_.pull("post_local_sgd");
    const auto values = values_.views();
    flat_.clear();
    for (const auto& v : values) flat_.insert(flat_.end(), v.begin(), v.end());
    // PyTorch's average_parameters: divide first, then one all_reduce (sum) of the flat buffer.
    const T inv = T(1) / static_cast<T>(world);
    if (world > 1) {
      for (auto& x : flat_) x *= inv;
      detail::host_collective(
          comm, std::span<T>(flat_), [&](auto t) { return comm.all_reduce(t, reduce_op::sum); },
          [&](auto&& w) { wait_named(std::forward<decltype(w)>(w), "parameter average all_reduce"); });
    }
    std::size_t off = 0;
    for (const auto& v : values) {
      std::copy(flat_.begin() + static_cast<std::ptrdiff_t>(off), flat_.begin() + static_cast<std::ptrdiff_t>(off + v.size()),
                v.begin());
      off += v.size();
    }
    values_.push();
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
    // A state is saved between steps, with no rank inside join(): past the warm-up, nobody is
    // left in the warm-up's DDP (and its join must not run again: it would broadcast one rank's
    // parameters over the others').
    warmup_closed_ = opts_.warmup_steps == 0 || step_ >= opts_.warmup_steps;
  }

  [[nodiscard]] distributed_data_parallel<M, C>& ddp() noexcept { return ddp_; }
  [[nodiscard]] O& optimizer() noexcept { return *opt_; }
  [[nodiscard]] M& module() noexcept { return ddp_.module(); }
  // Every rank of the job (the warm-up's and the averages' group).
  [[nodiscard]] C& comm() noexcept { return ddp_.comm(); }
  // The host's group when hierarchical; null otherwise.
  [[nodiscard]] C* intra_host() noexcept { return intra_ ? &intra_->comm() : nullptr; }
  [[nodiscard]] const local_sgd_options& options() const noexcept { return opts_; }

 private:
  [[nodiscard]] static local_sgd_options check_hierarchical(C& comm, C& intra, local_sgd_options o) {
    if (intra.size() > comm.size() || comm.size() % intra.size() != 0) {
      throw invalid_argument_error("post_local_sgd: the intra-host group has " + std::to_string(intra.size()) +
                                   " ranks, the job " + std::to_string(comm.size()) +
                                   " (expected hosts of equal size: a divisor of the job's size)");
    }
    return o;
  }
  [[nodiscard]] std::string where() { return "rank " + std::to_string(ddp_.comm().rank()) + " post_local_sgd: "; }

  // Leaves the warm-up's DDP through its join, which every rank calls once (collective).
  bool close_warmup() {
    const bool shadowed = ddp_.join();
    warmup_closed_ = true;
    return shadowed;
  }

  template <class W>
  void wait_named(W&& w, const char* what) {
    try {
      w.wait();
    } catch (const timeout_error& e) {
      throw timeout_error(where() + what + " failed: " + e.what() +
                          (opts_.join ? std::string()
                                      : std::string(". If ranks run out of batches at different steps, construct with "
                                                    "local_sgd_options{.join = true} and call join() on a rank once "
                                                    "its data ends")));
    }
  }
  void small_all_reduce(std::span<std::int64_t> v, reduce_op op, const char* what) {
    auto& comm = ddp_.comm();
    detail::host_collective(
        comm, v, [&](auto t) { return comm.all_reduce(t, op); },
        [&](auto&& w) { wait_named(std::forward<decltype(w)>(w), what); });
  }

  // PeriodicModelAverager.average_parameters: average when step >= warmup_steps and
  // (step - warmup_steps) % period == 0, then count the step.
  void average_if_due() {
    const bool warmup = step_ < opts_.warmup_steps;
    const bool due = !warmup && (step_ - opts_.warmup_steps) % opts_.period == 0;
    if (due) {
      if (opts_.join) {  // tells the joined ranks, waiting in join(), that an average follows
        std::array<std::int64_t, 1> active{1};
        small_all_reduce(std::span<std::int64_t>(active), reduce_op::sum, "active-rank all_reduce");
      }
      average_parameters();
    }
    synced_last_ = warmup || due;
    ++step_;
  }

  local_sgd_options opts_;
  O* opt_;
  distributed_data_parallel<M, C> ddp_;
  detail::host_values<M> values_;  // host views of the parameters (a mirror of CUDA ones)
  std::unique_ptr<distributed_data_parallel<M, C>> intra_;  // hierarchical: the host's gradients
  std::int64_t step_ = 0;
  bool synced_last_ = false;
  bool warmup_closed_;   // join: this rank has left the warm-up's DDP through its join()
  bool joined_ = false;  // inside join(): train_step is refused
  std::vector<T> flat_;
};

}  // namespace partrain::inline v0
