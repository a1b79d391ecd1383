// examples/fashion_mnist/mlp_cuda.cuh: the same MLP as mlp_host.hpp, on a CUDA device: cuBLAS for
// the GEMMs and this example's own kernels for the bias, ReLU, softmax cross-entropy and their
// backward. Same layout, same initial weights for the same seed, so its gradients can be checked
// against the host model's. Compiled by nvcc only.
#pragma once

#if !defined(__CUDACC__)
#error "mlp_cuda.cuh is CUDA code: compile it with nvcc (a .cu file)"
#endif

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <partrain/core/device.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/model/concepts.hpp>

#include "mlp_host.hpp"

namespace example {

namespace cuda_detail {

inline void check(cudaError_t e, const char* call, const char* file, int line) {
  if (e != cudaSuccess) {
    throw partrain::error(partrain::error_kind::internal, std::string(call) + " failed at " + file + ":" +
                                                              std::to_string(line) + ": " + cudaGetErrorString(e));
  }
}
inline void check(cublasStatus_t s, const char* call, const char* file, int line) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    throw partrain::error(partrain::error_kind::internal, std::string(call) + " failed at " + file + ":" +
                                                              std::to_string(line) + ": cuBLAS status " +
                                                              std::to_string(static_cast<int>(s)));
  }
}
#define EXAMPLE_CUDA_CHECK(call) ::example::cuda_detail::check((call), #call, __FILE__, __LINE__)

// Device memory for n elements of T; freed on destruction.
template <class T>
class device_array {
 public:
  device_array() = default;
  explicit device_array(std::size_t n) : n_(n) {
    if (n) {
      void* p = nullptr;
      EXAMPLE_CUDA_CHECK(cudaMalloc(&p, n * sizeof(T)));
      p_.reset(static_cast<T*>(p));
      EXAMPLE_CUDA_CHECK(cudaMemset(p, 0, n * sizeof(T)));
    }
  }
  [[nodiscard]] T* data() const noexcept { return p_.get(); }
  [[nodiscard]] std::size_t size() const noexcept { return n_; }
  // Grows (contents not kept) when n exceeds the capacity.
  void reserve(std::size_t n) {
    if (n > n_) *this = device_array(n);
  }

 private:
  struct free_t {
    void operator()(T* p) const noexcept { cudaFree(p); }
  };
  std::unique_ptr<T, free_t> p_;
  std::size_t n_ = 0;
};

class cublas_handle {
 public:
  cublas_handle() { EXAMPLE_CUDA_CHECK(cublasCreate(&h_)); }
  cublas_handle(const cublas_handle&) = delete;
  cublas_handle& operator=(const cublas_handle&) = delete;
  ~cublas_handle() { cublasDestroy(h_); }
  [[nodiscard]] cublasHandle_t get() const noexcept { return h_; }

 private:
  cublasHandle_t h_{};
};

class stream {
 public:
  stream() { EXAMPLE_CUDA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  stream(const stream&) = delete;
  stream& operator=(const stream&) = delete;
  ~stream() { cudaStreamDestroy(s_); }
  [[nodiscard]] cudaStream_t get() const noexcept { return s_; }

 private:
  cudaStream_t s_{};
};

inline unsigned blocks_for(std::size_t n, unsigned threads = 256) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

// h[i, j] += b[j], then ReLU when asked.
__global__ void bias_activation(float* h, const float* b, std::size_t rows, std::size_t cols, bool relu) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= rows * cols) return;
  float v = h[i] + b[i % cols];
  h[i] = relu && v < 0.0f ? 0.0f : v;
}

// One thread per example: loss = logsumexp(z) - z[y]; delta = (softmax(z) - onehot(y)) * scale;
// correct = argmax(z) == y. (Ten classes: a row fits one thread comfortably.)
__global__ void softmax_cross_entropy(const float* logits, const std::int32_t* labels, std::size_t rows,
                                      std::size_t classes, float scale, float* delta, float* loss,
                                      std::int32_t* correct) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= rows) return;
  const float* z = logits + i * classes;
  const auto y = static_cast<std::size_t>(labels[i]);
  float m = z[0];
  std::size_t best = 0;
  for (std::size_t j = 1; j < classes; ++j) {
    if (z[j] > m) m = z[j], best = j;
  }
  float s = 0.0f;
  for (std::size_t j = 0; j < classes; ++j) s += expf(z[j] - m);
  loss[i] = logf(s) - (z[y] - m);
  if (correct) correct[i] = best == y ? 1 : 0;
  if (delta) {
    float* d = delta + i * classes;
    for (std::size_t j = 0; j < classes; ++j) d[j] = expf(z[j] - m) / s * scale;
    d[y] -= scale;
  }
}

