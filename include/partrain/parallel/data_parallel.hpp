// partrain/parallel/data_parallel.hpp: one process drives several devices (torch.nn.DataParallel,
// done the way it should be). Host "devices" are worker threads; CUDA devices are one GPU each
// (the same GPU may be named twice), each with its own stream and worker thread.
//
//   data_parallel dp(model, {device::cpu(0), device::cpu(1)},
//                    [](mlp& replica) { return sgd(replica, {.lr = 0.1}); });
//   double loss = dp.train_step(batch);      // scatter, forward+backward, reduce, step everywhere
//   eval_result r = dp.evaluate(test_batches);
//
// Unlike distributed_data_parallel::train_step, this train_step includes the optimizer step: the
// policy owns one optimizer per replica (made by the factory), so a loop written for both calls
// its own optimizer's step() only under DDP.
//
// What differs from PyTorch, on purpose:
// - Replicas are made once (model.replicate_to(device)), not every forward; replica 0 is the
//   caller's model itself, so after training it holds the trained parameters.
// - One persistent thread per device and no interpreter lock; the loss and the optimizer step run
//   on every device (no device-0 hot spot).
// - Gradients: each replica's mean-loss gradient is weighted by its share of the batch, n_i / n,
//   then summed in device order by the `local` backend (deterministic), so the result equals one
//   device on the whole batch. With equal shares this is exactly DDP's sum-then-divide average.
// - Parameters stay in sync by all-reducing gradients and stepping the optimizer on every
//   replica (dp_sync::all_reduce, the default). The alternative, reducing to replica 0, stepping
//   there and broadcasting parameters (dp_sync::reduce_broadcast), is kept for comparison. The
//   all_reduce form won on the host MLP of bench_data_parallel (2 devices, batch 256): its update
//   phase took 1.0-1.5 ms per step against 2.3-4.0 ms for step-on-0 + broadcast, because the
//   optimizer steps run concurrently instead of idling the other devices during replica 0's step
//   and there is no parameter copy; the reduce phases cost about the same (the local all_reduce
//   splits the reduction across the device threads, reduce makes replica 0 add every buffer).
//   It costs one optimizer state per replica (memory), which DDP pays too. One device skips the
//   reduction altogether.
// - Batches are split into counts that follow the shares exactly (largest remainder), not
//   torch.chunk's ceil(n / devices); a batch smaller than the device count leaves the devices
//   with the smallest shares idle (their gradient counts as zero with weight zero).
// - balance mode: after warm-up steps each device's train_step time is measured and the shares
//   move to the devices' measured speeds, so devices finish together (shares and per-device times
//   are in stats()).
// - A replica that throws stops the step on every device (the local group is aborted, nobody
//   waits out a timeout) and the caller gets replica_error naming the device, with the original
//   exception nested. The next train_step runs on a fresh group; if any replica had already
//   started its optimizer step, parameters (and the optimizer state, for optimizers with
//   save_state/load_state) are first re-synchronised from replica 0.
// - Every wait is bounded by options.timeout; a step that exceeds it throws timeout_error naming
//   the devices still running, and the policy refuses further steps while they are stuck.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <ranges>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <partrain/comm/local.hpp>
#include <partrain/comm/process_group.hpp>
#include <partrain/core/buffer.hpp>
#include <partrain/core/device.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/executor.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/model/concepts.hpp>
#include <partrain/model/traits.hpp>
#include <partrain/optim/optimizer.hpp>
#include <partrain/optim/state_io.hpp>
#include <partrain/parallel/detail/dp_balance.hpp>
#include <partrain/parallel/detail/dp_device.hpp>
#include <partrain/parallel/detail/dp_scatter.hpp>

