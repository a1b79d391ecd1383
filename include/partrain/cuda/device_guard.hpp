// partrain/cuda/device_guard.hpp: makes a CUDA device current for a scope and restores the
// previous one after (torch.cuda.device as a context manager).
#pragma once

#include <partrain/config.hpp>

#if !PARTRAIN_HAS_CUDA
#error "partrain/cuda/device_guard.hpp needs the CUDA runtime: link partrain::cuda (or compile with nvcc)"
#endif

#include <cuda_runtime.h>

#include <partrain/cuda/check.hpp>

namespace partrain::inline v0 {

class [[nodiscard]] cuda_device_guard {
 public:
  explicit cuda_device_guard(int index) {
    PARTRAIN_CUDA_CHECK(cudaGetDevice(&previous_));
    if (index != previous_) PARTRAIN_CUDA_CHECK(cudaSetDevice(index));
  }
  cuda_device_guard(const cuda_device_guard&) = delete;
  cuda_device_guard& operator=(const cuda_device_guard&) = delete;
  ~cuda_device_guard() { (void)cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

// How many CUDA devices this process sees (0 without a driver or GPU; never throws).
[[nodiscard]] inline int cuda_device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

}  // namespace partrain::inline v0
