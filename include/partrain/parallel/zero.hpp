// partrain/parallel/zero.hpp: sharded data parallel, ZeRO stages 1 and 2 (DeepSpeed's ZeRO-1/2,
// PyTorch's ZeroRedundancyOptimizer without its extra broadcast). Every rank trains the whole
// model on its batch, as under DDP; the flat parameter space is cut among the ranks (by default
// each of DDP's buckets among all of them, so a bucket's reduce_scatter starts in backward the
// moment its gradients are final); gradients are averaged with a reduce_scatter bucket by
// bucket, so each rank receives only its own elements'; each rank keeps the optimizer state of
// its elements only and steps them; the updated elements are all_gathered. That moves what one
// all_reduce moves (reduce_scatter + all_gather), i.e. DDP's traffic, plus under n padding
// elements per bucket. The whole step, optimizer included, is train_step (as data_parallel's);
// no_sync accumulates, global-norm clipping spans the shards, join() handles uneven inputs.
//
//   sharded_data_parallel zero(model, group, adamw_options{.lr = 1e-3}, {.stage = 2});
//   for (auto& b : batches) zero.train_step(b);
//
// Host or CUDA parameters: the policy's buffers and the shard's optimizer state live where the
// parameters do (CUDA: on their device, the element loops as kernels on the communicator's input
// stream, so the backend must reduce CUDA memory: NCCL). The model's own parameters and gradients
// stay whole (the model owns them), so ZeRO-1/2 save optimizer state (and, stage 2, gradient
// buffers), not parameter memory. A model with 16-bit (half, bfloat16) parameters has its fp32 masters kept
// sharded here, beside their optimizer state; see docs/sharding.md.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <partrain/comm/local.hpp>
#include <partrain/comm/process_group.hpp>
#include <partrain/config.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/for_each_index.hpp>
#include <partrain/core/half.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/core/work.hpp>
#include <partrain/model/concepts.hpp>
#include <partrain/model/traits.hpp>
#include <partrain/optim/clip.hpp>
#include <partrain/optim/optimizer.hpp>
#include <partrain/parallel/detail/buckets.hpp>
#include <partrain/parallel/detail/ddp_elements.hpp>
#include <partrain/parallel/detail/evaluate.hpp>
#include <partrain/parallel/detail/host_staging.hpp>
#include <partrain/parallel/detail/buffers.hpp>
#include <partrain/parallel/detail/no_sync_guard.hpp>
#include <partrain/parallel/detail/sharded_join.hpp>
#include <partrain/parallel/detail/zero_layout.hpp>
#include <partrain/parallel/detail/zero_optimizer.hpp>
#include <partrain/parallel/detail/zero_space.hpp>
#include <partrain/parallel/mesh_clip.hpp>

#if PARTRAIN_HAS_CUDA
#include <partrain/cuda/device_guard.hpp>
#endif
#if defined(__CUDACC__)
#include <partrain/parallel/detail/zero_kernels.cuh>
#endif

