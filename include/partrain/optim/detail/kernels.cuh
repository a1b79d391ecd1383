// partrain/optim/detail/kernels.cuh: the optimizers' and clipping's element loops for parameters
// in CUDA memory: the functors of optim/detail/elements.hpp (the ones the host loops and the CPU
// tier run) launched through partrain/cuda/launch.cuh; these are the overloads the optimizers pick
// for tensor_view<T, cuda>. Every function takes the stream to queue on (default: the legacy
// stream, which the optimizers' callers use today) and has finished its work on return, so
// whatever stream reads the parameters next sees it. Launched on the calling thread's current
// device (the one holding the parameters). nvcc only.
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
#include <partrain/cuda/launch.cuh>
#include <partrain/optim/detail/elements.hpp>
#include <partrain/optim/detail/state_buffer.hpp>
#include <partrain/optim/detail/update_rules.hpp>

namespace partrain::inline v0::detail {

template <class T>
class state_buffer<T, cuda> {
 public:
  state_buffer() = default;
  state_buffer(const state_buffer&) = delete;
  state_buffer& operator=(const state_buffer&) = delete;
  state_buffer(state_buffer&& o) noexcept : p_(o.p_), n_(o.n_) {
    o.p_ = nullptr;
    o.n_ = 0;
  }
  state_buffer& operator=(state_buffer&& o) noexcept {
    if (this != &o) {
      release();
      p_ = o.p_;
      n_ = o.n_;
      o.p_ = nullptr;
      o.n_ = 0;
    }
    return *this;
  }
  ~state_buffer() { release(); }

  void assign_zero(std::size_t n) {
    if (n != n_) {
      release();
      if (n) PARTRAIN_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)));
      n_ = n;
    }
    // cudaMemset returns before the fill ran: queue it, then wait, so the zeros are there for any stream.
    if (n_) {
      PARTRAIN_CUDA_CHECK(cudaMemsetAsync(p_, 0, n_ * sizeof(T), cudaStreamLegacy));
      PARTRAIN_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
    }
  }
  [[nodiscard]] T* data() noexcept { return p_; }
  [[nodiscard]] std::size_t size() const noexcept { return n_; }
  void copy_to_host(std::span<T> out) const {
    if (n_) PARTRAIN_CUDA_CHECK(cudaMemcpy(out.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
  }
  void copy_from_host(std::span<const T> in) {
    assign_zero(in.size());
    if (n_) PARTRAIN_CUDA_CHECK(cudaMemcpy(p_, in.data(), n_ * sizeof(T), cudaMemcpyHostToDevice));
  }

 private:
  void release() noexcept {
    if (p_) cudaFree(p_);
    p_ = nullptr;
    n_ = 0;
  }
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

// The launches are queued on `stream` and waited for: the optimizer step is a synchronization
// point, as the host path is. Pass the stream that made the gradients (a non-blocking stream is
// not ordered with the legacy one).
template <class T>
void sgd_update(tensor_view<T, cuda> v, tensor_view<const T, cuda> g, T* buf, const sgd_coeffs<T>& c, bool first,
                cudaStream_t stream = cudaStreamLegacy) {
  if (v.empty()) return;
  const cuda_exec exec{stream, -1};
  for_each_index(exec, v.size(), sgd_update_fn<T>{v.data(), g.data(), buf, c, first});
  synchronize(exec, "sgd step: cudaStreamSynchronize");
}

template <class T>
void adamw_update(tensor_view<T, cuda> v, tensor_view<const T, cuda> g, T* m, T* s, const adamw_coeffs<T>& c,
                  cudaStream_t stream = cudaStreamLegacy) {
  if (v.empty()) return;
  const cuda_exec exec{stream, -1};
  for_each_index(exec, v.size(), adamw_update_fn<T>{v.data(), g.data(), m, s, c});
  synchronize(exec, "adamw step: cudaStreamSynchronize");
}

// One partial per block, folded in block order: the same total on every run.
template <class T>
[[nodiscard]] double sum_squares(tensor_view<const T, cuda> g, cudaStream_t stream = cudaStreamLegacy) {
  return transform_reduce_index(cuda_exec{stream, -1}, g.size(), 0.0, square_as_double_fn<T>{g.data()}, plus_fn{});
}

template <class T>
void scale_in_place(tensor_view<T, cuda> g, T coef, cudaStream_t stream = cudaStreamLegacy) {
  if (g.empty()) return;
  const cuda_exec exec{stream, -1};
  for_each_index(exec, g.size(), scale_fn<T>{g.data(), coef});
  synchronize(exec, "gradient scale: cudaStreamSynchronize");
}

// zero_grad: finished on return (cudaMemset alone returns before the fill ran), so a backward on
// any stream afterwards writes into zeros.
template <class T>
void fill_zero(tensor_view<T, cuda> g, cudaStream_t stream = cudaStreamLegacy) {
  if (g.empty()) return;
  PARTRAIN_CUDA_CHECK(cudaMemsetAsync(g.data(), 0, g.size_bytes(), stream));
  PARTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace partrain::inline v0::detail
