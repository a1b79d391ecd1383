// models/vit_elements.hpp: the element math of the Vision Transformer in vit_layers.hpp (LayerNorm,
// softmax, GELU, bias and residual adds, dropout masks), as free function templates on the element
// type T, one row or one element per call. vit_layers.hpp runs them in host loops, in float for the
// model and in double for its gradient check; a CUDA kernel can run the same functions one row per
// thread. Sums over a row accumulate in A (double by default; a kernel may pick float). Plain C++:
// g++ compiles it.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include <partrain/config.hpp>

namespace models::vit_elements {

// ---- host lanes: four floats as one value (GCC's and Clang's vector types) ----
// The element rules below are templates, so a host loop can run them on four elements at once:
// every lane does the IEEE operations the scalar rule does, in the same order, so the lanes and a
// scalar tail give the same bits. (GCC does not vectorise these loops itself: the selects and the
// exponential stop it.) Elsewhere (another compiler, device code) the loops stay scalar.
#if !defined(__CUDA_ARCH__) && (defined(__GNUC__) || defined(__clang__))
#define MODELS_VIT_HOST_LANES 1
using lanes4f = float __attribute__((vector_size(16)));
using lanes4i = std::int32_t __attribute__((vector_size(16)));
#else
#define MODELS_VIT_HOST_LANES 0
#endif

// A constant of a rule, as T (or, for lanes, as a float every lane takes).
template <class T>
struct element_of {
  using type = T;
};
#if MODELS_VIT_HOST_LANES
template <>
struct element_of<lanes4f> {
  using type = float;
};
#endif
template <class T>
PARTRAIN_HOST_DEVICE constexpr typename element_of<T>::type k(double c) {
  return static_cast<typename element_of<T>::type>(c);
}

// e^x in float on the host (and its lanes) as arithmetic alone: glibc's expf is a call per
// element, and the softmax and GELU loops spent most of their time in it (a seventh of a ViT
// step). Cody and Waite's reduction x = n ln 2 + r, |r| <= ln 2 / 2 (ln 2 in two parts, so n ln 2
// is exact), e^r by Cephes' expf polynomial (within 2 ulp), 2^n built in the exponent bits.
// Overflow gives inf, underflow 0 (no subnormals), NaN stays NaN.
template <class F>
inline F exp_host(F x) noexcept {
  constexpr float hi = 88.3762626647949f, lo = -87.3365447505531f;  // e^hi < FLT_MAX, e^lo = 2^-126
  F c = x > lo ? x : lo;  // NaN -> lo here: the integer conversion below must see a number
  c = c < hi ? c : hi;
  constexpr float round = 12582912.0f;  // 1.5 x 2^23: adding it rounds to an integer, ties to even
  const F n = (c * 1.44269504088896341f + round) - round;
  const F r = (c - n * 0.693359375f) + n * 2.12194440e-4f;
  F p = r * 1.9875691500e-4f + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const F er = p * r * r + r + 1.0f;
  F y;
  if constexpr (std::is_same_v<F, float>) {
    y = er * std::bit_cast<float>((static_cast<std::int32_t>(n) + 127) << 23);
  } else {
    y = er * std::bit_cast<F>((__builtin_convertvector(n, lanes4i) + 127) << 23);
  }
  y = x > hi ? std::numeric_limits<float>::infinity() : y;
  y = x < lo ? 0.0f : y;
  return x != x ? x : y;
}

// std:: on the host (exp_host for float and its lanes), CUDA's overloads on the device (a host
// function is not callable there).
template <class T>
PARTRAIN_HOST_DEVICE T exp_t(T x) {
#if defined(__CUDA_ARCH__)
  return ::exp(x);
#else
  if constexpr (std::is_same_v<typename element_of<T>::type, float>) {
    return exp_host(x);
  } else {
    return std::exp(x);
  }
#endif
}

// body(i, V{}) over n elements of T: V = lanes4f for i = 0, 4, 8, ... where the host has lanes
// and T is float, then V = T one at a time (everywhere else, all of them). body reads and
// writes with load<V> and store.
template <class T, class Body>
PARTRAIN_HOST_DEVICE void for_lanes(std::size_t n, Body body) {
  std::size_t i = 0;
#if MODELS_VIT_HOST_LANES
  if constexpr (std::is_same_v<T, float>) {
    for (; i + 4 <= n; i += 4) body(i, lanes4f{});
  }
#endif
  for (; i < n; ++i) body(i, T{});
}
template <class V, class T>
PARTRAIN_HOST_DEVICE V load(const T* p) {
  if constexpr (std::is_same_v<V, T>) {
    return *p;
  } else {
    V v;
    __builtin_memcpy(&v, p, sizeof v);
    return v;
  }
}
template <class T, class V>
PARTRAIN_HOST_DEVICE void store(T* p, const V& v) {
  if constexpr (std::is_same_v<V, T>) {
    *p = v;
  } else {
    __builtin_memcpy(p, &v, sizeof v);
  }
}
// y[i] = rule(x[i]) over n elements (y may be x), in lanes on the host.
template <class T, class Rule>
PARTRAIN_HOST_DEVICE void map_lanes(const T* x, T* y, std::size_t n, Rule rule) {
  for_lanes<T>(n, [&](std::size_t i, auto lanes) { store(y + i, rule(load<decltype(lanes)>(x + i))); });
}
template <class T>
PARTRAIN_HOST_DEVICE T sqrt_t(T x) {
#if defined(__CUDA_ARCH__)
  return ::sqrt(x);
#else
  return std::sqrt(x);
#endif
}

// ---- LayerNorm over one row of d values (PyTorch's: biased variance, eps inside the root) ----

// The row's mean and 1 / sqrt(variance + eps), stored in T: forward and the backward's
// recomputation both normalize with these stored values, so they agree bit for bit.
template <class T, class A = double>
PARTRAIN_HOST_DEVICE void layernorm_stats(const T* x, std::size_t d, T eps, T& mean, T& rstd) {
  A s = 0;
  for (std::size_t i = 0; i < d; ++i) s += static_cast<A>(x[i]);
  const A mu = s / static_cast<A>(d);
  A v = 0;  // two passes: one pass (E[x^2] - mu^2) cancels badly when |mu| >> std
  for (std::size_t i = 0; i < d; ++i) {
    const A c = static_cast<A>(x[i]) - mu;
    v += c * c;
  }
  mean = static_cast<T>(mu);
  rstd = static_cast<T>(A(1) / sqrt_t(v / static_cast<A>(d) + static_cast<A>(eps)));
}

// y = (x - mean) * rstd * gamma + beta.
template <class T>
PARTRAIN_HOST_DEVICE void layernorm_apply(const T* x, std::size_t d, T mean, T rstd, const T* gamma, const T* beta,
                                          T* y) {
  for (std::size_t i = 0; i < d; ++i) y[i] = (x[i] - mean) * rstd * gamma[i] + beta[i];
}

// The input gradient of one row, given dy: with xhat = (x - mean) * rstd and g = dy * gamma,
// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)). Written to dx, or added to it when `add`.
template <class T, class A = double>
PARTRAIN_HOST_DEVICE void layernorm_backward(const T* x, const T* dy, std::size_t d, T mean, T rstd, const T* gamma,
                                             T* dx, bool add) {
  A sg = 0, sgx = 0;
  for (std::size_t i = 0; i < d; ++i) {
    const A g = static_cast<A>(dy[i]) * static_cast<A>(gamma[i]);
    sg += g;
    sgx += g * static_cast<A>((x[i] - mean) * rstd);
  }
  const T mg = static_cast<T>(sg / static_cast<A>(d)), mgx = static_cast<T>(sgx / static_cast<A>(d));
  for (std::size_t i = 0; i < d; ++i) {
    const T v = rstd * (dy[i] * gamma[i] - mg - (x[i] - mean) * rstd * mgx);
    dx[i] = add ? dx[i] + v : v;
  }
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

// s = softmax(scale * s), in place (the maximum subtracted first, so exp never overflows).
template <class T, class A = double>
PARTRAIN_HOST_DEVICE void softmax_row(T* s, std::size_t n, T scale) {
  T mx = s[0];
  for (std::size_t i = 1; i < n; ++i) mx = s[i] > mx ? s[i] : mx;
  map_lanes(s, s, n, [mx, scale](auto v) { return exp_t((v - mx) * scale); });
  A sum = 0;
  for (std::size_t i = 0; i < n; ++i) sum += static_cast<A>(s[i]);
  const T inv = static_cast<T>(A(1) / sum);
  for (std::size_t i = 0; i < n; ++i) s[i] *= inv;
}

// The gradient of the softmax's input from that of its output p, in place:
// g = p * (g - sum(p * g)) (the scale the forward applied is left to the caller).
template <class T, class A = double>
PARTRAIN_HOST_DEVICE void softmax_backward_row(const T* p, T* g, std::size_t n) {
  A dot = 0;
  for (std::size_t i = 0; i < n; ++i) dot += static_cast<A>(p[i]) * static_cast<A>(g[i]);
  const T t = static_cast<T>(dot);
  for (std::size_t i = 0; i < n; ++i) g[i] = p[i] * (g[i] - t);
}

// ---- GELU, the tanh approximation (PyTorch's GELU(approximate="tanh"), GPT-2's and BERT's) ----
// gelu(x) = x/2 (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3). The tanh form,
// not the erf one: the value and the slope come from one exponential, so the backward's
// recomputation costs one exp per element, not erf and exp; the two forms differ by < 5e-4.
// Evaluated as x sigmoid(2u): one exp (glibc's tanhf took half of a block's time), and no
// cancellation in 1 + tanh(u) where x is negative.

// The rules take T or host lanes of it (constants through k<T>, which are T(c) for a scalar).
template <class T>
PARTRAIN_HOST_DEVICE T gelu_inner(T x) {
  return k<T>(0.7978845608028654) * (x + k<T>(0.044715) * x * x * x);
}
// sigmoid(2u), which is (1 + tanh(u)) / 2: 0 (not NaN) where exp overflows.
template <class T>
PARTRAIN_HOST_DEVICE T gelu_gate(T x) {
  return k<T>(1) / (k<T>(1) + exp_t(k<T>(-2) * gelu_inner(x)));
}
template <class T>
PARTRAIN_HOST_DEVICE T gelu(T x) {
  return x * gelu_gate(x);
}
// gelu(x) and its slope together (the backward needs both: the value for fc2's weight gradient,
// the slope for fc1's output gradient). With s = sigmoid(2u):
// d gelu / dx = s + 2 x s (1 - s) sqrt(2/pi) (1 + 3 * 0.044715 x^2).
template <class T>
PARTRAIN_HOST_DEVICE T gelu_slope(T x, T s) {
  return s + k<T>(2) * x * s * (k<T>(1) - s) * k<T>(0.7978845608028654) * (k<T>(1) + k<T>(3 * 0.044715) * x * x);
}
template <class T>
PARTRAIN_HOST_DEVICE void gelu_and_grad(T x, T& value, T& grad) {
  const T s = gelu_gate(x);
  value = x * s;
  grad = gelu_slope(x, s);
}
// Over n elements, in lanes on the host: y = gelu(x); or value, grad = gelu_and_grad(x).
template <class T>
PARTRAIN_HOST_DEVICE void gelu_n(const T* x, T* y, std::size_t n) {
  map_lanes(x, y, n, [](auto v) { return gelu(v); });
}
template <class T>
PARTRAIN_HOST_DEVICE void gelu_and_grad_n(const T* x, T* value, T* grad, std::size_t n) {
  for_lanes<T>(n, [&](std::size_t i, auto lanes) {
    using V = decltype(lanes);
    const V v = load<V>(x + i), s = gelu_gate(v);
    store(value + i, v * s);
    store(grad + i, gelu_slope(v, s));
  });
}

// ---- bias and residual adds ----

// y[j] += b[j] over one row of n.
template <class T>
PARTRAIN_HOST_DEVICE void add_bias_row(T* y, const T* b, std::size_t n) {
  for (std::size_t j = 0; j < n; ++j) y[j] += b[j];
}
// sums[j] += g[j] over one row of n: a bias's gradient is the sum over rows (kept in A).
template <class T, class A = double>
PARTRAIN_HOST_DEVICE void add_row_to_sums(const T* g, std::size_t n, A* sums) {
  for (std::size_t j = 0; j < n; ++j) sums[j] += static_cast<A>(g[j]);
}
// out[i] = x[i] + branch[i] (a residual connection; out may be branch).
template <class T>
PARTRAIN_HOST_DEVICE void residual_add(const T* x, const T* branch, T* out, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = x[i] + branch[i];
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
