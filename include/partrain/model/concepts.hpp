// partrain/model/concepts.hpp: what a user's model must offer. partrain never owns the math:
// any type with these members plugs in, whether it runs hand-written CUDA, cuBLAS or host C++.
#pragma once

#include <concepts>
#include <cstddef>
#include <functional>
#include <ranges>
#include <type_traits>

#include <partrain/core/device.hpp>
#include <partrain/core/tensor_view.hpp>

namespace partrain::inline v0 {

// A trainable tensor: its value and its gradient, the same shape, in the same memory space.
template <class P>
concept parameter = requires(P& p) {
  { p.value() } -> tensor_view_like;
  { p.grad() } -> tensor_view_like;
};

// A model: its parameters as a range, in the same order on every rank.
template <class M>
concept model = requires(M& m) {
  { m.parameters() } -> std::ranges::forward_range;
} && parameter<std::ranges::range_value_t<decltype(std::declval<M&>().parameters())>>;

// A model that trains on a batch: forward and backward, gradients written (not accumulated
// unless the model documents it), mean loss over the batch returned.
template <class M, class B>
concept trainable_on = model<M> && requires(M& m, const B& b) {
  { m.train_step(b) } -> std::convertible_to<double>;
};

// Called with a parameter's index (its position in parameters()) the moment its gradient is
// final, so the reducer can start that bucket's all_reduce while backward goes on.
using grad_ready_fn = std::function<void(std::size_t)>;

// Optional: a train_step that reports gradient readiness.
template <class M, class B>
concept notifies_grad_ready = trainable_on<M, B> && requires(M& m, const B& b, const grad_ready_fn& f) {
  { m.train_step(b, f) } -> std::convertible_to<double>;
};

// What an evaluation step reports: summed loss, correct predictions and examples counted.
struct eval_result {
  double loss_sum = 0;
  std::size_t correct = 0;
  std::size_t count = 0;

  eval_result& operator+=(const eval_result& o) noexcept {
    loss_sum += o.loss_sum;
    correct += o.correct;
    count += o.count;
    return *this;
  }
  [[nodiscard]] double mean_loss() const noexcept { return count ? loss_sum / static_cast<double>(count) : 0.0; }
  [[nodiscard]] double accuracy() const noexcept {
    return count ? static_cast<double>(correct) / static_cast<double>(count) : 0.0;
  }
};

// Optional: forward-only evaluation of a batch.
template <class M, class B>
concept evaluable_on = requires(M& m, const B& b) {
  { m.eval_step(b) } -> std::convertible_to<eval_result>;
};

// Optional: non-trainable state (PyTorch's buffers: batch norm's running statistics), host float
// tensors in the same order on every rank. DDP copies rank 0's at construction and, with
// ddp_options::broadcast_buffers (the default), before every step; checkpoints keep them.
template <class M>
concept has_buffers = requires(M& m) {
  { m.buffers() } -> std::ranges::forward_range;
  requires std::convertible_to<std::ranges::range_reference_t<decltype(m.buffers())>, tensor_view<float>>;
};

// Optional: a copy of the model on another device (what data_parallel replicates).
template <class M>
concept replicable = requires(const M& m, device d) {
  { m.replicate_to(d) } -> std::same_as<M>;
};

namespace detail {
template <class M>
concept has_parameters_member = requires(M& m) { m.parameters(); };
template <class M>
concept parameters_is_forward_range = requires(M& m) {
  { m.parameters() } -> std::ranges::forward_range;
};
}  // namespace detail

// Explains, in one sentence each, why M is not a model. Every public class that takes a model
// asserts it first, so the sentence is the first error a mistake produces.
template <class M>
consteval bool check_model() {
  static_assert(detail::has_parameters_member<M>,
                "partrain: the model type needs a member `parameters()` returning its parameters in a stable order "
                "(a sequence of layers becomes a model as partrain::sequential(layers, loss))");
  static_assert(detail::parameters_is_forward_range<M>,
                "partrain: `model.parameters()` must return a forward range of parameters (a std::vector<param>&, a "
                "span, a view); a pipeline stage is not a model: give the optimizer `stage.parameters()`");
  static_assert(model<M>,
                "partrain: each element of `model.parameters()` needs `value()` and `grad()` returning tensor views");
  return true;
}

// Explains, in one sentence each, why M is not a model trainable on B. Call it at a public
// entry point: the first failed assertion names the missing member.
template <class M, class B>
consteval bool check_trainable() {
  static_assert(check_model<M>());
  static_assert(trainable_on<M, B>,
                "partrain: the model has no `double train_step(const Batch&)` for this batch type (Batch is named in "
                "the lines below; the step runs forward and backward, writes the gradients and returns the mean "
                "loss); if its train_step takes another batch type, pass that one");
  return true;
}

}  // namespace partrain::inline v0
