// models/vit_elements.hpp: the element math of the Vision Transformer in vit_layers.hpp (LayerNorm,
// softmax, GELU, bias and residual adds, dropout masks), as free function templates on the element
// type T, one row or one element per call. vit_layers.hpp runs them in host loops, in float for the
// model and in double for its gradient check; a CUDA kernel can run the same functions one row per
// thread. Sums over a row accumulate in A (double by default; a kernel may pick float). Plain C++:
// g++ compiles it.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include <partrain/config.hpp>

namespace models::vit_elements {

// std:: on the host, CUDA's overloads on the device (a host function is not callable there).
template <class T>
PARTRAIN_HOST_DEVICE T exp_t(T x) {
#if defined(__CUDA_ARCH__)
  return ::exp(x);
#else
  return std::exp(x);
#endif
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
  A sum = 0;
  for (std::size_t i = 0; i < n; ++i) {
    s[i] = exp_t((s[i] - mx) * scale);
    sum += static_cast<A>(s[i]);
  }
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

template <class T>
PARTRAIN_HOST_DEVICE T gelu_inner(T x) {
  return T(0.7978845608028654) * (x + T(0.044715) * x * x * x);
}
// sigmoid(2u), which is (1 + tanh(u)) / 2: 0 (not NaN) where exp overflows.
template <class T>
PARTRAIN_HOST_DEVICE T gelu_gate(T x) {
  return T(1) / (T(1) + exp_t(T(-2) * gelu_inner(x)));
}
template <class T>
PARTRAIN_HOST_DEVICE T gelu(T x) {
  return x * gelu_gate(x);
}
// gelu(x) and its slope together (the backward needs both: the value for fc2's weight gradient,
// the slope for fc1's output gradient). With s = sigmoid(2u):
// d gelu / dx = s + 2 x s (1 - s) sqrt(2/pi) (1 + 3 * 0.044715 x^2).
template <class T>
PARTRAIN_HOST_DEVICE void gelu_and_grad(T x, T& value, T& grad) {
  const T s = gelu_gate(x);
  value = x * s;
  grad = s + T(2) * x * s * (T(1) - s) * T(0.7978845608028654) * (T(1) + T(3 * 0.044715) * x * x);
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

}  // namespace models::vit_elements
