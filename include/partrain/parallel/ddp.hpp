// partrain/parallel/ddp.hpp: distributed data parallel, one model replica per rank (PyTorch's
// DistributedDataParallel). Construction checks that every rank has the same parameters and
// copies rank 0's values everywhere; each train_step then runs the user's step and leaves the
// gradients averaged over all ranks, reduced bucket by bucket (overlapping the model's backward
// when the model reports gradient readiness).
#pragma once

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <partrain/comm/process_group.hpp>
#include <partrain/config.hpp>
#include <partrain/core/device.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/core/work.hpp>
#include <partrain/model/concepts.hpp>
#include <partrain/model/traits.hpp>
#include <partrain/optim/clip.hpp>
#include <partrain/optim/optimizer.hpp>
#include <partrain/parallel/comm_hooks.hpp>
#include <partrain/parallel/ddp_stats.hpp>
#include <partrain/parallel/detail/buffers.hpp>
#include <partrain/parallel/detail/evaluate.hpp>
#include <partrain/parallel/mesh_clip.hpp>
#include <partrain/parallel/detail/host_staging.hpp>
#include <partrain/parallel/detail/no_sync_guard.hpp>
#include <partrain/parallel/detail/reducer.hpp>

#if PARTRAIN_HAS_CUDA
#include <partrain/cuda/device_buffer.hpp>
#include <partrain/cuda/device_guard.hpp>
#endif

namespace partrain::inline v0 {

struct ddp_options {
  // Bucket limits (PyTorch's bucket_cap_mb = 25 and _DEFAULT_FIRST_BUCKET_BYTES = 1 MiB).
  std::size_t bucket_cap_bytes = std::size_t{25} << 20;
  std::size_t first_bucket_bytes = std::size_t{1} << 20;
  // Launch each bucket as soon as its gradients are final, when the model reports readiness.
  bool overlap = true;
  // Copy rank 0's parameter values to every rank at construction.
  bool broadcast_parameters = true;
  // A model with buffers (has_buffers: running statistics): rank 0's are copied to every rank at
  // construction and, when true, before every step (PyTorch's broadcast_buffers=True), so the
  // ranks compute with the same ones.
  bool broadcast_buffers = true;
  // Uneven inputs: ranks that ran out of data call join() and shadow the others (PyTorch Join).
  bool join = false;
  // Under join: divide by the world size even when some ranks already joined (PyTorch's
  // divide_by_initial_world_size=True); false divides by the number of ranks still active.
  bool divide_by_initial_world_size = true;
  // no_sync accumulation: true averages the k micro-steps (one k-times batch, since the model
  // returns mean gradients); false sums them, as PyTorch's .grad accumulation does.
  bool average_accumulated = true;
  comm_hook hook = comm_hooks::allreduce();
  // Called on the training thread right after each bucket's reduction was launched, with a work
  // that completes once the bucket is reduced (hook included) and the bucket's index; e.g.
  // trace_recorder::bucket_spans() draws each bucket's all_reduce on the timeline. Empty: off.
  std::function<void(const work&, std::size_t bucket)> on_bucket_launch = {};
};

namespace detail::ddp {

// Per parameter: dtype, rank, then up to 6 extents (fixed width, so every rank's record is the
// same length and one broadcast from rank 0 carries it).
inline constexpr std::size_t meta_width = 2 + max_rank;

[[nodiscard]] inline std::string describe_meta(const std::int64_t* m) {
  std::string s = "[";
  for (std::int64_t d = 0; d < m[1]; ++d) s += (d ? ", " : "") + std::to_string(m[2 + d]);
  return s + "] " + std::string(to_string(static_cast<dtype>(m[0])));
}

}  // namespace detail::ddp

template <class M, communicator C = process_group>
class distributed_data_parallel {
  static_assert(check_model<M>(), "partrain: distributed_data_parallel takes a model");
  using P = param_t<M>;
  using T = param_element_t<P>;
  using S = param_space_t<P>;
#if !PARTRAIN_HAS_CUDA
  static_assert(std::same_as<S, host>,
                "partrain: distributed_data_parallel over CUDA parameters needs the CUDA runtime (link partrain::cuda)");
#endif
  static_assert(std::same_as<T, float> || std::same_as<T, double>,
                "partrain: distributed_data_parallel averages float or double gradients");
  static_assert(std::convertible_to<decltype(std::declval<C&>().all_reduce(std::declval<tensor_view<T>>(), reduce_op::sum)), work>,
                "partrain: distributed_data_parallel needs a communicator whose collectives return partrain::work");

