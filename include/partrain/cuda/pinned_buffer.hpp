// partrain/cuda/pinned_buffer.hpp: page-locked host memory (cudaHostAlloc, RAII). Copies between
// it and the device run asynchronously on a stream and at full PCIe/NVLink speed.
#pragma once

#include <partrain/config.hpp>

#if !PARTRAIN_HAS_CUDA
#error "partrain/cuda/pinned_buffer.hpp needs the CUDA runtime: link partrain::cuda (or compile with nvcc)"
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>

#include <partrain/core/tensor_view.hpp>
#include <partrain/core/device.hpp>
#include <partrain/cuda/check.hpp>
#include <partrain/cuda/device_guard.hpp>

namespace partrain::inline v0 {

// A zero-initialised pinned host array of trivially copyable T with a shape. Portable (usable with
// every device); the allocation is made with `dev` current, so it creates no context elsewhere.
template <class T>
  requires std::is_trivially_copyable_v<T>
class pinned_buffer {
 public:
  pinned_buffer() = default;
  pinned_buffer(partrain::shape s, const device& dev) : pinned_buffer(s, detail::checked_cuda_index(dev, "pinned_buffer")) {}
  pinned_buffer(partrain::shape s, int device_index) : shape_(s) {
    if (s.numel() == 0) return;
    cuda_device_guard guard(device_index);
    void* p = nullptr;
    const cudaError_t rc = cudaHostAlloc(&p, size_bytes(), cudaHostAllocPortable);
    if (rc != cudaSuccess) {
      (void)cudaGetLastError();
      throw cuda_error(rc, "pinned_buffer: cudaHostAlloc of " + std::to_string(size_bytes()) +
                               " bytes failed: " + cudaGetErrorString(rc));
    }
    data_ = static_cast<T*>(p);
    std::memset(p, 0, size_bytes());
  }
  pinned_buffer(std::size_t n, const device& dev) : pinned_buffer(partrain::shape{n}, dev) {}
  pinned_buffer(std::size_t n, int device_index) : pinned_buffer(partrain::shape{n}, device_index) {}

  pinned_buffer(pinned_buffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), shape_(std::exchange(o.shape_, partrain::shape{0})) {}
  pinned_buffer& operator=(pinned_buffer&& o) noexcept {
    if (this != &o) {
      reset();
      data_ = std::exchange(o.data_, nullptr);
      shape_ = std::exchange(o.shape_, partrain::shape{0});
    }
    return *this;
  }
  pinned_buffer(const pinned_buffer&) = delete;
  pinned_buffer& operator=(const pinned_buffer&) = delete;
  ~pinned_buffer() { reset(); }

  [[nodiscard]] T* data() noexcept { return data_; }
  [[nodiscard]] const T* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return shape_.numel(); }
  [[nodiscard]] std::size_t size_bytes() const noexcept { return size() * sizeof(T); }
  [[nodiscard]] const partrain::shape& shape() const noexcept { return shape_; }
  [[nodiscard]] T& operator[](std::size_t i) noexcept { return data_[i]; }
  [[nodiscard]] const T& operator[](std::size_t i) const noexcept { return data_[i]; }
  [[nodiscard]] T* begin() noexcept { return data_; }
  [[nodiscard]] T* end() noexcept { return data_ + size(); }

  [[nodiscard]] tensor_view<T, host> view() noexcept { return {data_, shape_}; }
  [[nodiscard]] tensor_view<const T, host> view() const noexcept { return {data_, shape_}; }

 private:
  void reset() noexcept {
    if (data_) (void)cudaFreeHost(std::exchange(data_, nullptr));
  }

  T* data_ = nullptr;
  partrain::shape shape_{0};  // empty: one dimension of extent 0 (a rank-0 shape is a scalar, one element)
};

}  // namespace partrain::inline v0
