// partrain/model/layer.hpp: a model written as a sequence of layers plus a loss, the one
// description every parallel mode takes. `sequential` (model/sequential.hpp) makes it a model for
// DDP, ZeRO, data parallel, local SGD and DiLoCo; fully sharded data parallel and the pipeline cut
// the same sequence into units and stages. Layers hold no per-batch state: whoever runs them keeps
// every layer's input and output until its backward, so several micro-batches can be in flight
// through one layer and the activation memory is visible to the runner.
//
// Optional on a layer: train(bool) (a train/eval switch; evaluation runs in eval mode),
// buffers() (non-trainable state as tensor_view<float>s; see has_buffers in model/concepts.hpp),
// and saved activations: a layer with internals (a transformer block) declares saved_size and
// takes a layer_call, memory the runner owns for what its backward needs, so the runner can count
// it, keep one per micro-batch in flight, or drop it and recompute (recompute_options).
//
// The gradient rule, stated once: a layer's backward ADDS d loss / d parameters to its
// parameters' grad() and WRITES the gradient of its input; a model's train_step (sequential's
// too) zeroes the gradients first, so after a step they hold that step's gradients only.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <ranges>
#include <type_traits>
#include <utility>
#include <vector>

#include <partrain/core/tensor_view.hpp>
#include <partrain/model/concepts.hpp>

namespace partrain::inline v0 {

// What a runner passes to a layer that keeps activations (see keeps_activations): `saved` holds
// saved_size(in) floats of this call's own (several micro-batches may be in flight through one
// layer); forward writes there what backward needs, backward reads it and may overwrite it.
// `seed` is this call's own and the same when the forward is recomputed: random draws (dropout)
// come from it, so a recomputed forward repeats the original bit for bit.
template <class S = host>
struct layer_call {
  tensor_view<float, S> saved;
  std::uint64_t seed = 0;
};

// A layer that keeps activations beyond its output:
//   saved_size(in)                       floats it keeps from forward for backward
//   forward(in, out, call)               out = f(in), writes call.saved
//   backward(in, out, call, gout, gin)   as below, reading call.saved
template <class L, class S = host>
concept keeps_activations = requires(L& l, const L& cl, const shape& s, tensor_view<const float, S> in,
                                     tensor_view<float, S> wout, const layer_call<S>& c) {
  { cl.saved_size(s) } -> std::convertible_to<std::size_t>;
  l.forward(in, wout, c);
  l.backward(in, in, c, in, wout);
};

// One part of a model, computing on float tensors in memory space S (host; fully sharded data
// parallel also takes CUDA layers).
//   output_shape(in)               the output shape for an input shape (batch dimension first)
//   forward(in, out)               out = f(in)
//   backward(in, out, gout, gin)   accumulates d loss / d parameters (+=) and writes gin = d loss / d in
//   parameters()                   a forward range of parameters (may be empty)
// or, instead of that forward and backward, the three of keeps_activations.
template <class L, class S = host>
concept layer = requires(L& l, const L& cl, const shape& s) {
  { cl.output_shape(s) } -> std::convertible_to<shape>;
  { l.parameters() } -> std::ranges::forward_range;
} && (keeps_activations<L, S> ||
      requires(L& l, tensor_view<const float, S> in, tensor_view<const float, S> out, tensor_view<const float, S> gout,
               tensor_view<float, S> wout, tensor_view<float, S> gin) {
        l.forward(in, wout);
        l.backward(in, out, gout, gin);
      }) && parameter<std::ranges::range_value_t<decltype(std::declval<L&>().parameters())>>;

// Activation recomputation (PyTorch's checkpoint, Megatron's full recompute granularity): a
// selected layer that keeps activations drops them after its forward and runs its forward again,
// with the same seed, just before its backward. Gradients are bit-identical either way; the
// activation memory of a selected layer shrinks to its input and output (which the neighbouring
// layers keep anyway), at the cost of a second forward. No communication is repeated: a runner
// recomputes from parameters it holds for the backward anyway.
struct recompute_options {
  std::size_t every = 0;    // 0: none; 1: every layer; k: layers 0, k, 2k, ...
  std::vector<bool> layers; // per layer, by index (overrides every when not empty)

