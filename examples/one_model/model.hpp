// examples/one_model/model.hpp: a user's layers and loss, written once against partrain's layer
// concepts (partrain/model/layer.hpp): each layer maps a [batch, ...] tensor to another, its
// backward ADDS to its parameters' gradients and WRITES the gradient of its input; it keeps no
// state between forward and backward (whoever runs it keeps the activations).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include <partrain/partrain.hpp>

namespace one_model {

using partrain::eval_result;
using partrain::shape;
using partrain::tensor_view;

struct param {
  std::vector<float> v, g;
  tensor_view<float> bound_v, bound_g;  // FSDP owns the storage once it binds it
  explicit param(std::size_t n) : v(n), g(n), bound_v(v), bound_g(g) {}
  param(const param& o) : v(o.bound_v.begin(), o.bound_v.end()), g(o.v.size()), bound_v(v), bound_g(g) {}
  tensor_view<float> value() { return bound_v; }
  tensor_view<float> grad() { return bound_g; }
  void bind(tensor_view<float> value, tensor_view<float> grad) { bound_v = value, bound_g = grad; }
};

// y = x W^T + b, then tanh when `act`. Backward ADDS to the parameters' gradients, WRITES gx.
struct dense {
  std::size_t in, out;
  bool act;
  std::vector<param> params;  // W [out, in], b [out]
  dense(std::size_t i, std::size_t o, bool a, unsigned seed) : in(i), out(o), act(a), params{param(o * i), param(o)} {
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> u(-1 / std::sqrt(float(in)), 1 / std::sqrt(float(in)));
    for (float& w : params[0].value()) w = u(gen);
  }
  std::vector<param>& parameters() { return params; }
  shape output_shape(const shape& s) const { return {s[0], out}; }
  void forward(tensor_view<const float> x, tensor_view<float> y) {
    auto w = params[0].value(), b = params[1].value();
    for (std::size_t r = 0; r < x.extent(0); ++r) {
      for (std::size_t o = 0; o < out; ++o) {
        float z = b[o];
        for (std::size_t i = 0; i < in; ++i) z += w[o * in + i] * x[r * in + i];
        y[r * out + o] = act ? std::tanh(z) : z;
      }
    }
  }
  void backward(tensor_view<const float> x, tensor_view<const float> y, tensor_view<const float> gy, tensor_view<float> gx) {
    auto w = params[0].value(), gw = params[0].grad(), gb = params[1].grad();
    std::ranges::fill(gx, 0.0f);
    for (std::size_t r = 0; r < x.extent(0); ++r) {
      for (std::size_t o = 0; o < out; ++o) {
        const float yo = y[r * out + o], g = act ? gy[r * out + o] * (1 - yo * yo) : gy[r * out + o];
        gb[o] += g;
        for (std::size_t i = 0; i < in; ++i) {
          gw[o * in + i] += g * x[r * in + i];
          gx[r * in + i] += g * w[o * in + i];
        }
      }
    }
  }
};

// Softmax cross-entropy: the SUM of the rows' losses; grad = scale * d sum / d logits.
struct cross_entropy {
  double forward_backward(tensor_view<const float> z, tensor_view<const std::int32_t> y, tensor_view<float> grad, float scale) {
    return run(z, y, &grad, scale).loss_sum;
  }
  eval_result evaluate(tensor_view<const float> z, tensor_view<const std::int32_t> y) { return run(z, y, nullptr, 0); }
  static eval_result run(tensor_view<const float> z, tensor_view<const std::int32_t> y, tensor_view<float>* grad, float scale) {
    const std::size_t n = z.extent(0), k = z.size() / n;
    eval_result r{0, 0, n};
    for (std::size_t row = 0; row < n; ++row) {
      const float* zr = z.data() + row * k;
      std::size_t best = 0;
      double sum = 0;
      for (std::size_t c = 0; c < k; ++c) best = zr[c] > zr[best] ? c : best;
      for (std::size_t c = 0; c < k; ++c) sum += std::exp(zr[c] - zr[best]);
      r.loss_sum += std::log(sum) - (zr[y[row]] - zr[best]);
      r.correct += best == static_cast<std::size_t>(y[row]) ? 1 : 0;
      for (std::size_t c = 0; grad && c < k; ++c) {
        (*grad)[row * k + c] = scale * static_cast<float>(std::exp(zr[c] - zr[best]) / sum - (c == std::size_t(y[row])));
      }
    }
    return r;
  }
};

}  // namespace one_model
