// partrain/parallel/fsdp.hpp: fully sharded data parallel (ZeRO-3; PyTorch's FSDP with FULL_SHARD)
// for a model given as a layer sequence (model/layer.hpp). Every rank trains the
// whole model on its own batch, as under DDP, but holds only its chunk of each layer's parameters
// (the layer's parameters concatenated and cut in n chunks, see detail/fsdp_layout.hpp), their
// gradient and their optimizer state. Around each layer's forward its parameters are
// all_gathered into a whole buffer and freed again afterwards; backward gathers them once more,
// runs the layer's backward into a whole gradient buffer and reduce_scatters (averages) it into
// each rank's chunk. The next layer's all_gather is issued before this layer computes, so it
// overlaps. step (inside train_step, as sharded_data_parallel's) updates the local chunks only.
// fsdp_options::min_unit_elements makes units of several consecutive layers, gathered and
// reduced as one.
//
//   auto layers = models::layers::make_mlp({784, 256, 128, 10}, seed);
//   fully_sharded_data_parallel fsdp(layers, group, softmax_cross_entropy{}, adamw_options{.lr = 1e-3});
//   for (const batch& b : batches) fsdp.train_step(b);
//
// FSDP owns the layers' parameter storage while it lives (each parameter's bind(), as PyTorch's
// parameters become views into its flat parameter): outside a layer's own compute, value() and
// grad() are empty; summon_full_params() gathers them all for reading. Checkpoints are sharded
// (train/sharded_checkpoint.hpp), uneven inputs take join(), and fsdp_options' param_dtype and
// reduce_dtype gather and reduce in 16 bits (FSDP's MixedPrecision; amp_step with a grad scaler,
// precision/sharded_amp.hpp, scales the loss for float16 reductions). Float parameters, on the
// host or (compiled by nvcc, over NCCL) on a CUDA device: there the chunks, the gathered layers,
// the whole gradients and the activations live on the layers' device, the element loops run as
// kernels and the layers compute on their stream (a layer's stream(), else the legacy one).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <iterator>
#include <limits>
#include <optional>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <partrain/comm/process_group.hpp>
#include <partrain/config.hpp>
#include <partrain/core/buffer.hpp>
#include <partrain/core/dtype.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/for_each_index.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/core/work.hpp>
#include <partrain/data/batch.hpp>
#include <partrain/model/concepts.hpp>
#include <partrain/model/sequential.hpp>
#include <partrain/model/traits.hpp>
#include <partrain/optim/clip.hpp>
#include <partrain/parallel/mesh_clip.hpp>
#include <partrain/optim/optimizer.hpp>
#include <partrain/parallel/deterministic.hpp>
#include <partrain/parallel/detail/binned_sum.hpp>
#include <partrain/parallel/detail/ddp_elements.hpp>
#include <partrain/parallel/detail/buffers.hpp>
#include <partrain/parallel/detail/evaluate.hpp>
#include <partrain/parallel/detail/fsdp_layout.hpp>
#include <partrain/parallel/detail/fsdp_memory.hpp>
#include <partrain/parallel/detail/host_staging.hpp>
#include <partrain/parallel/detail/no_sync_guard.hpp>
#include <partrain/parallel/detail/sharded_join.hpp>
#include <partrain/parallel/detail/zero_layout.hpp>
#include <partrain/parallel/detail/zero_optimizer.hpp>
#include <partrain/parallel/detail/zero_space.hpp>
#include <partrain/model/layer.hpp>

#if defined(__CUDACC__)
#include <partrain/parallel/detail/zero_kernels.cuh>
#endif

namespace partrain::inline v0 {

// A parameter whose storage can live elsewhere: after p.bind(value, grad), p.value() and p.grad()
// view those tensors (in the parameter's memory space) and the parameter's own storage is freed.
template <class P>
concept bindable_parameter = parameter<P> && requires(P& p, tensor_view<float, param_space_t<P>> v) { p.bind(v, v); };

namespace detail::fsdp {
using layers::layer_param_t;
// Where R's layers compute: their parameters' memory space (host while that is not known yet, so
// check_fsdp_layers still explains a layer without parameters()).
template <class R>
struct layer_space {
  using type = host;
};
template <class R>
  requires requires { typename param_space_t<layer_param_t<R>>; }
struct layer_space<R> {
  using type = param_space_t<layer_param_t<R>>;
};
template <class R>
using layer_space_t = typename layer_space<R>::type;
}  // namespace detail::fsdp

// A layer sequence fully sharded data parallel can shard: layers computing where their float
// parameters are, parameters it can bind.
template <class R>
concept fsdp_layer_sequence = layer_sequence<R, detail::fsdp::layer_space_t<R>> &&
                              bindable_parameter<detail::fsdp::layer_param_t<R>>;

// Explains, one sentence each, why R cannot be fully sharded.
template <class R>
consteval bool check_fsdp_layers() {
  using S = detail::fsdp::layer_space_t<R>;
  static_assert(check_layer_sequence<R, S>());
  using P = detail::fsdp::layer_param_t<R>;
  static_assert(std::same_as<param_element_t<P>, float> && (std::same_as<S, host> || std::same_as<S, cuda>),
                "partrain: fully_sharded_data_parallel shards float parameters in host or CUDA memory");
#if !defined(__CUDACC__)
  static_assert(std::same_as<S, host>,
                "partrain: fully_sharded_data_parallel with CUDA layers must be compiled by nvcc (its element loops run "
                "as kernels on the layers' device)");
#endif
  static_assert(bindable_parameter<P>,
                "partrain: fully_sharded_data_parallel owns its layers' parameter storage: each parameter needs "
                "`void bind(tensor_view<float> value, tensor_view<float> grad)` (value() and grad() then view those "
                "tensors; see models/mlp_layers.hpp's host_param)");
  return true;
}

struct fsdp_options {
  // true (FULL_SHARD, ZeRO-3): a layer's parameters are freed after its forward and gathered again
  // for its backward, three passes of the parameters' bytes per step, one layer (two with
  // prefetch) held at a time. false (SHARD_GRAD_OP): kept from forward to backward, two passes,
  // but the whole model is held at the end of the forward. The last layer is kept either way:
  // its backward comes next.
  bool reshard_after_forward = true;
  // Issue the next layer's all_gather (in forward order, then in backward order) before this
  // layer computes (FSDP's forward_prefetch and BACKWARD_PRE): overlaps communication with
  // compute at the cost of one more layer's parameters held.
  bool prefetch = true;
  // Copy rank 0's parameter values to every rank at construction.
  bool broadcast_parameters = true;
  // > 0: clip the global gradient norm (over every rank's chunks) to this before the step.
  double max_grad_norm = 0;
  // no_sync accumulation: true averages the k micro-steps, false sums them (as ddp_options).
  bool average_accumulated = true;
  // Uneven inputs: ranks that ran out of data call join() and shadow the others (PyTorch Join).
  // A joined rank still owns its chunks, so it takes part in every all_gather and reduce_scatter
  // of the others' steps (zero gradients, no compute) and steps its chunks. Costs one small
  // all_reduce per step (which ranks still have data).
  bool join = false;
  // Under join: divide by the world size even when some ranks already joined (PyTorch's
  // divide_by_initial_world_size=True); false divides by the number of ranks still active.
  bool divide_by_initial_world_size = true;
  // Mixed precision (PyTorch FSDP's MixedPrecision): dtype::float16 or dtype::bfloat16 halve the
  // bytes of the all_gathers (param_dtype) or of the reduce_scatters (reduce_dtype); the chunks
  // (the fp32 masters) and the optimizer state stay fp32. A 16-bit param_dtype gathers each chunk
  // rounded to it, so forward and backward compute with the rounded values (held in fp32, the
  // layers' type; summon_full_params gathers fp32). A 16-bit reduce_dtype casts each whole
  // gradient to it, divides there and reduces in it, as DDP's 16-bit compression hooks do.
  dtype param_dtype = dtype::float32;
  dtype reduce_dtype = dtype::float32;
  // Units of several layers (PyTorch's size_based_auto_wrap_policy, min_num_params): consecutive
  // layers join one unit, gathered and reduce_scattered as one, until it holds at least this many
  // parameter elements; the layers left at the end form the last unit. 0: every layer with
  // parameters is its own unit. Fewer, larger collectives, for more parameters held at once.
  std::size_t min_unit_elements = 0;
  // > 0: the deterministic mode (parallel/deterministic.hpp's contract, sharded): every rank passes
  // the same global batch to train_step, cut by position into this many fixed shards; rank r
  // computes the shards k with k * world / S == r, each on its own, and each unit's shard
  // gradients are summed exactly (detail/binned_sum.hpp: integers, in any order) into the ranks'
  // chunks. The trained parameters are then the same bits at any world size up to S and on any
  // backend, and for any gradient-accumulation split (set_gradient_accumulation_steps); dropout
  // draws from the step and the shard, not the rank. Host layers, float32 reductions, no join.
  std::size_t deterministic_shards = 0;
};

// What one rank holds, in bytes; the peaks are the most held at once since construction (or
// reset_peak_memory()), measured on every allocation.
struct fsdp_memory {
  std::size_t parameter_bytes = 0;            // now: this rank's chunks, plus any layer still gathered
  std::size_t peak_parameter_bytes = 0;       // chunks + the gathered layers at the fullest moment
  std::size_t unsharded_parameter_bytes = 0;  // the whole model: what a DDP (or ZeRO-1/2) replica holds
  std::size_t gradient_bytes = 0;             // now: the gradient chunks (+ whole gradients kept by no_sync)
  std::size_t peak_gradient_bytes = 0;        // + whole layer gradients until their reduce_scatter is done
  std::size_t peak_activation_bytes = 0;      // layer outputs, saved activations and their gradients in a step
  std::size_t optimizer_state_bytes = 0;      // this rank's chunks of momentum / Adam moments
  std::size_t shard_elements = 0;             // this rank's real elements over every layer
  std::size_t padding_elements = 0;           // sum over layers of n*L - N: sent, never stored in a parameter
};

template <class Layers, class Loss, communicator C = process_group>
  requires std::ranges::random_access_range<Layers>
class fully_sharded_data_parallel {
  static_assert(check_fsdp_layers<Layers>());
  using param_type = detail::fsdp::layer_param_t<Layers>;
  // Where the layers compute and this object's buffers live; X moves elements there
  // (parallel/detail/zero_space.hpp, zero_kernels.cuh).
  using S = detail::fsdp::layer_space_t<Layers>;
  using X = detail::zero::place<S>;
  using buffer = detail::fsdp::counted_buffer<float, S>;
  using buffer16 = detail::fsdp::counted_buffer<std::uint16_t, S>;  // half or bfloat16 bits
  template <class U>
  using tensor = typename X::template tensor<U>;