  [[nodiscard]] bool selects(std::size_t i) const noexcept {
    if (!layers.empty()) return i < layers.size() && layers[i];
    return every > 0 && i % every == 0;
  }
  [[nodiscard]] bool any() const noexcept { return every > 0 || std::ranges::find(layers, true) != layers.end(); }
};

namespace detail::layers {

template <class T>
concept dereferenceable = requires(T& t) { *t; };

// A layer sequence may hold layers by value or through pointers (unique_ptr to a base class is
// how heterogeneous models are written); layer_of sees through either. A layer is what has
// parameters(), whatever memory it computes in.
template <class E>
[[nodiscard]] constexpr decltype(auto) layer_of(E& e) noexcept {
  if constexpr (requires { e.parameters(); }) {
    return (e);
  } else {
    return (*e);
  }
}

template <class R>
using layer_t = std::remove_reference_t<decltype(layer_of(std::declval<std::ranges::range_reference_t<R>&>()))>;

// The parameter type of R's layers (every layer of a sequence has the same one).
template <class R>
using layer_param_t = std::ranges::range_value_t<decltype(std::declval<layer_t<R>&>().parameters())>;

// How runners call any layer: with the saved memory and seed where the layer keeps activations,
// plainly where it does not (its saved size is then 0).
template <class S, class L>
[[nodiscard]] std::size_t saved_size(const L& l, const shape& in) {
  if constexpr (keeps_activations<L, S>) {
    return static_cast<std::size_t>(l.saved_size(in));
  } else {
    return 0;
  }
}
template <class S, class L>
void forward(L& l, tensor_view<const float, S> in, tensor_view<float, S> out, const layer_call<S>& c) {
  if constexpr (keeps_activations<L, S>) {
    l.forward(in, out, c);
  } else {
    l.forward(in, out);
  }
}
template <class S, class L>
void backward(L& l, tensor_view<const float, S> in, tensor_view<const float, S> out, const layer_call<S>& c,
              tensor_view<const float, S> gout, tensor_view<float, S> gin) {
  if constexpr (keeps_activations<L, S>) {
    l.backward(in, out, c, gout, gin);
  } else {
    l.backward(in, out, gout, gin);
  }
}

// A call's seed from the model's seed, the runner's step count, the micro-batch and the layer
// index (splitmix64 rounds over each): distinct per call, the same when that call's forward is
// recomputed.
[[nodiscard]] constexpr std::uint64_t call_seed(std::uint64_t seed, std::uint64_t step, std::uint64_t micro,
                                                std::uint64_t layer) noexcept {
  std::uint64_t x = seed;
  for (const std::uint64_t v : {step, micro, layer}) {
    x += 0x9E3779B97F4A7C15ull + v;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    x ^= x >> 31;
  }
  return x;
}

template <class E, class S = host>
concept layer_or_pointer_to_layer =
    layer<E, S> || (dereferenceable<E> && layer<std::remove_reference_t<decltype(*std::declval<E&>())>, S>);

}  // namespace detail::layers

// A model as an indexable sequence of layers (std::vector<linear>, or std::vector<std::unique_ptr<layer_base>>).
template <class R, class S = host>
concept layer_sequence = std::ranges::random_access_range<R> && std::ranges::sized_range<R> &&
                         detail::layers::layer_or_pointer_to_layer<std::ranges::range_value_t<R>, S>;

// Explains, one sentence each, why R is not a layer sequence (of layers computing in S). Called by
// sequential, the pipeline and fully sharded data parallel before anything else looks at R.
template <class R, class S = host>
consteval bool check_layer_sequence() {
  static_assert(std::ranges::random_access_range<R> && std::ranges::sized_range<R>,
                "partrain: a layered model must be a sized random-access range of layers (a std::vector of layers, "
                "or of pointers to layers)");
  using E = std::ranges::range_value_t<R>;
  using L = std::remove_cvref_t<decltype(detail::layers::layer_of(std::declval<E&>()))>;
  static_assert(requires(const L& l, const shape& s) {
    { l.output_shape(s) } -> std::convertible_to<shape>;
  }, "partrain: a layer needs `shape output_shape(const shape& in) const`");
  if constexpr (requires(const L& l, const shape& s) { l.saved_size(s); }) {
    static_assert(requires(L& l, tensor_view<const float, S> in, tensor_view<float, S> out, const layer_call<S>& c) {
      l.forward(in, out, c);
    }, "partrain: a layer with `saved_size` needs `void forward(tensor_view<const float> in, tensor_view<float> out, "
       "const layer_call<>& call)`");
    static_assert(requires(L& l, tensor_view<const float, S> in, tensor_view<float, S> g, const layer_call<S>& c) {
      l.backward(in, in, c, in, g);
    }, "partrain: a layer with `saved_size` needs `void backward(tensor_view<const float> in, tensor_view<const float> "
       "out, const layer_call<>& call, tensor_view<const float> grad_out, tensor_view<float> grad_in)`");
  } else {
    static_assert(requires(L& l, tensor_view<const float, S> in, tensor_view<float, S> out) { l.forward(in, out); },
                  "partrain: a layer needs `void forward(tensor_view<const float> in, tensor_view<float> out)`");
    static_assert(requires(L& l, tensor_view<const float, S> in, tensor_view<float, S> g) { l.backward(in, in, in, g); },
                  "partrain: a layer needs `void backward(tensor_view<const float> in, tensor_view<const float> "
                  "out, tensor_view<const float> grad_out, tensor_view<float> grad_in)`");
  }
  static_assert(requires(L& l) {
    { l.parameters() } -> std::ranges::forward_range;
  }, "partrain: a layer needs `parameters()` returning a forward range (empty for a layer without weights)");
  static_assert(layer<L, S>, "partrain: each element of a layer's `parameters()` needs `value()` and `grad()` views");
  return true;
}

// The loss after the last layer, per (micro-)batch. forward_backward returns the SUM of the
// per-example losses and writes grad_out = scale * d(sum)/d(out); callers pass scale = 1 / batch
// size so the layers' gradients are those of the batch mean. evaluate returns the summed loss,
// correct predictions and examples. S: where out, target and grad_out live (CUDA for fully sharded
// data parallel's CUDA layers; the sums come back to the host).
template <class F, class Target, class S = host>
concept layer_loss = requires(F& f, tensor_view<const float, S> out, tensor_view<const Target, S> target,
                              tensor_view<float, S> grad_out, float scale) {
  { f.forward_backward(out, target, grad_out, scale) } -> std::convertible_to<double>;
  { f.evaluate(out, target) } -> std::convertible_to<eval_result>;
};

// Explains why F is not a loss on targets of type Target.
template <class F, class Target, class S = host>
consteval bool check_layer_loss() {
  static_assert(requires(F& f, tensor_view<const float, S> out, tensor_view<const Target, S> target,
                         tensor_view<float, S> grad_out, float scale) {
    { f.forward_backward(out, target, grad_out, scale) } -> std::convertible_to<double>;
  }, "partrain: a loss needs `double forward_backward(tensor_view<const float> out, tensor_view<const Target> "
     "target, tensor_view<float> grad_out, float scale)` (returns the summed loss, writes scale * d sum / d out)");
  static_assert(requires(F& f, tensor_view<const float, S> out, tensor_view<const Target, S> target) {
    { f.evaluate(out, target) } -> std::convertible_to<eval_result>;
  }, "partrain: a loss needs `eval_result evaluate(tensor_view<const float> out, tensor_view<const Target> target)` "
     "(summed loss, correct predictions, examples)");
  return true;
}

// A parameter of a layer, seen from a model that spans several layers (sequential, a pipeline
// stage): its value() and grad() are the layer parameter's, read at each call, so a parameter
// whose storage moved (fully sharded data parallel binds it) is seen where it is now.
template <class P>
struct parameter_ref {
  P* p;
  [[nodiscard]] auto value() const { return p->value(); }
  [[nodiscard]] auto grad() const { return p->grad(); }
  [[nodiscard]] auto name() const
    requires requires(const P& q) { q.name(); }
  {
    return p->name();
  }
  // The group a tensor-parallel parameter is split across (parallel/mesh_clip.hpp counts it there).
  [[nodiscard]] auto shard_group() const
    requires requires(const P& q) { q.shard_group(); }
  {
    return p->shard_group();
  }
};

}  // namespace partrain::inline v0
