// partrain/precision/detail/kernels.cuh: the element loops of mixed precision for views in CUDA
// memory: casts between fp32 and the 16-bit types, and the fused unscale + inf/NaN check over all
// gradients. These are the overloads of precision/detail/host_kernels.hpp's functions for
// tensor_view<T, cuda>; each call is one kernel launch over all its tensors (a table of segments
// passed by value; more than precision_segments_per_launch tensors take one launch per table),
// on the legacy default stream, and has finished on return (as the optimizers' kernels). nvcc only.
#pragma once

#if !defined(__CUDACC__)
#error "partrain/precision/detail/kernels.cuh must be compiled by nvcc"
#endif

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>

#include <partrain/core/error.hpp>
#include <partrain/core/half.hpp>
#include <partrain/core/memory_space.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/cuda/check.hpp>
#include <partrain/precision/detail/host_kernels.hpp>

namespace partrain::inline v0::detail {

// One tensor of a fused launch: its elements are [start, start + n) of the launch's index space.
struct precision_segment {
  const void* src = nullptr;
  void* dst = nullptr;
  std::size_t n = 0;
  std::size_t start = 0;
};

inline constexpr unsigned precision_segments_per_launch = 64;

// Passed by value to the kernel: 64 * 32 + 16 bytes, well inside the 4 KiB of kernel parameters
// every architecture accepts.
struct precision_segment_table {
  precision_segment seg[precision_segments_per_launch];
  std::size_t total = 0;  // elements over all segments
  unsigned count = 0;
};
static_assert(sizeof(precision_segment_table) <= 4096, "kernel parameters are limited to 4 KiB");

inline constexpr unsigned precision_block = 256;
inline constexpr std::size_t precision_max_blocks = 2048;

[[nodiscard]] inline unsigned precision_blocks(std::size_t n) {
  const std::size_t b = (n + precision_block - 1) / precision_block;
  return static_cast<unsigned>(b == 0 ? 1 : (b < precision_max_blocks ? b : precision_max_blocks));
}

// The conversions, bit for bit those of core/half.hpp: the hardware's round-to-nearest-even
// conversions for every number; NaN by hand, because the hardware returns one canonical NaN
// while the host keeps the sign and the top payload bits (and quiets the NaN).
__device__ inline std::uint16_t device_float_to_half_bits(float f) {
  const std::uint32_t x = __float_as_uint(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) {
    return static_cast<std::uint16_t>(((x >> 16) & 0x8000u) | 0x7C00u | 0x0200u | ((x >> 13) & 0x3FFu));
  }
  return __half_as_ushort(__float2half_rn(f));
}
__device__ inline std::uint16_t device_float_to_bfloat16_bits(float f) {
  const std::uint32_t x = __float_as_uint(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((x >> 16) | 0x0040u);
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}
__device__ inline float device_half_bits_to_float(std::uint16_t h) {
  if ((h & 0x7C00u) == 0x7C00u && (h & 0x03FFu) != 0) {  // NaN: keep sign and payload, as the host
    return __uint_as_float((static_cast<std::uint32_t>(h & 0x8000u) << 16) | 0x7F800000u |
                           (static_cast<std::uint32_t>(h & 0x03FFu) << 13));
  }
  return __half2float(__ushort_as_half(h));
}
__device__ inline float device_bfloat16_bits_to_float(std::uint16_t b) {
  return __uint_as_float(static_cast<std::uint32_t>(b) << 16);  // exact, NaN included
}

// Element j of one segment, From -> To (one side float, the other half or bfloat16; the 16-bit
// side is read and written as its bits, which partrain::half/bfloat16 share with __half/__nv_bfloat16).
template <class From, class To>
__device__ void precision_cast_element(const void* src, void* dst, std::size_t j) {
  if constexpr (std::is_same_v<To, half>) {
    static_cast<std::uint16_t*>(dst)[j] = device_float_to_half_bits(static_cast<const float*>(src)[j]);
  } else if constexpr (std::is_same_v<To, bfloat16>) {
    static_cast<std::uint16_t*>(dst)[j] = device_float_to_bfloat16_bits(static_cast<const float*>(src)[j]);
  } else if constexpr (std::is_same_v<From, half>) {
    static_cast<float*>(dst)[j] = device_half_bits_to_float(static_cast<const std::uint16_t*>(src)[j]);
  } else {
    static_cast<float*>(dst)[j] = device_bfloat16_bits_to_float(static_cast<const std::uint16_t*>(src)[j]);
  }
}

// A grid-stride loop over the launch's index space. A thread's indices only grow, so the segment
// it is in is found by walking forward from the previous one (segments are never empty).
template <class From, class To>
__global__ void precision_cast_kernel(precision_segment_table t) {
  unsigned k = 0;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < t.total;
       i += static_cast<std::size_t>(blockDim.x) * gridDim.x) {
    while (i >= t.seg[k].start + t.seg[k].n) ++k;
    precision_cast_element<From, To>(t.seg[k].src, t.seg[k].dst, i - t.seg[k].start);
  }
}

// g *= inv_scale; *found = 1 when any element was inf or NaN (it stays non-finite after the
// multiplication, as on the host). A template only so that the header defines it in every
// translation unit without breaking the one-definition rule.
template <class T>
__global__ void precision_unscale_kernel(precision_segment_table t, T inv_scale, int* found) {
  bool bad = false;
  unsigned k = 0;
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < t.total;
       i += static_cast<std::size_t>(blockDim.x) * gridDim.x) {
    while (i >= t.seg[k].start + t.seg[k].n) ++k;
    T* g = static_cast<T*>(t.seg[k].dst) + (i - t.seg[k].start);
    const T v = *g;
    bad |= !isfinite(v);
    *g = v * inv_scale;
  }
  // Every thread of the block reaches this barrier (the loop has no early exit).
  if (__syncthreads_or(bad ? 1 : 0) && threadIdx.x == 0) atomicExch(found, 1);
}

