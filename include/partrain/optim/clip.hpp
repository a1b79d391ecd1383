// partrain/optim/clip.hpp: global-norm gradient clipping (torch.nn.utils.clip_grad_norm_):
// one 2-norm over every gradient, and every gradient scaled by max_norm / (norm + 1e-6) when
// that is below 1.
#pragma once

#include <cmath>
#include <concepts>
#include <ranges>
#include <string>
#include <type_traits>

#include <partrain/core/error.hpp>
#include <partrain/model/concepts.hpp>
#include <partrain/model/traits.hpp>
#include <partrain/optim/detail/state_buffer.hpp>
#include <partrain/optim/optimizer.hpp>

#if defined(__CUDACC__)
#include <partrain/optim/detail/kernels.cuh>
#endif

namespace partrain::inline v0 {

namespace detail::optim {

// A flat gradient buffer (a rank's shard, its chunks, a reduced slice) seen as a parameter whose
// value is the gradient itself, so clipping and the grad scaler's unscale run on it unchanged.
template <class T, class S = host>
struct gradient_only {
  tensor_view<T, S> g;
  [[nodiscard]] tensor_view<T, S> value() const { return g; }
  [[nodiscard]] tensor_view<T, S> grad() const { return g; }
};

template <class R>
concept parameter_range = std::ranges::forward_range<R> && parameter<std::ranges::range_value_t<R>>;

template <class X>
decltype(auto) parameters_of(X& x) {
  if constexpr (model<X>) {
    return x.parameters();
  } else {
    return (x);
  }
}

// Σ over parameters of Σ g², in double (PyTorch takes a norm per tensor in its dtype, then the
// norm of those; summing squares in double is at least as accurate).
template <class Range>
[[nodiscard]] double grad_sum_squares(Range&& params, void* stream = nullptr) {
  double total = 0;
  for (auto&& p : params) {
    using T = param_element_t<std::remove_cvref_t<decltype(p)>>;
    using S = param_space_t<std::remove_cvref_t<decltype(p)>>;
    static_assert(check_optimizable<T, S>());
    total += sum_squares(tensor_view<const T, S>(p.grad()), stream);
  }
  return total;
}

// Scales every gradient by max_norm / (total_norm + 1e-6) when that is below 1.
template <class Range>
void clip_to_norm(Range&& params, double total_norm, double max_norm, void* stream = nullptr) {
  if (!std::isfinite(total_norm)) return;  // the caller (or a gradient scaler) skips this step
  const double coef = max_norm / (total_norm + 1e-6);
  if (!(coef < 1.0)) return;
  for (auto&& p : params) {
    using T = param_element_t<std::remove_cvref_t<decltype(p)>>;
    scale_in_place(p.grad(), static_cast<T>(coef), stream);
  }
}

inline void check_max_norm(double max_norm, const char* who) {
  if (!(max_norm > 0) || !std::isfinite(max_norm)) {
    throw invalid_argument_error(std::string(who) + ": max_norm must be a finite number > 0, got " +
                                 std::to_string(max_norm));
  }
}

// A clipping option (0: off): where several options take one, one message for all.
inline void check_max_grad_norm(double v, const std::string& where) {
  if (!(v >= 0) || !std::isfinite(v)) {
    throw invalid_argument_error(where + " must be a finite number >= 0 (0: no clipping), got " + std::to_string(v));
  }
}

}  // namespace detail::optim

// Clips the gradients of a model (or of a range of parameters) to a global 2-norm of at most
// max_norm and returns the norm before clipping. A non-finite norm is returned as is and leaves
// the gradients untouched (the caller, or a gradient scaler, decides to skip the step).
template <class X>
  requires model<std::remove_cvref_t<X>> || detail::optim::parameter_range<std::remove_cvref_t<X>>
double clip_grad_norm(X&& model_or_params, double max_norm) {
  detail::optim::check_max_norm(max_norm, "clip_grad_norm");
  auto&& params = detail::optim::parameters_of(model_or_params);
  // A model's own stream orders the work with its kernels; a bare range of parameters has none.
  void* stream = nullptr;
  if constexpr (model<std::remove_cvref_t<X>>) stream = model_stream(model_or_params);
  const double total = std::sqrt(detail::optim::grad_sum_squares(params, stream));
  detail::optim::clip_to_norm(params, total, max_norm, stream);
  return total;
}

}  // namespace partrain::inline v0
