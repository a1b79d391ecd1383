// models/mlp_cuda.cuh: the same MLP as mlp_host.hpp, on a CUDA device: the step of
// mlp_device.hpp on the CUDA backend below, cuBLAS for the GEMMs and this example's own element
// loops (the functors of mlp_elements.hpp) launched on the model's stream. The CPU tier runs the
// same step on the host backend (mlp_host_twin.hpp). Compiled by nvcc only.
#pragma once

#if !defined(__CUDACC__)
#error "mlp_cuda.cuh is CUDA code: compile it with nvcc (a .cu file)"
#endif

#include <cstddef>
#include <cstdint>
#include <string>

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <library_types.h>

#include <partrain/core/device.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/cuda/check.hpp>
#include <partrain/cuda/cublas.hpp>
#include <partrain/cuda/device_buffer.hpp>
#include <partrain/cuda/launch.cuh>
#include <partrain/cuda/stream.hpp>
#include <partrain/precision/detail/kernels.cuh>

#include "mlp_device.hpp"

namespace models {

// The CUDA side of mlp_device.hpp's backend: partrain's RAII set (device_buffer on the model's
// device, one non-blocking stream, a cuBLAS handle bound to it); every kernel, copy and GEMM is
// queued on that stream.
class cuda_backend {
 public:
  using space = partrain::cuda;
  template <class T>
  using array = partrain::device_buffer<T>;
  static constexpr const char* model_name = "mlp_cuda";
  [[nodiscard]] static partrain::device default_device() noexcept { return partrain::device::cuda(0); }
  static void check_device(const partrain::device& d) {
    if (!d.is_cuda()) {
      throw partrain::invalid_argument_error("mlp_cuda: device " + d.to_string() + " is not a CUDA device; use mlp_host on the CPU");
    }
  }

  explicit cuda_backend(const partrain::device& d) : index_(d.index), compute_(d.index), blas_(d.index) {
    blas_.set_stream(compute_.get());
  }

  // Zero-filled and finished before it returns, so any stream sees the zeros.
  template <class T>
  [[nodiscard]] array<T> make(std::size_t n) const {
    return array<T>(n, index_);
  }
  // Grows (contents not kept), zero-filled on the model's stream.
  template <class T>
  void reserve(array<T>& a, std::size_t n) const {
    if (n > a.size()) a = array<T>(partrain::shape{n}, index_, compute_.get());
  }
  void activate() const { PARTRAIN_CUDA_CHECK(cudaSetDevice(index_)); }
  [[nodiscard]] cudaStream_t stream() const noexcept { return compute_.get(); }

  template <class F>
  void launch(std::size_t n, const F& f) const {
    partrain::detail::for_each_index(partrain::detail::cuda_exec{compute_.get(), -1}, n, f);
  }
  // Column-major C[m, n] = op(A) . op(B) (+ beta C), fp32.
  void sgemm(bool ta, bool tb, int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c, int ldc,
             float beta = 0.0f) const {
    const float one = 1.0f;
    PARTRAIN_CUBLAS_CHECK(cublasSgemm(blas_.get(), op(ta), op(tb), m, n, k, &one, a, lda, b, ldb, &beta, c, ldc));
  }
  // Column-major C_i = alpha op(A_i) op(B_i) + beta C_i for i < batch, X_i = X + i * stride_x
  // (the ViT's attention: one call per head over the images).
  void sgemm_strided(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda, long long sa,
                     const float* b, int ldb, long long sb, float beta, float* c, int ldc, long long sc, int batch) const {
    PARTRAIN_CUBLAS_CHECK(cublasSgemmStridedBatched(blas_.get(), op(ta), op(tb), m, n, k, &alpha, a, lda, sa, b, ldb, sb,
                                                    &beta, c, ldc, sc, batch));
  }
  // The same with A and B in the run's 16-bit type and fp32 accumulation (tensor cores).
  void gemm16(bool ta, bool tb, int m, int n, int k, const std::uint16_t* a, int lda, const std::uint16_t* b, int ldb,
              float* c, int ldc, bool bf16) const {
    const float one = 1.0f, zero = 0.0f;
    const cudaDataType_t t = bf16 ? CUDA_R_16BF : CUDA_R_16F;
    PARTRAIN_CUBLAS_CHECK(cublasGemmEx(blas_.get(), op(ta), op(tb), m, n, k, &one, a, t, lda, b, t, ldb, &zero, c,
                                       CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  // sgemm_strided with A and B in the run's 16-bit type, fp32 C and accumulation (the ViT's
  // bfloat16 matrix products).
  void gemm16_strided(bool ta, bool tb, int m, int n, int k, float alpha, const std::uint16_t* a, int lda, long long sa,
                      const std::uint16_t* b, int ldb, long long sb, float beta, float* c, int ldc, long long sc,
                      int batch, bool bf16) const {
    const cudaDataType_t t = bf16 ? CUDA_R_16BF : CUDA_R_16F;
    PARTRAIN_CUBLAS_CHECK(cublasGemmStridedBatchedEx(blas_.get(), op(ta), op(tb), m, n, k, &alpha, a, t, lda, sa, b, t,
                                                     ldb, sb, &beta, c, CUDA_R_32F, ldc, sc, batch, CUBLAS_COMPUTE_32F,
                                                     CUBLAS_GEMM_DEFAULT));
  }
  void upload(void* dst, const void* src, std::size_t bytes) const {
    PARTRAIN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, compute_.get()));
  }
  void download(void* dst, const void* src, std::size_t bytes) const {
    PARTRAIN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, compute_.get()));
  }
  void synchronize() const { PARTRAIN_CUDA_CHECK(cudaStreamSynchronize(compute_.get())); }

 private:
  [[nodiscard]] static cublasOperation_t op(bool transpose) noexcept { return transpose ? CUBLAS_OP_T : CUBLAS_OP_N; }

  int index_;
  partrain::cuda_stream compute_;
  partrain::cublas_handle blas_;
};

using cuda_parameter = device_parameter<partrain::cuda>;
using mlp_cuda = basic_mlp_device<cuda_backend>;

}  // namespace models