 public:
  distributed_data_parallel(M& m, C& comm, ddp_options o = {})
      : model_(&m), comm_(&comm), opts_(std::move(o)) {
    if (opts_.bucket_cap_bytes == 0 || opts_.first_bucket_bytes == 0) {
      throw invalid_argument_error("ddp_options: bucket_cap_bytes and first_bucket_bytes must be > 0 (got " +
                                   std::to_string(opts_.bucket_cap_bytes) + " and " +
                                   std::to_string(opts_.first_bucket_bytes) + ")");
    }
    plain_hook_ = opts_.hook.target_type() == comm_hooks::allreduce().target_type();
    std::vector<std::size_t> numels;
    std::vector<shape> shapes;
    for (auto&& p : model_->parameters()) {
      numels.push_back(p.value().size());
      shapes.push_back(p.value().shape());
    }
    cuda_device_ = resolve_cuda_device();
    verify_parameters();
    if (opts_.broadcast_parameters) broadcast_parameters_from(0);
    sync_buffers();
    reducer_ = std::make_unique<detail::ddp::reducer<T, S>>(std::move(numels), opts_.first_bucket_bytes,
                                                    opts_.bucket_cap_bytes, opts_.hook,
                                                    detail::ddp::make_all_reduce_fn(comm), comm.rank(), comm.size(), stats_,
                                                    device_placement(), opts_.on_bucket_launch, plain_hook_,
                                                    detail::ddp::make_all_reduce_divided_fn(comm));
    reducer_->set_param_shapes(shapes);
  }
  distributed_data_parallel(const distributed_data_parallel&) = delete;
  distributed_data_parallel& operator=(const distributed_data_parallel&) = delete;

  // The model's step on this rank's batch, then the gradients averaged over all ranks (or, inside
  // no_sync, accumulated locally). Returns this rank's loss.
  template <class B>
  double train_step(const B& batch) {
    static_assert(check_trainable<M, B>());
    if (joined_) throw invalid_argument_error(where() + "train_step after join() on this rank (join() ends this rank's steps until every rank joined)");
    if (opts_.broadcast_buffers) sync_buffers();
    const int world = comm_->size();
    double active = world;
    if (opts_.join) {
      std::array<std::int64_t, 2> flag{1, require_sync_ ? 1 : 0};
      wait_flag(flag, "active-rank all_reduce");
      if (flag[1] != 0 && flag[1] != flag[0]) {
        throw invalid_argument_error(where() + std::to_string(flag[0] - flag[1]) + " of " + std::to_string(flag[0]) +
                                     " active ranks are inside no_sync and the others are not (all ranks must "
                                     "accumulate the same micro-steps)");
      }
      active = static_cast<double>(flag[0]);
    }
    ++stats_.steps;
    ++steps_since_join_;
    collect_grads();
    if (!require_sync_) {
      const double loss = model_->train_step(batch);
      reducer_->accumulate(grads_, accumulated_ > 0);
      ++accumulated_;
      return loss;
    }
    if (world == 1 && accumulated_ == 0 && plain_hook_) {
      // One rank, the built-in hook, nothing accumulated: the average over one rank is the
      // gradient itself, so the bucket copies and the no-op all_reduce are skipped.
      const double loss = model_->train_step(batch);
      ++stats_.synced_steps;
      return loss;
    }
    const double ranks = opts_.join && !opts_.divide_by_initial_world_size ? active : world;
    const double micro = opts_.average_accumulated ? static_cast<double>(accumulated_ + 1) : 1.0;
    reducer_->begin(ranks * micro, accumulated_ > 0);
    double loss = 0;
    try {
      if constexpr (notifies_grad_ready<M, B>) {
        if (opts_.overlap) {
          // An index out of range reaches mark_ready with an empty view, which rejects it by name.
          const grad_ready_fn ready = [this](std::size_t i) {
            reducer_->mark_ready(i, i < grads_.size() ? tensor_view<const T, S>(grads_[i]) : tensor_view<const T, S>{});
          };
          loss = model_->train_step(batch, ready);
        } else {
          loss = model_->train_step(batch);
        }
      } else {
        loss = model_->train_step(batch);
      }
      reducer_->finish(grads_);
    } catch (...) {
      reducer_->drain();
      accumulated_ = 0;
      throw;
    }
    accumulated_ = 0;
    ++stats_.synced_steps;
    return loss;
  }