// gb[j] = sum over rows of delta[i, j]; one thread per column (reads are coalesced across threads).
__global__ void column_sums(const float* delta, std::size_t rows, std::size_t cols, float* gb) {
  const std::size_t j = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (j >= cols) return;
  float s = 0.0f;
  for (std::size_t i = 0; i < rows; ++i) s += delta[i * cols + j];
  gb[j] = s;
}

// d[i] = 0 where the layer's ReLU output a[i] was 0 (its input was not positive).
__global__ void relu_backward(float* d, const float* a, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n && a[i] <= 0.0f) d[i] = 0.0f;
}

}  // namespace cuda_detail

struct cuda_parameter {
  std::string name;
  partrain::tensor_view<float, partrain::cuda> value_view;
  partrain::tensor_view<float, partrain::cuda> grad_view;
  [[nodiscard]] partrain::tensor_view<float, partrain::cuda> value() const noexcept { return value_view; }
  [[nodiscard]] partrain::tensor_view<float, partrain::cuda> grad() const noexcept { return grad_view; }
};

class mlp_cuda {
 public:
  explicit mlp_cuda(mlp_layout layout = {}, std::uint64_t seed = 0, partrain::device dev = partrain::device::cuda(0))
      : layout_(std::move(layout)), dev_(dev) {
    layout_.validate();
    if (!dev.is_cuda()) {
      throw partrain::invalid_argument_error("mlp_cuda: device " + dev.to_string() +
                                             " is not a CUDA device; use mlp_host on the CPU");
    }
    EXAMPLE_CUDA_CHECK(cudaSetDevice(dev.index));
    state_ = std::make_unique<state>(layout_.parameter_count());
    set_values(layout_.initial_values(seed));
    bind();
  }
  mlp_cuda(mlp_cuda&&) noexcept = default;
  mlp_cuda& operator=(mlp_cuda&&) noexcept = default;

  [[nodiscard]] const mlp_layout& layout() const noexcept { return layout_; }
  [[nodiscard]] partrain::device device() const noexcept { return dev_; }
  [[nodiscard]] std::vector<cuda_parameter>& parameters() noexcept { return params_; }
  [[nodiscard]] cudaStream_t stream() const noexcept { return state_->compute.get(); }

  void set_values(std::span<const float> v) {
    if (v.size() != layout_.parameter_count()) {
      throw partrain::invalid_argument_error("mlp_cuda::set_values: " + std::to_string(v.size()) + " values, expected " +
                                             std::to_string(layout_.parameter_count()));
    }
    EXAMPLE_CUDA_CHECK(cudaMemcpy(state_->values.data(), v.data(), v.size_bytes(), cudaMemcpyHostToDevice));
  }
  [[nodiscard]] std::vector<float> values_to_host() const { return to_host(state_->values); }
  [[nodiscard]] std::vector<float> grads_to_host() const { return to_host(state_->grads); }

  // The batch is on the host (the loader's buffer); it is copied to the device first.
  template <labelled_batch B>
  double train_step(const B& b) {
    return step(b, nullptr);
  }
  // Gradient readiness: the stream is synchronised before each notification, so a reducer on
  // another stream (NCCL) reads final values.
  template <labelled_batch B>
  double train_step(const B& b, const partrain::grad_ready_fn& ready) {
    return step(b, &ready);
  }

