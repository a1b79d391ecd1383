// partrain/parallel/detail/dp_device.hpp: what data_parallel does to a device's memory: copy
// gradients and parameters between a replica and the host buffers the local backend reduces,
// with a scale on the way, and zero a gradient. Host views are plain loops; CUDA views (compiled
// only with PARTRAIN_HAS_CUDA) go through one stream per device, owned by that device's worker.
#pragma once

#include <cstddef>
#include <cstring>
#include <string>
#include <type_traits>

#include <partrain/config.hpp>
#include <partrain/core/device.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/memory_space.hpp>
#include <partrain/core/tensor_view.hpp>

#if PARTRAIN_HAS_CUDA
#include <cuda_runtime.h>
#endif

namespace partrain::inline v0::detail {

#if PARTRAIN_HAS_CUDA
inline void dp_cuda_check(cudaError_t e, const device& d, const char* what) {
  if (e != cudaSuccess) {
    throw communication_error("data_parallel: device " + d.to_string() + ": " + what + " failed: " +
                              cudaGetErrorString(e));
  }
}
#endif

// One device's execution context: for CUDA, the device is made current on the worker thread and
// owns a non-blocking stream for data_parallel's copies (RAII: destroyed on the same device).
class dp_device_context {
 public:
  explicit dp_device_context(device d) : dev_(d) {}
  dp_device_context(const dp_device_context&) = delete;
  dp_device_context& operator=(const dp_device_context&) = delete;
  ~dp_device_context() {
#if PARTRAIN_HAS_CUDA
    if (stream_) {
      // Destroyed from the owner's thread: leave its current device as it was.
      int prev = 0;
      const bool had = cudaGetDevice(&prev) == cudaSuccess;
      cudaSetDevice(dev_.index);
      cudaStreamDestroy(stream_);
      if (had) cudaSetDevice(prev);
    }
#endif
  }

  [[nodiscard]] const device& dev() const noexcept { return dev_; }

  // Called at the start of every job on the device's worker thread.
  void activate() {
    if (!dev_.is_cuda()) return;
#if PARTRAIN_HAS_CUDA
    dp_cuda_check(cudaSetDevice(dev_.index), dev_, "cudaSetDevice");
    if (!stream_) dp_cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), dev_, "cudaStreamCreate");
#else
    throw config_error("data_parallel: device " + dev_.to_string() +
                       " needs CUDA, but partrain was compiled without it (link partrain::cuda or compile with nvcc)");
#endif
  }

  // Host -> replica; the source must stay valid until synchronize().
  template <class T, class S>
  void copy_in(tensor_view<T, S> dst, const T* src, std::size_t n) {
    if constexpr (std::same_as<S, host>) {
      if (n) std::memcpy(static_cast<void*>(dst.data()), src, n * sizeof(T));
    } else {
#if PARTRAIN_HAS_CUDA
      dp_cuda_check(cudaMemcpyAsync(dst.data(), src, n * sizeof(T), cudaMemcpyHostToDevice, stream_), dev_,
                    "cudaMemcpyAsync (host to device)");
#else
      static_assert(std::same_as<S, host>, "partrain: CUDA parameters need partrain compiled with CUDA");
#endif
    }
  }

  // Replica -> host; the destination is valid after synchronize().
  template <class T, class S>
  void copy_out(T* dst, tensor_view<const T, S> src) {
    if constexpr (std::same_as<S, host>) {
      if (src.size()) std::memcpy(static_cast<void*>(dst), src.data(), src.size_bytes());
    } else {
#if PARTRAIN_HAS_CUDA
      dp_cuda_check(cudaMemcpyAsync(dst, src.data(), src.size_bytes(), cudaMemcpyDeviceToHost, stream_), dev_,
                    "cudaMemcpyAsync (device to host)");
#else
      static_assert(std::same_as<S, host>, "partrain: CUDA parameters need partrain compiled with CUDA");
#endif
    }
  }

  template <class T, class S>
  void zero(tensor_view<T, S> v) {
    if constexpr (std::same_as<S, host>) {
      for (auto& x : v) x = T{};
    } else {
#if PARTRAIN_HAS_CUDA
      dp_cuda_check(cudaMemsetAsync(v.data(), 0, v.size_bytes(), stream_), dev_, "cudaMemsetAsync");
#else
      static_assert(std::same_as<S, host>, "partrain: CUDA parameters need partrain compiled with CUDA");
#endif
    }
  }

  // Waits for this context's copies; also for the device's other work (the model's own streams),
  // since the model's train_step may have queued its backward asynchronously.
  void synchronize(bool whole_device = false) {
    if (!dev_.is_cuda()) return;
#if PARTRAIN_HAS_CUDA
    if (whole_device) {
      dp_cuda_check(cudaDeviceSynchronize(), dev_, "cudaDeviceSynchronize");
    } else {
      dp_cuda_check(cudaStreamSynchronize(stream_), dev_, "cudaStreamSynchronize");
    }
#else
    (void)whole_device;
#endif
  }

 private:
  device dev_;
#if PARTRAIN_HAS_CUDA
  cudaStream_t stream_ = nullptr;
#endif
};

}  // namespace partrain::inline v0::detail