 public:
  // layers: the same model on every rank (checked); each rank's parameter values are replaced by
  // rank 0's (broadcast_parameters) and its storage handed over to this object.
  fully_sharded_data_parallel(Layers& layers, C& comm, Loss loss, shard_optimizer_options optimizer,
                              fsdp_options o = {})
      : layers_(&layers), comm_(&comm), loss_(std::move(loss)), opts_(o),
        rank_(static_cast<std::size_t>(comm.rank())), world_(static_cast<std::size_t>(comm.size())) {
    detail::optim::check_max_grad_norm(opts_.max_grad_norm, where() + "fsdp_options::max_grad_norm");
    for (const auto& [name, t] : {std::pair{"param_dtype", opts_.param_dtype}, std::pair{"reduce_dtype", opts_.reduce_dtype}}) {
      if (t != dtype::float32 && t != dtype::float16 && t != dtype::bfloat16) {
        throw invalid_argument_error(where() + "fsdp_options::" + name + " must be float32, float16 or bfloat16, got " +
                                     std::string(to_string(t)));
      }
    }
    if (std::ranges::size(layers) == 0) throw invalid_argument_error(where() + "the model has no layers");
    build_units();
    if (deterministic()) check_exact();  // before the model's storage is taken: a refusal leaves it whole
    for (std::size_t i = 0; i < std::ranges::size(layers) && !compute_stream_; ++i) {
      compute_stream_ = model_stream(layer(i));  // the layers' stream: the first one's stream()
    }
    at_ = make_place();
    at_.after(compute_stream_);  // the parameters as the layers made them
    verify_model();
    if (opts_.broadcast_parameters) broadcast_parameters();
    broadcast_buffers();
    take_storage(optimizer);
  }
  // A sequential model: its layers, sharded, and its loss. The model's own train_step is not for
  // use while this object holds the parameters; its parameters() see them where they are.
  fully_sharded_data_parallel(sequential<Layers, Loss>& model, C& comm, shard_optimizer_options optimizer,
                              fsdp_options o = {})
      : fully_sharded_data_parallel(model.layers(), comm, model.loss(), std::move(optimizer), o) {
    recompute_ = model.recompute();
    seed_ = model.seed();
  }
  fully_sharded_data_parallel(const fully_sharded_data_parallel&) = delete;
  fully_sharded_data_parallel& operator=(const fully_sharded_data_parallel&) = delete;
  // The backend may still be reading or writing our buffers: wait for it before they go.
  ~fully_sharded_data_parallel() { abandon_step(); }

  // This rank's forward and backward on its batch (rows of input, one target each), the
  // gradients averaged into every rank's chunks, clipped and stepped (outside no_sync). Every rank
  // must call it the same number of times. Returns this rank's mean loss.
  template <class Target>
  double train_step(tensor_view<const float> input, tensor_view<const Target> target) {
    static_assert(check_layer_loss<Loss, Target, S>());
    check_not_summoned("train_step");
    if (joined_) throw invalid_argument_error(where() + "train_step after join() on this rank (join() ends this rank's steps until every rank joined)");
    if (deterministic()) return exact_micro_batch(input, target, /*last=*/true);
    const std::size_t rows = batch_rows(input, target, "train_step");
    const bool sync = require_sync_;
    double sum = 0;
    try {
      active_ = world_;
      if (opts_.join) {
        std::array<std::int64_t, 2> flag{1, sync ? 1 : 0};
        agree_flag(flag, "active-rank all_reduce");
        detail::zero::check_active_ranks(flag, where());
        if (!opts_.divide_by_initial_world_size) active_ = static_cast<std::size_t>(flag[0]);
      }
      const auto in = on_place(input);
      const auto tg = on_place(target);
      sum = forward_backward(in.view, tg.view, rows, sync);
      if (sync) finish_step();
    } catch (...) {
      abandon_step();
      throw;
    }
    if (sync) {
      accumulated_ = 0;
      ++steps_;
    } else {
      ++accumulated_;
    }
    return sum / static_cast<double>(rows);
  }

  // Uneven inputs (needs fsdp_options::join): call once this rank has no more batches. Until
  // every rank joined, it takes part in each step of the others (their all_gathers, and its zero
  // gradients in their reduce_scatters) and steps its chunks with the reduced gradients, so the
  // parameters stay one model. Returns true when it shadowed at least one step. Afterwards the
  // ranks are ready for the next epoch.
  bool join() {
    detail::zero::check_join_allowed(opts_.join, accumulated_, where(), "fsdp_options");
    check_not_summoned("join");
    joined_ = true;
    bool shadowed = false;
    try {
      for (;;) {
        std::array<std::int64_t, 2> flag{0, 0};
        agree_flag(flag, "join all_reduce");
        if (flag[0] == 0) break;
        shadowed = true;
        const bool sync = flag[1] != 0;
        active_ = opts_.divide_by_initial_world_size ? world_ : static_cast<std::size_t>(flag[0]);
        shadow_forward_backward(sync);
        if (sync) {
          finish_step();
          accumulated_ = 0;
          ++steps_;
          ++shadow_steps_;
        } else {
          ++accumulated_;  // the active ranks' micro-step: its (zero) gradients wait for the next sync
        }
      }
    } catch (...) {
      abandon_step();
      joined_ = false;
      throw;
    }
    joined_ = false;
    return shadowed;
  }
  // Steps this rank took part in after join() (all joins so far).
  [[nodiscard]] std::size_t shadow_steps() const noexcept { return shadow_steps_; }
  double train_step(const batch& b) {
    static_assert(check_layer_loss<Loss, std::int32_t, S>());
    return train_step(b.features, b.labels);
  }
  // A micro-batch before a step's last (gradient accumulation): in the deterministic mode its
  // shards join the step's exact sum; otherwise a train_step inside no_sync. Its mean loss.
  double accumulate_step(const batch& b) {
    static_assert(check_layer_loss<Loss, std::int32_t, S>());
    if (!deterministic()) {
      auto guard = no_sync();
      return train_step(b);
    }
    check_not_summoned("accumulate_step");
    return exact_micro_batch(b.features, b.labels, /*last=*/false);
  }
  // The micro-batches of a step (fit's gradient_accumulation_steps). The deterministic mode cuts
  // each into S / a of the step's S shards, so a must divide S; no_sync needs no count. Between steps.
  void set_gradient_accumulation_steps(std::size_t a) {
    if (a == 0 || (deterministic() && opts_.deterministic_shards % a != 0)) {
      throw invalid_argument_error(where() + std::to_string(a) + " micro-batches a step" +
                                   (deterministic() ? " for " + std::to_string(opts_.deterministic_shards) +
                                                  " deterministic shards (expected a count that divides the shards: each "
                                                  "micro-batch carries whole shards)"
                                            : " (expected at least 1)"));
    }
    if (exact_pending_ > 0) {
      throw invalid_argument_error(where() + "set_gradient_accumulation_steps inside a step (after " +
                                   std::to_string(exact_pending_) + " micro-batch(es)); call it between steps");
    }
    micro_batches_ = a;
  }
  // Whether fsdp_options::deterministic_shards is set: train_step takes the global batch.
  [[nodiscard]] bool deterministic() const noexcept { return opts_.deterministic_shards > 0; }