  template <labelled_batch B>
  partrain::eval_result eval_step(const B& b) {
    check_batch(b, layout_, "mlp_cuda::eval_step");
    const std::size_t n = b.labels.size();
    partrain::eval_result r;
    if (n == 0) return r;
    upload(b);
    forward(n);
    auto& s = *state_;
    cuda_detail::softmax_cross_entropy<<<cuda_detail::blocks_for(n), 256, 0, stream()>>>(
        s.acts.back().data(), s.labels.data(), n, layout_.classes(), 0.0f, nullptr, s.loss.data(), s.correct.data());
    EXAMPLE_CUDA_CHECK(cudaGetLastError());
    std::vector<float> loss(n);
    std::vector<std::int32_t> correct(n);
    EXAMPLE_CUDA_CHECK(cudaMemcpyAsync(loss.data(), s.loss.data(), n * sizeof(float), cudaMemcpyDeviceToHost, stream()));
    EXAMPLE_CUDA_CHECK(cudaMemcpyAsync(correct.data(), s.correct.data(), n * sizeof(std::int32_t),
                                       cudaMemcpyDeviceToHost, stream()));
    EXAMPLE_CUDA_CHECK(cudaStreamSynchronize(stream()));
    for (std::size_t i = 0; i < n; ++i) {
      r.loss_sum += loss[i];
      r.correct += static_cast<std::size_t>(correct[i]);
    }
    r.count = n;
    return r;
  }

  [[nodiscard]] mlp_cuda replicate_to(partrain::device d) const {
    mlp_cuda copy(layout_, 0, d);
    copy.set_values(values_to_host());
    return copy;
  }

 private:
  struct state {
    explicit state(std::size_t params) : values(params), grads(params) {
      EXAMPLE_CUDA_CHECK(cublasSetStream(blas.get(), compute.get()));
    }
    cuda_detail::device_array<float> values, grads;
    cuda_detail::stream compute;
    cuda_detail::cublas_handle blas;
    cuda_detail::device_array<float> x, delta, prev, loss;
    cuda_detail::device_array<std::int32_t> labels, correct;
    std::vector<cuda_detail::device_array<float>> acts;
  };

  void bind() {
    params_.clear();
    float* v = state_->values.data();
    float* g = state_->grads.data();
    for (std::size_t l = 0; l < layout_.layers(); ++l) {
      const std::size_t out = layout_.widths[l + 1], in = layout_.widths[l];
      const std::string idx = std::to_string(l + 1);
      params_.push_back({"fc" + idx + ".weight", {v + layout_.weight_offset(l), {out, in}},
                         {g + layout_.weight_offset(l), {out, in}}});
      params_.push_back({"fc" + idx + ".bias", {v + layout_.bias_offset(l), {out}}, {g + layout_.bias_offset(l), {out}}});
    }
  }

