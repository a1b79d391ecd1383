// models/mlp_host_twin.hpp: the CUDA MLP's step (mlp_device.hpp) on the host backend, so the CPU
// tier runs every line of it without a GPU: the element functors go through for_each_index on
// Thrust's host system (the thrust::for_each_n the CUDA backend calls; the plain host loop where
// the build has no Thrust, PARTRAIN_THRUST_HOST unset); the GEMMs go through OpenBLAS in
// cuBLAS's column-major conventions (the 16-bit GEMMs widen their operands to fp32 first: products
// of 16-bit values are exact in fp32, so only the summation order can differ from cuBLAS's
// fp32-accumulating GemmEx); copies are memcpy, in program order. Not a model to train with:
// mlp_host is the host model (it fuses the bias into its GEMMs and runs faster).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include <cblas.h>

#include <partrain/core/device.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/for_each_index.hpp>
#include <partrain/core/half.hpp>
#if defined(PARTRAIN_THRUST_HOST)
#include <partrain/core/detail/thrust_index.hpp>
#endif
#include <partrain/core/memory_space.hpp>

#include "mlp_device.hpp"

namespace models {

class host_twin_backend {
 public:
  using space = partrain::host;
  template <class T>
  using array = std::vector<T>;
  static constexpr const char* model_name = "mlp_host_twin";
  [[nodiscard]] static partrain::device default_device() noexcept { return partrain::device::cpu(); }
  static void check_device(const partrain::device& d) {
    if (d.is_cuda()) {
      throw partrain::invalid_argument_error("mlp_host_twin: device " + d.to_string() +
                                             " is not the CPU; the CUDA backend is mlp_cuda");
    }
  }

  explicit host_twin_backend(const partrain::device&) {}

  template <class T>
  [[nodiscard]] array<T> make(std::size_t n) const {
    return array<T>(n);
  }
  template <class T>
  void reserve(array<T>& a, std::size_t n) const {
    if (n > a.size()) a.assign(n, T{});  // as the device backend: contents not kept, zeros
  }
  void activate() const noexcept {}
  [[nodiscard]] std::nullptr_t stream() const noexcept { return nullptr; }

  template <class F>
  void launch(std::size_t n, const F& f) const {
#if defined(PARTRAIN_THRUST_HOST)
    partrain::detail::for_each_index(partrain::detail::thrust_host_exec{}, n, f);
#else
    partrain::detail::for_each_index(partrain::detail::host_exec{}, n, f);
#endif
  }
  // Column-major C[m, n] = op(A) . op(B) (+ beta C), fp32: cublasSgemm's arguments, meaning and layout.
  void sgemm(bool ta, bool tb, int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c, int ldc,
             float beta = 0.0f) const {
    cblas_sgemm(CblasColMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, a, lda, b,
                ldb, beta, c, ldc);
  }
  // cublasSgemmStridedBatched: batch column-major GEMMs, X_i = X + i * stride_x.
  void sgemm_strided(bool ta, bool tb, int m, int n, int k, float alpha, const float* a, int lda, long long sa,
                     const float* b, int ldb, long long sb, float beta, float* c, int ldc, long long sc, int batch) const {
    for (int i = 0; i < batch; ++i) {
      cblas_sgemm(CblasColMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, alpha, a + i * sa,
                  lda, b + i * sb, ldb, beta, c + i * sc, ldc);
    }
  }
  // cublasGemmEx with 16-bit A and B and fp32 accumulation: the operands widened, then sgemm.
  void gemm16(bool ta, bool tb, int m, int n, int k, const std::uint16_t* a, int lda, const std::uint16_t* b, int ldb,
              float* c, int ldc, bool bf16) const {
    // Stored column-major: op(A) is m x k, so A itself has (ta ? m : k) columns of lda elements.
    const auto wa = widen(a, static_cast<std::size_t>(lda) * static_cast<std::size_t>(ta ? m : k), bf16);
    const auto wb = widen(b, static_cast<std::size_t>(ldb) * static_cast<std::size_t>(tb ? k : n), bf16);
    sgemm(ta, tb, m, n, k, wa.data(), lda, wb.data(), ldb, c, ldc);
  }
  // cublasGemmStridedBatchedEx with 16-bit A and B: every batch's operands widened, then sgemm_strided.
  void gemm16_strided(bool ta, bool tb, int m, int n, int k, float alpha, const std::uint16_t* a, int lda, long long sa,
                      const std::uint16_t* b, int ldb, long long sb, float beta, float* c, int ldc, long long sc,
                      int batch, bool bf16) const {
    // Column-major op(A) is m x k: A has (ta ? m : k) columns of (ta ? k : m) rows; the last
    // batch's last column ends the elements read.
    const auto extent = [&](int rows, int cols, int ld, long long stride) {
      return static_cast<std::size_t>(batch - 1) * static_cast<std::size_t>(stride) +
             static_cast<std::size_t>(cols - 1) * static_cast<std::size_t>(ld) + static_cast<std::size_t>(rows);
    };
    if (batch <= 0 || m <= 0 || n <= 0 || k <= 0) return;
    const auto wa = widen(a, extent(ta ? k : m, ta ? m : k, lda, sa), bf16);
    const auto wb = widen(b, extent(tb ? n : k, tb ? k : n, ldb, sb), bf16);
    sgemm_strided(ta, tb, m, n, k, alpha, wa.data(), lda, sa, wb.data(), ldb, sb, beta, c, ldc, sc, batch);
  }
  void upload(void* dst, const void* src, std::size_t bytes) const {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void download(void* dst, const void* src, std::size_t bytes) const {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void synchronize() const noexcept {}

 private:
  [[nodiscard]] static std::vector<float> widen(const std::uint16_t* p, std::size_t n, bool bf16) {
    std::vector<float> out(n);
    for (std::size_t i = 0; i < n; ++i) {
      out[i] = bf16 ? partrain::detail::bfloat16_bits_to_float(p[i]) : partrain::detail::half_bits_to_float(p[i]);
    }
    return out;
  }
};

using mlp_host_twin = basic_mlp_device<host_twin_backend>;

}  // namespace models