  // Forward only on this rank's batch (collective: every rank gathers each layer), this rank's sums.
  template <class Target>
  [[nodiscard]] eval_result eval_step(tensor_view<const float> input, tensor_view<const Target> target) {
    static_assert(check_layer_loss<Loss, Target, S>());
    check_not_summoned("eval_step");
    (void)batch_rows(input, target, "eval_step");
    return guarded([&] { return forward_only_host(input, target); });
  }

  // This rank's batches (with .features and .labels) evaluated, loss, correct and count summed
  // over all ranks. Ranks may hold different numbers of batches: one that ran out still takes
  // part in the others' all_gathers.
  template <class Range>
  [[nodiscard]] eval_result evaluate(Range&& batches) {
    check_not_summoned("evaluate");
    eval_result local;
    auto it = std::ranges::begin(batches);
    const auto end = std::ranges::end(batches);
    for (;;) {
      std::array<std::int64_t, 1> more{it != end ? 1 : 0};
      small_all_reduce(std::span<std::int64_t>(more), "evaluation all_reduce");
      if (more[0] == 0) break;
      if (it != end) {
        auto&& b = *it;
        (void)batch_rows(b.features, b.labels, "evaluate");
        local += guarded([&] { return forward_only_host(tensor_view<const float>(b.features), b.labels); });
        ++it;
      } else {
        using label_t = std::remove_const_t<typename std::remove_cvref_t<decltype((*it).labels)>::value_type>;
        (void)guarded([&] { return forward_only(nullptr, tensor_view<const label_t, S>{}); });
      }
    }
    return detail::ddp::sum_over_ranks(local, [&](std::span<double> sums) { small_all_reduce(sums, "evaluation all_reduce"); });
  }

  // RAII: steps inside keep each layer's whole gradient and accumulate into it (PyTorch FSDP's
  // no_sync): no reduce_scatter, at the cost of one whole model of gradients held; the first step
  // after it reduces them all.
  using no_sync_guard = detail::ddp::no_sync_guard;
  [[nodiscard]] no_sync_guard no_sync() { return no_sync_guard(require_sync_); }

  // RAII (PyTorch's summon_full_params, read-only): every layer gathered and bound while it lives,
  // so the layers (or parameters(), a model) read the current values; writes are not kept.
  // Collective on construction; holds the whole model.
  class full_params_guard {
   public:
    using parameter_ref = partrain::parameter_ref<param_type>;
    explicit full_params_guard(fully_sharded_data_parallel& f) : f_(&f) {
      f.check_not_summoned("summon_full_params");
      f.guarded([&] {
        for (std::size_t u = 0; u < f.units_.size(); ++u) f.issue_gather(u, /*full_precision=*/true);
        for (std::size_t u = 0; u < f.units_.size(); ++u) {
          f.wait_gather(u);
          f.bind(u, false);
        }
        f.at_.finish();  // readable from any stream, or through a host copy
        return 0;
      });
      f.summoned_ = true;
      for (auto& u : f.units_) {
        f.for_each_param(u, [&](auto& p) { refs_.push_back({&p}); });
      }
    }
    full_params_guard(const full_params_guard&) = delete;
    full_params_guard& operator=(const full_params_guard&) = delete;
    ~full_params_guard() {
      for (std::size_t u = 0; u < f_->units_.size(); ++u) f_->reshard(u);
      f_->summoned_ = false;
    }
    // Every parameter of the model, in layer order, as a model (parameter_checksum takes it).
    [[nodiscard]] std::vector<parameter_ref>& parameters() noexcept { return refs_; }

   private:
    fully_sharded_data_parallel* f_;
    std::vector<parameter_ref> refs_;
  };
  [[nodiscard]] full_params_guard summon_full_params() { return full_params_guard(*this); }

  void set_lr(double lr) { optimizer_->set_lr(lr); }
  // The clipping of fsdp_options::max_grad_norm from the next step on (fit's max_grad_norm).
  void set_max_grad_norm(double v) {
    detail::optim::check_max_grad_norm(v, where() + "set_max_grad_norm");
    opts_.max_grad_norm = v;
  }
  [[nodiscard]] double lr() const noexcept { return optimizer_->lr(); }

  // Loss scaling (what a grad_scaler sets through amp_step, precision/sharded_amp.hpp): the loss's
  // gradient is multiplied by s before backward, so small gradients survive a 16-bit
  // reduce_dtype (PyTorch's ShardedGradScaler with FSDP). 1: none.
  void set_loss_scale(float s) {
    if (!(s > 0) || !std::isfinite(s)) {
      throw invalid_argument_error(where() + "set_loss_scale: the scale must be a finite number > 0, got " + std::to_string(s));
    }
    loss_scale_ = s;
  }
  [[nodiscard]] float loss_scale() const noexcept { return loss_scale_; }
  // Called on every rank with its reduced gradient chunks (padding zero) after the last
  // reduce_scatter of a synchronizing step, before clipping and the step; returning false skips
  // this step's update (every rank must decide alike: amp_step agrees across ranks). Empty: none.
  // CUDA layers: the chunks are in device memory, finished when the hook runs.
  using gradient_hook = std::function<bool(tensor_view<float, S>)>;
  void set_gradient_hook(gradient_hook h) { hook_ = std::move(h); }
  // Whether the last synchronizing step's update was skipped by the gradient hook.
  [[nodiscard]] bool last_step_skipped() const noexcept { return skipped_; }
  // The global gradient norm of the last synchronizing step, before clipping (NaN without clipping).
  [[nodiscard]] double last_grad_norm() const noexcept { return last_norm_; }
  [[nodiscard]] std::int64_t steps() const noexcept { return steps_; }
  [[nodiscard]] C& comm() noexcept { return *comm_; }
  [[nodiscard]] Layers& layers() noexcept { return *layers_; }
  [[nodiscard]] const fsdp_options& options() const noexcept { return opts_; }
  // Units of gathering and reduce_scatter: each layer with parameters, or groups of consecutive
  // layers (fsdp_options::min_unit_elements).
  [[nodiscard]] std::size_t units() const noexcept { return units_.size(); }
  // The layers [first, last] of unit u (the first and the last with parameters).
  [[nodiscard]] std::pair<std::size_t, std::size_t> unit_layers(std::size_t u) const {
    return {units_.at(u).first, units_.at(u).last};
  }
  // This rank's chunk of the unit holding layer `i`, within that unit's concatenated parameters
  // (empty for a layer without parameters).
  [[nodiscard]] detail::zero::flat_range owned(std::size_t layer_index) const {
    const auto u = unit_of_.at(layer_index);
    return u < 0 ? detail::zero::flat_range{} : units_[static_cast<std::size_t>(u)].mine;
  }

  [[nodiscard]] fsdp_memory memory() const noexcept {
    fsdp_memory m;
    m.parameter_bytes = param_meter_.now;
    m.peak_parameter_bytes = param_meter_.peak;
    m.unsharded_parameter_bytes = unsharded_ * sizeof(float);
    m.gradient_bytes = grad_meter_.now;
    m.peak_gradient_bytes = grad_meter_.peak;
    m.peak_activation_bytes = act_meter_.peak;
    m.optimizer_state_bytes = optimizer_->state_bytes();
    for (const auto& u : units_) {
      m.shard_elements += u.mine.size();
      m.padding_elements += u.chunks.padded() - u.chunks.total();
    }
    return m;
  }
  void reset_peak_memory() noexcept {
    param_meter_.reset_peak();
    grad_meter_.reset_peak();
    act_meter_.reset_peak();
  }

  [[nodiscard]] std::string optimizer_kind() const { return optimizer_->kind(); }