namespace partrain::inline v0 {

// How the flat parameter space is cut among the ranks (docs/sharding.md).
enum class zero_partition {
  // The flat space, walked backwards, cut into buckets (first_bucket_bytes, then
  // bucket_cap_bytes) and each bucket among all ranks: a bucket's reduce_scatter starts in
  // backward the moment the gradients it holds are final (for a model whose train_step reports
  // them, notifies_grad_ready). Each rank owns one range per bucket.
  per_bucket,
  // One contiguous range per rank; the reduce_scatters start after backward, since the shard of
  // the first layers is final last.
  contiguous,
};

struct zero_options {
  // 1: optimizer state sharded; the gradients are kept whole (bucket-major) between backward and
  // the reduce_scatter. 2: gradients sharded too; only the reduced shard and two bucket slots are
  // kept (a whole copy only while no_sync accumulates, as FSDP's no_sync).
  int stage = 2;
  zero_partition partition = zero_partition::per_bucket;
  // All ranks' blocks of one bucket together (PyTorch's bucket_cap_mb = 25).
  std::size_t bucket_cap_bytes = std::size_t{25} << 20;
  // per_bucket: the first bucket's (the last elements, final first in backward), small so that
  // communication starts early (as ddp_options::first_bucket_bytes).
  std::size_t first_bucket_bytes = std::size_t{1} << 20;
  // per_bucket: launch each bucket's reduce_scatter in backward once its gradients are final
  // (for a model whose train_step reports them). Both partitions: step each bucket's elements
  // and launch its all_gather as soon as its reduce_scatter landed, while later buckets still
  // reduce. Clipping needs the global norm first, so it waits for every bucket either way.
  bool overlap = true;
  // Copy rank 0's parameter values to every rank at construction.
  bool broadcast_parameters = true;
  // A model with buffers (has_buffers): rank 0's are copied to every rank at construction and,
  // when true, before every step, as ddp_options::broadcast_buffers; they stay whole on every rank.
  bool broadcast_buffers = true;
  // > 0: clip the global gradient norm (over every shard) to this before the step.
  double max_grad_norm = 0;
  // no_sync accumulation: true averages the k micro-steps, false sums them (as ddp_options).
  bool average_accumulated = true;
  // Uneven inputs: ranks that ran out of data call join() and shadow the others (PyTorch Join).
  // A joined rank still owns its shard, so it takes part in every step with zero gradients and
  // steps its shard: the parameters stay equal everywhere, no broadcast is needed afterwards.
  bool join = false;
  // Under join: divide by the world size even when some ranks already joined (PyTorch's
  // divide_by_initial_world_size=True); false divides by the number of ranks still active.
  bool divide_by_initial_world_size = true;
  // 16-bit parameters: reduce_scatter the gradients in fp32 (twice the bytes, no 16-bit rounding
  // of the sum). false: in the parameters' type, as DDP on that model all_reduces them.
  bool fp32_reduce = false;
  // Ranks that are threads of one process (the local backend), host parameters of the master
  // type, each rank's values and gradients one buffer: the step runs over shared memory, each rank
  // averaging its blocks of every rank's gradients a cache-sized piece at a time, stepping them
  // and writing the new values into every rank's parameters, all in one meeting (no reduce_scatter
  // buffer, no all_gather). The same arithmetic, so the same bits; the gradient hook, clipping and
  // no_sync accumulation take the reduce_scatter path. false: always that path.
  bool shared_memory_step = true;
};

// What one rank holds, in bytes (so a benchmark can print it beside DDP's).
struct sharded_memory {
  std::size_t parameter_bytes = 0;        // the model's parameters: whole on every rank under ZeRO-1/2
  std::size_t model_gradient_bytes = 0;   // the model's own gradients (its backward writes them whole)
  std::size_t gradient_bytes = 0;         // gradient buffers the policy holds (see zero_options::stage)
  std::size_t optimizer_state_bytes = 0;  // this rank's shard of momentum / Adam moments
  std::size_t master_bytes = 0;           // 16-bit parameters: this rank's fp32 masters (else 0: the model's values are the masters)
  std::size_t communication_bytes = 0;    // all_gather slots
  std::size_t shard_elements = 0;         // this rank's shard
  std::size_t padding_elements = 0;       // communicated to round each bucket up to n equal blocks, never stored in a parameter
};

template <class M, communicator C = process_group>
class sharded_data_parallel {
  static_assert(check_model<M>(), "partrain: sharded_data_parallel takes a model");
  using P = param_t<M>;
  using T = param_element_t<P>;
  using S = param_space_t<P>;
  static_assert(std::same_as<S, host> || std::same_as<S, cuda>, "partrain: parameters must be in host or CUDA memory");
#if !defined(__CUDACC__)
  static_assert(std::same_as<S, host>,
                "partrain: sharded_data_parallel with CUDA parameters must be compiled by nvcc (its element loops run "
                "as kernels on the parameters' device)");
#endif
  static_assert(std::same_as<T, float> || std::same_as<T, double> || std::same_as<T, half> || std::same_as<T, bfloat16>,
                "partrain: sharded_data_parallel averages and steps float, double, half or bfloat16 parameters");
  // 16-bit parameters: each rank keeps the fp32 masters of its own elements (the model holds
  // only the 16-bit copy), reduces the gradients in fp32 and gathers the updated 16-bit values.
  static constexpr bool sharded_masters = std::same_as<T, half> || std::same_as<T, bfloat16>;
  using W = std::conditional_t<sharded_masters, float, T>;
  // Where the policy's buffers live and how elements move there (detail/zero_space.hpp).
  using X = detail::zero::place<S>;
  template <class U>
  using buffer = typename X::template buffer<U>;

 public:
  // What the optimizer steps and a checkpoint saves: the parameters' type, or fp32 for 16-bit ones.
  using master_type = W;

  sharded_data_parallel(M& m, C& comm, shard_optimizer_options optimizer, zero_options o = {})
      : model_(&m), comm_(&comm), opts_(o), rank_(static_cast<std::size_t>(comm.rank())),
        world_(static_cast<std::size_t>(comm.size())) {
    if (opts_.stage != 1 && opts_.stage != 2) {
      throw invalid_argument_error(where() + "zero_options::stage must be 1 or 2, got " + std::to_string(opts_.stage) +
                                   " (stage 3, sharded parameters, is not in this release)");
    }
    if (opts_.bucket_cap_bytes == 0 || opts_.first_bucket_bytes == 0) {
      throw invalid_argument_error(where() + "zero_options::bucket_cap_bytes and first_bucket_bytes must be > 0 (got " +
                                   std::to_string(opts_.bucket_cap_bytes) + " and " +
                                   std::to_string(opts_.first_bucket_bytes) + ")");
    }
    if (opts_.partition != zero_partition::per_bucket && opts_.partition != zero_partition::contiguous) {
      throw invalid_argument_error(where() + "zero_options::partition must be per_bucket or contiguous, got " +
                                   std::to_string(static_cast<int>(opts_.partition)));
    }
    detail::optim::check_max_grad_norm(opts_.max_grad_norm, where() + "zero_options::max_grad_norm");
    collect_views();
    note_split_parameters();
    at_ = make_place();
    model_stream_ = model_stream(m);
    at_.after(model_stream_);  // the parameters as the model made them
    verify_parameters();
    if (opts_.broadcast_parameters) broadcast_parameters();
    sync_buffers();
    make_layout();
    decide_shared();
    optimizer_.emplace(optimizer, shard_elements_, at_.device(), at_.stream());
    if (!shared_) make_reduce_buffers();  // the shared-memory step needs none of them
    if constexpr (sharded_masters) {
      at_.allocate(masters_, shard_elements_);
      for (std::size_t k = 0; k < layout_.buckets(); ++k) {
        values_.read(layout_.real_block(k, rank_), masters_.data() + element_at_[k], false, at_);
      }
    }
    at_.finish();
  }
  sharded_data_parallel(const sharded_data_parallel&) = delete;
  sharded_data_parallel& operator=(const sharded_data_parallel&) = delete;
  ~sharded_data_parallel() { drain(); }

