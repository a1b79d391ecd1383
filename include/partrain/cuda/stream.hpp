// partrain/cuda/stream.hpp: an owned CUDA stream (RAII). Non-blocking with respect to the legacy
// default stream, so work on it overlaps work elsewhere unless an event orders it.
#pragma once

#include <partrain/config.hpp>

#if !PARTRAIN_HAS_CUDA
#error "partrain/cuda/stream.hpp needs the CUDA runtime: link partrain::cuda (or compile with nvcc)"
#endif

#include <cuda_runtime.h>

#include <utility>

#include <partrain/cuda/check.hpp>
#include <partrain/cuda/device_guard.hpp>

namespace partrain::inline v0 {

class cuda_stream {
 public:
  // A new stream on device `device_index`; priority as cudaStreamCreateWithPriority (0: default).
  // No default device: a stream made on GPU 0 by omission is what D1 of the GPU review was about.
  explicit cuda_stream(int device_index, int priority = 0) : device_(device_index) {
    cuda_device_guard guard(device_index);
    PARTRAIN_CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, priority));
  }
  cuda_stream(cuda_stream&& o) noexcept
      : stream_(std::exchange(o.stream_, nullptr)), device_(o.device_) {}
  cuda_stream& operator=(cuda_stream&& o) noexcept {
    if (this != &o) {
      reset();
      stream_ = std::exchange(o.stream_, nullptr);
      device_ = o.device_;
    }
    return *this;
  }
  cuda_stream(const cuda_stream&) = delete;
  cuda_stream& operator=(const cuda_stream&) = delete;
  ~cuda_stream() { reset(); }

  [[nodiscard]] cudaStream_t get() const noexcept { return stream_; }
  [[nodiscard]] int device_index() const noexcept { return device_; }
  [[nodiscard]] explicit operator bool() const noexcept { return stream_ != nullptr; }

  // Blocks the host until every operation queued so far has finished.
  void synchronize() const { PARTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  // True when the stream has no unfinished work.
  [[nodiscard]] bool query() const {
    const cudaError_t rc = cudaStreamQuery(stream_);
    if (rc == cudaErrorNotReady) return false;
    PARTRAIN_CUDA_CHECK(rc);
    return true;
  }

 private:
  void reset() noexcept {
    if (stream_) {
      // Destruction must not throw; a stream of a torn-down context is gone anyway.
      (void)cudaStreamDestroy(std::exchange(stream_, nullptr));
    }
  }

  cudaStream_t stream_ = nullptr;
  int device_ = -1;
};

}  // namespace partrain::inline v0