  // What a sharded checkpoint (train/sharded_checkpoint.hpp) saves and loads. The flat space is
  // every parameter of every layer, in order, as a model's parameters() would list them.
  [[nodiscard]] std::vector<std::string> parameter_names() {
    std::vector<std::string> out;
    std::size_t i = 0;
    for (const auto& u : units_) for_each_param(u, [&](auto& p) { out.push_back(detail::param_name(p, i++)); });
    return out;
  }
  [[nodiscard]] std::vector<shape> parameter_shapes() const {
    std::vector<shape> out;
    for (const auto& u : units_) out.insert(out.end(), u.shapes.begin(), u.shapes.end());
    return out;
  }
  [[nodiscard]] std::size_t total_elements() const noexcept { return unsharded_; }
  // The slices of the flat space rank r holds (its chunk of each layer), ascending, empty ones left out.
  [[nodiscard]] std::vector<detail::zero::flat_range> flat_segments(std::size_t r) const {
    std::vector<detail::zero::flat_range> out;
    std::size_t at = 0;
    for (const auto& u : units_) {
      const auto mine = u.chunks.owned(r);
      if (mine.size() != 0) out.push_back({at + mine.begin, at + mine.end});
      at += u.chunks.total();
    }
    return out;
  }
  // This rank's parameter values over flat_segments(rank), end to end, and back.
  [[nodiscard]] std::vector<float> shard_values() const {
    std::size_t n = 0;
    for (const auto& u : units_) n += u.mine.size();
    std::vector<float> out(n);
    std::size_t at = 0;
    for (const auto& u : units_) {
      at_.to_host(out.data() + at, values_.data() + u.chunk_at, u.mine.size());
      at += u.mine.size();
    }
    return out;
  }
  void load_shard_values(std::span<const float> v) {
    check_not_summoned("load_shard_values");
    std::size_t want = 0;
    for (const auto& u : units_) want += u.mine.size();
    if (v.size() != want) {
      throw invalid_argument_error(where() + "load_shard_values got " + std::to_string(v.size()) +
                                   " values, this rank holds " + std::to_string(want));
    }
    std::size_t at = 0;
    for (const auto& u : units_) {
      at_.from_host(values_.data() + u.chunk_at, v.data() + at, u.mine.size());
      at += u.mine.size();
    }
  }
  // The optimizer state over flat_segments(rank), end to end, and back.
  [[nodiscard]] shard_optimizer_state<float> optimizer_state() const {
    at_.finish();  // the last step's state is written on the place's stream
    return optimizer_->state();
  }
  void load_optimizer_state(const shard_optimizer_state<float>& s, const std::string& source) {
    optimizer_->load(s, source);
  }

 private:
  // One layer with parameters, or several consecutive layers: its chunking, its chunk's place in
  // this rank's storage, and the whole buffers while they exist.
  struct unit {
    std::size_t first = 0, last = 0;  // its first and last layer with parameters
    std::vector<shape> shapes;  // its parameters', in order
    detail::fsdp::chunking chunks;
    detail::zero::flat_range mine;
    detail::mesh_clip::split_parameters split;  // its tensor-parallel parameters' ranges (clipping)
    std::size_t chunk_at = 0;  // of its chunk in values_ and grads_ (chunk() elements each)
    std::size_t state_at = 0;  // of its real elements in the optimizer's state
    buffer full;               // gathered parameters (also while the all_gather is in flight)
    buffer full_grad;          // whole gradient: backward until its reduce_scatter is done (across no_sync)
    std::optional<work> gather;
    std::optional<work> scatter;
    // A 16-bit param_dtype: the chunk rounded and the gathered layer, while the all_gather runs
    // (then widened into full). A 16-bit reduce_dtype: the whole gradient and this rank's reduced
    // chunk, while the reduce_scatter runs (then widened into the chunk's gradient).
    buffer16 send16, full16, grad16, chunk16;
    // The deterministic mode: the step's exact sum over this rank's chunk so far (two bin
    // counters an element, detail/binned_sum.hpp) and each of the unit's parameters' bin.
    std::vector<std::int64_t> exact_hi, exact_lo;
    std::vector<int> exact_bin;
  };
  // f.template operator()<H>() with H the 16-bit type of t.
  template <class F>
  static void with_16bit(dtype t, F&& f) {
    if (t == dtype::float16) {
      f.template operator()<half>();
    } else {
      f.template operator()<bfloat16>();
    }
  }
  template <class H>
  [[nodiscard]] static tensor_view<H, S> as16(buffer16& b) noexcept {
    return tensor_view<H, S>(reinterpret_cast<H*>(b.data()), b.size());
  }

  [[nodiscard]] std::string where() const {
    return "rank " + std::to_string(rank_) + " fully_sharded_data_parallel: ";
  }

  // Where this object's buffers go: the host, or the layers' one CUDA device and the
  // communicator's input stream, which it orders its collectives after.
  [[nodiscard]] X make_place() {
    return X::make(
        *comm_, [&](auto&& fn) { for (const auto& u : units_) for_each_param(u, fn); }, where(),
        "fully_sharded_data_parallel keeps its chunks and gathered layers on the layers' device: use an nccl group");
  }

  // A batch's tensor where the layers compute: the host view itself, or a copy on their device.
  template <class U>
  struct placed {
    tensor<U> owned;  // the device copy
    tensor_view<const U, S> view;
  };
  template <class U>
  [[nodiscard]] placed<U> on_place(tensor_view<const U> h) const {
    if constexpr (std::same_as<S, host>) {
      return {tensor<U>{}, h};
    } else {
      tensor<U> d = at_.template upload<U>(h, compute_stream_);
      const tensor_view<const U, S> v(d.data(), h.shape());
      return {std::move(d), v};
    }
  }
  [[nodiscard]] decltype(auto) layer(std::size_t i) { return detail::layers::layer_of(std::ranges::begin(*layers_)[static_cast<std::ptrdiff_t>(i)]); }
  // fn(p) for every parameter of unit x, in layer order.
  template <class F>
  void for_each_param(const unit& x, F&& fn) {
    for (std::size_t i = x.first; i <= x.last; ++i) {
      if (unit_of_[i] < 0) continue;  // no parameters, or only empty ones: in no unit
      for (auto&& p : layer(i).parameters()) fn(p);
    }
  }
  // "layer 3", or "layers 2-5": what a message calls unit x.
  [[nodiscard]] static std::string unit_name(const unit& x) {
    return x.first == x.last ? "layer " + std::to_string(x.first)
                             : "layers " + std::to_string(x.first) + "-" + std::to_string(x.last);
  }

  void build_units() {
    const std::size_t n = std::ranges::size(*layers_);
    unit_of_.assign(n, -1);
    unit u;
    std::size_t total = 0;
    const auto close = [&] {
      u.chunks = detail::fsdp::chunking(total, world_);
      u.mine = u.chunks.owned(rank_);
      // From every unit, not only those this rank holds chunks of: every rank must clip alike.
      split_group_ = detail::mesh_clip::one_split_group(split_group_, u.split.group, where());
      unsharded_ += total;
      units_.push_back(std::move(u));
      u = unit{};
      total = 0;
    };
    for (std::size_t i = 0; i < n; ++i) {
      std::size_t here = 0, k = 0;
      for (auto&& p : layer(i).parameters()) {
        const tensor_view<float, S> v = p.value();
        const tensor_view<float, S> g = p.grad();
        if (v.size() != g.size()) {
          throw invalid_argument_error(where() + "parameter " + std::to_string(k) + " of layer " + std::to_string(i) +
                                       " has " + std::to_string(v.size()) + " values but " + std::to_string(g.size()) +
                                       " gradient elements (expected the same shape)");
        }
        u.shapes.push_back(v.shape());
        u.split.add(p, where());  // (a layer of empty parameters adds nothing)
        here += v.size();
        ++k;
      }
      if (here == 0) {
        u.shapes.resize(u.shapes.size() - k);  // empty parameters of a layer left out of every unit
        continue;                              // nothing to gather: the layer runs as it is
      }
      if (total == 0) u.first = i;
      u.last = i;
      total += here;
      unit_of_[i] = static_cast<std::ptrdiff_t>(units_.size());
      if (total >= opts_.min_unit_elements) close();
    }
    if (total > 0) close();
  }

  // Every rank must hold the same layers with the same parameter shapes: each rank's layer count,
  // element count and a hash of the shapes, gathered through one all_reduce so all ranks fail together.
  void verify_model() {
    std::uint64_t h = 0xcbf29ce484222325ull;
    const auto mix = [&h](std::uint64_t x) { h = (h ^ x) * 0x100000001b3ull; };
    for (const auto& u : units_) {
      mix(u.first);
      mix(u.last);
      for (const auto& s : u.shapes) {
        for (std::size_t d = 0; d < s.rank(); ++d) mix(s[d]);
        mix(0xff);
      }
    }
    // And the deterministic mode's shards: ranks that disagree would run different collectives.
    std::vector<std::int64_t> all(4 * world_, 0);
    all[4 * rank_] = static_cast<std::int64_t>(std::ranges::size(*layers_));
    all[4 * rank_ + 1] = static_cast<std::int64_t>(unsharded_);
    all[4 * rank_ + 2] = static_cast<std::int64_t>(h >> 1);
    all[4 * rank_ + 3] = static_cast<std::int64_t>(opts_.deterministic_shards);
    small_all_reduce(std::span<std::int64_t>(all), "model check all_reduce");
    for (std::size_t q = 1; q < world_; ++q) {
      if (all[4 * q + 3] != all[3]) {
        throw config_error(where() + "rank " + std::to_string(q) + " has fsdp_options::deterministic_shards = " +
                           std::to_string(all[4 * q + 3]) + ", rank 0 " + std::to_string(all[3]) +
                           " (expected the same on every rank)");
      }
      if (std::equal(all.begin(), all.begin() + 3, all.begin() + static_cast<std::ptrdiff_t>(4 * q))) continue;
      throw config_error(where() + "rank " + std::to_string(q) + " has " + std::to_string(all[4 * q]) + " layers of " +
                         std::to_string(all[4 * q + 1]) + " parameter elements" +
                         (all[4 * q + 2] != all[2] ? " (other shapes)" : "") + ", rank 0 has " + std::to_string(all[0]) +
                         " of " + std::to_string(all[1]) + " (fully_sharded_data_parallel expects the same model on every rank)");
    }
  }

