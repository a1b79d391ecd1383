// partrain/precision/low_precision_copy.hpp: the 16-bit copy of a model's fp32 master weights
// that its forward and backward compute with. One contiguous buffer holds every parameter's copy;
// refresh() re-casts all masters into it (after each optimizer step) in one pass, rounding to
// nearest even. The precision is chosen at run time (fp16 or bf16), as a command-line flag would.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <partrain/core/buffer.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/half.hpp>
#include <partrain/core/memory_space.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/model/concepts.hpp>
#include <partrain/optim/optimizer.hpp>
#include <partrain/precision/cast.hpp>
#include <partrain/precision/precision.hpp>

#if PARTRAIN_HAS_CUDA
#include <partrain/cuda/device_buffer.hpp>
#include <partrain/cuda/device_guard.hpp>
#endif

namespace partrain::inline v0 {

template <class S = host>
class low_precision_copy {
#if !PARTRAIN_HAS_CUDA
  static_assert(std::same_as<S, host>, "partrain: a low_precision_copy in CUDA memory needs the CUDA runtime (link partrain::cuda)");
#endif

 public:
  low_precision_copy() = default;
  // A copy of each master (their order kept), made at once.
  low_precision_copy(precision p, std::vector<tensor_view<float, S>> masters) : kind_(p), masters_(std::move(masters)) {
    if (p == precision::fp32) {
      throw invalid_argument_error("low_precision_copy: precision fp32 has no 16-bit copy (expected fp16 or bf16)");
    }
    std::size_t total = 0;
    for (const auto& m : masters_) {
      offsets_.push_back(total);
      total += m.size();
    }
    storage_ = make_storage(total);
    refresh();
  }

  [[nodiscard]] precision kind() const noexcept { return kind_; }
  [[nodiscard]] std::size_t size() const noexcept { return masters_.size(); }
  [[nodiscard]] std::size_t bytes() const noexcept { return storage_.size() * sizeof(std::uint16_t); }

  // Casts every master into its copy.
  void refresh() {
    if (masters_.empty()) return;
    visit_precision(kind_, [this](auto tag) {
      using T16 = decltype(tag);
      if constexpr (!std::same_as<T16, float>) {
        std::vector<tensor_view<const float, S>> src(masters_.begin(), masters_.end());
        std::vector<tensor_view<T16, S>> dst;
        dst.reserve(masters_.size());
        for (std::size_t i = 0; i < masters_.size(); ++i) dst.push_back(view_of<T16>(i));
        static_assert(std::same_as<S, host> || detail::amp::is_nvcc_compiled,
                      "partrain: refreshing a CUDA low_precision_copy needs the translation unit compiled by nvcc");
        detail::amp::cast_views<float, T16>(std::span<const tensor_view<const float, S>>(src),
                                       std::span<const tensor_view<T16, S>>(dst));
      }
      return 0;
    });
  }

  // Parameter i's copy as T (half for fp16, bfloat16 for bf16; anything else is refused).
  template <low_precision_element T>
  [[nodiscard]] tensor_view<const T, S> get(std::size_t i) const {
    if ((std::same_as<T, half> && kind_ != precision::fp16) || (std::same_as<T, bfloat16> && kind_ != precision::bf16)) {
      throw invalid_argument_error(std::string("low_precision_copy::get: the copy holds ") + std::string(to_string(kind_)) +
                                   ", asked for " + (std::same_as<T, half> ? "half" : "bfloat16"));
    }
    return const_cast<low_precision_copy*>(this)->template view_of<T>(i);
  }
  // Parameter i's copy as raw 16-bit words (for libraries that take a data-type tag, as cuBLAS).
  [[nodiscard]] const void* data(std::size_t i) const {
    check_index(i);
    return storage_.data() + offsets_[i];
  }

 private:
#if PARTRAIN_HAS_CUDA
  using storage_t = std::conditional_t<std::same_as<S, host>, host_buffer<std::uint16_t>, device_buffer<std::uint16_t>>;
#else
  using storage_t = host_buffer<std::uint16_t>;
#endif

  // CUDA storage on the masters' device (their memory says which: cudaPointerGetAttributes),
  // not on whatever device is current, nor device 0. Every master must be on that one device.
  [[nodiscard]] storage_t make_storage(std::size_t n) const {
#if PARTRAIN_HAS_CUDA
    if constexpr (std::same_as<S, cuda>) {
      int dev = -1;
      for (std::size_t i = 0; i < masters_.size(); ++i) {
        if (masters_[i].empty()) continue;
        const int d = cuda_device_of(masters_[i].data(), "low_precision_copy").index;
        if (dev >= 0 && d != dev) {
          throw invalid_argument_error("low_precision_copy: master " + std::to_string(i) + " is on cuda:" +
                                       std::to_string(d) + ", the earlier ones on cuda:" + std::to_string(dev) +
                                       " (expected every master on one device)");
        }
        dev = d;
      }
      if (dev < 0) return storage_t();  // no elements: nothing to allocate
      return storage_t(n, dev);
    } else {
      return storage_t(n);
    }
#else
    return storage_t(n);
#endif
  }

  void check_index(std::size_t i) const {
    if (i >= masters_.size()) {
      throw invalid_argument_error("low_precision_copy: parameter " + std::to_string(i) + " out of range (the copy has " +
                                   std::to_string(masters_.size()) + ")");
    }
  }
  template <class T>
  [[nodiscard]] tensor_view<T, S> view_of(std::size_t i) {
    check_index(i);
    static_assert(sizeof(T) == sizeof(std::uint16_t));
    return tensor_view<T, S>(reinterpret_cast<T*>(storage_.data() + offsets_[i]), masters_[i].shape());
  }

  precision kind_ = precision::fp16;
  std::vector<tensor_view<float, S>> masters_;
  std::vector<std::size_t> offsets_;
  storage_t storage_;
};

// The copy of a model's parameter values (fp32 masters), in parameters() order.
template <model M>
[[nodiscard]] auto make_low_precision_copy(precision p, M& m) {
  using S = model_space_t<M>;
  static_assert(std::same_as<model_element_t<M>, float>, "partrain: mixed precision keeps fp32 master weights");
  std::vector<tensor_view<float, S>> masters;
  for (auto&& prm : m.parameters()) masters.push_back(prm.value());
  return low_precision_copy<S>(p, std::move(masters));
}

}  // namespace partrain::inline v0
