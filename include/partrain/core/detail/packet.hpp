// partrain/core/detail/packet.hpp: four floats as one value, for the few host element loops GCC
// cannot vectorize on its own. std::sqrt may set errno (the default -fmath-errno), so a loop that
// calls it keeps a branch and a call per element and stays scalar: AdamW ran at 0.13 of memcpy.
// The element rule is the same template instantiated on the packet: every lane does the same
// IEEE operations in the same order, so the results are bit-identical to the scalar loop's.
// x86 only (SSE, part of every x86-64); elsewhere PARTRAIN_HOST_PACKETS is 0 and the scalar loop
// runs. Never in device code.
#pragma once

#include <cstddef>

#if !defined(__CUDA_ARCH__) && (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__SSE__))
#include <xmmintrin.h>
#define PARTRAIN_HOST_PACKETS 1
#else
#define PARTRAIN_HOST_PACKETS 0
#endif

#if PARTRAIN_HOST_PACKETS
namespace partrain::inline v0::detail {

// GCC and Clang give __m128 the arithmetic operators (with a float broadcast on either side).
using packet4f = __m128;
inline constexpr std::size_t packet4f_lanes = 4;

[[nodiscard]] inline packet4f load_packet(const float* p) noexcept { return _mm_loadu_ps(p); }
inline void store_packet(float* p, packet4f v) noexcept { _mm_storeu_ps(p, v); }
// IEEE square root per lane, without errno: what the scalar rule's std::sqrt computes.
[[nodiscard]] inline packet4f opt_sqrt(packet4f x) noexcept { return _mm_sqrt_ps(x); }

}  // namespace partrain::inline v0::detail
#endif