  void broadcast_parameters() {
    std::vector<work> works;
    for (const auto& u : units_) {
      for_each_param(u, [&](auto& p) {
        const tensor_view<float, S> v = p.value();
        if (!v.empty()) works.push_back(comm_->broadcast(v, 0));
      });
    }
    for (auto& w : works) wait_named(w, "parameter broadcast");
  }
  // Host layers' buffers (non-trainable state) stay whole on every rank: rank 0's at construction.
  void broadcast_buffers() {
    if constexpr (std::same_as<S, host>) {
      for (std::size_t i = 0; i < std::ranges::size(*layers_); ++i) {
        detail::broadcast_buffers(*comm_, layer(i), [&](work& w) { wait_named(w, "buffer broadcast"); });
      }
    }
  }

  // Copies this rank's chunk of every layer into its own storage, then binds the layers'
  // parameters to nothing: their storage is freed, only the chunks remain.
  void take_storage(const shard_optimizer_options& optimizer) {
    std::size_t chunks = 0, real = 0;
    for (auto& u : units_) {
      u.chunk_at = chunks;
      u.state_at = real;
      chunks += u.chunks.chunk();
      real += u.mine.size();
    }
    values_ = buffer(param_meter_, chunks, true, at_);  // padding stays zero: it is what the all_gather sends
    grads_ = buffer(grad_meter_, chunks, true, at_);
    optimizer_.emplace(optimizer, real, at_.device(), at_.stream());
    for (auto& u : units_) {
      std::vector<tensor_view<float, S>> views;
      for_each_param(u, [&](auto& p) { views.push_back(p.value()); });
      detail::zero::flat_views<float, S>(std::move(views)).read(u.mine, values_.data() + u.chunk_at, false, at_);
    }
    at_.finish();  // copied before the layers' own storage goes
    for (std::size_t u = 0; u < units_.size(); ++u) {
      reshard(u);
      for (std::size_t i = units_[u].first; i <= units_[u].last; ++i) {
        if (unit_of_[i] < 0) continue;
        std::size_t k = 0;
        for (auto&& p : layer(i).parameters()) {
          if (p.value().size() != 0 || p.grad().size() != 0) {
            throw invalid_argument_error(where() + "parameter " + std::to_string(k) + " of layer " + std::to_string(i) +
                                         " still views its own storage after bind() (bind must make value() and grad() "
                                         "view the tensors it is given)");
          }
          ++k;
        }
      }
    }
  }

  template <class Target>
  std::size_t batch_rows(tensor_view<const float> input, tensor_view<const Target> target, const char* what) const {
    const std::size_t rows = input.rank() ? input.extent(0) : 0;
    const std::size_t targets = target.rank() ? target.extent(0) : 0;
    if (rows == 0) throw invalid_argument_error(where() + what + ": the input batch is empty");
    if (rows != targets) {
      throw invalid_argument_error(where() + what + ": the input has " + std::to_string(rows) + " rows, the target " +
                                   std::to_string(targets) + " (expected one target per row)");
    }
    return rows;
  }
  void check_not_summoned(const char* what) const {
    if (summoned_) {
      throw invalid_argument_error(where() + what + " while a summon_full_params() guard is alive (end its scope first)");
    }
  }

  // Runs f; on failure waits for whatever is in flight and drops the whole buffers, so the object
  // holds only its chunks again.
  template <class F>
  decltype(auto) guarded(F&& f) {
    try {
      return f();
    } catch (...) {
      abandon_step();
      throw;
    }
  }

  [[nodiscard]] shape output_shape_of(std::size_t i, const shape& in) {
    try {
      return layer(i).output_shape(in);
    } catch (const error& e) {
      throw invalid_argument_error(where() + "layer " + std::to_string(i) + ": " + e.what());
    }
  }

  // A layer's saved activations, counted (none allocated for a layer that keeps none).
  [[nodiscard]] buffer activation_buffer(std::size_t floats) {
    return floats ? buffer(act_meter_, floats, false, at_) : buffer();
  }

  template <class Target>
  double forward_backward(tensor_view<const float, S> input, tensor_view<const Target, S> target, std::size_t rows,
                          bool sync) {
    const std::size_t n = std::ranges::size(*layers_);
    std::vector<tensor<float>> outs;
    std::vector<buffer> saved(n);  // what each layer keeps for its backward (none where recomputed)
    outs.reserve(n);
    const auto call = [&](std::size_t i) {
      // The deterministic mode keys dropout by the optimizer's step (checkpointed with its state)
      // and the shard, whichever rank computes it.
      return layer_call<S>{tensor_view<float, S>(saved[i].data(), shape{saved[i].size()}),
                           deterministic() ? detail::layers::call_seed(seed_, static_cast<std::uint64_t>(optimizer_->steps()), exact_shard_, i)
                                   : detail::layers::call_seed(seed_, calls_, 0, i)};
    };
    // Bytes of each output, and of the gradient in hand: they leave the meter however the step ends.
    std::vector<std::size_t> out_bytes(n, 0);
    std::size_t grad_bytes = 0;
    struct uncount {
      detail::fsdp::byte_meter& m;
      std::vector<std::size_t>& outs;
      std::size_t& grad;
      ~uncount() {
        for (const auto b : outs) m.sub(b);
        m.sub(grad);
      }
    } guard{act_meter_, out_bytes, grad_bytes};
    tensor_view<const float, S> x = input;
    for (std::size_t i = 0; i < n; ++i) {
      const shape s = output_shape_of(i, x.shape());
      before_forward(i);
      outs.push_back(at_.template make_tensor<float>(s, compute_stream_));
      out_bytes[i] = s.numel() * sizeof(float);
      act_meter_.add(out_bytes[i]);
      saved[i] = activation_buffer(detail::layers::saved_size<S>(layer(i), x.shape()));
      detail::layers::forward<S>(layer(i), x, outs.back().view(), call(i));
      if (recompute_.selects(i)) saved[i].release();
      after_forward(i, /*training=*/true);
      x = tensor_view<const float, S>(outs.back().view());
    }
    tensor<float> grad = at_.template make_tensor<float>(x.shape(), compute_stream_);
    grad_bytes = x.size() * sizeof(float);
    act_meter_.add(grad_bytes);
    const double sum = loss_.forward_backward(x, target, grad.view(), loss_scale_ / static_cast<float>(rows));
    const float divisor = gradient_divisor();
    for (std::size_t j = n; j-- > 0;) {
      const tensor_view<const float, S> in = j == 0 ? input : tensor_view<const float, S>(outs[j - 1].view());
      before_backward(j);
      const std::size_t floats = detail::layers::saved_size<S>(layer(j), in.shape());
      if (floats > 0 && recompute_.selects(j)) {
        // The layer's parameters are gathered for its backward anyway: recomputing sends nothing.
        saved[j] = activation_buffer(floats);
        tensor<float> again = at_.template make_tensor<float>(outs[j].view().shape(), compute_stream_);
        detail::layers::forward<S>(layer(j), in, again.view(), call(j));
      }
      tensor<float> gin = at_.template make_tensor<float>(in.shape(), compute_stream_);
      act_meter_.add(in.size() * sizeof(float));
      detail::layers::backward<S>(layer(j), in, tensor_view<const float, S>(outs[j].view()), call(j),
                                  tensor_view<const float, S>(grad.view()), gin.view());
      after_backward(j, sync, divisor);
      grad = std::move(gin);
      act_meter_.sub(std::exchange(grad_bytes, in.size() * sizeof(float)));
      saved[j].release();
      outs[j] = tensor<float>();  // this activation is done with
      act_meter_.sub(std::exchange(out_bytes[j], 0));
    }
    ++calls_;
    return sum;
  }
  // A joined rank's part in the others' step: the same all_gathers and reduce_scatters in the
  // same order (forward_backward's hooks), no compute, its whole gradients zero.
  void shadow_forward_backward(bool sync) {
    const std::size_t n = std::ranges::size(*layers_);
    for (std::size_t i = 0; i < n; ++i) {
      before_forward(i);
      after_forward(i, /*training=*/true);
    }
    const float divisor = gradient_divisor();
    for (std::size_t j = n; j-- > 0;) {
      before_backward(j);
      after_backward(j, sync, divisor);
    }
  }
  // Gradients are divided before the reduction, as DDP's hooks do (keeps the sum in range).
  [[nodiscard]] float gradient_divisor() const noexcept {
    return static_cast<float>(static_cast<double>(active_) *
                              (opts_.average_accumulated ? static_cast<double>(accumulated_ + 1) : 1.0));
  }

