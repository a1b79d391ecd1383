// partrain/cuda/device_buffer.hpp: owned device memory (cudaMalloc, RAII) with a shape, seen as
// tensor_view<T, cuda>, and copies to and from host views (finished on return, or queued on a stream).
#pragma once

#include <partrain/config.hpp>

#if !PARTRAIN_HAS_CUDA
#error "partrain/cuda/device_buffer.hpp needs the CUDA runtime: link partrain::cuda (or compile with nvcc)"
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>

#include <partrain/core/error.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/cuda/check.hpp>
#include <partrain/cuda/device_guard.hpp>

namespace partrain::inline v0 {

// A zero-initialised device array of trivially copyable T with a shape, on one device. The device
// is always named: there is no default, so a buffer cannot land on GPU 0 by omission.
template <class T>
  requires std::is_trivially_copyable_v<T>
class device_buffer {
 public:
  device_buffer() = default;
  // Zero-filled before the constructor returns (queued on the legacy stream of `dev`, then that
  // stream is synchronised), so work on any stream afterwards sees zeros.
  device_buffer(partrain::shape s, const partrain::device& dev)
      : device_buffer(s, detail::checked_cuda_index(dev, "device_buffer"), nullptr) {}
  device_buffer(partrain::shape s, int device_index) : device_buffer(s, device_index, nullptr) {}
  device_buffer(std::size_t n, const partrain::device& dev) : device_buffer(partrain::shape{n}, dev) {}
  device_buffer(std::size_t n, int device_index) : device_buffer(partrain::shape{n}, device_index) {}
  // Zero-fill queued on `stream` (of `device_index`) and not waited for: work queued on that
  // stream afterwards sees zeros; other streams must wait on it (an event) first.
  device_buffer(partrain::shape s, int device_index, cudaStream_t stream) : shape_(s), device_(device_index) {
    if (device_index < 0) {
      throw invalid_argument_error("device_buffer: device index " + std::to_string(device_index) +
                                   " (expected a CUDA device index >= 0)");
    }
    if (s.numel() == 0) return;
    cuda_device_guard guard(device_index);
    void* p = nullptr;
    const cudaError_t rc = cudaMalloc(&p, size_bytes());
    if (rc != cudaSuccess) {
      (void)cudaGetLastError();
      throw cuda_error(rc, "device_buffer: cudaMalloc of " + std::to_string(size_bytes()) + " bytes on cuda:" +
                               std::to_string(device_index) + " failed: " + cudaGetErrorString(rc));
    }
    data_ = static_cast<T*>(p);
    // cudaMemset would return before the fill ran and order it only on the legacy stream.
    const cudaStream_t fill = stream ? stream : cudaStreamLegacy;
    cudaError_t rc2 = cudaMemsetAsync(data_, 0, size_bytes(), fill);
    if (rc2 == cudaSuccess && !stream) rc2 = cudaStreamSynchronize(fill);
    if (rc2 != cudaSuccess) {
      reset();
      detail::cuda_check(rc2, "device_buffer: cudaMemsetAsync + cudaStreamSynchronize (zero fill)", __FILE__, __LINE__);
    }
  }

  device_buffer(device_buffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), shape_(std::exchange(o.shape_, partrain::shape{0})), device_(o.device_) {}
  device_buffer& operator=(device_buffer&& o) noexcept {
    if (this != &o) {
      reset();
      data_ = std::exchange(o.data_, nullptr);
      shape_ = std::exchange(o.shape_, partrain::shape{0});
      device_ = o.device_;
    }
    return *this;
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() { reset(); }

  [[nodiscard]] T* data() noexcept { return data_; }
  [[nodiscard]] const T* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return shape_.numel(); }
  [[nodiscard]] bool empty() const noexcept { return size() == 0; }
  [[nodiscard]] std::size_t size_bytes() const noexcept { return size() * sizeof(T); }
  [[nodiscard]] const partrain::shape& shape() const noexcept { return shape_; }
  [[nodiscard]] int device_index() const noexcept { return device_; }
  [[nodiscard]] partrain::device device() const noexcept { return partrain::device::cuda(device_); }

  [[nodiscard]] tensor_view<T, cuda> view() noexcept { return {data_, shape_}; }
  [[nodiscard]] tensor_view<const T, cuda> view() const noexcept { return {data_, shape_}; }

  // Host -> device. With a stream the copy is queued on it (the host memory must stay alive until
  // it ran and, to be truly asynchronous, be pinned). Without one it is queued on the legacy
  // stream of the buffer's device, which is then synchronised: the copy has finished on return
  // (cudaMemcpy alone does not promise that for pageable host memory). Either way it is ordered
  // after earlier work on that stream only: data made on another stream needs that stream.
  void copy_from(tensor_view<const T, host> src, cudaStream_t stream = nullptr) {
    check_size("copy_from", src.size());
    copy(data_, src.data(), cudaMemcpyHostToDevice, stream);
  }
  // Device -> host, same rules.
  void copy_to(tensor_view<T, host> dst, cudaStream_t stream = nullptr) const {
    check_size("copy_to", dst.size());
    copy(dst.data(), data_, cudaMemcpyDeviceToHost, stream);
  }

 private:
  void check_size(const char* what, std::size_t n) const {
    if (n != size()) {
      throw invalid_argument_error("device_buffer::" + std::string(what) + ": the host view has " + std::to_string(n) +
                                   " elements, the buffer " + std::to_string(size()) + " (expected equal sizes)");
    }
  }
  void copy(void* dst, const void* src, cudaMemcpyKind kind, cudaStream_t stream) const {
    if (size() == 0) return;
    if (stream) {
      PARTRAIN_CUDA_CHECK(cudaMemcpyAsync(dst, src, size_bytes(), kind, stream));
      return;
    }
    cuda_device_guard guard(device_);  // the legacy stream of the buffer's device
    PARTRAIN_CUDA_CHECK(cudaMemcpyAsync(dst, src, size_bytes(), kind, cudaStreamLegacy));
    PARTRAIN_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
  }
  void reset() noexcept {
    if (data_) (void)cudaFree(std::exchange(data_, nullptr));  // cudaFree frees on any current device
  }

  T* data_ = nullptr;
  partrain::shape shape_{0};  // empty: one dimension of extent 0 (a rank-0 shape is a scalar, one element)
  int device_ = -1;  // -1: an empty default-constructed buffer
};

}  // namespace partrain::inline v0
