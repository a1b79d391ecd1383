// partrain/core/buffer.hpp: owning host memory (64-byte aligned) with a tensor_view on it.
// Pinned host memory and device memory live in partrain/cuda/ (they need the CUDA runtime).
#pragma once

#include <cstddef>
#include <cstring>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

#include <partrain/core/tensor_view.hpp>

namespace partrain::inline v0 {

namespace detail {
struct aligned_free {
  void operator()(void* p) const noexcept { ::operator delete(p, std::align_val_t{64}); }
};
}  // namespace detail

// A zero-initialised host array of trivially copyable T with a shape.
template <class T>
  requires std::is_trivially_copyable_v<T>
class host_buffer {
 public:
  host_buffer() = default;
  explicit host_buffer(partrain::shape s) : shape_(s) {
    if (s.numel() != 0) {
      data_.reset(static_cast<T*>(::operator new(s.numel() * sizeof(T), std::align_val_t{64})));
      std::memset(static_cast<void*>(data_.get()), 0, s.numel() * sizeof(T));
    }
  }
  explicit host_buffer(std::size_t n) : host_buffer(partrain::shape{n}) {}

  host_buffer(host_buffer&&) noexcept = default;
  host_buffer& operator=(host_buffer&&) noexcept = default;
  host_buffer(const host_buffer& o) : host_buffer(o.shape_) {
    if (size()) std::memcpy(static_cast<void*>(data()), o.data(), size_bytes());
  }
  host_buffer& operator=(const host_buffer& o) {
    if (this != &o) *this = host_buffer(o);
    return *this;
  }

  [[nodiscard]] T* data() noexcept { return data_.get(); }
  [[nodiscard]] const T* data() const noexcept { return data_.get(); }
  [[nodiscard]] std::size_t size() const noexcept { return shape_.numel(); }
  [[nodiscard]] std::size_t size_bytes() const noexcept { return size() * sizeof(T); }
  [[nodiscard]] const partrain::shape& shape() const noexcept { return shape_; }
  [[nodiscard]] T& operator[](std::size_t i) noexcept { return data_.get()[i]; }
  [[nodiscard]] const T& operator[](std::size_t i) const noexcept { return data_.get()[i]; }
  [[nodiscard]] T* begin() noexcept { return data(); }
  [[nodiscard]] T* end() noexcept { return data() + size(); }
  [[nodiscard]] const T* begin() const noexcept { return data(); }
  [[nodiscard]] const T* end() const noexcept { return data() + size(); }

  [[nodiscard]] tensor_view<T, host> view() noexcept { return {data(), shape_}; }
  [[nodiscard]] tensor_view<const T, host> view() const noexcept { return {data(), shape_}; }

 private:
  std::unique_ptr<T, detail::aligned_free> data_;
  partrain::shape shape_{0};  // empty: one dimension of extent 0 (a rank-0 shape is a scalar)
};

}  // namespace partrain::inline v0