  // After the last reduce_scatter of a synchronizing step: clip and step this rank's chunks.
  void finish_step() {
    while (!scattering_.empty()) finish_scatter();
    last_norm_ = std::nan("");
    skipped_ = false;
    if (hook_) at_.finish();  // the hook may read the chunks on another stream
    if (hook_ && !hook_(tensor_view<float, S>(grads_.data(), grads_.size()))) {
      skipped_ = true;  // the chunks stay as they are on every rank
      return;
    }
    if (opts_.max_grad_norm > 0) clip_chunks();
    step_chunks();
  }
  void agree_flag(std::array<std::int64_t, 2>& flag, const char* what) { small_all_reduce(std::span<std::int64_t>(flag), what); }
  // A few host numbers summed over the ranks (through a device copy on a backend that reduces
  // CUDA memory only); errors name this rank and `what`.
  template <class E>
  void small_all_reduce(std::span<E> data, const std::string& what) {
    detail::host_collective(
        *comm_, data, [&](auto view) { return comm_->all_reduce(view, reduce_op::sum); },
        [&](const work& w) { wait_named(w, what); }, at_.device());
  }

  // forward_only on a host batch, copied where the layers compute.
  template <class Target>
  eval_result forward_only_host(tensor_view<const float> input, tensor_view<const Target> target) {
    const auto in = on_place(input);
    const auto tg = on_place(target);
    return forward_only(&in.view, tg.view);
  }
  // input null: this rank has no batch this round but joins the others' all_gathers.
  template <class Target>
  eval_result forward_only(const tensor_view<const float, S>* input, tensor_view<const Target, S> target) {
    const std::size_t n = std::ranges::size(*layers_);
    tensor<float> cur;
    tensor_view<const float, S> x = input ? *input : tensor_view<const float, S>{};
    for (std::size_t i = 0; i < n; ++i) {
      shape s;
      if (input) s = output_shape_of(i, x.shape());
      before_forward(i);
      if (input) {
        tensor<float> y = at_.template make_tensor<float>(s, compute_stream_);
        buffer kept = activation_buffer(detail::layers::saved_size<S>(layer(i), x.shape()));
        detail::layers::forward<S>(layer(i), x, y.view(),
                                   layer_call<S>{tensor_view<float, S>(kept.data(), shape{kept.size()}), 0});
        cur = std::move(y);
        x = tensor_view<const float, S>(cur.view());
      }
      after_forward(i, /*training=*/false);
    }
    return input ? eval_result(loss_.evaluate(x, target)) : eval_result{};
  }

  // The next unit after layer i in forward order (starting after it) or in backward order
  // (ending before it), or -1.
  [[nodiscard]] std::ptrdiff_t next_unit(std::size_t i, bool forward) const {
    if (forward) {
      for (std::size_t u = 0; u < units_.size(); ++u) {
        if (units_[u].first > i) return static_cast<std::ptrdiff_t>(u);
      }
    } else {
      for (std::size_t u = units_.size(); u-- > 0;) {
        if (units_[u].last < i) return static_cast<std::ptrdiff_t>(u);
      }
    }
    return -1;
  }
  // Layer i's unit when i is that unit's first (or last) layer with parameters, else -1.
  [[nodiscard]] std::ptrdiff_t unit_starting(std::size_t i) const {
    const auto u = unit_of_[i];
    return u >= 0 && units_[static_cast<std::size_t>(u)].first == i ? u : -1;
  }
  [[nodiscard]] std::ptrdiff_t unit_ending(std::size_t i) const {
    const auto u = unit_of_[i];
    return u >= 0 && units_[static_cast<std::size_t>(u)].last == i ? u : -1;
  }

  // A unit is gathered before its first layer's forward and resharded after its last one's.
  void before_forward(std::size_t i) {
    const auto u = unit_starting(i);
    if (u >= 0) issue_gather(static_cast<std::size_t>(u));
    if (opts_.prefetch) {
      if (const auto nx = next_unit(i, true); nx >= 0) issue_gather(static_cast<std::size_t>(nx));
    }
    if (u >= 0) {
      wait_gather(static_cast<std::size_t>(u));
      bind(static_cast<std::size_t>(u), false);
    }
  }
  void after_forward(std::size_t i, bool training) {
    const auto u = unit_ending(i);
    if (u < 0) return;
    const bool last = static_cast<std::size_t>(u) + 1 == units_.size();
    if (!training || (opts_.reshard_after_forward && !last)) reshard(static_cast<std::size_t>(u));
  }

  // In backward, before its last layer's backward and after its first one's.
  void before_backward(std::size_t j) {
    const auto u = unit_ending(j);
    if (u >= 0) issue_gather(static_cast<std::size_t>(u));  // resharded after forward: again
    if (opts_.prefetch) {
      if (const auto pv = next_unit(j, false); pv >= 0) issue_gather(static_cast<std::size_t>(pv));
    }
    if (u < 0) return;
    auto& x = units_[static_cast<std::size_t>(u)];
    wait_gather(static_cast<std::size_t>(u));
    if (!x.full_grad.held()) x.full_grad = buffer(grad_meter_, x.chunks.padded(), true, at_);  // zero: backward accumulates
    bind(static_cast<std::size_t>(u), true);
  }
  void after_backward(std::size_t j, bool sync, float divisor) {
    const auto ui = unit_starting(j);
    if (ui < 0) return;
    const auto u = static_cast<std::size_t>(ui);
    reshard(u);
    if (deterministic()) {
      exact_scatter(u);
      return;
    }
    if (!sync) return;  // no_sync: the whole gradient stays, the next micro-step adds to it
    auto& x = units_[u];
    // Two whole gradients in flight at most: the oldest was issued a layer ago and is likely done.
    if (scattering_.size() >= 2) finish_scatter();
    at_.after(compute_stream_);  // the layers' backward wrote the whole gradient on their stream
    if (opts_.reduce_dtype == dtype::float32) {
      if (divisor != 1.0f) {
        detail::ddp::divide_elements(at_.exec(), x.chunks.padded(), x.full_grad.data(), divisor);
      }
      x.scatter = comm_->reduce_scatter(tensor_view<const float, S>(x.full_grad.data(), x.chunks.padded()),
                                        tensor_view<float, S>(grads_.data() + x.chunk_at, x.chunks.chunk()), reduce_op::sum);
    } else {
      with_16bit(opts_.reduce_dtype, [&]<class H>() {
        x.grad16 = buffer16(grad_meter_, x.chunks.padded(), false, at_);
        x.chunk16 = buffer16(grad_meter_, x.chunks.chunk(), false, at_);
        const tensor_view<H, S> whole = as16<H>(x.grad16);
        detail::for_each_index(at_.exec(), x.chunks.padded(),
                               detail::ddp::compress_16_fn<float, H>{x.full_grad.data(), whole.data(), divisor});
        x.full_grad.release();  // the 16-bit copy is what is reduced
        x.scatter = comm_->reduce_scatter(tensor_view<const H, S>(whole), as16<H>(x.chunk16), reduce_op::sum);
      });
    }
    scattering_.push_back(u);
  }

