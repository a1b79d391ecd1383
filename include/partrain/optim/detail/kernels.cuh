// partrain/optim/detail/kernels.cuh: the optimizers' and clipping's element loops for parameters
// in CUDA memory. The arithmetic is the same detail::*_element functions the host loops use;
// these are the overloads the optimizers pick for tensor_view<T, cuda>. Every function takes the
// stream to queue on (default: the legacy stream, which the optimizers' callers use today) and
// has finished its work on return, so whatever stream reads the parameters next sees it. nvcc only.
#pragma once

#if !defined(__CUDACC__)
#error "partrain/optim/detail/kernels.cuh must be compiled by nvcc"
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include <partrain/core/error.hpp>
#include <partrain/core/memory_space.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/optim/detail/state_buffer.hpp>
#include <partrain/optim/detail/update_rules.hpp>

namespace partrain::inline v0::detail {

inline void optim_cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw error(error_kind::internal, std::string("CUDA ") + what + " failed: " + cudaGetErrorString(e));
  }
}

// Launch geometry: a grid-stride loop over at most this many blocks.
inline constexpr unsigned optim_block = 256;
inline constexpr unsigned optim_max_blocks = 1024;

[[nodiscard]] inline unsigned optim_blocks(std::size_t n) {
  const std::size_t b = (n + optim_block - 1) / optim_block;
  return static_cast<unsigned>(b < optim_max_blocks ? (b ? b : 1) : optim_max_blocks);
}

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
      if (n) optim_cuda_check(cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)), "cudaMalloc (optimizer state)");
      n_ = n;
    }
    // cudaMemset returns before the fill ran: queue it, then wait, so the zeros are there for any stream.
    if (n_) {
      optim_cuda_check(cudaMemsetAsync(p_, 0, n_ * sizeof(T), cudaStreamLegacy), "cudaMemsetAsync (optimizer state)");
      optim_cuda_check(cudaStreamSynchronize(cudaStreamLegacy), "cudaStreamSynchronize (optimizer state)");
    }
  }
  [[nodiscard]] T* data() noexcept { return p_; }
  [[nodiscard]] std::size_t size() const noexcept { return n_; }
  void copy_to_host(std::span<T> out) const {
    if (n_) optim_cuda_check(cudaMemcpy(out.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy (state save)");
  }
  void copy_from_host(std::span<const T> in) {
    assign_zero(in.size());
    if (n_) optim_cuda_check(cudaMemcpy(p_, in.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy (state load)");
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

template <class T>
__global__ void sgd_kernel(T* v, const T* g, T* buf, std::size_t n, sgd_coeffs<T> c, bool first) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(blockDim.x) * gridDim.x) {
    sgd_element(v[i], g[i], buf ? buf + i : nullptr, c, first);
  }
}

template <class T>
__global__ void adamw_kernel(T* v, const T* g, T* m, T* s, std::size_t n, adamw_coeffs<T> c) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(blockDim.x) * gridDim.x) {
    adamw_element(v[i], g[i], m[i], s[i], c);
  }
}

// One partial sum per block, in a fixed order, so the total is the same on every run.
template <class T>
__global__ void sum_squares_kernel(const T* g, std::size_t n, double* partial) {
  __shared__ double tile[optim_block];
  double acc = 0;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(blockDim.x) * gridDim.x) {
    const double x = static_cast<double>(g[i]);
    acc += x * x;
  }
  tile[threadIdx.x] = acc;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s /= 2) {
    if (threadIdx.x < s) tile[threadIdx.x] += tile[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = tile[0];
}

template <class T>
__global__ void scale_kernel(T* g, std::size_t n, T coef) {
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::size_t>(blockDim.x) * gridDim.x) {
    g[i] = g[i] * coef;
  }
}

// The launches are queued on `stream` and waited for: the optimizer step is a synchronization
// point, as the host path is. Pass the stream that made the gradients (a non-blocking stream is
// not ordered with the legacy one).
template <class T>
void sgd_update(tensor_view<T, cuda> v, tensor_view<const T, cuda> g, T* buf, const sgd_coeffs<T>& c, bool first,
                cudaStream_t stream = cudaStreamLegacy) {
  if (v.empty()) return;
  sgd_kernel<T><<<optim_blocks(v.size()), optim_block, 0, stream>>>(v.data(), g.data(), buf, v.size(), c, first);
  optim_cuda_check(cudaGetLastError(), "launch (sgd)");
  optim_cuda_check(cudaStreamSynchronize(stream), "sgd step");
}

template <class T>
void adamw_update(tensor_view<T, cuda> v, tensor_view<const T, cuda> g, T* m, T* s, const adamw_coeffs<T>& c,
                  cudaStream_t stream = cudaStreamLegacy) {
  if (v.empty()) return;
  adamw_kernel<T><<<optim_blocks(v.size()), optim_block, 0, stream>>>(v.data(), g.data(), m, s, v.size(), c);
  optim_cuda_check(cudaGetLastError(), "launch (adamw)");
  optim_cuda_check(cudaStreamSynchronize(stream), "adamw step");
}

template <class T>
[[nodiscard]] double sum_squares(tensor_view<const T, cuda> g, cudaStream_t stream = cudaStreamLegacy) {
  if (g.empty()) return 0;
  const unsigned blocks = optim_blocks(g.size());
  state_buffer<double, cuda> partial;
  partial.assign_zero(blocks);
  sum_squares_kernel<T><<<blocks, optim_block, 0, stream>>>(g.data(), g.size(), partial.data());
  optim_cuda_check(cudaGetLastError(), "launch (sum of squares)");
  std::vector<double> host(blocks);
  optim_cuda_check(cudaMemcpyAsync(host.data(), partial.data(), blocks * sizeof(double), cudaMemcpyDeviceToHost, stream),
                   "cudaMemcpyAsync (sum of squares)");
  optim_cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (sum of squares)");
  return std::accumulate(host.begin(), host.end(), 0.0);
}

template <class T>
void scale_in_place(tensor_view<T, cuda> g, T coef, cudaStream_t stream = cudaStreamLegacy) {
  if (g.empty()) return;
  scale_kernel<T><<<optim_blocks(g.size()), optim_block, 0, stream>>>(g.data(), g.size(), coef);
  optim_cuda_check(cudaGetLastError(), "launch (scale)");
  optim_cuda_check(cudaStreamSynchronize(stream), "gradient scale");
}

// zero_grad: finished on return (cudaMemset alone returns before the fill ran), so a backward on
// any stream afterwards writes into zeros.
template <class T>
void fill_zero(tensor_view<T, cuda> g, cudaStream_t stream = cudaStreamLegacy) {
  if (g.empty()) return;
  optim_cuda_check(cudaMemsetAsync(g.data(), 0, g.size_bytes(), stream), "cudaMemsetAsync (zero_grad)");
  optim_cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (zero_grad)");
}

}  // namespace partrain::inline v0::detail