  // The model's step on this rank's batch, then (outside no_sync) the gradients averaged into
  // each rank's shard, clipped, the shard stepped and the parameters all_gathered. Returns this
  // rank's loss.
  template <class B>
  double train_step(const B& batch) {
    static_assert(check_trainable<M, B>());
    if (joined_) throw invalid_argument_error(where() + "train_step after join() on this rank (join() ends this rank's steps until every rank joined)");
    if (opts_.broadcast_buffers) sync_buffers();
    ranks_ = static_cast<double>(world_);
    if (opts_.join) {
      std::array<std::int64_t, 2> flag{1, require_sync_ ? 1 : 0};
      agree_flag(flag, "active-rank all_reduce");
      detail::zero::check_active_ranks(flag, where());
      if (!opts_.divide_by_initial_world_size) ranks_ = static_cast<double>(flag[0]);
    }
    if (require_sync_) {
      try {
        const double loss = synchronizing_step(batch);
        accumulated_ = 0;
        if (opts_.stage == 2) at_.release(whole_);
        ++steps_;
        return loss;
      } catch (...) {
        drain();
        accumulated_ = 0;
        throw;
      }
    }
    const double loss = model_->train_step(batch);
    collect_views();
    at_.after(model_stream_);
    if (whole_.empty()) at_.allocate(whole_, layout_.padded());
    for (std::size_t k = 0; k < layout_.buckets(); ++k) {
      detail::zero::pack_bucket(layout_, k, grads_, whole_.data() + layout_.bucket_offset(k), accumulated_ > 0, at_);
    }
    at_.finish();  // read before the model's next backward overwrites its gradients
    ++accumulated_;
    return loss;
  }

  // Uneven inputs (needs zero_options::join): call once this rank has no more batches. Until
  // every rank joined, it takes part in each synchronizing step of the others with zero
  // gradients, and steps its shard with the reduced gradient. Returns true when it shadowed at
  // least one step. Afterwards the ranks are ready for the next epoch.
  bool join() {
    detail::zero::check_join_allowed(opts_.join, accumulated_, where(), "zero_options");
    joined_ = true;
    bool shadowed = false;
    try {
      for (;;) {
        std::array<std::int64_t, 2> flag{0, 0};
        agree_flag(flag, "join all_reduce");
        if (flag[0] == 0) break;
        shadowed = true;
        if (flag[1] == 0) continue;  // the active ranks accumulate: nothing is communicated
        if (zeros_.size() != values_.total()) at_.allocate(zeros_, values_.total());
        const auto real = grads_;
        grads_ = detail::zero::flat_views<T, S>({tensor_view<T, S>(zeros_.data(), zeros_.size())});
        ranks_ = opts_.divide_by_initial_world_size ? static_cast<double>(world_) : static_cast<double>(flag[0]);
        try {
          reduce_step_gather();
        } catch (...) {
          grads_ = real;
          drain();
          throw;
        }
        grads_ = real;
        if (opts_.stage == 2) at_.release(whole_);
        ++steps_;
        ++shadow_steps_;
      }
    } catch (...) {
      joined_ = false;
      throw;
    }
    joined_ = false;
    at_.release(zeros_);
    return shadowed;
  }
  // Steps this rank took part in after join() (all joins so far).
  [[nodiscard]] std::size_t shadow_steps() const noexcept { return shadow_steps_; }

  // RAII: steps inside accumulate gradients locally; the first step after it reduces them all.
  using no_sync_guard = detail::ddp::no_sync_guard;
  [[nodiscard]] no_sync_guard no_sync() { return no_sync_guard(require_sync_); }

  // This rank's batches evaluated, loss, correct and count summed over all ranks.
  template <class Range>
  [[nodiscard]] eval_result evaluate(Range&& batches) {
    return detail::ddp::sum_over_ranks(detail::ddp::evaluate_batches(*model_, std::forward<Range>(batches)),
                                       [&](std::span<double> sums) { small_all_reduce(sums, "evaluation all_reduce"); });
  }

  // Called on every rank with its reduced gradient slice after the reduce_scatters, before
  // clipping and the step; returning false skips this step's update and all_gather (every rank
  // must decide alike, e.g. by agreeing across ranks). What mixed precision's unscale and
  // overflow check plug into (precision/sharded_amp.hpp). Empty: none. CUDA parameters: the slice
  // is in device memory, finished when the hook runs.
  using gradient_hook = std::function<bool(tensor_view<W, S>)>;
  void set_gradient_hook(gradient_hook h) { hook_ = std::move(h); }
  // Whether steps run over shared memory (zero_options::shared_memory_step; all ranks agree).
  [[nodiscard]] bool shared_memory_step() const noexcept { return shared_ != nullptr; }
  // Whether the last synchronizing step's update was skipped by the gradient hook.
  [[nodiscard]] bool last_step_skipped() const noexcept { return skipped_; }

  void set_lr(double lr) { optimizer_->set_lr(lr); }
  // The clipping of zero_options::max_grad_norm from the next step on (fit's max_grad_norm).
  void set_max_grad_norm(double v) {
    detail::optim::check_max_grad_norm(v, where() + "set_max_grad_norm");
    opts_.max_grad_norm = v;
  }
  [[nodiscard]] double lr() const noexcept { return optimizer_->lr(); }
  // The global gradient norm of the last synchronizing step, before clipping (NaN without clipping).
  [[nodiscard]] double last_grad_norm() const noexcept { return last_norm_; }
  [[nodiscard]] std::int64_t steps() const noexcept { return steps_; }

