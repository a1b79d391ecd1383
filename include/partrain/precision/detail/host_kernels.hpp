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
// AVX2 through the compiler (it also checks that the OS saves the YMM registers); F16C from
// CPUID leaf 1 (ECX bit 29), since Clang's __builtin_cpu_supports does not know "f16c".
[[nodiscard]] inline bool wide_casts() noexcept {
  static const bool yes = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(1u), "c"(0u));
    return __builtin_cpu_supports("avx2") && (c >> 29 & 1u) != 0;
  }();
  return yes;
}
// GCC's vector types and F16C's two builtins rather than <immintrin.h>: parsing that header cost
// every translation unit of the facade about 0.8 s (CI builds hundreds). Operators on these types
// compile to AVX2 lanes inside the target("avx2") functions.
typedef float wide_f32x8 __attribute__((vector_size(32)));
typedef unsigned wide_u32x8 __attribute__((vector_size(32)));
typedef int wide_i32x8 __attribute__((vector_size(32)));
typedef long long wide_i64x4 __attribute__((vector_size(32)));
typedef short wide_i16x8 __attribute__((vector_size(16)));
typedef unsigned short wide_u16x8 __attribute__((vector_size(16)));

__attribute__((target("avx2,f16c"))) inline void cast_wide(const float* s, half* d, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    wide_f32x8 f;
    __builtin_memcpy(&f, s + i, sizeof f);
    // Immediate 8: round to nearest even, exceptions suppressed (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC).
    const wide_i16x8 h = __builtin_ia32_vcvtps2ph256(f, 8);
    __builtin_memcpy(static_cast<void*>(d + i), &h, sizeof h);
  }
  for (; i < n; ++i) d[i] = half(s[i]);
}
__attribute__((target("avx2,f16c"))) inline void cast_wide(const half* s, float* d, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    wide_u16x8 h;
    __builtin_memcpy(&h, static_cast<const void*>(s + i), sizeof h);
    // A signalling NaN (exponent all ones, mantissa nonzero, quiet bit clear) comes out of F16C
    // quieted; half_bits_to_float keeps it signalling, so the quiet bit is cleared again. The mask
    // also takes in the infinities (mantissa zero), whose floats have that bit clear anyway: one
    // compare instead of three, the difference between 0.45 and 0.6 of memcpy's speed.
    const wide_i16x8 signalling = (h & 0x7E00) == 0x7C00;
#if defined(__clang__)
    const wide_i32x8 widened = __builtin_convertvector(signalling, wide_i32x8);  // one vpmovsxwd
#else
    const wide_i32x8 widened = __builtin_ia32_pmovsxwd256(signalling);  // GCC 12 splits convertvector in two
#endif
    const wide_u32x8 clear = (wide_u32x8)widened & 0x00400000u;
    const wide_u32x8 bits = (wide_u32x8)__builtin_ia32_vcvtph2ps256((wide_i16x8)h) & ~clear;
    __builtin_memcpy(d + i, &bits, sizeof bits);
  }
  for (; i < n; ++i) d[i] = static_cast<float>(s[i]);
}
// float_to_bfloat16_bits on sixteen lanes at a time: round to nearest even on the top 16 bits; NaN
// quieted.
__attribute__((target("avx2"))) inline void cast_wide(const float* s, bfloat16* d, std::size_t n) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    wide_i32x8 lanes[2];
    for (int k = 0; k < 2; ++k) {
      wide_u32x8 x;
      __builtin_memcpy(&x, s + i + 8 * k, sizeof x);
      const wide_i32x8 rounded = (wide_i32x8)((x + (0x7FFFu + ((x >> 16) & 1u))) >> 16);
      const wide_i32x8 nan = (wide_i32x8)(x & 0x7FFFFFFFu) > 0x7F800000;  // non-negative: a signed compare
      const wide_i32x8 quieted = (wide_i32x8)((x >> 16) | 0x0040u);
      lanes[k] = (rounded & ~nan) | (quieted & nan);
    }
    // Sixteen 32-bit lanes (each < 2^16) to sixteen 16-bit ones, in order: packus interleaves the
    // 128-bit halves, the permute puts them back.
    const wide_i64x4 packed = __builtin_ia32_permdi256((wide_i64x4)__builtin_ia32_packusdw256(lanes[0], lanes[1]), 0xD8);
    __builtin_memcpy(static_cast<void*>(d + i), &packed, sizeof packed);
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