  void issue_gather(std::size_t u, bool full_precision = false) {
    auto& x = units_[u];
    if (x.full.held() || x.full16.held()) return;  // gathered, or on its way
    if (opts_.param_dtype == dtype::float32 || full_precision) {
      x.full = buffer(param_meter_, x.chunks.padded(), false, at_);  // the all_gather writes every element
      x.gather = comm_->all_gather(tensor_view<const float, S>(values_.data() + x.chunk_at, x.chunks.chunk()),
                                   tensor_view<float, S>(x.full.data(), x.chunks.padded()));
      return;
    }
    with_16bit(opts_.param_dtype, [&]<class H>() {
      x.send16 = buffer16(param_meter_, x.chunks.chunk(), false, at_);
      x.full16 = buffer16(param_meter_, x.chunks.padded(), false, at_);
      const tensor_view<H, S> mine = as16<H>(x.send16);
      detail::for_each_index(at_.exec(), x.chunks.chunk(),
                             detail::ddp::compress_16_fn<float, H>{values_.data() + x.chunk_at, mine.data(), 1.0f});
      x.gather = comm_->all_gather(tensor_view<const H, S>(mine), as16<H>(x.full16));
    });
  }
  void wait_gather(std::size_t u) {
    auto& x = units_[u];
    if (!x.gather) return;
    work w = std::move(*x.gather);
    x.gather.reset();
    wait_named(w, "parameter all_gather of " + unit_name(x));
    if (x.full16.held()) {
      // The fp32 layer only now: while the gather is in flight (a prefetch) only the 16-bit one is held.
      x.full = buffer(param_meter_, x.chunks.padded(), false, at_);  // the widening writes every element
      with_16bit(opts_.param_dtype, [&]<class H>() {
        detail::for_each_index(at_.exec(), x.chunks.padded(),
                               detail::ddp::decompress_16_fn<H, float>{as16<H>(x.full16).data(), x.full.data()});
      });
      x.send16.release();
      x.full16.release();
    }
  }
  void finish_scatter() {
    const std::size_t u = scattering_.front();
    scattering_.pop_front();
    auto& x = units_[u];
    if (x.scatter) {
      work w = std::move(*x.scatter);
      x.scatter.reset();
      wait_named(w, "gradient reduce_scatter of " + unit_name(x));
    }
    x.full_grad.release();
    if (x.chunk16.held()) {
      with_16bit(opts_.reduce_dtype, [&]<class H>() {
        detail::for_each_index(at_.exec(), x.chunks.chunk(),
                               detail::ddp::decompress_16_fn<H, float>{as16<H>(x.chunk16).data(), grads_.data() + x.chunk_at});
      });
      x.grad16.release();
      x.chunk16.release();
    }
  }

  // Points the layer's parameters into the gathered buffer (and the whole gradient, for backward).
  void bind(std::size_t u, bool with_grad) {
    auto& x = units_[u];
    std::size_t at = 0, k = 0;
    for_each_param(x, [&](auto& p) {
      const shape& s = x.shapes[k++];
      p.bind(tensor_view<float, S>(x.full.data() + at, s),
             with_grad ? tensor_view<float, S>(x.full_grad.data() + at, s) : tensor_view<float, S>{});
      at += s.numel();
    });
    at_.ahead_of(compute_stream_);  // the layers compute after the widening and the zeroed gradient
  }
  // The layer holds nothing again; its gathered buffer is freed.
  void reshard(std::size_t u) noexcept {
    auto& x = units_[u];
    for_each_param(x, [](auto& p) { p.bind(tensor_view<float, S>{}, tensor_view<float, S>{}); });
    x.full.release();
    x.send16.release();
    x.full16.release();
  }

  // Global-norm clipping across ranks: Σg² of this rank's chunks, summed over ranks (one double
  // all_reduce), then clip_grad_norm's rule on the chunks. Layers split over a tensor-parallel
  // group: their split parameters' squares add over that group too, the replicated ones' do not.
  void clip_chunks() {
    std::vector<detail::optim::gradient_only<float, S>> mine;
    std::array<double, 2> sum{0.0, 0.0};  // split parameters' elements, the rest
    for (auto& x : units_) {
      if (!x.mine.size()) continue;
      const tensor_view<float, S> g(grads_.data() + x.chunk_at, x.mine.size());
      mine.push_back({g});
      const auto s = detail::mesh_clip::split_squares<float, S>(g.data(), x.mine.begin, x.mine.end, x.split.ranges, at_.stream());
      sum[0] += s[0];
      sum[1] += s[1];
    }
    last_norm_ = deterministic() ? exact_norm()
                         : detail::mesh_clip::split_norm(
                               sum, [&](std::span<double> v) { small_all_reduce(v, "gradient-norm all_reduce"); }, split_group_);
    detail::optim::clip_to_norm(mine, last_norm_, opts_.max_grad_norm, at_.stream());
  }

  void step_chunks() {
    optimizer_->begin_step();
    for (const auto& x : units_) {
      if (x.mine.size() == 0) continue;
      optimizer_->update(values_.data() + x.chunk_at, grads_.data() + x.chunk_at, x.state_at, x.mine.size());
    }
  }

  // After a failure: waits for every collective in flight (errors ignored: the buffers must
  // outlive the backend's use), unbinds every layer and drops the whole buffers and any
  // accumulated micro-steps.
  void abandon_step() noexcept {
    for (auto& x : units_) {
      for (auto* w : {&x.gather, &x.scatter}) {
        if (!*w) continue;
        try {
          (*w)->wait();
        } catch (...) {
        }
        w->reset();
      }
    }
    for (std::size_t u = 0; u < units_.size(); ++u) {
      reshard(u);
      units_[u].full_grad.release();
      units_[u].grad16.release();
      units_[u].chunk16.release();
    }
    scattering_.clear();
    accumulated_ = 0;
    reset_exact();
  }

  // The deterministic mode's refusals, before anything is taken, and its per-unit sums.
  void check_exact() {
    const auto refuse = [&](const std::string& why) {
      throw config_error(where() + "fsdp_options::deterministic_shards = " + std::to_string(opts_.deterministic_shards) +
                         ": " + why);
    };
    if constexpr (!std::same_as<S, host>) {
      refuse("the deterministic mode sums host gradients (expected layers in host memory)");
    }
    if (opts_.deterministic_shards < world_) {
      refuse("fewer shards than the " + std::to_string(world_) +
             " ranks (expected at least one shard per rank; the shards, not the ranks, fix the result)");
    }
    if (opts_.reduce_dtype != dtype::float32) refuse("the exact sum takes float32 gradients (expected reduce_dtype float32)");
    if (opts_.join) refuse("every rank takes the whole global batch, so there are no uneven inputs to join (expected join = false)");
    if (split_group_) refuse("tensor-parallel layers are not summed exactly yet (expected layers without a split group)");
    std::size_t bytes = 0;
    for (auto& x : units_) {
      x.exact_hi.assign(x.mine.size(), 0);
      x.exact_lo.assign(x.mine.size(), 0);
      x.exact_bin.assign(x.shapes.size(), detail::deterministic::no_bin);
      bytes += 2 * x.mine.size() * sizeof(std::int64_t);
    }
    grad_meter_.add(bytes);  // held for the object's life, as the gradient chunks are
  }
  // Zero sums, no bins, no micro-batch under way: a new step.
  void reset_exact() noexcept {
    exact_pending_ = 0;
    for (auto& x : units_) {
      std::ranges::fill(x.exact_hi, 0);
      std::ranges::fill(x.exact_lo, 0);
      std::ranges::fill(x.exact_bin, detail::deterministic::no_bin);
    }
  }

