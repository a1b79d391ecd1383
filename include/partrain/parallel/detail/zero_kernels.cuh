// partrain/parallel/detail/zero_kernels.cuh: place<cuda>, sharded data parallel's buffers and
// element moves for parameters in CUDA memory (the twin of place<host> in zero_space.hpp): buffers
// are device_buffers on the parameters' device; copies, fills and the functors of
// parallel/detail/ddp_elements.hpp are queued on one stream, the communicator's input stream, so
// the collectives (which NCCL orders after that stream) see them, and the host waits for that
// stream only where it hands memory back (finish, to_host, from_host). nvcc only.
#pragma once

#if !defined(__CUDACC__)
#error "partrain/parallel/detail/zero_kernels.cuh must be compiled by nvcc"
#endif

#include <cuda_runtime.h>

#include <concepts>
#include <cstddef>
#include <optional>
#include <string>

#include <partrain/core/memory_space.hpp>
#include <partrain/cuda/check.hpp>
#include <partrain/cuda/device_buffer.hpp>
#include <partrain/cuda/device_guard.hpp>
#include <partrain/cuda/event.hpp>
#include <partrain/cuda/launch.cuh>
#include <partrain/parallel/detail/host_staging.hpp>
#include <partrain/parallel/detail/zero_space.hpp>

namespace partrain::inline v0::detail::zero {

template <>
struct place<cuda> {
  template <class U>
  using buffer = device_buffer<U>;

  place() = default;
  // device: the parameters' CUDA device; stream: a cudaStream_t of it (null: the legacy stream).
  place(int device, void* stream) : device_(device), stream_(stream) {}
  // The place of a rank whose parameters are in CUDA memory: their one device (checked by
  // parameters_cuda_device; none in CUDA memory: the communicator's, else the current one) and the
  // communicator's input stream, which it orders its collectives after. for_each_param(fn) calls
  // fn(p) for each parameter. A communicator that reduces host memory only is refused with
  // `advice` (what to use instead).
  template <class C, class ForEach>
  [[nodiscard]] static place make(C& comm, ForEach&& for_each_param, const std::string& where, const char* advice) {
    if (!takes_memory(comm, device_kind::cuda)) {
      throw config_error(where + "the parameters are in CUDA memory but the communicator reduces host memory only (" +
                         advice + ")");
    }
    int dev = parameters_cuda_device(comm, for_each_param, where);
    const int comm_dev = comm_cuda_device(comm);
    void* stream = nullptr;  // the legacy stream
    if constexpr (requires { { comm.input_stream() } -> std::convertible_to<void*>; }) {
      stream = comm.input_stream();
    }
    if (dev < 0) dev = comm_dev >= 0 ? comm_dev : cuda_current_device();
    return place(dev, stream);
  }

  [[nodiscard]] cuda_exec exec() const noexcept { return {s(), device_}; }
  [[nodiscard]] void* stream() const noexcept { return stream_; }
  [[nodiscard]] int device() const noexcept { return device_; }

  // n zeros, the fill queued on the stream (so work queued there next sees zeros).
  template <class U>
  void allocate(device_buffer<U>& b, std::size_t n) const {
    b = device_buffer<U>(partrain::shape{n}, device_, s());
  }
  // cudaFree waits for the device's work, so nothing queued still uses the memory.
  template <class U>
  void release(device_buffer<U>& b) const {
    b = device_buffer<U>();
  }
  template <class U>
  void copy(U* dst, const U* src, std::size_t n) const {
    if (n == 0) return;
    cuda_device_guard guard(device_);
    PARTRAIN_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(U), cudaMemcpyDeviceToDevice, s()));
  }
  template <class U>
  void fill_zero(U* dst, std::size_t n) const {
    if (n == 0) return;
    cuda_device_guard guard(device_);
    PARTRAIN_CUDA_CHECK(cudaMemsetAsync(dst, 0, n * sizeof(U), s()));
  }
  template <class U>
  void to_host(U* dst, const U* src, std::size_t n) const {
    copy_waited(dst, src, n * sizeof(U), cudaMemcpyDeviceToHost);
  }
  template <class U>
  void from_host(U* dst, const U* src, std::size_t n) const {
    copy_waited(dst, src, n * sizeof(U), cudaMemcpyHostToDevice);
  }
  // Zeros of shape s, filled on `stream` (the model's; null: the legacy one), not waited for:
  // the model's work queued there next sees them.
  template <class U>
  using tensor = device_buffer<U>;
  template <class U>
  [[nodiscard]] device_buffer<U> make_tensor(const partrain::shape& sh, void* stream) const {
    return device_buffer<U>(sh, device_, stream_or_legacy(stream));
  }
  // A device copy of host memory h (a batch), queued on `stream` (the model's). Pageable memory
  // is staged before this returns; pinned memory must live until the model's work that follows.
  template <class U>
  [[nodiscard]] device_buffer<U> upload(tensor_view<const U> h, void* stream) const {
    device_buffer<U> d(h.shape(), device_, stream_or_legacy(stream));
    d.copy_from(h, stream_or_legacy(stream));
    return d;
  }
  // The stream's next work waits for what `stream` (the model's; null: the legacy one) queued.
  void after(void* stream) const { order(stream_or_legacy(stream), s()); }
  // What `stream` (the model's) queues next waits for the stream's work.
  void ahead_of(void* stream) const { order(s(), stream_or_legacy(stream)); }
  void finish() const {
    cuda_device_guard guard(device_);
    PARTRAIN_CUDA_CHECK(cudaStreamSynchronize(s()));
  }

 private:
  [[nodiscard]] cudaStream_t s() const noexcept { return stream_or_legacy(stream_); }
  // `later`'s next work waits for what `first` has queued (one event, recorded anew each time).
  void order(cudaStream_t first, cudaStream_t later) const {
    if (first == later) return;
    cuda_device_guard guard(device_);
    if (!ready_) ready_.emplace();
    ready_->record(first);
    ready_->block(later);
  }
  // Queued after the stream's work, finished on return.
  void copy_waited(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) const {
    if (bytes == 0) return;
    cuda_device_guard guard(device_);
    PARTRAIN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, s()));
    PARTRAIN_CUDA_CHECK(cudaStreamSynchronize(s()));
  }

  int device_ = -1;
  void* stream_ = nullptr;
  mutable std::optional<cuda_event> ready_;  // created at the first after() that needs it
};

}  // namespace partrain::inline v0::detail::zero