namespace partrain::inline v0 {

// How replicas stay in sync after each step.
enum class dp_sync {
  all_reduce,        // all-reduce gradients, every replica steps its own optimizer (default)
  reduce_broadcast,  // reduce gradients to replica 0, step there, broadcast its parameters
};

struct data_parallel_options {
  std::vector<double> weights{};        // fixed share per device (any positive scale); empty = even
  bool balance = false;                 // measure device speeds and move the shares to them
  std::size_t balance_warmup_steps = 2;  // steps not measured at the start
  double balance_smoothing = 0.5;       // weight of the newest speed measurement
  double balance_min_share = 0.01;      // floor, so a slow device keeps being measured
  dp_sync sync = dp_sync::all_reduce;
  std::chrono::milliseconds timeout = default_timeout;  // bound on one step and every collective
};

// Seconds spent in each phase of a step. compute: the slowest device's train_step; reduce: the
// gradient collective as seen by the device that waited least; update: optimizer step (and the
// parameter broadcast in reduce_broadcast mode).
struct dp_phase_times {
  double scatter_s = 0, compute_s = 0, reduce_s = 0, update_s = 0, total_s = 0;
  dp_phase_times& operator+=(const dp_phase_times& o) noexcept {
    scatter_s += o.scatter_s;
    compute_s += o.compute_s;
    reduce_s += o.reduce_s;
    update_s += o.update_s;
    total_s += o.total_s;
    return *this;
  }
};

struct data_parallel_stats {
  std::size_t steps = 0;
  std::vector<double> shares;             // current share per device, sums to 1
  std::vector<std::size_t> counts;        // examples per device in the last step
  std::vector<double> device_step_s;      // each device's train_step time in the last step
  std::vector<double> device_speed;       // balance mode: smoothed examples/s per device
  dp_phase_times last;                    // the last step
  dp_phase_times sum;                     // all steps since construction
};

// A replica failed; what() names the device and the replica, the original exception is nested
// (std::rethrow_if_nested gets it back).
class replica_error : public error {
 public:
  replica_error(device d, std::size_t replica, const std::string& what)
      : error(error_kind::internal, what), device_(d), replica_(replica) {}
  [[nodiscard]] const device& failed_device() const noexcept { return device_; }
  [[nodiscard]] std::size_t replica() const noexcept { return replica_; }

