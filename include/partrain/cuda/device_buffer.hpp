// partrain/cuda/device_buffer.hpp: owned device memory (cudaMalloc, RAII) with a shape, seen as
// tensor_view<T, cuda>, and copies to and from host views (blocking, or queued on a stream).
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

// A zero-initialised device array of trivially copyable T with a shape, on one device.
template <class T>
  requires std::is_trivially_copyable_v<T>
class device_buffer {
 public:
  device_buffer() = default;
  explicit device_buffer(partrain::shape s, int device_index = 0) : shape_(s), device_(device_index) {
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
    const cudaError_t rc2 = cudaMemset(data_, 0, size_bytes());
    if (rc2 != cudaSuccess) {
      reset();
      detail::cuda_check(rc2, "cudaMemset(data_, 0, size_bytes())", __FILE__, __LINE__);
    }
  }
  explicit device_buffer(std::size_t n, int device_index = 0) : device_buffer(partrain::shape{n}, device_index) {}

  device_buffer(device_buffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), shape_(std::exchange(o.shape_, {})), device_(o.device_) {}
  device_buffer& operator=(device_buffer&& o) noexcept {
    if (this != &o) {
      reset();
      data_ = std::exchange(o.data_, nullptr);
      shape_ = std::exchange(o.shape_, {});
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
  [[nodiscard]] std::size_t size_bytes() const noexcept { return size() * sizeof(T); }
  [[nodiscard]] const partrain::shape& shape() const noexcept { return shape_; }
  [[nodiscard]] int device_index() const noexcept { return device_; }

  [[nodiscard]] tensor_view<T, cuda> view() noexcept { return {data_, shape_}; }
  [[nodiscard]] tensor_view<const T, cuda> view() const noexcept { return {data_, shape_}; }

  // Host -> device. With a stream the copy is queued (the host memory must stay alive and, to be
  // truly asynchronous, be pinned); without one it has finished on return.
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
    } else {
      PARTRAIN_CUDA_CHECK(cudaMemcpy(dst, src, size_bytes(), kind));
    }
  }
  void reset() noexcept {
    if (data_) (void)cudaFree(std::exchange(data_, nullptr));
  }

  T* data_ = nullptr;
  partrain::shape shape_{};
  int device_ = 0;
};

}  // namespace partrain::inline v0