  [[nodiscard]] M& module() noexcept { return *model_; }
  [[nodiscard]] C& comm() noexcept { return *comm_; }
  [[nodiscard]] const zero_options& options() const noexcept { return opts_; }
  // The ranges of the flat parameter space rank r owns (ascending), this rank's element count,
  // and the whole space's size.
  [[nodiscard]] std::vector<detail::zero::flat_range> flat_segments(std::size_t r) const { return layout_.segments(r); }
  [[nodiscard]] std::size_t shard_elements() const noexcept { return shard_elements_; }
  [[nodiscard]] std::size_t total_elements() const noexcept { return layout_.total(); }
  [[nodiscard]] std::size_t buckets() const noexcept { return layout_.buckets(); }
  // Buckets whose reduce_scatter the last synchronizing step launched inside the model's backward.
  [[nodiscard]] std::size_t buckets_launched_in_backward() const noexcept { return launched_in_backward_; }
  // Seconds spent launching reduce_scatters (copy, divide, launch) and waiting for them once the
  // last gradient was final (the model's last report, or its train_step's return), summed over
  // all steps: the gradient communication backward did not hide (the shared-memory step: all
  // of it, the optimizer included).
  [[nodiscard]] double exposed_reduce_seconds() const noexcept { return exposed_reduce_s_; }

  [[nodiscard]] sharded_memory memory() const noexcept {
    const auto bytes = [](const auto& v) { return v.size() * sizeof(*v.data()); };
    sharded_memory r;
    r.parameter_bytes = layout_.total() * sizeof(T);
    r.model_gradient_bytes = layout_.total() * sizeof(T);
    r.gradient_bytes = bytes(shard_grad_) + bytes(whole_) + bytes(scatter_[0]) + bytes(scatter_[1]) + bytes(slot16_[0]) +
                       bytes(slot16_[1]) + bytes(shard16_);
    r.optimizer_state_bytes = optimizer_->state_bytes();
    r.master_bytes = bytes(masters_);
    r.communication_bytes = bytes(gather_[0]) + bytes(gather_[1]) + bytes(send_[0]) + bytes(send_[1]);
    r.shard_elements = shard_elements_;
    r.padding_elements = layout_.padded() - layout_.total();
    return r;
  }

  // This rank's optimizer state over its shard (what a sharded checkpoint writes), and back.
  // This rank's parameter values over flat_segments(rank), end to end, in the master type (the
  // fp32 masters for 16-bit parameters): what a sharded checkpoint saves.
  [[nodiscard]] std::vector<W> master_values() const {
    std::vector<W> out;
    if constexpr (sharded_masters) {
      out.resize(masters_.size());
      at_.to_host(out.data(), masters_.data(), masters_.size());
    } else {
      for (const auto& seg : layout_.segments(rank_)) {
        const std::size_t at = out.size();
        out.resize(at + seg.size());
        values_.read_to_host(seg, out.data() + at, at_);
      }
    }
    return out;
  }
  // Every parameter's value, the whole flat space (what a checkpoint load read): into the model
  // (rounded for 16-bit parameters) and this rank's masters.
  void load_values(std::span<const W> all) {
    if (all.size() != layout_.total()) {
      throw invalid_argument_error(where() + "load_values got " + std::to_string(all.size()) + " values, the model has " +
                                   std::to_string(layout_.total()));
    }
    if constexpr (sharded_masters) {
      std::vector<T> rounded(all.size());
      detail::for_each_index(detail::host_exec{}, all.size(), detail::ddp::compress_16_fn<W, T>{all.data(), rounded.data(), 1.0f});
      values_.write_from_host({0, all.size()}, rounded.data(), at_);
      for (std::size_t k = 0; k < layout_.buckets(); ++k) {
        const auto mine = layout_.real_block(k, rank_);
        at_.from_host(masters_.data() + element_at_[k], all.data() + mine.begin, mine.size());
      }
    } else {
      values_.write_from_host({0, all.size()}, all.data(), at_);
    }
  }

  [[nodiscard]] shard_optimizer_state<W> optimizer_state() const { return optimizer_->state(); }
  void load_optimizer_state(const shard_optimizer_state<W>& s, const std::string& source) {
    optimizer_->load(s, source);
  }
  [[nodiscard]] std::string optimizer_kind() const { return optimizer_->kind(); }

 private:
  [[nodiscard]] std::string where() const { return "rank " + std::to_string(rank_) + " sharded_data_parallel: "; }

  // Host: nothing to choose. CUDA: the parameters' device (all on one, the communicator's if it
  // is bound to one) and the communicator's input stream, which it orders its collectives after.
  [[nodiscard]] X make_place() {
    return X::make(
        *comm_, [&](auto&& fn) { for (auto&& p : model_->parameters()) fn(p); }, where(),
        "sharded_data_parallel keeps its shards on the parameters' device: use an nccl group, or "
        "distributed_data_parallel, which stages through the host");
  }

  // A few host numbers summed over the ranks (through a device copy on a backend that reduces
  // CUDA memory only); errors name this rank and `what`.
  template <class E>
  void small_all_reduce(std::span<E> data, const std::string& what) {
    detail::host_collective(
        *comm_, data, [&](auto view) { return comm_->all_reduce(view, reduce_op::sum); },
        [&](const work& w) { wait_named(w, what); }, at_.device());
  }

