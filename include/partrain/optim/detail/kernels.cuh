// partrain/optim/detail/kernels.cuh: the optimizers' and clipping's element loops for parameters
// in CUDA memory: the functors of optim/detail/elements.hpp (the ones the host loops and the CPU
// tier run) launched through partrain/cuda/launch.cuh; these are the overloads the optimizers pick
// for tensor_view<T, cuda>. Every function takes the stream to queue on (the optimizers pass the
// model's, model_traits' model_stream; null: the legacy stream) and has finished its work on
// return, so whatever stream reads the parameters next sees it. Launched on the calling thread's
// current device (the one holding the parameters); the state lives on the model's. nvcc only.
#pragma once

#if !defined(__CUDACC__)
#error "partrain/optim/detail/kernels.cuh must be compiled by nvcc"
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <span>

#include <partrain/core/memory_space.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/cuda/check.hpp>
#include <partrain/cuda/device_buffer.hpp>
#include <partrain/cuda/launch.cuh>
#include <partrain/optim/detail/elements.hpp>
#include <partrain/optim/detail/state_buffer.hpp>
#include <partrain/optim/detail/update_rules.hpp>

namespace partrain::inline v0::detail::optim {

// The optimizer's state for a CUDA model: partrain's device_buffer on the model's device.
template <class T>
class state_buffer<T, cuda> {
 public:
  // n zeros on cuda:device_index (-1: the current device), filled on `stream` (a cudaStream_t,
  // type-erased; null: the legacy stream, waited for), so a kernel queued on that stream next
  // sees them.
  void assign_zero(std::size_t n, int device_index = -1, void* stream = nullptr) {
    const int dev = device_index >= 0 ? device_index : current_device();
    if (n != buf_.size() || dev != buf_.device_index()) {
      buf_ = device_buffer<T>(partrain::shape{n}, dev, static_cast<cudaStream_t>(stream));
      return;
    }
    if (n == 0) return;
    const cudaStream_t s = stream_or_legacy(stream);
    PARTRAIN_CUDA_CHECK(cudaMemsetAsync(buf_.data(), 0, buf_.size_bytes(), s));
    if (!stream) PARTRAIN_CUDA_CHECK(cudaStreamSynchronize(s));
  }
  [[nodiscard]] T* data() noexcept { return buf_.data(); }
  [[nodiscard]] std::size_t size() const noexcept { return buf_.size(); }
  // Finished on return (device_buffer's streamless copies).
  void copy_to_host(std::span<T> out) const {
    if (size()) buf_.copy_to(tensor_view<T, host>(out.data(), out.size()));
  }
  void copy_from_host(std::span<const T> in, int device_index = -1) {
    assign_zero(in.size(), device_index);
    if (size()) buf_.copy_from(tensor_view<const T, host>(in.data(), in.size()));
  }

 private:
  [[nodiscard]] static int current_device() {
    int d = 0;
    PARTRAIN_CUDA_CHECK(cudaGetDevice(&d));
    return d;
  }
  device_buffer<T> buf_;
};

// The launches are queued on `stream` and waited for: the optimizer step is a synchronization
// point, as the host path is. Pass the stream that made the gradients (a non-blocking stream is
// not ordered with the legacy one).
template <class T>
void sgd_update(tensor_view<T, cuda> v, tensor_view<const T, cuda> g, T* buf, const sgd_coeffs<T>& c, bool first,
                void* stream = nullptr) {
  if (v.empty()) return;
  const cuda_exec exec{stream_or_legacy(stream), -1};
  for_each_index(exec, v.size(), sgd_update_fn<T>{v.data(), g.data(), buf, c, first});
  synchronize(exec, "sgd step: cudaStreamSynchronize");
}

template <class T>
void adamw_update(tensor_view<T, cuda> v, tensor_view<const T, cuda> g, T* m, T* s, const adamw_coeffs<T>& c,
                  void* stream = nullptr) {
  if (v.empty()) return;
  const cuda_exec exec{stream_or_legacy(stream), -1};
  for_each_index(exec, v.size(), adamw_update_fn<T>{v.data(), g.data(), m, s, c});
  synchronize(exec, "adamw step: cudaStreamSynchronize");
}

// One partial per block, folded in block order: the same total on every run.
template <class T>
[[nodiscard]] double sum_squares(tensor_view<const T, cuda> g, void* stream = nullptr) {
  return transform_reduce_index(cuda_exec{stream_or_legacy(stream), -1}, g.size(), 0.0, square_as_double_fn<T>{g.data()},
                                plus_fn{});
}

template <class T>
void scale_in_place(tensor_view<T, cuda> g, T coef, void* stream = nullptr) {
  if (g.empty()) return;
  const cuda_exec exec{stream_or_legacy(stream), -1};
  for_each_index(exec, g.size(), scale_fn<T>{g.data(), coef});
  synchronize(exec, "gradient scale: cudaStreamSynchronize");
}

// zero_grad: finished on return (cudaMemset alone returns before the fill ran), so a backward on
// any stream afterwards writes into zeros.
template <class T>
void fill_zero(tensor_view<T, cuda> g, void* stream = nullptr) {
  if (g.empty()) return;
  PARTRAIN_CUDA_CHECK(cudaMemsetAsync(g.data(), 0, g.size_bytes(), stream_or_legacy(stream)));
  PARTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream_or_legacy(stream)));
}

}  // namespace partrain::inline v0::detail::optim
