// partrain/parallel/detail/fsdp_memory.hpp: the buffers fully sharded data parallel allocates and
// frees within a step (a layer's gathered parameters, its whole gradient), each counted in a meter
// while it lives, so the peak a rank held is measured rather than estimated.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstring>
#include <memory>
#include <type_traits>
#include <utility>

#include <partrain/core/memory_space.hpp>
#include <partrain/parallel/detail/zero_space.hpp>

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

// n elements of T in memory space S (host, or CUDA where the layers are), counted in a meter from
// allocation to release (or destruction).
template <class T, class S = host>
class counted_buffer {
  static constexpr bool on_host = std::same_as<S, host>;
  using storage = std::conditional_t<on_host, std::unique_ptr<T[]>, typename zero::place<S>::template buffer<T>>;

 public:
  counted_buffer() = default;
  // zeroed: the gradient buffers, which backward accumulates into; a gather target is overwritten
  // whole. On a device `at` (the owner's place: its device and stream) fills zeros either way, in
  // its stream's order.
  counted_buffer(byte_meter& m, std::size_t n, bool zeroed, const zero::place<S>& at) : size_(n), meter_(&m) {
    if constexpr (on_host) {
      (void)at;
      data_.reset(new T[n]);
      if (zeroed) std::memset(static_cast<void*>(data_.get()), 0, n * sizeof(T));
    } else {
      (void)zeroed;
      at.allocate(data_, n);
    }
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
    data_ = storage{};  // a device buffer's cudaFree waits for the work still using it
    size_ = 0;
    meter_ = nullptr;
  }
  [[nodiscard]] T* data() noexcept {
    if constexpr (on_host) {
      return data_.get();
    } else {
      return data_.data();
    }
  }
  [[nodiscard]] const T* data() const noexcept { return const_cast<counted_buffer*>(this)->data(); }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] bool held() const noexcept { return meter_ != nullptr; }

 private:
  storage data_{};
  std::size_t size_ = 0;
  byte_meter* meter_ = nullptr;
};

}  // namespace partrain::inline v0::detail::fsdp
