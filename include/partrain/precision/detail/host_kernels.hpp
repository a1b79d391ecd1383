// partrain/precision/detail/host_kernels.hpp: the element loops of mixed precision for views in
// host memory: casts between fp32 and the 16-bit types (round to nearest even), and the fused
// unscale + inf/NaN check over all gradients, each the functor of precision/detail/elements.hpp
// run per tensor through for_each_index(host_exec). partrain/precision/detail/kernels.cuh has the
// same functions for views in CUDA memory (the same functors, one launch over all the tensors).
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <type_traits>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__CUDA_ARCH__) && !defined(PARTRAIN_NO_WIDE_CASTS)
#include <immintrin.h>
#endif

#include <partrain/core/error.hpp>
#include <partrain/core/for_each_index.hpp>
#include <partrain/core/half.hpp>
#include <partrain/core/memory_space.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/precision/detail/elements.hpp>

namespace partrain::inline v0::detail::amp {

#if defined(__CUDACC__)
inline constexpr bool is_nvcc_compiled = true;
#else
inline constexpr bool is_nvcc_compiled = false;
#endif

// One destination per source, each the source's size (shared by the host and CUDA casts).
template <class Src, class Dst>
void check_cast_pairs(std::span<const Src> src, std::span<const Dst> dst) {
  if (src.size() != dst.size()) {
    throw invalid_argument_error("cast: " + std::to_string(src.size()) + " source views but " +
                                 std::to_string(dst.size()) + " destinations (expected one destination per source)");
  }
  for (std::size_t k = 0; k < src.size(); ++k) {
    if (src[k].size() != dst[k].size()) {
      throw invalid_argument_error("cast: view #" + std::to_string(k) + " has " + std::to_string(src[k].size()) +
                                   " source elements but " + std::to_string(dst[k].size()) +
                                   " destination elements (expected the same size)");
    }
  }
}

// The 16-bit casts are the element loops that x86-64's baseline ISA (SSE2) leaves furthest from
// memory speed (0.10-0.24 of memcpy in bench_elementwise). On a CPU with AVX2 and F16C (x86-64
// since 2013) they run eight lanes at a time: fp32 <-> fp16 through F16C's instructions, whose
// rounding (IEEE, to nearest even, explicit in the instruction) and NaN quieting give the bits of
// float_to_half_bits (fp16 -> fp32 keeps a signalling NaN signalling, as half_bits_to_float, and
// so the device, does); fp32 -> bfloat16 through AVX2 integer lanes doing float_to_bfloat16_bits'
// steps; the others through the same functor compiled for AVX2.
// tests/precision/test_cast.cpp checks a stride of all floats and every 16-bit pattern. Picked
// once at run time; other CPUs and other compilers take the portable loop (so does a build with
// PARTRAIN_NO_WIDE_CASTS defined: bench_elementwise's baseline). nvcc's host pass compiles the
// same wide code, so every translation unit has one definition of cast_views.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__CUDA_ARCH__) && !defined(PARTRAIN_NO_WIDE_CASTS)
#define PARTRAIN_X86_WIDE_CASTS 1
[[nodiscard]] inline bool wide_casts() noexcept {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  return yes;
}
__attribute__((target("avx2,f16c"))) inline void cast_wide(const float* s, half* d, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), h);
  }
  for (; i < n; ++i) d[i] = half(s[i]);
}
__attribute__((target("avx2,f16c"))) inline void cast_wide(const half* s, float* d, std::size_t n) {
  const __m128i exponent = _mm_set1_epi16(0x7C00), mantissa = _mm_set1_epi16(0x03FF), quiet = _mm_set1_epi16(0x0200);
  const __m128i zero = _mm_setzero_si128(), ones = _mm_set1_epi16(-1);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    // A signalling NaN (exponent all ones, mantissa nonzero, quiet bit clear) comes out of F16C
    // quieted; half_bits_to_float keeps it signalling, so the quiet bit is cleared again.
    const __m128i all_ones_exponent = _mm_cmpeq_epi16(_mm_and_si128(h, exponent), exponent);
    const __m128i payload = _mm_xor_si128(_mm_cmpeq_epi16(_mm_and_si128(h, mantissa), zero), ones);
    const __m128i signalling = _mm_and_si128(_mm_and_si128(all_ones_exponent, payload),
                                             _mm_cmpeq_epi16(_mm_and_si128(h, quiet), zero));
    const __m256i clear = _mm256_and_si256(_mm256_cvtepi16_epi32(signalling), _mm256_set1_epi32(0x00400000));
    const __m256 f = _mm256_cvtph_ps(h);
    _mm256_storeu_ps(d + i, _mm256_castsi256_ps(_mm256_andnot_si256(clear, _mm256_castps_si256(f))));
  }
  for (; i < n; ++i) d[i] = static_cast<float>(s[i]);
}
// float_to_bfloat16_bits on eight lanes: round to nearest even on the top 16 bits; NaN quieted.
__attribute__((target("avx2"))) inline __m256i bfloat16_lanes(__m256i x) {
  const __m256i rounding = _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1)));
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(x, rounding), 16);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7FFFFFFF)), _mm256_set1_epi32(0x7F800000));
  const __m256i quieted = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x0040));
  return _mm256_blendv_epi8(rounded, quieted, nan);
}
__attribute__((target("avx2"))) inline void cast_wide(const float* s, bfloat16* d, std::size_t n) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i lo = bfloat16_lanes(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i)));
    const __m256i hi = bfloat16_lanes(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 8)));
    // Sixteen 32-bit lanes (each < 2^16) to sixteen 16-bit ones, in order: packus interleaves the
    // 128-bit halves, the permute puts them back.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), packed);
  }
  for (; i < n; ++i) d[i] = bfloat16(s[i]);
}
template <class From, class To>
__attribute__((target("avx2"))) inline void cast_wide(const From* s, To* d, std::size_t n) {
  for_each_index(host_exec{}, n, cast_fn<From, To>{s, d});
}
#endif

// dst[k][j] = To(src[k][j]) for every pair of views.
template <class From, class To>
void cast_views(std::span<const tensor_view<const From>> src, std::span<const tensor_view<To>> dst) {
  check_cast_pairs(src, dst);
#if PARTRAIN_X86_WIDE_CASTS
  constexpr bool sixteen = std::is_same_v<From, half> || std::is_same_v<To, half> || std::is_same_v<From, bfloat16> ||
                           std::is_same_v<To, bfloat16>;
  if constexpr (sixteen) {
    if (wide_casts()) {
      for (std::size_t k = 0; k < src.size(); ++k) cast_wide(src[k].data(), dst[k].data(), src[k].size());
      return;
    }
  }
#endif
  for (std::size_t k = 0; k < src.size(); ++k) {
    for_each_index(host_exec{}, src[k].size(), cast_fn<From, To>{src[k].data(), dst[k].data()});
  }
}

// g *= inv_scale over every gradient, in one pass; true when any element is inf or NaN
// (PyTorch's _amp_foreach_non_finite_check_and_unscale_). Non-finite values stay non-finite.
[[nodiscard]] inline bool unscale_and_check(std::span<const tensor_view<float>> grads, float inv_scale,
                                            void* /*stream: the CUDA twin's*/ = nullptr) {
  int found = 0;
  for (const auto& g : grads) {
    found |= transform_reduce_index(host_exec{}, g.size(), 0, unscale_check_fn{g.data(), inv_scale}, bit_or_fn{});
  }
  return found != 0;
}

}  // namespace partrain::inline v0::detail::amp