  // Per bucket: the flat space walked backwards (the order backward finishes gradients in) and
  // cut into ranges of first_bucket_bytes, then bucket_cap_bytes; a range may cut through a
  // parameter, so one bucket slot never exceeds the cap. A bucket is final once every parameter
  // it touches is.
  void make_layout() {
    const std::size_t total = values_.total();
    if (opts_.partition == zero_partition::contiguous) {
      layout_ = detail::zero::layout(total, world_, opts_.bucket_cap_bytes / sizeof(W) / world_);
    } else {
      const std::size_t first = std::max<std::size_t>(opts_.first_bucket_bytes / sizeof(W), 1);
      const std::size_t cap = std::max<std::size_t>(opts_.bucket_cap_bytes / sizeof(W), 1);
      std::vector<detail::zero::flat_range> spans;
      for (std::size_t end = total; end > 0;) {
        const std::size_t len = std::min(end, spans.empty() ? first : cap);
        spans.push_back({end - len, end});
        end -= len;
      }
      layout_ = detail::zero::layout::per_bucket(total, world_, spans);
      // Each parameter's buckets: a run of consecutive ones (spans descend); none when empty.
      param_buckets_.clear();
      pending_start_.assign(spans.size(), 0);
      std::size_t at = 0;
      for (auto&& p : model_->parameters()) {
        const std::size_t n = p.value().size();
        std::pair<std::size_t, std::size_t> ks{0, 0};
        if (n > 0) {
          // Buckets holding the parameter's last and first elements.
          const auto holding = [&](std::size_t e) {
            return static_cast<std::size_t>(std::find_if(spans.begin(), spans.end(), [&](const auto& r) { return r.begin <= e; }) -
                                            spans.begin());
          };
          ks = {holding(at + n - 1), holding(at) + 1};
          for (std::size_t k = ks.first; k < ks.second; ++k) ++pending_start_[k];
        }
        param_buckets_.push_back(ks);
        at += n;
      }
    }
    shard_elements_ = 0;
    element_at_.clear();
    for (std::size_t k = 0; k < layout_.buckets(); ++k) {
      element_at_.push_back(layout_.element_offset(k, rank_));
      shard_elements_ += layout_.real_block(k, rank_).size();
    }
  }

  // Forward, backward and the bucket's reduce_scatters (in backward where the model reports
  // final gradients and the partition allows), then the step and the all_gathers.
  template <class B>
  double synchronizing_step(const B& batch) {
    double loss = 0;
    if constexpr (notifies_grad_ready<M, B>) {
      if (opts_.overlap && layout_.is_per_bucket() && !use_shared()) {
        collect_views();  // the views the buckets are packed from while backward runs
        begin_reduction();
        pending_ = pending_start_;
        param_ready_.assign(param_buckets_.size(), 0);
        reported_ = 0;
        const grad_ready_fn ready = [this](std::size_t i) { mark_ready(i); };
        loss = model_->train_step(batch, ready);
        launched_in_backward_ = launched_;
        collect_views();
        exposed([&] { launch_from(launched_); });
        finish_reduction();
        return loss;
      }
    }
    loss = model_->train_step(batch);
    collect_views();
    launched_in_backward_ = 0;
    reduce_step_gather();
    return loss;
  }

  void mark_ready(std::size_t i) {
    detail::ddp::check_grad_ready(where(), i, param_ready_.size(), i < param_ready_.size() && param_ready_[i]);
    param_ready_[i] = 1;
    for (std::size_t k = param_buckets_[i].first; k < param_buckets_[i].second; ++k) --pending_[k];
    // Buckets launch in order on every rank, whatever order their gradients became final in.
    const auto launch = [&] {
      while (launched_ < layout_.buckets() && pending_[launched_] == 0) launch_bucket(launched_++);
    };
    // After the last gradient nothing is left to hide the buckets it completes behind.
    if (++reported_ == param_ready_.size()) {
      exposed(launch);
    } else {
      launch();
    }
  }