  std::vector<float> to_host(const cuda_detail::device_array<float>& a) const {
    std::vector<float> h(a.size());
    EXAMPLE_CUDA_CHECK(cudaStreamSynchronize(stream()));
    EXAMPLE_CUDA_CHECK(cudaMemcpy(h.data(), a.data(), a.size() * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
  }

  template <class B>
  void upload(const B& b) {
    const std::size_t n = b.labels.size();
    auto& s = *state_;
    EXAMPLE_CUDA_CHECK(cudaSetDevice(dev_.index));
    s.x.reserve(n * layout_.inputs());
    s.labels.reserve(n);
    s.loss.reserve(n);
    s.correct.reserve(n);
    EXAMPLE_CUDA_CHECK(cudaMemcpyAsync(s.x.data(), b.features.data(), n * layout_.inputs() * sizeof(float),
                                       cudaMemcpyHostToDevice, stream()));
    EXAMPLE_CUDA_CHECK(cudaMemcpyAsync(s.labels.data(), b.labels.data(), n * sizeof(std::int32_t),
                                       cudaMemcpyHostToDevice, stream()));
  }

  void forward(std::size_t n) {
    auto& s = *state_;
    s.acts.resize(layout_.layers());
    const float* in = s.x.data();
    const float one = 1.0f, zero = 0.0f;
    for (std::size_t l = 0; l < layout_.layers(); ++l) {
      const int out_w = static_cast<int>(layout_.widths[l + 1]);
      const int in_w = static_cast<int>(layout_.widths[l]);
      auto& h = s.acts[l];
      h.reserve(n * static_cast<std::size_t>(out_w));
      // Row-major H[n, out] = X[n, in] . W^T is column-major H^T = W^T(as stored) ^T . X^T.
      EXAMPLE_CUDA_CHECK(cublasSgemm(s.blas.get(), CUBLAS_OP_T, CUBLAS_OP_N, out_w, static_cast<int>(n), in_w, &one,
                                     s.values.data() + layout_.weight_offset(l), in_w, in, in_w, &zero, h.data(), out_w));
      const std::size_t count = n * static_cast<std::size_t>(out_w);
      cuda_detail::bias_activation<<<cuda_detail::blocks_for(count), 256, 0, stream()>>>(
          h.data(), s.values.data() + layout_.bias_offset(l), n, static_cast<std::size_t>(out_w), l + 1 < layout_.layers());
      EXAMPLE_CUDA_CHECK(cudaGetLastError());
      in = h.data();
    }
  }

  template <class B>
  double step(const B& b, const partrain::grad_ready_fn* ready) {
    check_batch(b, layout_, "mlp_cuda::train_step");
    const std::size_t n = b.labels.size();
    if (n == 0) throw partrain::invalid_argument_error("mlp_cuda::train_step: the batch is empty");
    upload(b);
    forward(n);
    auto& s = *state_;
    const std::size_t c = layout_.classes();
    s.delta.reserve(n * c);
    cuda_detail::softmax_cross_entropy<<<cuda_detail::blocks_for(n), 256, 0, stream()>>>(
        s.acts.back().data(), s.labels.data(), n, c, 1.0f / static_cast<float>(n), s.delta.data(), s.loss.data(),
        nullptr);
    EXAMPLE_CUDA_CHECK(cudaGetLastError());
    std::vector<float> loss(n);
    EXAMPLE_CUDA_CHECK(cudaMemcpyAsync(loss.data(), s.loss.data(), n * sizeof(float), cudaMemcpyDeviceToHost, stream()));

    const float one = 1.0f, zero = 0.0f;
    for (std::size_t l = layout_.layers(); l-- > 0;) {
      const int out_w = static_cast<int>(layout_.widths[l + 1]);
      const int in_w = static_cast<int>(layout_.widths[l]);
      const float* in = l == 0 ? s.x.data() : s.acts[l - 1].data();
      float* gw = s.grads.data() + layout_.weight_offset(l);
      float* gb = s.grads.data() + layout_.bias_offset(l);
      cuda_detail::column_sums<<<cuda_detail::blocks_for(static_cast<std::size_t>(out_w)), 256, 0, stream()>>>(
          s.delta.data(), n, static_cast<std::size_t>(out_w), gb);
      EXAMPLE_CUDA_CHECK(cudaGetLastError());
      // dW[out, in] = delta^T . X: column-major dW^T[in, out] = X^T[in, n] . delta[n, out].
      EXAMPLE_CUDA_CHECK(cublasSgemm(s.blas.get(), CUBLAS_OP_N, CUBLAS_OP_T, in_w, out_w, static_cast<int>(n), &one, in,
                                     in_w, s.delta.data(), out_w, &zero, gw, in_w));
      if (ready) {
        EXAMPLE_CUDA_CHECK(cudaStreamSynchronize(stream()));
        (*ready)(2 * l + 1);
        (*ready)(2 * l);
      }
      if (l == 0) break;
      // dX[n, in] = delta[n, out] . W[out, in]: column-major dX^T = W^T(as stored) . delta^T.
      s.prev.reserve(n * static_cast<std::size_t>(in_w));
      EXAMPLE_CUDA_CHECK(cublasSgemm(s.blas.get(), CUBLAS_OP_N, CUBLAS_OP_N, in_w, static_cast<int>(n), out_w, &one,
                                     s.values.data() + layout_.weight_offset(l), in_w, s.delta.data(), out_w, &zero,
                                     s.prev.data(), in_w));
      const std::size_t count = n * static_cast<std::size_t>(in_w);
      cuda_detail::relu_backward<<<cuda_detail::blocks_for(count), 256, 0, stream()>>>(s.prev.data(), in, count);
      EXAMPLE_CUDA_CHECK(cudaGetLastError());
      std::swap(s.delta, s.prev);
    }
    EXAMPLE_CUDA_CHECK(cudaStreamSynchronize(stream()));
    double total = 0;
    for (float v : loss) total += v;
    return total / static_cast<double>(n);
  }

  mlp_layout layout_;
  partrain::device dev_;
  std::unique_ptr<state> state_;  // on the heap: the parameter views stay valid when the model moves
  std::vector<cuda_parameter> params_;
};

}  // namespace example