// Fills tables with the non-empty segments seg(0) .. seg(count - 1) and calls launch(table) for
// each full table and for the last one.
template <class Seg, class Launch>
void for_each_precision_table(std::size_t count, Seg&& seg, Launch&& launch) {
  precision_segment_table t{};
  for (std::size_t k = 0; k < count; ++k) {
    precision_segment s = seg(k);
    if (s.n == 0) continue;
    s.start = t.total;
    t.seg[t.count++] = s;
    t.total += s.n;
    if (t.count == precision_segments_per_launch) {
      launch(t);
      t = precision_segment_table{};
    }
  }
  if (t.count != 0) launch(t);
}

// dst[k][j] = To(src[k][j]) for every pair of views in CUDA memory (on the current device),
// rounding to nearest even; bit for bit the host cast. Queued on `stream` (pass the one that made
// src: a non-blocking stream is not ordered with the legacy default) and finished on return.
template <class From, class To>
void cast_views(std::span<const tensor_view<const From, cuda>> src, std::span<const tensor_view<To, cuda>> dst,
                cudaStream_t stream = cudaStreamLegacy) {
  static_assert((std::is_same_v<From, float> && (std::is_same_v<To, half> || std::is_same_v<To, bfloat16>)) ||
                    ((std::is_same_v<From, half> || std::is_same_v<From, bfloat16>) && std::is_same_v<To, float>),
                "partrain: the CUDA cast converts float to half/bfloat16 or half/bfloat16 to float");
  check_cast_pairs(src, dst);
  bool launched = false;
  for_each_precision_table(
      src.size(),
      [&](std::size_t k) {
        return precision_segment{src[k].data(), dst[k].data(), src[k].size(), 0};
      },
      [&](const precision_segment_table& t) {
        precision_cast_kernel<From, To><<<precision_blocks(t.total), precision_block, 0, stream>>>(t);
        cuda_check(cudaGetLastError(), "cast_views: precision_cast_kernel launch", __FILE__, __LINE__);
        launched = true;
      });
  if (launched) cuda_check(cudaStreamSynchronize(stream), "cast_views: cudaStreamSynchronize", __FILE__, __LINE__);
}

// A device int from the stream-ordered pool (no device-wide synchronisation, unlike cudaFree),
// allocated, zeroed and freed in the order of `stream`.
class precision_device_flag {
 public:
  explicit precision_device_flag(cudaStream_t stream) : stream_(stream) {
    cuda_check(cudaMallocAsync(reinterpret_cast<void**>(&p_), sizeof(int), stream_),
               "unscale_and_check: cudaMallocAsync (overflow flag)", __FILE__, __LINE__);
    const cudaError_t rc = cudaMemsetAsync(p_, 0, sizeof(int), stream_);
    if (rc != cudaSuccess) {
      release();
      cuda_check(rc, "unscale_and_check: cudaMemsetAsync (overflow flag)", __FILE__, __LINE__);
    }
  }
  precision_device_flag(const precision_device_flag&) = delete;
  precision_device_flag& operator=(const precision_device_flag&) = delete;
  ~precision_device_flag() { release(); }
  [[nodiscard]] int* get() const noexcept { return p_; }

 private:
  void release() noexcept {
    if (p_) (void)cudaFreeAsync(p_, stream_);
    p_ = nullptr;
  }
  cudaStream_t stream_;
  int* p_ = nullptr;
};

// g *= inv_scale over every gradient in CUDA memory, in one pass; true when any element is inf or
// NaN (PyTorch's _amp_foreach_non_finite_check_and_unscale_). One copy of the flag to the host.
// Queued on `stream` (the one that made the gradients) and finished on return.
[[nodiscard]] inline bool unscale_and_check(std::span<const tensor_view<float, cuda>> grads, float inv_scale,
                                            cudaStream_t stream = cudaStreamLegacy) {
  std::size_t total = 0;
  for (const auto& g : grads) total += g.size();
  if (total == 0) return false;
  precision_device_flag flag(stream);
  for_each_precision_table(
      grads.size(), [&](std::size_t k) { return precision_segment{grads[k].data(), grads[k].data(), grads[k].size(), 0}; },
      [&](const precision_segment_table& t) {
        precision_unscale_kernel<float><<<precision_blocks(t.total), precision_block, 0, stream>>>(t, inv_scale,
                                                                                                   flag.get());
        cuda_check(cudaGetLastError(), "unscale_and_check: precision_unscale_kernel launch", __FILE__, __LINE__);
      });
  int found = 0;
  cuda_check(cudaMemcpyAsync(&found, flag.get(), sizeof(int), cudaMemcpyDeviceToHost, stream),
             "unscale_and_check: cudaMemcpyAsync (overflow flag to host)", __FILE__, __LINE__);
  cuda_check(cudaStreamSynchronize(stream), "unscale_and_check: cudaStreamSynchronize", __FILE__, __LINE__);
  return found != 0;
}

}  // namespace partrain::inline v0::detail