  // Runs f, counting its time as communication backward did not hide.
  template <class F>
  void exposed(F&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    exposed_reduce_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  // Parameters split over a tensor-parallel group (shard_group(), parallel/mesh_clip.hpp): their
  // flat ranges, so that clipping adds their squares over that group and counts the replicated
  // ones once.
  void note_split_parameters() { split_ = detail::mesh_clip::find_split(model_->parameters(), where()); }

  void collect_views() {
    std::vector<tensor_view<T, S>> values, grads;
    std::size_t i = 0;
    for (auto&& p : model_->parameters()) {
      tensor_view<T, S> v = p.value();
      tensor_view<T, S> g = p.grad();
      if (v.size() != g.size()) {
        throw invalid_argument_error(where() + "parameter " + detail::param_name(p, i) + " has " +
                                     std::to_string(v.size()) + " values but " + std::to_string(g.size()) +
                                     " gradient elements (expected the same shape)");
      }
      values.push_back(v);
      grads.push_back(g);
      ++i;
    }
    const std::size_t before = values_.total();
    values_ = detail::zero::flat_views<T, S>(std::move(values));
    grads_ = detail::zero::flat_views<T, S>(std::move(grads));
    if (optimizer_ && values_.total() != before) {
      throw invalid_argument_error(where() + "the model now has " + std::to_string(values_.total()) +
                                   " parameter elements, it had " + std::to_string(before) + " at construction");
    }
  }

  // Every rank must see the same parameter count, elements and shapes (a hash of them): each
  // rank's three numbers gathered through one all_reduce, so all ranks fail together.
  void verify_parameters() {
    std::uint64_t h = 0xcbf29ce484222325ull;
    std::int64_t count = 0;
    for (auto&& p : model_->parameters()) {
      const auto v = p.value();
      for (std::size_t d = 0; d < v.rank(); ++d) h = (h ^ v.extent(d)) * 0x100000001b3ull;
      h = (h ^ 0xffu) * 0x100000001b3ull;
      ++count;
    }
    std::vector<std::int64_t> all(3 * world_, 0);
    all[3 * rank_] = count;
    all[3 * rank_ + 1] = static_cast<std::int64_t>(values_.total());
    all[3 * rank_ + 2] = static_cast<std::int64_t>(h >> 1);
    small_all_reduce(std::span<std::int64_t>(all), "parameter check all_reduce");
    for (std::size_t q = 1; q < world_; ++q) {
      if (std::equal(all.begin(), all.begin() + 3, all.begin() + static_cast<std::ptrdiff_t>(3 * q))) continue;
      throw config_error(where() + "rank " + std::to_string(q) + " has " + std::to_string(all[3 * q]) +
                         " parameters of " + std::to_string(all[3 * q + 1]) + " elements" +
                         (all[3 * q + 2] != all[2] ? " (other shapes)" : "") + ", rank 0 has " + std::to_string(all[0]) +
                         " of " + std::to_string(all[1]) +
                         " (sharded_data_parallel expects the same model on every rank)");
    }
  }

  void agree_flag(std::array<std::int64_t, 2>& flag, const char* what) { small_all_reduce(std::span<std::int64_t>(flag), what); }

  void sync_buffers() {
    detail::broadcast_buffers(*comm_, *model_, [&](work& w) { wait_named(w, "buffer broadcast"); });
  }
  void broadcast_parameters() {
    std::vector<work> works;
    for (auto&& p : model_->parameters()) {
      tensor_view<T, S> v = p.value();
      if (!v.empty()) works.push_back(comm_->broadcast(v, 0));
    }
    wait_all(works, "parameter broadcast");
  }

  // The reduce_scatters, the shard's step and the all_gathers of one synchronizing step.
  void reduce_step_gather() {
    if (use_shared()) {
      exposed([&] { shared_step(); });
      return;
    }
    begin_reduction();
    exposed([&] { launch_from(0); });
    finish_reduction();
  }

  // One process's threads, host parameters of the master type in one buffer on every rank: the
  // step can run over shared memory. Every rank must agree, since the two paths communicate
  // differently; a model whose buffers differ between ranks takes the reduce_scatter path.
  void decide_shared() {
    if constexpr (std::same_as<S, host> && !sharded_masters && std::derived_from<C, process_group>) {
      auto* local = dynamic_cast<local_group*>(static_cast<process_group*>(comm_));
      const bool can = opts_.shared_memory_step && local && values_.contiguous_data() && grads_.contiguous_data();
      std::array<std::int64_t, 2> flag{can ? 1 : 0, 0};
      agree_flag(flag, "shared-memory check all_reduce");
      if (flag[0] == static_cast<std::int64_t>(world_)) shared_ = local;
    }
  }
  [[nodiscard]] bool use_shared() const noexcept {
    return shared_ && !hook_ && opts_.max_grad_norm == 0 && accumulated_ == 0;
  }

  // The step over shared memory (zero_options::shared_memory_step): one exchange in which this
  // rank takes its blocks of every rank's gradients a piece at a time (small enough to stay in
  // L1), divides and sums them in rank order as the reduce_scatter path does, steps the piece and
  // writes the new values into every rank's parameters. Nothing else touches those blocks meanwhile.
  void shared_step() {
    if constexpr (std::same_as<S, host> && !sharded_masters) shared_step_host();
  }
  void shared_step_host() {
    last_norm_ = std::nan("");
    skipped_ = false;
    T* mine = values_.contiguous_data();
    const T* grads = grads_.contiguous_data();
    if (layout_.total() > 0 && (!mine || !grads)) {
      throw invalid_argument_error(where() + "the model's parameter values or gradients are no longer one buffer each, "
                                   "as they were at construction (the shared-memory step needs them so; construct with "
                                   "zero_options{.shared_memory_step = false})");
    }
    optimizer_->begin_step();
    const double divisor = ranks_;  // no micro-steps accumulated on this path
    using peers_t = std::span<const local_group::peer_buffers>;
    auto body = [&](peers_t peers) {
      constexpr std::size_t piece = 2048;
      alignas(64) W g[piece];
      for (std::size_t k = 0; k < layout_.buckets(); ++k) {
        const auto r = layout_.real_block(k, rank_);
        for (std::size_t b = r.begin; b < r.end; b += piece) {
          const std::size_t n = std::min(piece, r.end - b);
          detail::sum_divided_typed(g, [&](std::size_t q) { return static_cast<const W*>(peers[q].in) + b; }, peers.size(), n,
                                    divisor);
          optimizer_->update(mine + b, g, element_at_[k] + (b - r.begin), n);
          for (std::size_t q = 0; q < peers.size(); ++q) {
            if (q != rank_) std::memcpy(static_cast<T*>(peers[q].out) + b, mine + b, n * sizeof(T));
          }
        }
      }
    };
    wait_named(shared_->exchange(grads, mine, layout_.total(), dtype_of<T>, body), "shared-memory step");
  }

  // The reduce_scatter path's buffers: at construction, or (where steps run over shared memory)
  // the first time a step takes that path.
  void make_reduce_buffers() {
    if (!shard_grad_.empty() || layout_.padded_shard() == 0) return;
    at_.allocate(shard_grad_, layout_.padded_shard());
    // Two buckets in flight need two slots; a model that fits one bucket needs one.
    const std::size_t slot = std::min(layout_.window(), layout_.padded_shard());
    const std::size_t slots = std::min<std::size_t>(2, layout_.buckets());
    for (std::size_t i = 0; i < slots; ++i) {
      at_.allocate(gather_[i], world_ * slot);
      at_.allocate(send_[i], slot);
      if (opts_.stage == 2) at_.allocate(scatter_[i], world_ * slot);
      if (reduce16()) at_.allocate(slot16_[i], world_ * slot);
    }
    if (reduce16()) at_.allocate(shard16_, layout_.padded_shard());
    // Stage 1 keeps the gradients whole until reduced (no_sync may have made this copy already).
    if (opts_.stage == 1 && whole_.empty()) at_.allocate(whole_, layout_.padded());
  }

  void begin_reduction() {
    make_reduce_buffers();
    const std::size_t nb = layout_.buckets();
    rs_.assign(nb, std::nullopt);
    ag_.assign(nb, std::nullopt);
    launched_ = 0;
    divisor_ = static_cast<W>(ranks_ * (opts_.average_accumulated ? static_cast<double>(accumulated_ + 1) : 1.0));
  }

  void launch_from(std::size_t first) {
    for (std::size_t k = first; k < layout_.buckets(); ++k) launch_bucket(k);
    launched_ = layout_.buckets();
  }

  // Bucket k packed (added to what no_sync accumulated, if anything), divided and reduce_scattered.
  void launch_bucket(std::size_t k) {
    const std::size_t w = layout_.window_size(k);
    at_.after(model_stream_);  // the gradients the model reported are made on its stream
    W* in = nullptr;
    if (!whole_.empty()) {  // stage 1, or stage 2 after no_sync micro-steps
      in = whole_.data() + layout_.bucket_offset(k);
      detail::zero::pack_bucket(layout_, k, grads_, in, accumulated_ > 0, at_);
    } else {
      if (k >= 2) wait_reduce(k - 2);  // its slot is free again
      in = scatter_[k % 2].data();
      detail::zero::pack_bucket(layout_, k, grads_, in, false, at_);
    }
    // Divided before the reduction, as DDP's hooks do (keeps the sum in range).
    if (divisor_ != W(1)) detail::ddp::divide_elements(at_.exec(), world_ * w, in, divisor_);
    if (reduce16()) {
      // Rounded to the parameters' type and reduced in it; wait_reduce widens the result.
      if (!whole_.empty() && k >= 2) wait_reduce(k - 2);  // its 16-bit slot is free again
      T* h = slot16_[k % 2].data();
      detail::for_each_index(at_.exec(), world_ * w, detail::ddp::compress_16_fn<W, T>{in, h, 1.0f});
      rs_[k] = comm_->reduce_scatter(tensor_view<const T, S>(h, world_ * w),
                                     tensor_view<T, S>(shard16_.data() + layout_.window_begin(k), w), reduce_op::sum);
      return;
    }
    rs_[k] = comm_->reduce_scatter(tensor_view<const W, S>(in, world_ * w),
                                   tensor_view<W, S>(shard_grad_.data() + layout_.window_begin(k), w), reduce_op::sum);
  }

  // After every reduce_scatter is launched: the hook, clipping, each bucket's step and all_gather.
  void finish_reduction() {
    const std::size_t nb = layout_.buckets();
    last_norm_ = std::nan("");
    skipped_ = false;
    if (opts_.max_grad_norm > 0 || !opts_.overlap || hook_) {
      exposed([&] {
        for (std::size_t k = 0; k < nb; ++k) wait_reduce(k);
      });
    }
    if (hook_) at_.finish();  // the hook may read the slice on another stream
    // The padded share: its padding elements are zero, so a norm or an overflow check over
    // them is the real elements'.
    if (hook_ && !hook_(tensor_view<W, S>(shard_grad_.data(), shard_grad_.size()))) {
      skipped_ = true;  // the parameters stay as they are on every rank: nothing to gather
      return;
    }
    if (opts_.max_grad_norm > 0) clip_shard();
    optimizer_->begin_step();
    for (std::size_t k = 0; k < nb; ++k) {
      exposed([&] { wait_reduce(k); });
      step_bucket(k);
      if (k >= 2) finish_gather(k - 2);
      const std::size_t w = layout_.window_size(k);
      T* send = send_[k % 2].data();
      const auto mine = layout_.real_block(k, rank_);
      if constexpr (sharded_masters) {
        const W* m = masters_.data() + element_at_[k];
        detail::for_each_index(at_.exec(), mine.size(), detail::ddp::compress_16_fn<W, T>{m, send, 1.0f});
      } else {
        values_.read(mine, send, false, at_);
      }
      at_.fill_zero(send + mine.size(), w - mine.size());
      ag_[k] = comm_->all_gather(tensor_view<const T, S>(send, w), tensor_view<T, S>(gather_[k % 2].data(), world_ * w));
    }
    for (std::size_t k = nb >= 2 ? nb - 2 : 0; k < nb; ++k) finish_gather(k);
    at_.finish();  // the parameters are whole before the model's next forward, on any stream
  }

  // Global-norm clipping across shards: Σg² of this shard, summed over ranks (one double
  // all_reduce), then clip_grad_norm's rule on the shard.
  // Global-norm clipping across shards: Σg² of this shard, summed over ranks (one double
  // all_reduce), then clip_grad_norm's rule on the shard. A model split over a tensor-parallel
  // group: its split parameters' squares add over that group too, the replicated ones' do not.
  void clip_shard() {
    using shard = detail::optim::gradient_only<W, S>;
    const std::array<shard, 1> mine{shard{tensor_view<W, S>(shard_grad_.data(), shard_grad_.size())}};
    std::array<double, 2> sum{0.0, 0.0};  // split parameters' elements, the rest
    if (!split_.group) {
      sum[1] = detail::optim::grad_sum_squares(mine, at_.stream());
    } else {
      for (std::size_t k = 0; k < layout_.buckets(); ++k) {
        const auto r = layout_.real_block(k, rank_);
        const auto s = detail::mesh_clip::split_squares<W, S>(shard_grad_.data() + layout_.window_begin(k), r.begin, r.end,
                                                               split_.ranges, at_.stream());
        sum[0] += s[0];
        sum[1] += s[1];
      }
    }
    last_norm_ = detail::mesh_clip::split_norm(
        sum, [&](std::span<double> v) { small_all_reduce(v, "gradient-norm all_reduce"); }, split_.group);
    detail::optim::clip_to_norm(mine, last_norm_, opts_.max_grad_norm, at_.stream());
  }

  // The optimizer on this rank's real elements of bucket k (they may span several parameters).
  void step_bucket(std::size_t k) {
    const auto mine = layout_.real_block(k, rank_);
    const W* g = shard_grad_.data() + layout_.window_begin(k);
    const std::size_t at = element_at_[k];
    if constexpr (sharded_masters) {
      optimizer_->update(masters_.data() + at, g, at, mine.size());
    } else {
      values_.for_each_piece(mine, [&](T* v, std::size_t off, std::size_t len) {
        optimizer_->update(v, g + off, at + off, len);
      });
    }
  }

  void wait_reduce(std::size_t k) {
    if (!rs_[k]) return;
    wait_bucket(rs_[k], "gradient reduce_scatter", k);
    if (reduce16()) {
      const T* h = shard16_.data() + layout_.window_begin(k);
      W* g = shard_grad_.data() + layout_.window_begin(k);
      detail::for_each_index(at_.exec(), layout_.window_size(k), detail::ddp::decompress_16_fn<T, W>{h, g});
    }
  }
  // 16-bit parameters, gradients reduced in their type.
  [[nodiscard]] bool reduce16() const noexcept { return sharded_masters && !opts_.fp32_reduce; }

  void finish_gather(std::size_t k) {
    if (!ag_[k]) return;
    wait_bucket(ag_[k], "parameter all_gather", k);
    // With masters, this rank's own block comes back rounded like the others'; without, it is
    // already in place.
    detail::zero::unpack_bucket(layout_, k, gather_[k % 2].data(), values_, sharded_masters ? world_ : rank_, at_);
  }

  void wait_bucket(std::optional<work>& w, std::string_view what, std::size_t k) {
    if (!w) return;
    work done = std::move(*w);
    w.reset();
    wait_named(done, std::string(what) + " of bucket " + std::to_string(k) + " (of " +
                         std::to_string(layout_.buckets()) + ")");
  }

  void wait_all(std::vector<work>& works, const std::string& what) {
    partrain::wait_all(works, [&](work& w) { wait_named(w, what); });
  }

  // Waits, and names this rank and the operation in a communication failure (keeping its type).
  void wait_named(const work& w, const std::string& what) {
    detail::zero::wait_named(w, where() + what, static_cast<int>(rank_), what,
                             opts_.join ? std::string_view()
                                        : ". If ranks run out of batches at different steps, construct with "
                                          "zero_options{.join = true} and call join() on a rank once its data ends");
  }

  // Waits for whatever is in flight, ignoring errors: the buffers must outlive the backend's use.
  void drain() noexcept {
    for (auto* list : {&rs_, &ag_}) {
      for (auto& w : *list) {
        if (!w) continue;
        try {
          w->wait();
        } catch (...) {
        }
        w.reset();
      }
    }
  }

  M* model_;
  C* comm_;
  zero_options opts_;
  std::size_t rank_, world_;
  X at_;                                   // where the buffers below live (the parameters' space)
  void* model_stream_ = nullptr;          // CUDA: the stream the model makes its gradients on
  detail::zero::flat_views<T, S> values_, grads_;
  detail::zero::layout layout_;
  std::size_t shard_elements_ = 0;
  std::vector<std::size_t> element_at_;    // bucket k's elements of this rank start here in its optimizer state
  std::vector<std::pair<std::size_t, std::size_t>> param_buckets_;  // per bucket: each parameter's buckets [first, last)
  std::vector<std::size_t> pending_start_; // per bucket: the parameters each bucket touches
  std::vector<std::size_t> pending_;       // in backward: those it still waits for
  std::vector<char> param_ready_;
  std::size_t launched_ = 0;               // buckets whose reduce_scatter is launched, in order
  std::size_t launched_in_backward_ = 0;
  std::size_t reported_ = 0;               // in backward: gradients reported final so far
  double exposed_reduce_s_ = 0;
  W divisor_ = W(1);
  std::optional<detail::zero::shard_optimizer<W, S>> optimizer_;
  buffer<W> masters_;                  // 16-bit parameters: this rank's fp32 masters (optimizer-state order)
  buffer<W> shard_grad_;               // the reduced gradient of this rank's blocks (padded, bucket order)
  buffer<W> whole_;                    // bucket-major gradients: stage 1, or accumulation
  std::array<buffer<W>, 2> scatter_;   // stage 2: the reduce_scatter inputs, two buckets in flight
  std::array<buffer<T>, 2> slot16_;    // reduce16(): the 16-bit reduce_scatter inputs
  buffer<T> shard16_;                  // reduce16(): their outputs, widened into shard_grad_
  std::array<buffer<T>, 2> gather_;    // all_gather outputs, two buckets in flight
  std::array<buffer<T>, 2> send_;      // all_gather inputs
  std::vector<std::optional<work>> rs_, ag_;
  gradient_hook hook_;
  bool skipped_ = false;
  buffer<T> zeros_;                    // a joined rank's gradients while it shadows
  std::size_t accumulated_ = 0;
  std::size_t shadow_steps_ = 0;
  double ranks_ = 1;                       // what the step's gradients are divided by (times micro-steps)
  bool joined_ = false;
  std::int64_t steps_ = 0;
  double last_norm_ = std::nan("");
  bool require_sync_ = true;
  local_group* shared_ = nullptr;  // set when steps run over shared memory (decide_shared)
  detail::mesh_clip::split_parameters split_;  // tensor-parallel parameters' flat ranges and group
};

}  // namespace partrain::inline v0