 private:
  device device_;
  std::size_t replica_;
};

// Optional: a forward pass writing per-example outputs, out = [rows of the batch, ...].
template <class M, class B>
concept forwardable_on = requires(M& m, const B& b, tensor_view<float> out) { m.forward(b, out); };

// Optional: how many output elements forward writes per example (the allocating functional form).
template <class M>
concept has_output_size = requires(const M& m) {
  { m.output_size() } -> std::convertible_to<std::size_t>;
};

namespace detail::dp {

template <class M>
consteval bool check_model() {
  static_assert(detail::has_parameters_member<M>,
                "partrain: data_parallel needs a model with `parameters()` returning its parameters in a stable order");
  static_assert(model<M>, "partrain: each element of `model.parameters()` needs `value()` and `grad()` tensor views");
  static_assert(replicable<M>,
                "partrain: data_parallel needs `M replicate_to(device) const` on the model, to copy it to each device");
  return true;
}

template <class T>
[[nodiscard]] inline double seconds_since(T start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

[[nodiscard]] inline std::string what(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace detail::dp

template <class M, class Opt>
class data_parallel {
  static_assert(detail::dp::check_model<M>());
  using T = model_element_t<M>;
  using S = model_space_t<M>;
  static_assert(std::same_as<std::remove_cv_t<typename param_grad_view_t<param_t<M>>::value_type>, T> &&
                    std::same_as<typename param_grad_view_t<param_t<M>>::space_type, S>,
                "partrain: a parameter's value() and grad() must have the same element type and memory space");

 public:
  using model_type = M;
  using optimizer_type = Opt;

  // model becomes replica 0 (it must live on devices[0] and outlive the policy); the others are
  // model.replicate_to(devices[i]). make_optimizer(replica) is called once per replica, on that
  // device's worker thread, and must return Opt.
  template <class F>
    requires std::invocable<F&, M&>
  data_parallel(M& model, std::vector<device> devices, F make_optimizer, data_parallel_options opts = {})
      : devices_(std::move(devices)),
        opts_(std::move(opts)),
        balancer_(devices_.size(), opts_.balance_warmup_steps, opts_.balance_smoothing, opts_.balance_min_share) {
    static_assert(std::same_as<std::remove_cvref_t<std::invoke_result_t<F&, M&>>, Opt>,
                  "partrain: make_optimizer(replica) must return the policy's optimizer type");
    validate_devices();
    const std::size_t n = devices_.size();
    set_weights(opts_.weights);
    pg_opts_.timeout = opts_.timeout;
    groups_ = make_local_world(static_cast<int>(n), pg_opts_);
    replicas_.assign(n, nullptr);
    replicas_[0] = &model;
    owned_.resize(n);
    optimizers_.resize(n);
    flat_.resize(n);
    held_.resize(n);
    for (std::size_t i = 0; i < n; ++i) contexts_.push_back(std::make_unique<detail::dp::device_context>(devices_[i]));
    for (std::size_t i = 0; i < n; ++i) workers_.push_back(std::make_unique<detail::executor>());
    // Replicate and make optimizers on each device's own thread (CUDA: with that device current);
    // the user's factory is called one replica at a time, so it need not be thread-safe.
    std::mutex factory_mutex;
    dispatch("replicate", /*collective=*/false, [&](std::size_t i) {
      contexts_[i]->activate();
      if (i != 0) owned_[i].reset(new M(model.replicate_to(devices_[i])));
      if (i != 0) replicas_[i] = owned_[i].get();
      std::lock_guard lock(factory_mutex);
      optimizers_[i].reset(new Opt(std::invoke(make_optimizer, *replicas_[i])));
    });
    check_replicas();
    for (auto& f : flat_) f = host_buffer<T>(total_);
    stats_.shares = shares_;
    stats_.counts.assign(n, 0);
    stats_.device_step_s.assign(n, 0.0);
    stats_.device_speed.assign(n, 0.0);
  }

  data_parallel(const data_parallel&) = delete;
  data_parallel& operator=(const data_parallel&) = delete;

  // Calls f(optimizer) for every replica's optimizer (e.g. to change the learning rate of all).
  template <class F>
  void for_each_optimizer(F&& f) {
    for (auto& o : optimizers_) f(*o);
  }

  // One synchronised training step on the whole batch; returns its mean loss.
  template <class B>
  double train_step(const B& batch) {
    static_assert(splittable_batch<B>,
                  "partrain: data_parallel cannot split this batch type: give it `size()` and "
                  "`slice(first, last)`, or `features`/`labels` views (like partrain::batch), or pass a tensor_view");
    using shard_t = std::remove_cvref_t<decltype(split_batch(batch, 0, 0))>;
    static_assert(trainable_on<M, shard_t>,
                  "partrain: the model needs `double train_step(const Batch&)` for the batch type data_parallel passes");
    check_usable("train_step");
    for (auto& h : held_) h.reset();  // the previous step's collectives
    const auto t_start = std::chrono::steady_clock::now();
    const std::size_t n = batch_size_of(batch);
    if (n == 0) throw invalid_argument_error("data_parallel::train_step: the batch is empty (expected >= 1 example)");
    const std::size_t d = devices_.size();

    auto st = std::make_shared<step_state<shard_t>>();
    st->n = n;
    st->counts = detail::dp::split_counts(n, shares_);
    const auto offsets = detail::dp::split_offsets(st->counts);
    st->shards.resize(d);
    for (std::size_t i = 0; i < d; ++i) {
      if (st->counts[i]) st->shards[i].emplace(split_batch(batch, offsets[i], offsets[i + 1]));
    }
    st->equal = std::all_of(st->counts.begin(), st->counts.end(), [&](std::size_t c) { return c == st->counts[0]; });
    st->results = std::vector<device_result>(d);
    const double scatter_s = detail::dp::seconds_since(t_start);

    const bool broadcast_mode = opts_.sync == dp_sync::reduce_broadcast;
    dispatch("train_step", /*collective=*/true, [this, st, broadcast_mode](std::size_t i) {
      auto& ctx = *contexts_[i];
      auto& r = st->results[i];
      auto& m = *replicas_[i];
      ctx.activate();
      r.reached = step_phase::compute;
      auto t0 = std::chrono::steady_clock::now();
      if (st->shards[i]) {
        r.loss = static_cast<double>(m.train_step(*st->shards[i]));
      } else {
        for (auto&& p : m.parameters()) ctx.zero(p.grad());
      }
      ctx.synchronize(/*whole_device=*/true);
      r.compute_s = detail::dp::seconds_since(t0);

      r.reached = step_phase::reduce;
      t0 = std::chrono::steady_clock::now();
      const bool single = devices_.size() == 1;  // nothing to reduce: the gradients are final
      auto flat = flat_[i].view();
      if (!single) {
        // Mean-loss gradients weighted by batch share, so the sum is the whole batch's gradient.
        const double scale = st->equal ? 1.0 : static_cast<double>(st->counts[i]) / static_cast<double>(st->n);
        pack_grads(i, scale);
        const auto op = st->equal ? reduce_op::avg : reduce_op::sum;
        held_[i] = broadcast_mode ? groups_[i]->reduce(flat, 0, op) : groups_[i]->all_reduce(flat, op);
        held_[i]->wait();
      }
      r.reduce_s = detail::dp::seconds_since(t0);

      r.reached = step_phase::update;
      t0 = std::chrono::steady_clock::now();
      if (single) {
        optimizers_[0]->step();
      } else if (!broadcast_mode) {
        unpack(i, /*into_grads=*/true);
        optimizers_[i]->step();
      } else {
        if (i == 0) {
          unpack(0, /*into_grads=*/true);
          optimizers_[0]->step();
          pack_values(0);
        }
        held_[i] = groups_[i]->broadcast(flat, 0);
        held_[i]->wait();
        if (i != 0) unpack(i, /*into_grads=*/false);
      }
      ctx.synchronize(/*whole_device=*/true);
      r.update_s = detail::dp::seconds_since(t0);
      r.reached = step_phase::done;
    }, &st->results);

    auto& counts = st->counts;
    const auto& results = st->results;
    double loss = 0;
    dp_phase_times t;
    t.scatter_s = scatter_s;
    t.reduce_s = 1e300;
    std::vector<double> step_s(d, 0.0);
    for (std::size_t i = 0; i < d; ++i) {
      loss += static_cast<double>(counts[i]) / static_cast<double>(n) * results[i].loss;
      step_s[i] = results[i].compute_s;
      t.compute_s = std::max(t.compute_s, results[i].compute_s);
      t.reduce_s = std::min(t.reduce_s, results[i].reduce_s);
      t.update_s = std::max(t.update_s, results[i].update_s);
    }
    if (opts_.balance && balancer_.observe(counts, step_s)) shares_ = balancer_.shares();
    t.total_s = detail::dp::seconds_since(t_start);
    ++stats_.steps;
    stats_.shares = shares_;
    stats_.counts = std::move(counts);
    stats_.device_step_s = std::move(step_s);
    stats_.device_speed.assign(balancer_.speeds().begin(), balancer_.speeds().end());
    stats_.last = t;
    stats_.sum += t;
    return loss;
  }

  // Sums eval_step over the batches, each split across the devices by the current shares.
  template <std::ranges::input_range R>
  eval_result evaluate(R&& batches) {
    using B = std::remove_cvref_t<std::ranges::range_reference_t<R>>;
    static_assert(splittable_batch<B>, "partrain: data_parallel::evaluate cannot split this batch type");
    using shard_t = std::remove_cvref_t<decltype(split_batch(std::declval<const B&>(), 0, 0))>;
    static_assert(evaluable_on<M, shard_t>,
                  "partrain: data_parallel::evaluate needs `eval_result eval_step(const Batch&)` on the model");
    check_usable("evaluate");
    eval_result total;
    for (auto&& b : batches) {
      const std::size_t n = batch_size_of(b);
      if (n == 0) continue;
      const auto offsets = detail::dp::split_offsets(detail::dp::split_counts(n, shares_));
      auto parts = std::make_shared<std::vector<eval_result>>(devices_.size());
      std::vector<std::optional<shard_t>> shards(devices_.size());
      for (std::size_t i = 0; i < shards.size(); ++i) {
        if (offsets[i] != offsets[i + 1]) shards[i].emplace(split_batch(b, offsets[i], offsets[i + 1]));
      }
      dispatch("evaluate", /*collective=*/false, [this, parts, shards = std::move(shards)](std::size_t i) {
        if (!shards[i]) return;
        contexts_[i]->activate();
        (*parts)[i] = replicas_[i]->eval_step(*shards[i]);
      });
      for (auto& p : *parts) total += p;
    }
    return total;
  }

  // Forward only: each device writes the outputs of its rows into out (gathered in the batch's
  // original order, since every device writes its own rows of the same view).
  template <class B, class U>
  void forward(const B& batch, tensor_view<U> out) {
    static_assert(splittable_batch<B>, "partrain: data_parallel::forward cannot split this batch type");
    check_usable("forward");
    const std::size_t n = batch_size_of(batch);
    if (out.rank() == 0 || out.extent(0) != n) {
      throw invalid_argument_error("data_parallel::forward: out has shape " + out.shape().to_string() +
                                   ", expected a first dimension of " + std::to_string(n) + " (the batch size)");
    }
    using shard_t = std::remove_cvref_t<decltype(split_batch(batch, 0, 0))>;
    static_assert(forwardable_on<M, shard_t>,
                  "partrain: data_parallel::forward needs `forward(const Batch&, tensor_view<float> out)` on the model");
    const auto offsets = detail::dp::split_offsets(detail::dp::split_counts(n, shares_));
    std::vector<std::optional<shard_t>> shards(devices_.size());
    for (std::size_t i = 0; i < shards.size(); ++i) {
      if (offsets[i] != offsets[i + 1]) shards[i].emplace(split_batch(batch, offsets[i], offsets[i + 1]));
    }
    dispatch("forward", /*collective=*/false, [this, out, offsets, shards = std::move(shards)](std::size_t i) {
      if (!shards[i]) return;
      contexts_[i]->activate();
      replicas_[i]->forward(*shards[i], out.slice(offsets[i], offsets[i + 1]));
    });
  }

  // Fixed shares (any positive scale; empty = even). Also what balance mode starts from.
  void set_weights(std::span<const double> weights) {
    const std::size_t n = devices_.size();
    if (weights.empty()) {
      shares_.assign(n, 1.0 / static_cast<double>(n));
      return;
    }
    if (weights.size() != n) {
      throw config_error("data_parallel: " + std::to_string(weights.size()) + " weights given for " +
                         std::to_string(n) + " devices (expected one weight per device)");
    }
    double total = 0;
    for (double w : weights) {
      if (!(w >= 0) || !std::isfinite(w)) {
        throw config_error("data_parallel: device weights must be finite and >= 0, got " + std::to_string(w));
      }
      total += w;
    }
    if (total <= 0) throw config_error("data_parallel: at least one device weight must be positive");
    shares_.resize(n);
    for (std::size_t i = 0; i < n; ++i) shares_[i] = weights[i] / total;
    stats_.shares = shares_;
  }

  [[nodiscard]] M& module() noexcept { return *replicas_[0]; }
  [[nodiscard]] M& replica(std::size_t i) { return *replicas_.at(i); }
  [[nodiscard]] Opt& optimizer(std::size_t i = 0) { return *optimizers_.at(i); }
  [[nodiscard]] const std::vector<device>& devices() const noexcept { return devices_; }
  [[nodiscard]] std::span<const double> shares() const noexcept { return shares_; }
  [[nodiscard]] const data_parallel_stats& stats() const noexcept { return stats_; }
  [[nodiscard]] const data_parallel_options& options() const noexcept { return opts_; }

 private:
  enum class step_phase { none, compute, reduce, update, done };
  struct device_result {
    double loss = 0, compute_s = 0, reduce_s = 0, update_s = 0;
    std::atomic<step_phase> reached{step_phase::none};
  };
  // What a step's device jobs share; owned jointly so a job that outlives a timed-out step
  // still points at live memory.
  template <class Shard>
  struct step_state {
    std::vector<std::optional<Shard>> shards;
    std::vector<device_result> results;
    std::vector<std::size_t> counts;
    std::size_t n = 0;
    bool equal = false;
  };

  void validate_devices() {
    if (devices_.empty()) throw config_error("data_parallel: the device list is empty (expected at least one device)");
    constexpr bool cuda_params = std::same_as<S, cuda>;
    for (const auto& d : devices_) {
      if (d.is_cuda() != cuda_params) {
        throw config_error("data_parallel: device " + d.to_string() + " does not match the model, whose parameters are " +
                           (cuda_params ? "CUDA" : "host") + " tensors (expected only " +
                           (cuda_params ? "cuda:N" : "cpu") + " devices)");
      }
    }
  }

  // Every replica must have the same parameter list as replica 0.
  void check_replicas() {
    std::vector<std::size_t> sizes;
    for (auto&& p : replicas_[0]->parameters()) sizes.push_back(p.grad().size());
    total_ = 0;
    for (auto s : sizes) total_ += s;
    for (std::size_t i = 1; i < replicas_.size(); ++i) {
      std::size_t k = 0;
      for (auto&& p : replicas_[i]->parameters()) {
        if (k >= sizes.size() || p.grad().size() != sizes[k] || p.value().size() != sizes[k]) {
          throw config_error("data_parallel: replica " + std::to_string(i) + " on " + devices_[i].to_string() +
                             " differs from replica 0 at parameter #" + std::to_string(k) +
                             " (replicate_to must give the same parameters, in the same order and shapes)");
        }
        ++k;
      }
      if (k != sizes.size()) {
        throw config_error("data_parallel: replica " + std::to_string(i) + " has " + std::to_string(k) +
                           " parameters, replica 0 has " + std::to_string(sizes.size()));
      }
    }
  }

  // A step that timed out leaves jobs behind; once they have all finished, the policy rebuilds its
  // group and re-synchronises parameters, and works again.
  void check_usable(const char* op) {
    if (stuck_.empty()) return;
    if (std::all_of(stuck_works_.begin(), stuck_works_.end(), [](const work& w) { return w.is_completed(); })) {
      stuck_.clear();
      stuck_works_.clear();
      recover(nullptr, /*resync=*/true);
      return;
    }
    throw communication_error(std::string("data_parallel::") + op + ": refused, " + stuck_ +
                              " still running a step that timed out");
  }

  // Gradients of replica i into its flat host buffer, times scale (the replica's batch share).
  void pack_grads(std::size_t i, double scale) {
    auto& ctx = *contexts_[i];
    T* dst = flat_[i].data();
    std::size_t off = 0;
    for (auto&& p : replicas_[i]->parameters()) {
      tensor_view<const T, S> g = p.grad();
      ctx.copy_out(dst + off, g);
      off += g.size();
    }
    ctx.synchronize();
    if (scale != 1.0) {
      for (std::size_t k = 0; k < total_; ++k) {
        if constexpr (std::is_floating_point_v<T>) {
          dst[k] = static_cast<T>(dst[k] * static_cast<T>(scale));
        } else {
          dst[k] = T(static_cast<float>(dst[k]) * static_cast<float>(scale));
        }
      }
    }
  }
  void pack_values(std::size_t i) {
    auto& ctx = *contexts_[i];
    T* dst = flat_[i].data();
    std::size_t off = 0;
    for (auto&& p : replicas_[i]->parameters()) {
      tensor_view<const T, S> v = p.value();
      ctx.copy_out(dst + off, v);
      off += v.size();
    }
    ctx.synchronize();
  }
  void unpack(std::size_t i, bool into_grads) {
    auto& ctx = *contexts_[i];
    const T* src = flat_[i].data();
    std::size_t off = 0;
    for (auto&& p : replicas_[i]->parameters()) {
      auto v = into_grads ? p.grad() : p.value();
      ctx.copy_in(v, src + off, v.size());
      off += v.size();
    }
    ctx.synchronize();
  }

  // Runs job(i) on every device's worker and waits (bounded). On failure: aborts the group so no
  // device waits for the failed one, rebuilds the group, re-synchronises parameters if some
  // replica may have stepped, and throws replica_error naming the first device that failed.
  template <class Job>
  void dispatch(const char* op, bool collective, Job job, const std::vector<device_result>* results = nullptr) {
    const std::size_t n = devices_.size();
    auto shared_job = std::make_shared<Job>(std::move(job));
    auto errors = std::make_shared<std::vector<std::exception_ptr>>(n);
    auto first = std::make_shared<std::atomic<int>>(-1);
    std::vector<work> works;
    works.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      works.push_back(workers_[i]->submit([this, i, op, collective, shared_job, errors, first] {
        try {
          (*shared_job)(i);
        } catch (...) {
          (*errors)[i] = std::current_exception();
          int expected = -1;
          first->compare_exchange_strong(expected, static_cast<int>(i));
          // Peers blocked in this step's collective stop waiting for us.
          if (collective) {
            groups_[i]->abort("device " + devices_[i].to_string() + " (replica " + std::to_string(i) +
                              ") failed in " + op + ": " + detail::dp::what((*errors)[i]));
          }
        }
      }));
    }
    const auto deadline = std::chrono::steady_clock::now() + opts_.timeout;
    std::string late;
    for (std::size_t i = 0; i < n; ++i) {
      const auto left = deadline - std::chrono::steady_clock::now();
      if (!works[i].wait_for(std::max(left, decltype(left)::zero()))) {
        late += (late.empty() ? "" : ", ") + devices_[i].to_string() + " (replica " + std::to_string(i) + ")";
      }
    }
    if (!late.empty()) {
      // The late jobs still hold references into this frame: they must be allowed to finish
      // (the worker joins them at destruction), and nothing else may run on these devices.
      groups_[0]->abort(std::string("data_parallel::") + op + " timed out");
      stuck_ = "device(s) " + late + " are";
      stuck_works_ = std::move(works);
      throw timeout_error(std::string("data_parallel::") + op + ": device(s) " + late + " did not finish within " +
                          std::to_string(opts_.timeout.count()) + " ms");
    }
    const int culprit = first->load();
    if (culprit < 0) return;
    const auto c = static_cast<std::size_t>(culprit);
    if (collective) recover(results, /*resync=*/false);
    try {
      std::rethrow_exception((*errors)[c]);
    } catch (...) {
      std::throw_with_nested(replica_error(devices_[c], c,
                                           "data_parallel::" + std::string(op) + ": device " + devices_[c].to_string() +
                                               " (replica " + std::to_string(c) + ") failed: " +
                                               detail::dp::what((*errors)[c]) + " (the step was stopped on all " +
                                               std::to_string(n) + " devices)"));
    }
  }

  // After a failed collective step: a fresh local group (the old one stays aborted), and if any
  // replica may have changed its parameters, copy replica 0's to all others.
  void recover(const std::vector<device_result>* results, bool resync) {
    groups_ = make_local_world(static_cast<int>(devices_.size()), pg_opts_);
    bool stepped = resync;
    if (results) {
      for (const auto& r : *results) {
        const auto p = r.reached.load();
        stepped = stepped || p == step_phase::update || p == step_phase::done;
      }
    }
    if (!stepped) return;
    dispatch("resynchronise parameters", /*collective=*/true, [this](std::size_t i) {
      contexts_[i]->activate();
      if (i == 0) pack_values(0);
      groups_[i]->broadcast(flat_[i].view(), 0).wait();
      if (i != 0) unpack(i, /*into_grads=*/false);
    });
    // Optimizer state (momentum, moments) too, where the optimizer can save and load it;
    // otherwise replicas that skipped the failed step keep their own state.
    if constexpr (stateful_optimizer<Opt>) {
      auto bytes = std::make_shared<std::vector<std::byte>>();
      dispatch("resynchronise optimizer state", /*collective=*/false, [this, bytes](std::size_t i) {
        if (i != 0) return;
        contexts_[0]->activate();
        state_writer w;
        optimizers_[0]->save_state(w);
        *bytes = w.release();
      });
      dispatch("resynchronise optimizer state", /*collective=*/false, [this, bytes](std::size_t i) {
        if (i == 0) return;
        contexts_[i]->activate();
        state_reader r(*bytes);
        optimizers_[i]->load_state(r);
      });
    }
  }

  std::vector<device> devices_;
  data_parallel_options opts_;
  process_group_options pg_opts_;
  std::vector<double> shares_;
  detail::dp::balancer balancer_;
  data_parallel_stats stats_;
  std::vector<M*> replicas_;
  std::vector<std::unique_ptr<M>> owned_;
  std::vector<std::unique_ptr<Opt>> optimizers_;
  std::vector<host_buffer<T>> flat_;
  std::size_t total_ = 0;
  std::vector<std::unique_ptr<local_group>> groups_;
  std::vector<std::unique_ptr<detail::dp::device_context>> contexts_;
  std::string stuck_;
  std::vector<work> stuck_works_;
  // Each device's last collective, kept until the next train_step: an error it carries was made on
  // the backend's thread, and holding the work keeps that thread from being the one to free it
  // while a device thread or the caller still reads it.
  std::vector<std::optional<work>> held_;
  // Last: the worker threads are joined before anything they use goes away.
  std::vector<std::unique_ptr<detail::executor>> workers_;
};

template <class M, class F>
data_parallel(M&, std::vector<device>, F, data_parallel_options = {})
    -> data_parallel<M, std::remove_cvref_t<std::invoke_result_t<F&, M&>>>;

namespace functional {

// One forward pass over several devices, stateless (torch.nn.parallel.data_parallel): the model
// runs on devices[0] itself and is replicated to the others for this call; the batch is split
// evenly; each device writes its rows of out, so outputs come back in the batch's order.
template <class M, class B, class U>
void data_parallel(M& model, const B& batch, std::span<const device> devices, tensor_view<U> out) {
  static_assert(detail::dp::check_model<M>());
  static_assert(splittable_batch<B>, "partrain: data_parallel cannot split this batch type");
  using shard_t = std::remove_cvref_t<decltype(split_batch(batch, 0, 0))>;
  static_assert(forwardable_on<M, shard_t>,
                "partrain: the functional data_parallel needs `forward(const Batch&, tensor_view<float> out)` on the model");
  if (devices.empty()) throw config_error("data_parallel: the device list is empty (expected at least one device)");
  const std::size_t n = batch_size_of(batch);
  if (out.rank() == 0 || out.extent(0) != n) {
    throw invalid_argument_error("data_parallel (functional): out has shape " + out.shape().to_string() +
                                 ", expected a first dimension of " + std::to_string(n) + " (the batch size)");
  }
  if (n == 0) return;
  const std::vector<double> even(devices.size(), 1.0);
  const auto counts = detail::dp::split_counts(n, even);
  const auto offsets = detail::dp::split_offsets(counts);
  std::vector<std::exception_ptr> errors(devices.size());
  {
    std::vector<std::jthread> threads;
    for (std::size_t i = 0; i < devices.size(); ++i) {
      if (!counts[i]) continue;
      threads.emplace_back([&, i] {
        try {
          detail::dp::device_context ctx(devices[i]);
          ctx.activate();
          auto shard = split_batch(batch, offsets[i], offsets[i + 1]);
          auto rows = out.slice(offsets[i], offsets[i + 1]);
          if (i == 0) {
            model.forward(shard, rows);
          } else {
            M replica = model.replicate_to(devices[i]);
            replica.forward(shard, rows);
          }
          ctx.synchronize(/*whole_device=*/true);
        } catch (...) {
          errors[i] = std::current_exception();
        }
      });
    }
  }
  for (std::size_t i = 0; i < errors.size(); ++i) {
    if (!errors[i]) continue;
    try {
      std::rethrow_exception(errors[i]);
    } catch (...) {
      std::throw_with_nested(replica_error(devices[i], i,
                                           "data_parallel (functional) forward: device " + devices[i].to_string() +
                                               " (replica " + std::to_string(i) + ") failed: " +
                                               detail::dp::what(errors[i])));
    }
  }
}

// The same, allocating the outputs: [batch size, model.output_size()].
template <class M, class B>
  requires has_output_size<M>
[[nodiscard]] host_buffer<float> data_parallel(M& model, const B& batch, std::span<const device> devices) {
  host_buffer<float> out(shape{batch_size_of(batch), static_cast<std::size_t>(model.output_size())});
  functional::data_parallel(model, batch, devices, out.view());
  return out;
}

}  // namespace functional

}  // namespace partrain::inline v0
