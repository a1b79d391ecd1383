// partrain/cuda/cublas.hpp: an owned cuBLAS handle (RAII) and PARTRAIN_CUBLAS_CHECK.
#pragma once

#include <partrain/config.hpp>

#if !PARTRAIN_HAS_CUDA
#error "partrain/cuda/cublas.hpp needs the CUDA runtime: link partrain::cuda (or compile with nvcc)"
#endif

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>
#include <utility>

#include <partrain/core/error.hpp>
#include <partrain/cuda/device_guard.hpp>

namespace partrain::inline v0 {

// A cuBLAS call failed. kind() is internal; status() is cuBLAS's code.
class cublas_error : public error {
 public:
  cublas_error(cublasStatus_t status, const std::string& what) : error(error_kind::internal, what), status_(status) {}
  [[nodiscard]] cublasStatus_t status() const noexcept { return status_; }

 private:
  cublasStatus_t status_;
};

namespace detail {
inline void cublas_check(cublasStatus_t st, const char* call, const char* file, int line) {
  if (st != CUBLAS_STATUS_SUCCESS) {
    throw cublas_error(st, "cuBLAS call '" + std::string(call) + "' failed at " + file + ":" + std::to_string(line) +
                               ": " + cublasGetStatusName(st) + " (" + cublasGetStatusString(st) + ")");
  }
}
}  // namespace detail

}  // namespace partrain::inline v0

#define PARTRAIN_CUBLAS_CHECK(call) ::partrain::detail::cublas_check((call), #call, __FILE__, __LINE__)

namespace partrain::inline v0 {

class cublas_handle {
 public:
  // A handle bound to device `device_index` (cuBLAS handles belong to the device current at creation).
  explicit cublas_handle(int device_index) : device_(device_index) {
    cuda_device_guard guard(device_index);
    PARTRAIN_CUBLAS_CHECK(cublasCreate(&handle_));
  }
  cublas_handle(cublas_handle&& o) noexcept : handle_(std::exchange(o.handle_, nullptr)), device_(o.device_) {}
  cublas_handle& operator=(cublas_handle&& o) noexcept {
    if (this != &o) {
      reset();
      handle_ = std::exchange(o.handle_, nullptr);
      device_ = o.device_;
    }
    return *this;
  }
  cublas_handle(const cublas_handle&) = delete;
  cublas_handle& operator=(const cublas_handle&) = delete;
  ~cublas_handle() { reset(); }

  [[nodiscard]] cublasHandle_t get() const noexcept { return handle_; }
  [[nodiscard]] int device_index() const noexcept { return device_; }
  // Later calls through this handle queue on `stream`.
  void set_stream(cudaStream_t stream) { PARTRAIN_CUBLAS_CHECK(cublasSetStream(handle_, stream)); }

 private:
  void reset() noexcept {
    if (handle_) (void)cublasDestroy(std::exchange(handle_, nullptr));
  }

  cublasHandle_t handle_ = nullptr;
  int device_ = -1;
};

}  // namespace partrain::inline v0