  // RAII: steps inside accumulate gradients locally; the first step after it reduces them all.
  using no_sync_guard = detail::ddp::no_sync_guard;
  [[nodiscard]] no_sync_guard no_sync() { return no_sync_guard(require_sync_); }

  // Evaluates this rank's batches and sums loss, correct and count over all ranks (each example
  // counted once when the ranks' batches partition the test set).
  template <class Range>
  [[nodiscard]] eval_result evaluate(Range&& batches) {
    return all_reduce_eval(detail::ddp::evaluate_batches(*model_, std::forward<Range>(batches)));
  }
  // Sums an eval_result computed elsewhere over all ranks (exact for counts below 2^53).
  [[nodiscard]] eval_result all_reduce_eval(const eval_result& local) {
    return detail::ddp::sum_over_ranks(local, [&](std::span<double> sums) {
      small_all_reduce(sums, reduce_op::sum, "evaluation all_reduce");
    });
  }

  // Uneven inputs (needs ddp_options::join): call once this rank has no more batches. It shadows
  // the other ranks' steps with zero gradients until every rank has joined, then copies the
  // parameters of the rank that ran the most steps (ties: the highest rank) to all. Returns
  // true when this rank shadowed at least one step. The optimizer state of a rank that joined
  // early is not updated. Afterwards the DDP is ready for the next epoch. `each_step` runs after
  // every step of the others this rank took part in (hierarchical post-local SGD uses it to take
  // part in the job's averages at the steps they fall on).
  bool join() {
    return join([] {});
  }
  template <std::invocable F>
  bool join(F&& each_step) {
    if (!opts_.join) {
      throw config_error(where() + "join() needs join enabled: construct with ddp_options{.join = true} (every "
                                   "rank then agrees each step on which ranks still have data)");
    }
    joined_ = true;
    bool shadowed = false;
    for (;;) {
      std::array<std::int64_t, 2> flag{0, 0};
      wait_flag(flag, "join all_reduce");
      if (flag[0] == 0) break;
      shadowed = true;
      if (flag[1] > 0) {
        const double ranks = opts_.divide_by_initial_world_size ? comm_->size() : static_cast<double>(flag[0]);
        reducer_->shadow(ranks);
        ++stats_.shadow_steps;
      }
      each_step();
    }
    std::array<std::int64_t, 1> last{steps_since_join_ * comm_->size() + comm_->rank()};
    small_all_reduce(std::span<std::int64_t>(last), reduce_op::max, "join last-rank all_reduce");
    broadcast_parameters_from(static_cast<int>(last[0] % comm_->size()));
    joined_ = false;
    accumulated_ = 0;
    steps_since_join_ = 0;
    return shadowed;
  }

  // Global-norm clipping of the averaged gradients; returns the norm before clipping. After a
  // synchronizing step every rank holds the same gradients (all_reduce gives every rank the same
  // bytes), so every rank computes the same norm and the same scale without communicating; a
  // tensor-parallel model's sharded parameters add their slices over their group
  // (parallel/mesh_clip.hpp), so DP x TP counts every parameter once.
  double clip_grad_norm(double max_norm) {
    return partrain::clip_grad_norm(*model_, max_norm, std::span<process_group* const>{});
  }

  [[nodiscard]] M& module() noexcept { return *model_; }
  [[nodiscard]] C& comm() noexcept { return *comm_; }
  [[nodiscard]] const ddp_stats& stats() const noexcept { return stats_; }
  [[nodiscard]] ddp_stats& stats() noexcept { return stats_; }
  [[nodiscard]] const ddp_options& options() const noexcept { return opts_; }

 private:
  [[nodiscard]] std::string where() const { return "rank " + std::to_string(comm_->rank()) + " DDP: "; }

  template <class W>
  void wait_named(W&& w, const char* what) {
    try {
      w.wait();
    } catch (const timeout_error& e) {
      // The backend's fields stay (rank, operation, peer, deadline); the text says what DDP did.
      throw timeout_error(where() + what + " failed: " + detail::unprefixed(e.what()) +
                              (opts_.join ? std::string()
                                          : std::string(". If ranks run out of batches at different steps, construct "
                                                        "DDP with ddp_options{.join = true} and call join() on a rank "
                                                        "once its data ends")),
                          detail::site_or(e, comm_->rank(), what));
    }
  }
  void wait_flag(std::array<std::int64_t, 2>& flag, const char* what) {
    small_all_reduce(std::span<std::int64_t>(flag), reduce_op::sum, what);
  }

