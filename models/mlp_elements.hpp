// mlp_elements.hpp: the element work of the example MLP's CUDA step (bias + ReLU, softmax
// cross-entropy, bias gradients, ReLU masks, the 16-bit roundings) as functors for partrain's
// launch helper. mlp_cuda.cuh launches them on the GPU (partrain/cuda/launch.cuh); the CPU tier
// (tests/cpu_tier) runs the same functors through for_each_index(host_exec) against references
// of its own. Plain C++: g++ compiles it.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include <partrain/config.hpp>
#include <partrain/core/half.hpp>

namespace models::elements {

// expf/logf on the device, std:: on the host (a host function is not callable in device code).
PARTRAIN_HOST_DEVICE inline float exp_f(float x) {
#if defined(__CUDA_ARCH__)
  return ::expf(x);
#else
  return std::exp(x);
#endif
}
PARTRAIN_HOST_DEVICE inline float log_f(float x) {
#if defined(__CUDA_ARCH__)
  return ::logf(x);
#else
  return std::log(x);
#endif
}

// `bf16` picks the 16-bit type (bfloat16, else half); partrain's conversion (round to nearest
// even), so a value stored here is the value mlp_host stores.
PARTRAIN_HOST_DEVICE inline std::uint16_t to16(float v, bool bf16) {
  return bf16 ? partrain::bfloat16(v).bits : partrain::half(v).bits;
}
PARTRAIN_HOST_DEVICE inline float from16(std::uint16_t b, bool bf16) {
  return bf16 ? static_cast<float>(partrain::bfloat16::from_bits(b)) : static_cast<float>(partrain::half::from_bits(b));
}

// h[i] += b[i % cols], then ReLU when asked (i over rows * cols).
struct bias_activation_fn {
  float* h;
  const float* b;
  std::size_t cols;
  bool relu;
  PARTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const float v = h[i] + b[i % cols];
    h[i] = relu && v < 0.0f ? 0.0f : v;
  }
};

// Row i (one example): loss = logsumexp(z) - z[y]; delta = (softmax(z) - onehot(y)) * scale *
// loss_scale (in that order, as the host model); correct = argmax(z) == y. delta and correct may
// be null (evaluation, training).
struct softmax_cross_entropy_fn {
  const float* logits;
  const std::int32_t* labels;
  std::size_t classes;
  float scale;
  float loss_scale;
  float* delta;
  float* loss;
  std::int32_t* correct;
  PARTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    const float* z = logits + i * classes;
    const auto y = static_cast<std::size_t>(labels[i]);
    float m = z[0];
    std::size_t best = 0;
    for (std::size_t j = 1; j < classes; ++j) {
      if (z[j] > m) m = z[j], best = j;
    }
    float s = 0.0f;
    for (std::size_t j = 0; j < classes; ++j) s += exp_f(z[j] - m);
    loss[i] = log_f(s) - (z[y] - m);
    if (correct) correct[i] = best == y ? 1 : 0;
    if (delta) {
      float* d = delta + i * classes;
      for (std::size_t j = 0; j < classes; ++j) d[j] = exp_f(z[j] - m) / s * scale;
      d[y] -= scale;
      for (std::size_t j = 0; j < classes; ++j) d[j] *= loss_scale;
    }
  }
};

// gb[j] = sum over rows of delta[i, j], in row order (j over columns: a thread per column reads
// coalesced across threads); with add, gb[j] += that sum (a layer's backward accumulates).
struct column_sums_fn {
  const float* delta;
  std::size_t rows;
  std::size_t cols;
  float* gb;
  bool add = false;
  PARTRAIN_HOST_DEVICE void operator()(std::size_t j) const {
    float s = 0.0f;
    for (std::size_t i = 0; i < rows; ++i) s += delta[i * cols + j];
    gb[j] = add ? gb[j] + s : s;
  }
};

// y = max(x, 0), and its backward: gx = gy where x was positive, else 0 (a ReLU layer's).
struct relu_fn {
  const float* x;
  float* y;
  PARTRAIN_HOST_DEVICE void operator()(std::size_t i) const { y[i] = x[i] > 0.0f ? x[i] : 0.0f; }
};
struct relu_grad_fn {
  const float* x;
  const float* gy;
  float* gx;
  PARTRAIN_HOST_DEVICE void operator()(std::size_t i) const { gx[i] = x[i] > 0.0f ? gy[i] : 0.0f; }
};

// d[i] = 0 where the layer's ReLU output a[i] was 0 (its input was not positive).
struct relu_backward_fn {
  float* d;
  const float* a;
  // A select, not a conditional store: the host loop vectorizes, with no branch on the sign.
  PARTRAIN_HOST_DEVICE void operator()(std::size_t i) const { d[i] = a[i] <= 0.0f ? 0.0f : d[i]; }
};

// y = x rounded to 16 bits.
struct to_16_fn {
  const float* x;
  std::uint16_t* y;
  bool bf16;
  PARTRAIN_HOST_DEVICE void operator()(std::size_t i) const { y[i] = to16(x[i], bf16); }
};

// x = x rounded to 16 bits, kept as float (the parameters' gradients: an fp16 overflow becomes inf).
struct round_16_fn {
  float* x;
  bool bf16;
  PARTRAIN_HOST_DEVICE void operator()(std::size_t i) const { x[i] = from16(to16(x[i], bf16), bf16); }
};

// v = h[i] + b16[i % cols] in fp32, then ReLU when asked; stored as 16 bits in out16 (hidden
// layers), or as float in h when out16 is null (the logits).
struct bias_activation16_fn {
  float* h;
  const std::uint16_t* b16;
  std::size_t cols;
  bool relu;
  std::uint16_t* out16;
  bool bf16;
  PARTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    float v = h[i] + from16(b16[i % cols], bf16);
    if (relu && !(v > 0.0f)) v = 0.0f;  // as the host's ReLU (v > 0 ? v : 0)
    if (out16) {
      out16[i] = to16(v, bf16);
    } else {
      h[i] = v;
    }
  }
};

// gb[j] = sum over rows of delta16[i, j], in fp32 and row order (as the host), rounded to 16 bits.
struct column_sums16_fn {
  const std::uint16_t* delta16;
  std::size_t rows;
  std::size_t cols;
  float* gb;
  bool bf16;
  PARTRAIN_HOST_DEVICE void operator()(std::size_t j) const {
    float s = 0.0f;
    for (std::size_t i = 0; i < rows; ++i) s += from16(delta16[i * cols + j], bf16);
    gb[j] = from16(to16(s, bf16), bf16);
  }
};

// out16[i] = (a16[i] > 0 ? d[i] : 0) rounded to 16 bits: the gradient reaching the layer below,
// masked by its ReLU (a16 is that layer's stored 16-bit output).
struct relu_backward16_fn {
  const float* d;
  const std::uint16_t* a16;
  std::uint16_t* out16;
  bool bf16;
  PARTRAIN_HOST_DEVICE void operator()(std::size_t i) const {
    out16[i] = to16(from16(a16[i], bf16) <= 0.0f ? 0.0f : d[i], bf16);
  }
};

}  // namespace models::elements
