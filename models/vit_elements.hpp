// models/vit_elements.hpp: the element math of the Vision Transformer in vit_layers.hpp (LayerNorm,
// softmax, GELU, bias and residual adds, dropout masks), as free function templates on the element
// type T, one row or one element per call; a CUDA kernel can run the same functions one row or
// element per thread. vit_layers.hpp runs them in float for the model and in double for its
// gradient check, through the host loops of vit_lane_rules.inc: in lanes of 4, 8 or 16 floats
// (the widest the CPU has) and several rows at a time, with the bits of the one-row functions.
// Sums over a row accumulate in A (double by default; a kernel may pick float). Plain C++: g++
// compiles it.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include <partrain/config.hpp>

namespace models::vit_elements {

// ---- host lanes: 4, 8 or 16 floats as one value (GCC's and Clang's vector types) ----
// The element rules of vit_lane_rules.inc are templates, so a host loop can run them on several
// elements at once: every lane does the IEEE operations the scalar rule does, in the same order,
// so the lanes and a scalar tail give the same bits. (GCC does not vectorise these loops itself:
// the selects and the exponential stop it.) The build targets baseline x86-64 (SSE2: 4 lanes);
// with GCC on x86-64 the same rules are compiled again for AVX2 (8 lanes) and AVX-512 (16), and
// the loops take the widest the CPU has, picked once at run time. Elsewhere (another compiler,
// device code) the loops stay scalar.
#if !defined(__CUDA_ARCH__) && (defined(__GNUC__) || defined(__clang__))
#define MODELS_VIT_HOST_LANES 1
using lanes4f = float __attribute__((vector_size(16)));
using lanes4i = std::int32_t __attribute__((vector_size(16)));
#else
#define MODELS_VIT_HOST_LANES 0
#endif
// Clang is left out: it has no optimize("fp-contract=off"), and with AVX-512's FMA it would fuse
// a * b + c, which rounds once where the scalar rule rounds twice.
#if MODELS_VIT_HOST_LANES && defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MODELS_VIT_WIDE_LANES 1
using lanes8f = float __attribute__((vector_size(32)));
using lanes8i = std::int32_t __attribute__((vector_size(32)));
using lanes16f = float __attribute__((vector_size(64)));
using lanes16i = std::int32_t __attribute__((vector_size(64)));
#else
#define MODELS_VIT_WIDE_LANES 0
#endif

// A constant of a rule, as T (or, for lanes, as a float every lane takes); for lanes, also their
// int32 counterpart.
template <class T>
struct element_of {
  using type = T;
};
#if MODELS_VIT_HOST_LANES
template <>
struct element_of<lanes4f> {
  using type = float;
  using int_lanes = lanes4i;
};
#endif
#if MODELS_VIT_WIDE_LANES
template <>
struct element_of<lanes8f> {
  using type = float;
  using int_lanes = lanes8i;
};
template <>
struct element_of<lanes16f> {
  using type = float;
  using int_lanes = lanes16i;
};
#endif
template <class T>
PARTRAIN_HOST_DEVICE constexpr typename element_of<T>::type k(double c) {
  return static_cast<typename element_of<T>::type>(c);
}

// The host's row loops take this many rows at a time (vit_lane_rules.inc's host_loops).
inline constexpr std::size_t row_group = 8;

// The rules and their loops in 4 lanes (and scalar, and on the device) ...
#define MODELS_VIT_LANE_FN PARTRAIN_HOST_DEVICE
#if MODELS_VIT_HOST_LANES
using lanes = lanes4f;
#endif
#include "vit_lane_rules.inc"
#undef MODELS_VIT_LANE_FN

// ... and in 8 and 16. fp-contract=off: GCC's default would fuse a * b + c into one FMA where the
// target has it (AVX-512 does), changing the bits.
#if MODELS_VIT_WIDE_LANES
namespace wide8 {
using lanes = lanes8f;
#define MODELS_VIT_LANE_FN __attribute__((target("avx2"), optimize("fp-contract=off")))
#include "vit_lane_rules.inc"
#undef MODELS_VIT_LANE_FN
}  // namespace wide8
namespace wide16 {
using lanes = lanes16f;
#define MODELS_VIT_LANE_FN __attribute__((target("avx512f,avx512vl,avx512dq,avx512bw"), optimize("fp-contract=off")))
#include "vit_lane_rules.inc"
#undef MODELS_VIT_LANE_FN
}  // namespace wide16
#endif

// The widest lanes this CPU runs: 16 (AVX-512 F, VL, DQ and BW: x86-64-v4), 8 (AVX2) or 4; read once.
[[nodiscard]] inline int host_lane_width() noexcept {
#if MODELS_VIT_WIDE_LANES
  static const int width = [] {
    __builtin_cpu_init();  // before any constructor that may call this has run it
    const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw");
    return avx512 ? 16 : __builtin_cpu_supports("avx2") ? 8 : 4;
  }();
  return width;
#else
  return 4;
#endif
}

#if MODELS_VIT_HOST_LANES
// f(loops), loops the host_loops of the widest lanes this CPU runs.
template <class F>
void with_host_loops(F&& f) {
#if MODELS_VIT_WIDE_LANES
  if (host_lane_width() == 16) return f(wide16::host_loops{});
  if (host_lane_width() == 8) return f(wide8::host_loops{});
#endif
  f(host_loops{});
}
// The host loops run for float values with double sums; other types take the one-row functions.
template <class T, class A = double>
inline constexpr bool has_host_loops = std::is_same_v<T, float> && std::is_same_v<A, double>;
#else
template <class T, class A = double>
inline constexpr bool has_host_loops = false;
#endif

// ---- LayerNorm over one row of d values (PyTorch's: biased variance, eps inside the root) ----

// The row's mean and 1 / sqrt(variance + eps), stored in T: forward and the backward's
// recomputation both normalize with these stored values, so they agree bit for bit.
template <class T, class A = double>
PARTRAIN_HOST_DEVICE void layernorm_stats(const T* x, std::size_t d, T eps, T& mean, T& rstd) {
  layernorm_stats_group<1, T, A>(x, d, eps, &mean, &rstd);
}

// The input gradient of one row, given dy: with xhat = (x - mean) * rstd and g = dy * gamma,
// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)). Written to dx, or added to it when `add`.
template <class T, class A = double>
PARTRAIN_HOST_DEVICE void layernorm_backward(const T* x, const T* dy, std::size_t d, T mean, T rstd, const T* gamma,
                                             T* dx, bool add) {
  layernorm_backward_group<1, T, A>(x, dy, d, &mean, &rstd, gamma, dx, add);
}

// One row's share of the parameter gradients: dgamma += dy * xhat, dbeta += dy (sums over rows in A).
template <class T, class A = double>
PARTRAIN_HOST_DEVICE void layernorm_param_grads(const T* x, const T* dy, std::size_t d, T mean, T rstd, A* dgamma,
                                                A* dbeta) {
  for (std::size_t i = 0; i < d; ++i) {
    dgamma[i] += static_cast<A>(dy[i]) * static_cast<A>((x[i] - mean) * rstd);
    dbeta[i] += static_cast<A>(dy[i]);
  }
}

// ---- softmax over one row of n values ----

// s = softmax(scale * s), in place (the maximum subtracted first, so exp never overflows), one
// element at a time (the host loops take the lanes).
template <class T, class A = double>
PARTRAIN_HOST_DEVICE void softmax_row(T* s, std::size_t n, T scale) {
  softmax_group<1, false, T, A>(s, n, scale);
}

// The gradient of the softmax's input from that of its output p, in place:
// g = p * (g - sum(p * g)) (the scale the forward applied is left to the caller).
template <class T, class A = double>
PARTRAIN_HOST_DEVICE void softmax_backward_row(const T* p, T* g, std::size_t n) {
  softmax_backward_group<1, T, A>(p, g, n);
}

// ---- GELU over arrays (the rules are in vit_lane_rules.inc) ----

// Over n elements, in the widest lanes on the host: y = gelu(x); or value, grad = gelu_and_grad(x).
template <class T>
PARTRAIN_HOST_DEVICE void gelu_n(const T* x, T* y, std::size_t n) {
#if MODELS_VIT_HOST_LANES
  if constexpr (has_host_loops<T>) return with_host_loops([&](auto loops) { loops.gelu_n(x, y, n); });
#endif
  for (std::size_t i = 0; i < n; ++i) y[i] = gelu(x[i]);
}
template <class T>
PARTRAIN_HOST_DEVICE void gelu_and_grad_n(const T* x, T* value, T* grad, std::size_t n) {
#if MODELS_VIT_HOST_LANES
  if constexpr (has_host_loops<T>) return with_host_loops([&](auto loops) { loops.gelu_and_grad_n(x, value, grad, n); });
#endif
  for (std::size_t i = 0; i < n; ++i) gelu_and_grad(x[i], value[i], grad[i]);
}

// ---- the row functions over many rows on the host ----
// The same bits as calling the one-row function for each row (host_loops says how they are
// faster); other types than float do exactly that.

// layernorm_stats of each row of x [rows, d] into mean[r], rstd[r].
template <class T, class A = double>
void layernorm_stats_rows(const T* x, std::size_t rows, std::size_t d, T eps, T* mean, T* rstd) {
#if MODELS_VIT_HOST_LANES
  if constexpr (has_host_loops<T, A>) {
    return with_host_loops([&](auto loops) { loops.layernorm_stats_rows(x, rows, d, eps, mean, rstd); });
  }
#endif
  for (std::size_t r = 0; r < rows; ++r) layernorm_stats<T, A>(x + r * d, d, eps, mean[r], rstd[r]);
}
// layernorm_apply of each row of x [rows, d] into y.
template <class T>
void layernorm_apply_rows(const T* x, std::size_t rows, std::size_t d, const T* mean, const T* rstd, const T* gamma,
                          const T* beta, T* y) {
#if MODELS_VIT_HOST_LANES
  if constexpr (has_host_loops<T>) {
    return with_host_loops([&](auto loops) { loops.layernorm_apply_rows(x, rows, d, mean, rstd, gamma, beta, y); });
  }
#endif
  for (std::size_t r = 0; r < rows; ++r) layernorm_apply(x + r * d, d, mean[r], rstd[r], gamma, beta, y + r * d);
}
// layernorm_backward of each row of x and dy [rows, d] into dx (added when `add`).
template <class T, class A = double>
void layernorm_backward_rows(const T* x, const T* dy, std::size_t rows, std::size_t d, const T* mean, const T* rstd,
                             const T* gamma, T* dx, bool add) {
#if MODELS_VIT_HOST_LANES
  if constexpr (has_host_loops<T, A>) {
    return with_host_loops([&](auto loops) { loops.layernorm_backward_rows(x, dy, rows, d, mean, rstd, gamma, dx, add); });
  }
#endif
  for (std::size_t r = 0; r < rows; ++r) {
    layernorm_backward<T, A>(x + r * d, dy + r * d, d, mean[r], rstd[r], gamma, dx + r * d, add);
  }
}
// softmax_row of each row of s [rows, n].
template <class T, class A = double>
void softmax_rows(T* s, std::size_t rows, std::size_t n, T scale) {
#if MODELS_VIT_HOST_LANES
  if constexpr (has_host_loops<T, A>) return with_host_loops([&](auto loops) { loops.softmax_rows(s, rows, n, scale); });
#endif
  for (std::size_t r = 0; r < rows; ++r) softmax_row<T, A>(s + r * n, n, scale);
}
// softmax_backward_row of each row of p and g [rows, n].
template <class T, class A = double>
void softmax_backward_rows(const T* p, T* g, std::size_t rows, std::size_t n) {
#if MODELS_VIT_HOST_LANES
  if constexpr (has_host_loops<T, A>) return with_host_loops([&](auto loops) { loops.softmax_backward_rows(p, g, rows, n); });
#endif
  for (std::size_t r = 0; r < rows; ++r) softmax_backward_row<T, A>(p + r * n, g + r * n, n);
}

// ---- bias and residual adds ----

// (add_bias_row and add_row_to_sums, one row each, are in vit_lane_rules.inc.)
// out[i] = x[i] + branch[i] (a residual connection; out may be branch).
template <class T>
PARTRAIN_HOST_DEVICE void residual_add(const T* x, const T* branch, T* out, std::size_t n) {
#if MODELS_VIT_HOST_LANES
  if constexpr (has_host_loops<T>) return with_host_loops([&](auto loops) { loops.residual_add(x, branch, out, n); });
#endif
  for (std::size_t i = 0; i < n; ++i) out[i] = x[i] + branch[i];
}
// The same over many rows, on the host: add_bias_row for each row of y [rows, n]; add_row_to_sums
// for each row of g [rows, n]; and y[i] *= s[i] over n.
template <class T>
void add_bias_rows(T* y, std::size_t rows, std::size_t n, const T* b) {
#if MODELS_VIT_HOST_LANES
  if constexpr (has_host_loops<T>) return with_host_loops([&](auto loops) { loops.add_bias_rows(y, rows, n, b); });
#endif
  for (std::size_t r = 0; r < rows; ++r) add_bias_row(y + r * n, b, n);
}
template <class T, class A = double>
void column_sums(const T* g, std::size_t rows, std::size_t n, A* sums) {
#if MODELS_VIT_HOST_LANES
  if constexpr (has_host_loops<T, A>) return with_host_loops([&](auto loops) { loops.column_sums(g, rows, n, sums); });
#endif
  for (std::size_t r = 0; r < rows; ++r) add_row_to_sums(g + r * n, n, sums);
}
template <class T>
void multiply_n(T* y, const T* s, std::size_t n) {
#if MODELS_VIT_HOST_LANES
  if constexpr (has_host_loops<T>) return with_host_loops([&](auto loops) { loops.multiply(y, s, n); });
#endif
  for (std::size_t i = 0; i < n; ++i) y[i] *= s[i];
}

// ---- dropout: a keep bit that is a pure function of (stream, element index) ----
// No generator state: a recomputed forward, a backward, or a GPU thread for element i all draw
// the same bit. splitmix64's i-th output from state `stream` (a counter-based generator).

PARTRAIN_HOST_DEVICE inline std::uint64_t mix64(std::uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
// The stream of one dropout site (k) within a call's seed: distinct sites draw unrelated bits.
PARTRAIN_HOST_DEVICE inline std::uint64_t dropout_stream(std::uint64_t seed, std::uint64_t k) {
  return mix64(seed ^ mix64(k + 0x632BE59BD9B4E019ull));
}
// Elements whose 32 random bits fall below this are dropped: p * 2^32, rounded down (p < 1).
PARTRAIN_HOST_DEVICE inline std::uint32_t dropout_threshold(float p) {
  return p <= 0.0f ? 0u : static_cast<std::uint32_t>(static_cast<double>(p) * 4294967296.0);
}
PARTRAIN_HOST_DEVICE inline bool dropout_keep(std::uint64_t stream, std::uint64_t i, std::uint32_t threshold) {
  return static_cast<std::uint32_t>(mix64(stream + (i + 1) * 0x9E3779B97F4A7C15ull) >> 32) >= threshold;
}
// y[i] = x[i] * scale where kept, else 0, for elements first .. first + n of the site (y may be x).
template <class T>
PARTRAIN_HOST_DEVICE void dropout_row(const T* x, T* y, std::size_t n, std::uint64_t stream, std::uint64_t first,
                                      std::uint32_t threshold, T scale) {
  for (std::size_t i = 0; i < n; ++i) y[i] = dropout_keep(stream, first + i, threshold) ? x[i] * scale : T(0);
}

// ---- the same math as functors for a launch helper (f(i) for i < n; vit_layers_device.hpp) ----
// One row or one element per index, so a CUDA kernel runs a thread per row or element and the
// host twin loops over them; the sums stay in double (A) as in the host layers, so the two
// paths differ only by the GEMMs' rounding.

// Row r of x [rows, d]: its LayerNorm statistics (kept) and output.
struct layernorm_forward_fn {
  const float* x;
  const float* gamma;
  const float* beta;
  std::size_t d;
  float eps;
  float* mean;
  float* rstd;
  float* y;
  PARTRAIN_HOST_DEVICE void operator()(std::size_t r) const {
    layernorm_stats(x + r * d, d, eps, mean[r], rstd[r]);
    layernorm_apply(x + r * d, d, mean[r], rstd[r], gamma, beta, y + r * d);
  }
};
// Row r again from kept statistics (a backward's recomputation).
struct layernorm_apply_fn {
  const float* x;
  const float* gamma;
  const float* beta;
  std::size_t d;
  const float* mean;
  const float* rstd;
  float* y;
  PARTRAIN_HOST_DEVICE void operator()(std::size_t r) const {
    layernorm_apply(x + r * d, d, mean[r], rstd[r], gamma, beta, y + r * d);
  }
};
// Row r's input gradient: dx = base + LN'(dy) (base null: dx = LN'(dy); base may be dx).
struct layernorm_backward_fn {
  const float* x;
  const float* dy;
  const float* gamma;
  std::size_t d;
  const float* mean;
  const float* rstd;
  const float* base;
  float* dx;
  PARTRAIN_HOST_DEVICE void operator()(std::size_t r) const {
    if (base && base != dx) {
      for (std::size_t i = 0; i < d; ++i) dx[r * d + i] = base[r * d + i];
    }
    layernorm_backward(x + r * d, dy + r * d, d, mean[r], rstd[r], gamma, dx + r * d, base != nullptr);
  }
};
// Column j of the LayerNorm's parameter gradients over all rows: dgamma[j] += sum dy * xhat,
// dbeta[j] += sum dy (summed in double, added once).
struct layernorm_param_grads_fn {
  const float* x;
  const float* dy;
  std::size_t rows;
  std::size_t d;
  const float* mean;
  const float* rstd;
  float* dgamma;
  float* dbeta;
  PARTRAIN_HOST_DEVICE void operator()(std::size_t j) const {
    double sg = 0, sb = 0;
    for (std::size_t r = 0; r < rows; ++r) {
      const float g = dy[r * d + j];
      sg += static_cast<double>(g) * static_cast<double>((x[r * d + j] - mean[r]) * rstd[r]);
      sb += static_cast<double>(g);
    }
    dgamma[j] += static_cast<float>(sg);
    dbeta[j] += static_cast<float>(sb);
  }
};
// sums[j] += the sum over rows of g[r * stride + j] (j < cols), in double: a bias's gradient
// (stride = cols), or a position embedding's (one column per token and feature, a row per image).
struct column_sums_fn {
  const float* g;
  std::size_t rows;
  std::size_t stride;
  float* sums;
  PARTRAIN_HOST_DEVICE void operator()(std::size_t j) const {
    double s = 0;
    for (std::size_t r = 0; r < rows; ++r) s += static_cast<double>(g[r * stride + j]);
    sums[j] += static_cast<float>(s);
  }
};
// Row r of s [rows, n]: softmax(scale * row), in place.
struct softmax_fn {
  float* s;
  std::size_t n;
  float scale;
  PARTRAIN_HOST_DEVICE void operator()(std::size_t r) const { softmax_row(s + r * n, n, scale); }
};
// Row r: g = p * (g - sum(p * g)), in place.
struct softmax_backward_fn {
  const float* p;
  float* g;
  std::size_t n;
  PARTRAIN_HOST_DEVICE void operator()(std::size_t r) const { softmax_backward_row(p + r * n, g + r * n, n); }
};
// y[i] = x[i] + b[i % cols] (+ pos[(i / cols) % tokens * cols + i % cols] when pos is given).
struct bias_fn {
  float* y;
  const float* b;
  std::size_t cols;
  const float* pos = nullptr;
  std::size_t tokens = 1;
  PARTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const std::size_t j = i % cols;
    float v = y[i] + b[j];
    if (pos) v += pos[(i / cols) % tokens * cols + j];
    y[i] = v;
  }
};
struct gelu_fn {
  const float* x;
  float* y;
  PARTRAIN_HOST_DEVICE void operator()(std::size_t i) const { y[i] = gelu(x[i]); }
};
struct gelu_and_grad_fn {
  const float* x;
  float* value;
  float* grad;
  PARTRAIN_HOST_DEVICE void operator()(std::size_t i) const { gelu_and_grad(x[i], value[i], grad[i]); }
};
// y[i] *= s[i].
struct multiply_fn {
  float* y;
  const float* s;
  PARTRAIN_HOST_DEVICE void operator()(std::size_t i) const { y[i] *= s[i]; }
};
// out[i] = x[i] + branch[i].
struct residual_fn {
  const float* x;
  const float* branch;
  float* out;
  PARTRAIN_HOST_DEVICE void operator()(std::size_t i) const { out[i] = x[i] + branch[i]; }
};
// Element i of a dropout site: y[i] = x[i] * scale where kept, else 0 (y may be x).
struct dropout_fn {
  const float* x;
  float* y;
  std::uint64_t stream;
  std::uint32_t threshold;
  float scale;
  PARTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    y[i] = dropout_keep(stream, i, threshold) ? x[i] * scale : 0.0f;
  }
};
// Element i of attention probabilities [n, heads, t, t] held by a tensor-parallel shard (heads
// head0 .. head0 + heads of every image's total): dropout_fn with the element's place in the
// whole block's probabilities [n, total, t, t], so a shard drops what the whole block drops.
struct head_dropout_fn {
  const float* x;
  float* y;
  std::uint64_t stream;
  std::uint32_t threshold;
  float scale;
  std::size_t tt;  // t * t
  std::size_t heads;
  std::size_t total;
  std::size_t head0;
  PARTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const std::size_t per_image = heads * tt, e = i / per_image, h = i % per_image / tt;
    const std::size_t whole = (e * total + head0 + h) * tt + i % tt;
    y[i] = dropout_keep(stream, whole, threshold) ? x[i] * scale : 0.0f;
  }
};
// Element i of the gathered patches [images * tokens, patch^2] from the images [images, side^2]
// (to_patches), or back (each pixel belongs to exactly one patch).
struct patches_fn {
  float* image;
  float* patches;
  std::size_t side;
  std::size_t patch;
  bool to_patches;
  PARTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const std::size_t pp = patch * patch, grid = side / patch, tokens = grid * grid;
    const std::size_t row = i / pp, within = i % pp, e = row / tokens, tok = row % tokens;
    const std::size_t pixel = e * side * side + (tok / grid * patch + within / patch) * side + tok % grid * patch +
                              within % patch;
    if (to_patches) {
      patches[i] = image[pixel];
    } else {
      image[pixel] = patches[i];
    }
  }
};
// Element (e, j) of the mean over tokens of x [images, tokens, d].
struct token_mean_fn {
  const float* x;
  std::size_t tokens;
  std::size_t d;
  float* mean;
  PARTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const std::size_t e = i / d, j = i % d;
    double s = 0;
    for (std::size_t k = 0; k < tokens; ++k) s += static_cast<double>(x[(e * tokens + k) * d + j]);
    mean[i] = static_cast<float>(s / static_cast<double>(tokens));
  }
};
// Element i of the gradient of x [images, tokens, d] through that mean.
struct token_mean_backward_fn {
  const float* dmean;
  std::size_t tokens;
  std::size_t d;
  float* dx;
  PARTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    dx[i] = dmean[i / (tokens * d) * d + i % d] / static_cast<float>(tokens);
  }
};

}  // namespace models::vit_elements