  // Device mode (CUDA parameters, a backend that reduces CUDA memory): buckets on the parameters'
  // device, their work on the communicator's input stream.
  [[nodiscard]] detail::ddp::device_placement device_placement() {
    if (!(std::same_as<S, cuda> && detail::takes_memory(*comm_, device_kind::cuda))) {
      detail::ddp::device_placement host_buckets;
      host_buckets.staging_stream = model_stream(*model_);
      return host_buckets;
    }
    detail::ddp::device_placement p{cuda_device_, {}};
    if constexpr (requires(const C& c) { { c.input_stream() } -> std::convertible_to<void*>; }) {
      p.stream = [c = comm_] { return c->input_stream(); };
    }
    return p;
  }

  // The CUDA device DDP's own device memory goes on (buckets, the staging of its small
  // collectives): the device of the parameters' memory, asked with cudaPointerGetAttributes.
  // The model concepts expose no device and a process_group& may hide NCCL, so the memory
  // itself is the one source that every model and communicator has; the buckets must sit where
  // the gradients are. A communicator bound to a device (nccl_group) must agree. Without CUDA
  // parameters: the communicator's device, else the current one. -1: no CUDA in this build.
  [[nodiscard]] int resolve_cuda_device() const {
#if PARTRAIN_HAS_CUDA
    const int comm_dev = detail::comm_cuda_device(*comm_);
    int dev = -1;
    if constexpr (std::same_as<S, cuda>) {
      dev = detail::parameters_cuda_device(
          *comm_, [&](auto&& fn) { for (auto&& p : model_->parameters()) fn(p); }, where());
    }
    if (dev >= 0) return dev;
    if (comm_dev >= 0) return comm_dev;
    return detail::takes_memory(*comm_, device_kind::cpu) ? -1 : cuda_current_device();
#else
    return -1;
#endif
  }

  // The few small host collectives DDP needs (shape check, join flags, evaluation sums); on a
  // backend that only takes CUDA memory (NCCL) they go through a device copy on cuda_device_.
  template <class E, class Op>
  void small_collective(std::span<E> host_data, Op&& op, const char* what) {
    detail::host_collective(
        *comm_, host_data, std::forward<Op>(op), [&](auto&& w) { wait_named(std::forward<decltype(w)>(w), what); },
        cuda_device_);
  }
  template <class E>
  void small_all_reduce(std::span<E> v, reduce_op op, const char* what) {
    small_collective(v, [&](auto t) { return comm_->all_reduce(t, op); }, what);
  }
  template <class E>
  void small_broadcast(std::span<E> v, int root, const char* what) {
    small_collective(v, [&](auto t) { return comm_->broadcast(t, root); }, what);
  }
  // Every rank's single value, in rank order.
  template <class E>
  [[nodiscard]] std::vector<E> small_all_gather(E mine, const char* what) {
    // An all_gather is an all_reduce (sum) of a vector that is zero except at this rank's slot;
    // that keeps the staging path to one primitive.
    std::vector<E> all(static_cast<std::size_t>(comm_->size()), E{});
    all[static_cast<std::size_t>(comm_->rank())] = mine;
    small_all_reduce(std::span<E>(all), reduce_op::sum, what);
    return all;
  }

  void collect_grads() {
    grads_.clear();
    for (auto&& p : model_->parameters()) grads_.push_back(p.grad());
    if (grads_.size() != reducer_->size()) {
      throw invalid_argument_error(where() + "the model now has " + std::to_string(grads_.size()) +
                                   " parameters, it had " + std::to_string(reducer_->size()) + " at construction");
    }
  }

