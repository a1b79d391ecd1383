// partrain/model/sequential.hpp: a layer sequence plus a loss as a model (PyTorch's
// nn.Sequential with its loss). The one description of a layered model every mode takes: DDP,
// ZeRO, data parallel, local SGD, DiLoCo and PowerSGD train it as a model (train_step writes the
// gradients, reports each layer's parameters ready as its backward finishes, so DDP's buckets
// overlap the rest of backward); fully sharded data parallel and the pipeline take it whole and
// cut its layers into units and stages.
//
//   sequential model(models::layers::make_mlp({784, 256, 128, 10}, seed), softmax_cross_entropy{});
//   distributed_data_parallel ddp(model, group);             // or sharded_data_parallel, diloco, ...
//   fully_sharded_data_parallel fsdp(model, group, sgd_options{.lr = 0.05});
//   pipeline_stage stage(model, group, {.micro_batches = 4});
//
// Host layers (float tensors in host memory). The activations of the last step are kept in
// buffers reused from step to step (grown when a batch needs more). Layers that keep activations
// (saved_size) get theirs from here too, or recompute them in backward (set_recompute); fully
// sharded data parallel and the pipeline take the setting with the layers.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <ranges>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <partrain/core/buffer.hpp>
#include <partrain/core/device.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/model/concepts.hpp>
#include <partrain/model/layer.hpp>

namespace partrain::inline v0 {

namespace detail::layers {

// A batch a layered model reads: features (the first layer's input) and labels (the loss's targets).
template <class B>
concept features_and_labels = requires(const B& b) {
  tensor_view<const float>(b.features);
  b.labels.data();
  b.labels.size();
};
template <class B>
using label_t = std::remove_cv_t<typename std::remove_cvref_t<decltype(std::declval<const B&>().labels)>::value_type>;

// A sequence whose copy constructor works (std::vector<std::unique_ptr<T>> claims one it cannot
// instantiate, hence the element check).
template <class R>
concept copyable_values = std::copy_constructible<R> && std::copy_constructible<std::ranges::range_value_t<R>>;

// How a sequence is copied for another device: as a value, or (a sequence of pointers to a base)
// layer by layer through each layer's clone().
template <class R>
concept copyable_sequence = copyable_values<R> || requires(const std::ranges::range_value_t<R>& e, R& r) {
  { e->clone() } -> std::convertible_to<std::ranges::range_value_t<R>>;
  r.push_back(e->clone());
};

template <class R>
[[nodiscard]] R copy_sequence(const R& r) {
  if constexpr (copyable_values<R>) {
    return r;
  } else {
    R out;
    for (const auto& e : r) out.push_back(e->clone());
    return out;
  }
}

// Host memory that keeps its capacity while the shapes it holds change.
class activation {
 public:
  [[nodiscard]] tensor_view<float> reshape(const shape& s) {
    if (s.numel() > mem_.size()) mem_ = host_buffer<float>(s.numel());
    shape_ = s;
    return view();
  }
  [[nodiscard]] tensor_view<float> view() noexcept { return {mem_.data(), shape_}; }
  [[nodiscard]] tensor_view<const float> cview() noexcept { return {mem_.data(), shape_}; }
  [[nodiscard]] std::size_t capacity_bytes() const noexcept { return mem_.size_bytes(); }

 private:
  host_buffer<float> mem_;
  shape shape_{0};
};

}  // namespace detail::layers

// Optional, on a layer: a train/eval switch (dropout, batch norm). sequential::eval_step runs the
// layers in eval mode and puts them back.
template <class L>
concept has_training_mode = requires(L& l, bool on) { l.train(on); };

template <class Layers, class Loss>
class sequential {
  static_assert(check_layer_sequence<Layers>(), "partrain: sequential takes a layer sequence (see above)");
  using param_type = detail::layers::layer_param_t<Layers>;

 public:
  using layers_type = Layers;
  using loss_type = Loss;

  // Takes the layers (moved in: std::vector<std::unique_ptr<base>> is how heterogeneous models
  // are written) and the loss after the last layer.
  explicit sequential(Layers layers, Loss loss = {}) : layers_(std::move(layers)), loss_(std::move(loss)) {
    if (std::ranges::size(layers_) == 0) {
      throw invalid_argument_error("sequential: the layer sequence is empty (expected at least one layer)");
    }
    index_parameters();
  }
  sequential(const sequential& o)
    requires detail::layers::copyable_values<Layers> && std::copy_constructible<Loss>
      : layers_(o.layers_), loss_(o.loss_), loss_scale_(o.loss_scale_), training_(o.training_),
        recompute_(o.recompute_), seed_(o.seed_) {
    index_parameters();
  }
  // Not noexcept: the parameter index is rebuilt for the moved layers (an allocation).
  sequential(sequential&& o)
      : layers_(std::move(o.layers_)), loss_(std::move(o.loss_)), loss_scale_(o.loss_scale_), training_(o.training_),
        recompute_(std::move(o.recompute_)), seed_(o.seed_) {
    index_parameters();
  }
  sequential& operator=(const sequential&) = delete;
  sequential& operator=(sequential&&) = delete;

