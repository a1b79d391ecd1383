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

#include <optional>

#include <partrain/cuda/check.hpp>
#include <partrain/cuda/stream.hpp>
#endif

namespace partrain::inline v0::detail::dp {

// One device's execution context: for CUDA, the device is made current on the worker thread and
// owns a non-blocking stream (cuda/stream.hpp) for data_parallel's copies.
class device_context {
 public:
  explicit device_context(device d) : dev_(d) {}
  device_context(const device_context&) = delete;
  device_context& operator=(const device_context&) = delete;

  [[nodiscard]] const device& dev() const noexcept { return dev_; }

  // Called at the start of every job on the device's worker thread.
  void activate() {
    if (!dev_.is_cuda()) return;
#if PARTRAIN_HAS_CUDA
    PARTRAIN_CUDA_CHECK(cudaSetDevice(dev_.index));  // the worker thread works on its device only
    if (!stream_) stream_.emplace(dev_.index);
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
      PARTRAIN_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src, n * sizeof(T), cudaMemcpyHostToDevice, stream()));
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
      PARTRAIN_CUDA_CHECK(cudaMemcpyAsync(dst, src.data(), src.size_bytes(), cudaMemcpyDeviceToHost, stream()));
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
      PARTRAIN_CUDA_CHECK(cudaMemsetAsync(v.data(), 0, v.size_bytes(), stream()));
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
      PARTRAIN_CUDA_CHECK(cudaDeviceSynchronize());
    } else {
      PARTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream()));
    }
#else
    (void)whole_device;
#endif
  }

 private:
#if PARTRAIN_HAS_CUDA
  [[nodiscard]] cudaStream_t stream() const {
    if (!stream_) throw invalid_argument_error("data_parallel: device " + dev_.to_string() + " was used before activate()");
    return stream_->get();
  }
#endif

  device dev_;
#if PARTRAIN_HAS_CUDA
  std::optional<cuda_stream> stream_;  // made on the worker thread, on dev_
#endif
};

}  // namespace partrain::inline v0::detail::dp
