// partrain/precision/detail/elements.hpp: mixed precision's element loops as functors, written
// once for every path: casts between fp32 and the 16-bit types (core/half.hpp's conversion, round
// to nearest even) and the fused unscale + inf/NaN check. The host loops (host_kernels.hpp) run
// the per-tensor functors through for_each_index(host_exec); the CUDA launches (kernels.cuh) run
// the segmented ones, which cover up to segments_per_launch tensors in one launch; the
// CPU tier runs both kinds.
#pragma once

#include <cstddef>
#include <cstdint>

#include <partrain/config.hpp>
#include <partrain/core/for_each_index.hpp>
#include <partrain/core/half.hpp>

namespace partrain::inline v0::detail::amp {

// dst[i] = To(src[i]) through float (one side float, the other half or bfloat16).
template <class From, class To>
struct cast_fn {
  const From* src;
  To* dst;
  PARTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    dst[i] = static_cast<To>(static_cast<float>(src[i]));
  }
};

// Not inf and not NaN, from the bits: the same test on host and device, and branch-free (the
// host loop stays vectorized).
[[nodiscard]] PARTRAIN_HOST_DEVICE constexpr bool finite_bits(float v) noexcept {
  return (bits_as<std::uint32_t>(v) & 0x7F800000u) != 0x7F800000u;
}

// g[i] *= inv_scale; the map of the fused unscale + check, 1 when g[i] was inf or NaN (it stays
// non-finite after the multiplication). Combined with bit_or_fn: PyTorch's
// _amp_foreach_non_finite_check_and_unscale_.
struct unscale_check_fn {
  float* g;
  float inv_scale;
  PARTRAIN_HOST_DEVICE int operator()(std::size_t i) const {
    const float v = g[i];
    g[i] = v * inv_scale;
    return finite_bits(v) ? 0 : 1;
  }
};

// One tensor of a fused launch: its elements are [start, start + n) of the launch's index space.
struct segment {
  const void* src = nullptr;
  void* dst = nullptr;
  std::size_t n = 0;
  std::size_t start = 0;
};

inline constexpr unsigned segments_per_launch = 64;

// Copied into the kernel's parameters: 64 * 32 + 16 bytes, inside the 4 KiB every architecture
// accepts with room for the functor's other members.
struct segment_table {
  segment seg[segments_per_launch];
  std::size_t total = 0;  // elements over all segments
  unsigned count = 0;
};
static_assert(sizeof(segment_table) <= 3072, "kernel parameters are limited to 4 KiB");

// The segment holding launch index i < t.total: the last one starting at or before i (segments are
// non-empty and in index order). A binary search, so any thread finds it in 6 steps.
[[nodiscard]] PARTRAIN_HOST_DEVICE inline unsigned segment_of(const segment_table& t, std::size_t i) {
  unsigned lo = 0;
  unsigned hi = t.count;  // invariant: seg[lo].start <= i < seg[hi].start (seg[count] = total)
  while (hi - lo > 1) {
    const unsigned mid = (lo + hi) / 2;
    if (t.seg[mid].start <= i) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

template <class From, class To>
struct segmented_cast_fn {
  segment_table t;
  PARTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const segment& s = t.seg[segment_of(t, i)];
    cast_fn<From, To>{static_cast<const From*>(s.src), static_cast<To*>(s.dst)}(i - s.start);
  }
};

struct segmented_unscale_check_fn {
  segment_table t;
  float inv_scale;
  PARTRAIN_HOST_DEVICE int operator()(std::size_t i) const {
    const segment& s = t.seg[segment_of(t, i)];
    return unscale_check_fn{static_cast<float*>(s.dst), inv_scale}(i - s.start);
  }
};

// Fills tables with the non-empty segments seg(0) .. seg(count - 1) and calls launch(table) for
// each full table and for the last one.
template <class Seg, class Launch>
void for_each_table(std::size_t count, Seg&& seg, Launch&& launch) {
  segment_table t{};
  for (std::size_t k = 0; k < count; ++k) {
    segment s = seg(k);
    if (s.n == 0) continue;
    s.start = t.total;
    t.seg[t.count++] = s;
    t.total += s.n;
    if (t.count == segments_per_launch) {
      launch(t);
      t = segment_table{};
    }
  }
  if (t.count != 0) launch(t);
}

}  // namespace partrain::inline v0::detail::amp