  // One micro-batch (the whole global batch without accumulation) in the deterministic mode: this
  // rank's shards of it, one forward and backward each, every unit's shard gradients summed
  // exactly into the chunks after its backward (exact_scatter); in rounds of one shard per rank,
  // a rank without a shard in a round taking part in its collectives with zero gradients. The
  // step's last micro-batch then steps. Returns the micro-batch's mean loss, summed exactly over
  // the ranks (the same bits on every rank).
  template <class Target>
  double exact_micro_batch(tensor_view<const float> input, tensor_view<const Target> target, bool last) {
    if (!require_sync_) {
      throw invalid_argument_error(where() + "no_sync() in the deterministic mode (use accumulate_step and "
                                   "set_gradient_accumulation_steps: the exact sum needs every shard's own gradient)");
    }
    const std::size_t n = batch_rows(input, target, last ? "train_step" : "accumulate_step");
    const std::size_t s = opts_.deterministic_shards / micro_batches_;
    if (n % s != 0 || (exact_pending_ > 0 && n / s != exact_rows_)) {
      const std::string expected = exact_pending_ > 0 ? "the micro-batches of a step all of " + std::to_string(exact_rows_ * s) + " rows"
                                                      : "a batch whose size the shard count divides";
      reset_exact();  // the step is abandoned: the next call starts a new one
      throw invalid_argument_error(where() + "a " + (micro_batches_ > 1 ? "micro-batch" : "global batch") + " of " +
                                   std::to_string(n) + " rows in " + std::to_string(s) + " deterministic shards (expected " +
                                   expected + ")");
    }
    const std::size_t rows = n / s;
    exact_rows_ = rows;
    const auto mine = detail::deterministic::shards_of(rank_, world_, s);
    std::int64_t loss = 0;
    double result = 0;
    try {
      for (std::size_t j = 0; j < (s + world_ - 1) / world_; ++j) {
        if (j < mine.size()) {
          const std::size_t k = mine[j], first = k * rows;
          exact_shard_ = exact_pending_ * s + k;
          const auto in = on_place(input.slice(first, first + rows));
          const auto tg = on_place(target.slice(first, first + rows));
          const double sum = forward_backward(in.view, tg.view, rows, true);
          loss += detail::deterministic::to_fixed(sum / static_cast<double>(rows), detail::deterministic::loss_scale);
        } else {
          shadow_forward_backward(true);
        }
      }
      small_all_reduce(std::span<std::int64_t>(&loss, 1), "loss all_reduce");
      result = detail::deterministic::from_fixed(loss) / detail::deterministic::loss_scale / static_cast<double>(s);
      ++exact_pending_;
      if (last) {
        exact_to_chunks(exact_pending_ * s);
        finish_step();
        ++steps_;
      }
    } catch (...) {
      abandon_step();
      throw;
    }
    return result;
  }
  // After unit u's backward of one round: each parameter's largest magnitude over every rank's
  // shard (an all_reduce max), its values as two bin digits per element (int64), their
  // reduce_scatter, and this rank's block merged into the step's sum.
  void exact_scatter(std::size_t u) {
    if constexpr (std::same_as<S, host>) {
      namespace det = detail::deterministic;
      auto& x = units_[u];
      const float* g = x.full_grad.data();
      const std::size_t chunk = x.chunks.chunk(), count = x.shapes.size();
      exact_largest_.assign(count, 0.0f);
      for (std::size_t k = 0, at = 0; k < count; at += x.shapes[k].numel(), ++k) {
        exact_largest_[k] = det::largest_magnitude(g + at, x.shapes[k].numel());  // inf for any inf or NaN
      }
      wait_named(comm_->all_reduce(tensor_view<float>(exact_largest_), reduce_op::max), "largest-gradient all_reduce of " + unit_name(x));
      exact_send_.assign(2 * x.chunks.padded(), 0);  // rank r's block: its chunk's high digits, then its low ones
      exact_round_bin_.assign(count, det::no_bin);
      for (std::size_t k = 0, at = 0; k < count; at += x.shapes[k].numel(), ++k) {
        if (!std::isfinite(exact_largest_[k])) {
          throw invalid_argument_error(where() + "a shard's gradient of parameter " + std::to_string(k) + " of " + unit_name(x) +
                                       " is not finite (inf or NaN): nothing exact can be summed");
        }
        if (exact_largest_[k] == 0.0f) continue;  // zeros add nothing, in any bin
        const int t = exact_round_bin_[k] = det::bin_of(exact_largest_[k]);
        for (std::size_t e = at, end = at + x.shapes[k].numel(); e < end;) {
          const std::size_t r = e / chunk, stop = std::min(end, (r + 1) * chunk);
          std::int64_t* block = exact_send_.data() + 2 * r * chunk + (e - r * chunk);
          det::add_digits(g + e, stop - e, t, block, block + chunk);
          e = stop;
        }
      }
      exact_recv_.resize(2 * chunk);
      struct counted {  // the digits in flight count as gradient bytes, however the step ends
        detail::fsdp::byte_meter& m;
        std::size_t bytes;
        ~counted() { m.sub(bytes); }
      } guard{grad_meter_, (exact_send_.size() + exact_recv_.size()) * sizeof(std::int64_t)};
      grad_meter_.add(guard.bytes);
      const work w = comm_->reduce_scatter(tensor_view<const std::int64_t>(exact_send_), tensor_view<std::int64_t>(exact_recv_));
      wait_named(w, "exact gradient reduce_scatter of " + unit_name(x));
      x.full_grad.release();
      for_each_owned_piece(x, [&](std::size_t k, std::size_t o, std::size_t len) {
        det::merge_bins(x.exact_bin[k], x.exact_hi.data() + o, x.exact_lo.data() + o, exact_recv_.data() + o,
                        exact_recv_.data() + chunk + o, len, exact_round_bin_[k]);
      });
    } else {
      (void)u;
    }
  }
  // f(k, offset, n) for each parameter k of unit x with elements in this rank's chunk: its
  // n elements there start `offset` elements into the chunk.
  template <class F>
  static void for_each_owned_piece(const unit& x, F&& f) {
    for (std::size_t k = 0, at = 0; k < x.shapes.size(); at += x.shapes[k].numel(), ++k) {
      const std::size_t lo = std::max(at, x.mine.begin), hi = std::min(at + x.shapes[k].numel(), x.mine.end);
      if (lo < hi) f(k, lo - x.mine.begin, hi - lo);
    }
  }
  // The step's exact sums as the mean gradient of its `shards` shards, into the gradient chunks;
  // the sums start again.
  void exact_to_chunks(std::size_t shards) {
    if constexpr (std::same_as<S, host>) {
      for (auto& x : units_) {
        float* g = grads_.data() + x.chunk_at;
        for_each_owned_piece(x, [&](std::size_t k, std::size_t o, std::size_t len) {
          for (std::size_t e = o; e < o + len; ++e) {
            g[e] = static_cast<float>(detail::deterministic::bins_value(x.exact_bin[k], x.exact_hi[e], x.exact_lo[e]) /
                                      static_cast<double>(shards));
          }
        });
      }
    } else {
      (void)shards;
    }
    reset_exact();
  }
  // The global gradient norm the same at any world size: every chunk element's square in 64-bit
  // fixed point at one scale (from the largest magnitude anywhere, an all_reduce max) so that
  // their sum stays below 2^51, summed exactly over the ranks.
  [[nodiscard]] double exact_norm() {
    if constexpr (std::same_as<S, host>) {
      float largest = 0;
      for (const auto& x : units_) {
        largest = std::max(largest, detail::deterministic::largest_magnitude(grads_.data() + x.chunk_at, x.mine.size()));
      }
      wait_named(comm_->all_reduce(tensor_view<float>(&largest, 1), reduce_op::max), "largest-gradient all_reduce");
      if (!std::isfinite(largest)) return std::numeric_limits<double>::infinity();  // every rank alike
      const double big = static_cast<double>(largest);
      const double scale = detail::deterministic::fixed_point_scale(big * big * static_cast<double>(std::max<std::size_t>(unsharded_, 1)));
      std::int64_t q = 0;
      for (const auto& x : units_) {
        for (const float v : std::span<const float>(grads_.data() + x.chunk_at, x.mine.size())) {
          q += detail::deterministic::to_fixed(static_cast<double>(v) * static_cast<double>(v), scale);
        }
      }
      small_all_reduce(std::span<std::int64_t>(&q, 1), "gradient-norm all_reduce");
      return std::sqrt(detail::deterministic::from_fixed(q) / scale);
    } else {
      return 0.0;
    }
  }

  // Waits, and names this rank and the operation in a communication failure (keeping its type).
  void wait_named(const work& w, const std::string& what) const {
    detail::zero::wait_named(w, where() + what, static_cast<int>(rank_), what,
                             opts_.join ? " (every rank must run the same steps and evaluations)"
                                        : " (every rank must run the same steps and evaluations; if ranks run out of "
                                          "batches at different steps, construct with fsdp_options{.join = true} and "
                                          "call join() on a rank once its data ends)");
  }

  Layers* layers_;
  C* comm_;
  Loss loss_;
  fsdp_options opts_;
  std::size_t rank_, world_;
  X at_{};
  void* compute_stream_ = nullptr;  // the first layer's stream() (a cudaStream_t; null: the legacy stream)
  std::vector<unit> units_;
  process_group* split_group_ = nullptr;  // the tensor-parallel group of split parameters (build_units)
  std::vector<std::ptrdiff_t> unit_of_;  // per layer: its unit, or -1 (no parameters)
  std::size_t unsharded_ = 0;            // the model's parameter elements
  detail::fsdp::byte_meter param_meter_, grad_meter_, act_meter_;
  recompute_options recompute_;  // the sequential model's, when made from one
  std::uint64_t seed_ = 0;
  std::uint64_t calls_ = 0;  // forward_backward calls: each draws from its own seeds
  buffer values_;  // this rank's chunk of every unit, chunk() elements each (padding zero)
  buffer grads_;   // their reduced gradients
  std::optional<detail::zero::shard_optimizer<float, S>> optimizer_;
  std::deque<std::size_t> scattering_;  // units whose reduce_scatter is in flight, oldest first
  std::size_t accumulated_ = 0;
  std::size_t active_ = 1;  // the divisor's rank count this step (world_ unless join divides by the active ranks)
  std::size_t shadow_steps_ = 0;
  bool joined_ = false;
  bool require_sync_ = true;
  bool summoned_ = false;
  float loss_scale_ = 1.0f;
  gradient_hook hook_;
  bool skipped_ = false;
  std::int64_t steps_ = 0;
  double last_norm_ = std::nan("");
  // The deterministic mode: micro-batches a step, those of the step under way already summed,
  // their shards' rows, the global index in the step of the shard being computed, and scratch.
  std::size_t micro_batches_ = 1;
  std::size_t exact_pending_ = 0;
  std::size_t exact_rows_ = 0;
  std::uint64_t exact_shard_ = 0;
  std::vector<float> exact_largest_;
  std::vector<int> exact_round_bin_;
  std::vector<std::int64_t> exact_send_, exact_recv_;
};

}  // namespace partrain::inline v0
