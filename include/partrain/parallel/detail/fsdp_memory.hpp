// partrain/parallel/detail/fsdp_memory.hpp: the buffers fully sharded data parallel allocates and
// frees within a step (a layer's gathered parameters, its whole gradient), each counted in a meter
// while it lives, so the peak a rank held is measured rather than estimated.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <utility>

namespace partrain::inline v0::detail::fsdp {

// Bytes held now, and the most held at once since the last reset.
struct byte_meter {
  std::size_t now = 0;
  std::size_t peak = 0;
  void add(std::size_t b) noexcept {
    now += b;
    peak = std::max(peak, now);
  }
  void sub(std::size_t b) noexcept { now -= b; }
  void reset_peak() noexcept { peak = now; }
};

// n elements of T, counted in a meter from allocation to release (or destruction).
template <class T>
class counted_buffer {
 public:
  counted_buffer() = default;
  // zeroed: the gradient buffers, which backward accumulates into; a gather target is overwritten whole.
  counted_buffer(byte_meter& m, std::size_t n, bool zeroed) : data_(new T[n]), size_(n), meter_(&m) {
    if (zeroed) std::memset(static_cast<void*>(data_.get()), 0, n * sizeof(T));
    meter_->add(n * sizeof(T));
  }
  counted_buffer(counted_buffer&& o) noexcept
      : data_(std::move(o.data_)), size_(std::exchange(o.size_, 0)), meter_(std::exchange(o.meter_, nullptr)) {}
  counted_buffer& operator=(counted_buffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::move(o.data_);
      size_ = std::exchange(o.size_, 0);
      meter_ = std::exchange(o.meter_, nullptr);
    }
    return *this;
  }
  counted_buffer(const counted_buffer&) = delete;
  counted_buffer& operator=(const counted_buffer&) = delete;
  ~counted_buffer() { release(); }

  void release() noexcept {
    if (meter_) meter_->sub(size_ * sizeof(T));
    data_.reset();
    size_ = 0;
    meter_ = nullptr;
  }
  [[nodiscard]] T* data() noexcept { return data_.get(); }
  [[nodiscard]] const T* data() const noexcept { return data_.get(); }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] bool held() const noexcept { return meter_ != nullptr; }

 private:
  std::unique_ptr<T[]> data_;
  std::size_t size_ = 0;
  byte_meter* meter_ = nullptr;
};

}  // namespace partrain::inline v0::detail::fsdp