  [[nodiscard]] Layers& layers() noexcept { return layers_; }
  [[nodiscard]] const Layers& layers() const noexcept { return layers_; }
  [[nodiscard]] Loss& loss() noexcept { return loss_; }
  [[nodiscard]] std::size_t size() const noexcept { return std::ranges::size(layers_); }
  [[nodiscard]] decltype(auto) layer(std::size_t i) {
    return detail::layers::layer_of(std::ranges::begin(layers_)[static_cast<std::ptrdiff_t>(i)]);
  }

  // Every layer's parameters, layer by layer, in the layers' own order: the same on every rank.
  [[nodiscard]] std::vector<parameter_ref<param_type>>& parameters() noexcept { return refs_; }

  // Every layer's buffers (non-trainable state), layer by layer, when the layers have them.
  [[nodiscard]] std::vector<tensor_view<float>> buffers()
    requires has_buffers<detail::layers::layer_t<Layers>>
  {
    std::vector<tensor_view<float>> out;
    for (auto& e : layers_) {
      for (auto&& b : detail::layers::layer_of(e).buffers()) out.push_back(b);
    }
    return out;
  }

  // Forward through every layer, the loss, backward through every layer. The gradients are zeroed
  // first, so they hold this batch's (of its mean loss) afterwards; returns the mean loss.
  template <class B>
  double train_step(const B& b) {
    return step(b, nullptr);
  }
  // The same, calling ready(i) for parameter i (its index in parameters()) the moment its
  // gradient is final: after its layer's backward, last layer first.
  template <class B>
  double train_step(const B& b, const grad_ready_fn& ready) {
    return step(b, &ready);
  }

  // Forward only (layers in eval mode for the call): summed loss, correct predictions, examples.
  template <class B>
  [[nodiscard]] eval_result eval_step(const B& b) {
    check_batch<B>();
    const auto x = rows(b, "eval_step");
    const bool was_training = training_;
    train(false);
    struct restore {
      sequential* s;
      bool mode;
      ~restore() { s->train(mode); }
    } back{this, was_training};
    const tensor_view<const float> out = forward(x);
    return loss_.evaluate(out, labels_of(b));
  }

  // PyTorch's module.train(mode) / eval(): passed to every layer that has a switch.
  void train(bool on = true) {
    training_ = on;
    for (auto& e : layers_) {
      auto& l = detail::layers::layer_of(e);
      if constexpr (has_training_mode<std::remove_reference_t<decltype(l)>>) l.train(on);
    }
  }
  void eval() { train(false); }
  [[nodiscard]] bool training() const noexcept { return training_; }

  // Activation recomputation for the layers `r` selects (see recompute_options), under every mode
  // that runs these layers.
  void set_recompute(recompute_options r) {
    if (!r.layers.empty() && r.layers.size() != size()) {
      throw invalid_argument_error("sequential::set_recompute: " + std::to_string(r.layers.size()) +
                                   " per-layer flags for " + std::to_string(size()) + " layers (expected one per layer)");
    }
    recompute_ = std::move(r);
  }
  [[nodiscard]] const recompute_options& recompute() const noexcept { return recompute_; }

  // The seed layers' random draws (dropout) start from; each step's calls get their own seeds.
  void set_seed(std::uint64_t s) noexcept { seed_ = s; }
  [[nodiscard]] std::uint64_t seed() const noexcept { return seed_; }

  // Mixed precision (amp_step with a grad scaler): the loss's gradient is multiplied by s.
  void set_loss_scale(float s) {
    if (!(s > 0) || !(s < std::numeric_limits<float>::infinity())) {
      throw invalid_argument_error("sequential::set_loss_scale: the scale must be a finite number > 0, got " +
                                   std::to_string(s));
    }
    loss_scale_ = s;
  }

  // A copy for another host device (what data_parallel replicates): the layers copied, or cloned
  // one by one when the sequence holds pointers to a base with clone().
  [[nodiscard]] sequential replicate_to(device d) const
    requires detail::layers::copyable_sequence<Layers> && std::copy_constructible<Loss>
  {
    if (d.is_cuda()) {
      throw invalid_argument_error("sequential::replicate_to(" + d.to_string() +
                                   "): sequential runs host layers (expected a cpu device)");
    }
    sequential copy(detail::layers::copy_sequence(layers_), loss_);
    copy.loss_scale_ = loss_scale_;
    copy.recompute_ = recompute_;
    copy.seed_ = seed_;
    copy.train(training_);
    return copy;
  }

  // The bytes the activations and their gradients occupy at the most (kept for reuse from step to
  // step): layer outputs, saved activations, the recomputation's scratch.
  [[nodiscard]] std::size_t activation_bytes() const noexcept {
    std::size_t n = grad_a_.capacity_bytes() + grad_b_.capacity_bytes() + scratch_saved_.capacity_bytes() +
                    scratch_out_.capacity_bytes();
    for (const auto& a : outs_) n += a.capacity_bytes();
    for (const auto& a : saved_) n += a.capacity_bytes();
    return n;
  }

