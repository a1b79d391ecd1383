// partrain/cuda/device_guard.hpp: makes a CUDA device current for a scope and restores the
// previous one after (torch.cuda.device as a context manager), without ever creating a context
// on a device nobody asked for.
#pragma once

#include <partrain/config.hpp>

#if !PARTRAIN_HAS_CUDA
#error "partrain/cuda/device_guard.hpp needs the CUDA runtime: link partrain::cuda (or compile with nvcc)"
#endif

#include <cuda.h>  // CUcontext and the driver's function type only: nothing links libcuda
#include <cuda_runtime.h>

#include <string>

#include <partrain/core/device.hpp>
#include <partrain/core/error.hpp>
#include <partrain/cuda/check.hpp>

namespace partrain::inline v0 {

namespace detail {

// Whether this thread has a current CUDA context, i.e. someone already made a device current on
// it (cudaSetDevice, or a runtime call that initialised one). cudaGetDevice answers 0 on a fresh
// thread, and cudaSetDevice(0) would then create device 0's context (CUDA 12+): restoring must
// not do that. The driver's cuCtxGetCurrent is reached through the runtime, so nothing links
// libcuda. Unknown (entry point missing): true, i.e. restore as a plain guard would.
[[nodiscard]] inline bool thread_has_cuda_context() noexcept {
#if defined(CUDART_VERSION) && CUDART_VERSION >= 12050
  using get_current_fn = CUresult(CUDAAPI*)(CUcontext*);
  static const get_current_fn get_current = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &fn, 12000, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return get_current_fn{nullptr};
    }
    return reinterpret_cast<get_current_fn>(fn);
  }();
  if (!get_current) return true;
  CUcontext ctx = nullptr;
  if (get_current(&ctx) != CUDA_SUCCESS) return true;
  return ctx != nullptr;
#else
  return true;
#endif
}

[[nodiscard]] inline int checked_cuda_index(const device& d, const char* who) {
  if (!d.is_cuda()) {
    throw invalid_argument_error(std::string(who) + ": device " + d.to_string() + " is not a CUDA device (expected cuda:N)");
  }
  return d.index;
}

}  // namespace detail

// The device current on this thread (cudaGetDevice: it does not create a context; 0 when none
// was ever set).
[[nodiscard]] inline int cuda_current_device() {
  int d = 0;
  PARTRAIN_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

class [[nodiscard]] cuda_device_guard {
 public:
  // Makes `index` current unless it already is. The destructor restores the previous device only
  // when this guard changed it and the thread had a context before (someone had set a device).
  explicit cuda_device_guard(int index) {
    const int current = cuda_current_device();
    if (current == index) return;
    const bool restore = detail::thread_has_cuda_context();
    PARTRAIN_CUDA_CHECK(cudaSetDevice(index));
    if (restore) previous_ = current;
  }
  explicit cuda_device_guard(const device& d) : cuda_device_guard(detail::checked_cuda_index(d, "cuda_device_guard")) {}
  cuda_device_guard(const cuda_device_guard&) = delete;
  cuda_device_guard& operator=(const cuda_device_guard&) = delete;
  ~cuda_device_guard() {
    if (previous_ >= 0) (void)cudaSetDevice(previous_);
  }

 private:
  int previous_ = -1;  // -1: leave the device as it is at the end of the scope
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

// The device whose memory `p` is (cudaPointerGetAttributes): device memory and managed memory
// report their device. Host memory (pageable or pinned) has no device: config_error naming `who`.
[[nodiscard]] inline device cuda_device_of(const void* p, const char* who) {
  cudaPointerAttributes a{};
  const cudaError_t rc = cudaPointerGetAttributes(&a, p);
  if (rc != cudaSuccess) {
    (void)cudaGetLastError();
    throw cuda_error(rc, std::string(who) + ": cudaPointerGetAttributes failed: " + cudaGetErrorString(rc));
  }
  if ((a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged) || a.device < 0) {
    throw config_error(std::string(who) + ": a pointer expected in CUDA device memory is host memory (a tensor_view<T, "
                                          "cuda> must point into device memory)");
  }
  return device::cuda(a.device);
}

}  // namespace partrain::inline v0