  // PyTorch's _verify_param_shape_across_processes: all_gather the counts, then broadcast rank
  // 0's shapes and compare; every rank learns which rank differs, so all of them fail together.
  void verify_parameters() {
    const int world = comm_->size();
    const int me = comm_->rank();
    std::vector<std::int64_t> meta;
    std::vector<std::string> names;
    std::size_t index = 0;
    for (auto&& p : model_->parameters()) {
      const auto v = p.value();
      const auto g = p.grad();
      if (v.shape() != g.shape()) {
        throw invalid_argument_error(where() + "parameter " + detail::param_name(p, index) + " has value shape " +
                                     v.shape().to_string() + " but gradient shape " + g.shape().to_string());
      }
      meta.push_back(static_cast<std::int64_t>(dtype_of<T>));
      meta.push_back(static_cast<std::int64_t>(v.rank()));
      for (std::size_t d = 0; d < max_rank; ++d) meta.push_back(d < v.rank() ? static_cast<std::int64_t>(v.extent(d)) : 0);
      names.push_back(detail::param_name(p, index));
      ++index;
    }
    const auto count = static_cast<std::int64_t>(names.size());
    const auto counts = small_all_gather(count, "parameter check all_gather");
    for (int q = 0; q < world; ++q) {
      if (counts[static_cast<std::size_t>(q)] != counts[0]) {
        throw config_error(where() + "DDP expects the same model on every rank, but rank " + std::to_string(q) +
                           " has " + std::to_string(counts[static_cast<std::size_t>(q)]) +
                           " parameters while rank 0 has " + std::to_string(counts[0]));
      }
    }
    std::vector<std::int64_t> theirs = meta;
    small_broadcast(std::span<std::int64_t>(theirs), 0, "parameter check broadcast");
    std::int64_t first_diff = -1;
    for (std::size_t i = 0; i < names.size() && first_diff < 0; ++i) {
      if (!std::equal(meta.begin() + static_cast<std::ptrdiff_t>(i * detail::ddp::meta_width),
                      meta.begin() + static_cast<std::ptrdiff_t>((i + 1) * detail::ddp::meta_width),
                      theirs.begin() + static_cast<std::ptrdiff_t>(i * detail::ddp::meta_width))) {
        first_diff = static_cast<std::int64_t>(i);
      }
    }
    const auto diffs = small_all_gather(first_diff, "parameter check all_gather");
    for (int q = 0; q < world; ++q) {
      const auto d = diffs[static_cast<std::size_t>(q)];
      if (d < 0) continue;
      const auto i = static_cast<std::size_t>(d);
      if (q == me) {
        throw config_error(where() + "parameter " + std::to_string(i) + " (" + names[i] + ") has shape " +
                           detail::ddp::describe_meta(&meta[i * detail::ddp::meta_width]) + " on rank " + std::to_string(me) +
                           " but " + detail::ddp::describe_meta(&theirs[i * detail::ddp::meta_width]) +
                           " on rank 0 (DDP expects the same model on every rank)");
      }
      throw config_error(where() + "parameter " + std::to_string(i) + " (" + names[i] + ") on rank " +
                         std::to_string(q) + " does not match rank 0's in shape or dtype (DDP expects the same model "
                         "on every rank)");
    }
  }

  // Rank 0's buffers to every rank (a model without buffers: nothing).
  void sync_buffers() {
    detail::broadcast_buffers(*comm_, *model_, [&](work& w) { wait_named(w, "buffer broadcast"); });
  }
  // Waits for every work (none is left reading our buffers), then rethrows the first failure.
  void wait_all(std::vector<work>& works, const char* what) {
    partrain::wait_all(works, [&](work& w) { wait_named(w, what); });
  }

  void broadcast_parameters_from(int root) {
    std::vector<work> works;
    // CUDA parameters travel through host copies (the host backends take host memory).
    std::vector<std::vector<T>> staged;
    std::vector<T> tmp;
    const bool direct = std::same_as<S, host> || detail::takes_memory(*comm_, device_kind::cuda);
    for (auto&& p : model_->parameters()) {
      if (direct) {
        works.push_back(comm_->broadcast(p.value(), root));
      } else {
        auto& h = staged.emplace_back(p.value().size());
        detail::ddp::stage_in(h.data(), tensor_view<const T, S>(p.value()), false, tmp, model_stream(*model_));
        works.push_back(comm_->broadcast(tensor_view<T>(h), root));
      }
    }
    wait_all(works, "parameter broadcast");
    if constexpr (!std::same_as<S, host>) {
      std::size_t k = 0;
      if (!direct) {
        for (auto&& p : model_->parameters()) detail::ddp::stage_out(p.value(), staged[k++].data(), model_stream(*model_));
      }
    }
  }

  M* model_;
  C* comm_;
  ddp_options opts_;
  ddp_stats stats_;
  std::unique_ptr<detail::ddp::reducer<T, S>> reducer_;
  std::vector<tensor_view<T, S>> grads_;
  std::size_t accumulated_ = 0;
  std::int64_t steps_since_join_ = 0;
  bool require_sync_ = true;
  bool joined_ = false;
  bool plain_hook_ = false;  // ddp_options::hook is comm_hooks::allreduce()
  int cuda_device_ = -1;     // resolve_cuda_device()
};

}  // namespace partrain::inline v0