 private:
  template <class B>
  static consteval void check_batch() {
    static_assert(detail::layers::features_and_labels<B>,
                  "partrain: sequential trains on a batch with `features` (a float tensor_view, the first layer's "
                  "input) and `labels` (the loss's targets), like partrain::batch");
    static_assert(check_layer_loss<Loss, detail::layers::label_t<B>>());
  }
  template <class B>
  static tensor_view<const detail::layers::label_t<B>> labels_of(const B& b) {
    return b.labels;
  }
  template <class B>
  tensor_view<const float> rows(const B& b, const char* what) const {
    const tensor_view<const float> x(b.features);
    const std::size_t n = x.rank() ? x.extent(0) : 0;
    if (n == 0) throw invalid_argument_error(std::string("sequential::") + what + ": the batch is empty (expected >= 1 example)");
    if (b.labels.size() != n) {
      throw invalid_argument_error(std::string("sequential::") + what + ": " + std::to_string(n) + " rows of features but " +
                                   std::to_string(b.labels.size()) + " labels (expected one label per row)");
    }
    return x;
  }

  void index_parameters() {
    refs_.clear();
    first_param_.clear();
    for (auto& e : layers_) {
      first_param_.push_back(refs_.size());
      for (auto& p : detail::layers::layer_of(e).parameters()) refs_.push_back({&p});
    }
    first_param_.push_back(refs_.size());
    outs_.resize(size());
    saved_.resize(size());
  }

  // Whether layer i's saved activations are dropped after forward (and recomputed in backward).
  [[nodiscard]] bool recomputed(std::size_t i) const noexcept { return training_ && recompute_.selects(i); }
  [[nodiscard]] layer_call<> call(std::size_t i, std::size_t floats) {
    auto& mem = recomputed(i) || !training_ ? scratch_saved_ : saved_[i];
    return {mem.reshape(shape{floats}), detail::layers::call_seed(seed_, steps_, 0, i)};
  }

  // Runs every layer forward into outs_; returns the last output. Saved activations go to saved_
  // (training, kept) or the scratch (evaluation, or a recomputed layer).
  tensor_view<const float> forward(tensor_view<const float> x) {
    tensor_view<const float> cur = x;
    for (std::size_t i = 0; i < size(); ++i) {
      auto& l = layer(i);
      const tensor_view<float> out = outs_[i].reshape(l.output_shape(cur.shape()));
      detail::layers::forward<host>(l, cur, out, call(i, detail::layers::saved_size<host>(l, cur.shape())));
      cur = out;
    }
    return cur;
  }

  template <class B>
  double step(const B& b, const grad_ready_fn* ready) {
    check_batch<B>();
    const auto x = rows(b, "train_step");
    for (auto& p : refs_) std::ranges::fill(p.grad(), 0.0f);
    const tensor_view<const float> out = forward(x);
    const std::size_t n = x.extent(0);
    tensor_view<float> g = grad_a_.reshape(out.shape());
    const double sum = loss_.forward_backward(out, labels_of(b), g, loss_scale_ / static_cast<float>(n));
    detail::layers::activation* gin_mem = &grad_b_;
    for (std::size_t j = size(); j-- > 0;) {
      const tensor_view<const float> in = j == 0 ? x : outs_[j - 1].cview();
      const tensor_view<float> gin = gin_mem->reshape(in.shape());
      auto& l = layer(j);
      const std::size_t floats = detail::layers::saved_size<host>(l, in.shape());
      // The forward's call (memory, seed): a recomputed forward writes the same activations.
      const layer_call<> c = call(j, floats);
      if (recomputed(j) && floats > 0) detail::layers::forward<host>(l, in, scratch_out_.reshape(outs_[j].view().shape()), c);
      detail::layers::backward<host>(l, in, outs_[j].cview(), c, g, gin);
      if (ready) {
        for (std::size_t k = first_param_[j + 1]; k-- > first_param_[j];) (*ready)(k);
      }
      g = gin;
      gin_mem = gin_mem == &grad_b_ ? &grad_a_ : &grad_b_;
    }
    ++steps_;
    return sum / static_cast<double>(n);
  }

  Layers layers_;
  Loss loss_;
  float loss_scale_ = 1.0f;
  bool training_ = true;
  std::vector<parameter_ref<param_type>> refs_;
  std::vector<std::size_t> first_param_;  // per layer, the index of its first parameter (+ the end)
  recompute_options recompute_;
  std::uint64_t seed_ = 0;
  std::uint64_t steps_ = 0;  // train steps taken: each step's layer calls draw from their own seeds
  std::vector<detail::layers::activation> outs_;
  std::vector<detail::layers::activation> saved_;  // per layer, what forward kept for backward
  detail::layers::activation scratch_saved_, scratch_out_;  // evaluation's and recomputation's
  detail::layers::activation grad_a_, grad_b_;
};

}  // namespace partrain::inline v0
