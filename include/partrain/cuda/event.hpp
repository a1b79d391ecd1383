// partrain/cuda/event.hpp: an owned CUDA event (RAII). Recorded on a stream, it marks "all work
// queued before this point"; another stream can wait on it without blocking the host.
#pragma once

#include <partrain/config.hpp>

#if !PARTRAIN_HAS_CUDA
#error "partrain/cuda/event.hpp needs the CUDA runtime: link partrain::cuda (or compile with nvcc)"
#endif

#include <cuda_runtime.h>

#include <utility>

#include <partrain/core/error.hpp>
#include <partrain/cuda/check.hpp>

namespace partrain::inline v0 {

class cuda_event {
 public:
  // Without timing the event is cheaper (no timestamp); ask for it to measure elapsed_ms.
  explicit cuda_event(bool timing = false) : timing_(timing) {
    PARTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming));
  }
  cuda_event(cuda_event&& o) noexcept : event_(std::exchange(o.event_, nullptr)), timing_(o.timing_) {}
  cuda_event& operator=(cuda_event&& o) noexcept {
    if (this != &o) {
      reset();
      event_ = std::exchange(o.event_, nullptr);
      timing_ = o.timing_;
    }
    return *this;
  }
  cuda_event(const cuda_event&) = delete;
  cuda_event& operator=(const cuda_event&) = delete;
  ~cuda_event() { reset(); }

  [[nodiscard]] cudaEvent_t get() const noexcept { return event_; }

  void record(cudaStream_t stream) { PARTRAIN_CUDA_CHECK(cudaEventRecord(event_, stream)); }
  // Work queued on `stream` after this call starts only once the event has completed.
  void block(cudaStream_t stream) const { PARTRAIN_CUDA_CHECK(cudaStreamWaitEvent(stream, event_, 0)); }
  void synchronize() const { PARTRAIN_CUDA_CHECK(cudaEventSynchronize(event_)); }
  // True once the work before the record point has finished (or if never recorded).
  [[nodiscard]] bool query() const {
    const cudaError_t rc = cudaEventQuery(event_);
    if (rc == cudaErrorNotReady) return false;
    PARTRAIN_CUDA_CHECK(rc);
    return true;
  }
  // Milliseconds from `start` to this event; both need timing and must have completed.
  [[nodiscard]] float elapsed_ms(const cuda_event& start) const {
    if (!timing_ || !start.timing_) {
      throw invalid_argument_error("cuda_event::elapsed_ms: both events must be created with timing = true");
    }
    float ms = 0.0f;
    PARTRAIN_CUDA_CHECK(cudaEventElapsedTime(&ms, start.event_, event_));
    return ms;
  }

 private:
  void reset() noexcept {
    if (event_) (void)cudaEventDestroy(std::exchange(event_, nullptr));
  }

  cudaEvent_t event_ = nullptr;
  bool timing_ = false;
};

}  // namespace partrain::inline v0
