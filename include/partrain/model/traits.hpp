// partrain/model/traits.hpp: the types a model's parameters reveal, named once for every layer
// above (optimizers, DDP, data_parallel, mixed precision, checkpoints):
//   param_t<M>           the parameter type          param_range_t<M>  what parameters() returns
//   param_view_t<P>      the tensor_view of a value  param_grad_view_t<P>  of a gradient
//   param_element_t<P>, param_space_t<P>             a value's element type and memory space
//   model_element_t<M>   float, double, ...          model_space_t<M>  host or cuda
#pragma once

#include <concepts>
#include <ranges>
#include <type_traits>
#include <utility>

#include <partrain/core/device.hpp>
#include <partrain/model/concepts.hpp>

namespace partrain::inline v0 {

template <model M>
using param_range_t = decltype(std::declval<M&>().parameters());
template <model M>
using param_t = std::ranges::range_value_t<param_range_t<M>>;
template <class P>
using param_view_t = std::remove_cvref_t<decltype(std::declval<P&>().value())>;
template <class P>
using param_grad_view_t = std::remove_cvref_t<decltype(std::declval<P&>().grad())>;
template <class P>
using param_element_t = std::remove_cv_t<typename param_view_t<P>::value_type>;
template <class P>
using param_space_t = typename param_view_t<P>::space_type;

template <model M>
using model_element_t = param_element_t<param_t<M>>;
template <model M>
using model_space_t = param_space_t<param_t<M>>;

// The stream a device model queues its work on (m.stream(), a cudaStream_t), type-erased so the
// layers above need no CUDA header; null (the legacy default stream) for a model without one.
// The library's own device work on a model's tensors (optimizer steps, zero_grad, clipping,
// unscaling) is queued there, ordered with the model's kernels.
template <class M>
[[nodiscard]] void* model_stream(M& m) noexcept {
  if constexpr (requires { static_cast<void*>(m.stream()); }) {
    return static_cast<void*>(m.stream());
  } else {
    return nullptr;
  }
}

// The CUDA device a model lives on (m.device(), when it is a CUDA device), else -1: where the
// optimizer keeps its state for that model.
template <class M>
[[nodiscard]] int model_cuda_device(const M& m) noexcept {
  if constexpr (requires { { m.device() } -> std::convertible_to<device>; }) {
    const device d = m.device();
    return d.is_cuda() ? d.index : -1;
  } else {
    return -1;
  }
}

}  // namespace partrain::inline v0
