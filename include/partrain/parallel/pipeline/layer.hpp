// partrain/parallel/pipeline/layer.hpp: what a model must look like to be cut into pipeline
// stages. A model is a sequence of layers; each layer maps a [batch, ...] float tensor to
// another and back-propagates a gradient. Layers hold no per-micro-batch state: the pipeline
// keeps every layer's input and output until the backward, so several micro-batches can be in
// flight through the same layer and the activation memory a schedule needs is visible to it.
#pragma once

#include <concepts>
#include <cstddef>
#include <memory>
#include <ranges>
#include <type_traits>
#include <utility>

#include <partrain/core/tensor_view.hpp>
#include <partrain/model/concepts.hpp>

namespace partrain::inline v0 {

// One stage-able part of a model, computing on tensors in memory space S (host for the pipeline;
// fully sharded data parallel also takes CUDA layers).
//   output_shape(in)               the output shape for an input shape (batch dimension first)
//   forward(in, out)               out = f(in)
//   backward(in, out, gout, gin)   accumulates d loss / d parameters (+=) and writes gin = d loss / d in
//   parameters()                   a forward range of parameters (may be empty)
template <class L, class S = host>
concept pipeline_layer = requires(L& l, const L& cl, const shape& s, tensor_view<const float, S> in,
                                  tensor_view<const float, S> out, tensor_view<const float, S> gout,
                                  tensor_view<float, S> wout, tensor_view<float, S> gin) {
  { cl.output_shape(s) } -> std::convertible_to<shape>;
  l.forward(in, wout);
  l.backward(in, out, gout, gin);
  { l.parameters() } -> std::ranges::forward_range;
} && parameter<std::ranges::range_value_t<decltype(std::declval<L&>().parameters())>>;

namespace detail::pipeline {

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

template <class E, class S = host>
concept layer_or_pointer_to_layer =
    pipeline_layer<E, S> || (dereferenceable<E> && pipeline_layer<std::remove_reference_t<decltype(*std::declval<E&>())>, S>);

}  // namespace detail::pipeline

// A model as an indexable sequence of layers (std::vector<linear>, or std::vector<std::unique_ptr<layer_base>>).
template <class R, class S = host>
concept layer_sequence = std::ranges::random_access_range<R> && std::ranges::sized_range<R> &&
                         detail::pipeline::layer_or_pointer_to_layer<std::ranges::range_value_t<R>, S>;

// Explains, one sentence each, why R is not a layer sequence (of layers computing in S). Called at
// the pipeline's entry points and by fully sharded data parallel.
template <class R, class S = host>
consteval bool check_layer_sequence() {
  static_assert(std::ranges::random_access_range<R> && std::ranges::sized_range<R>,
                "partrain: a pipeline model must be a sized random-access range of layers (a std::vector of layers, "
                "or of pointers to layers)");
  using E = std::ranges::range_value_t<R>;
  using L = std::remove_cvref_t<decltype(detail::pipeline::layer_of(std::declval<E&>()))>;
  static_assert(requires(const L& l, const shape& s) {
    { l.output_shape(s) } -> std::convertible_to<shape>;
  }, "partrain: a pipeline layer needs `shape output_shape(const shape& in) const`");
  static_assert(requires(L& l, tensor_view<const float, S> in, tensor_view<float, S> out) { l.forward(in, out); },
                "partrain: a pipeline layer needs `void forward(tensor_view<const float> in, tensor_view<float> out)`");
  static_assert(requires(L& l, tensor_view<const float, S> in, tensor_view<float, S> g) { l.backward(in, in, in, g); },
                "partrain: a pipeline layer needs `void backward(tensor_view<const float> in, tensor_view<const float> "
                "out, tensor_view<const float> grad_out, tensor_view<float> grad_in)`");
  static_assert(requires(L& l) {
    { l.parameters() } -> std::ranges::forward_range;
  }, "partrain: a pipeline layer needs `parameters()` returning a forward range (empty for a layer without weights)");
  static_assert(pipeline_layer<L, S>,
                "partrain: each element of a pipeline layer's `parameters()` needs `value()` and `grad()` views");
  return true;
}

// The loss on the last stage, per micro-batch. forward_backward returns the SUM of the
// per-example losses and writes grad_out = scale * d(sum)/d(out); the pipeline passes
// scale = 1 / batch size so accumulated gradients are those of the batch mean.
// evaluate returns the summed loss, correct predictions and examples. S: where out, target and
// grad_out live (CUDA for fully sharded data parallel's CUDA layers; the sums come back to the host).
template <class F, class Target, class S = host>
concept pipeline_loss = requires(F& f, tensor_view<const float, S> out, tensor_view<const Target, S> target,
                                 tensor_view<float, S> grad_out, float scale) {
  { f.forward_backward(out, target, grad_out, scale) } -> std::convertible_to<double>;
  { f.evaluate(out, target) } -> std::convertible_to<eval_result>;
};

}  // namespace partrain::inline v0
