// tests/support/vit_device_step.hpp: one forward and backward of a ViT given as layers (the host
// layers of models/vit_layers.hpp, or the device layers of models/vit_layers_device.hpp on any
// backend), each layer with its saved activations and call seed as the runners pass them; returns
// the logits, the summed loss, every parameter's gradient and the input's, copied to the host.
// The CPU tier runs it on the device layers' host twin, the GPU test on CUDA, each against the
// host ViT. Memory: a backend of models/mlp_device.hpp (make, upload, download, synchronize).
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <partrain/model/layer.hpp>

#include "pipeline_layers.hpp"
#include "vit_layers.hpp"

namespace partrain::test {

struct vit_step {
  std::vector<float> logits;
  double loss_sum = 0;
  std::vector<std::vector<float>> grads;  // per parameter, layer by layer
  std::vector<float> input_grad;
};

// The slice of a whole block's parameter i (a gradient here) that rank r of p holds.
inline std::vector<float> tp_slice(const std::vector<float>& whole, std::size_t i, std::size_t r, std::size_t p,
                                   std::size_t d, std::size_t f) {
  const std::size_t w = d / p, fl = f / p;
  std::vector<float> out;
  auto rows = [&](std::size_t row0, std::size_t n, std::size_t cols) {
    out.insert(out.end(), whole.begin() + static_cast<std::ptrdiff_t>(row0 * cols),
               whole.begin() + static_cast<std::ptrdiff_t>((row0 + n) * cols));
  };
  auto cols = [&](std::size_t nrows, std::size_t ncols, std::size_t col0, std::size_t n) {
    for (std::size_t k = 0; k < nrows; ++k) {
      const auto at = whole.begin() + static_cast<std::ptrdiff_t>(k * ncols + col0);
      out.insert(out.end(), at, at + static_cast<std::ptrdiff_t>(n));
    }
  };
  switch (i) {
    case models::layers::basic_transformer_block<float>::qkv_w:
    case models::layers::basic_transformer_block<float>::qkv_b:
      for (std::size_t part = 0; part < 3; ++part) rows(part * d + r * w, w, i == models::layers::basic_transformer_block<float>::qkv_w ? d : 1);
      return out;
    case models::layers::basic_transformer_block<float>::proj_w: cols(d, d, r * w, w); return out;
    case models::layers::basic_transformer_block<float>::fc1_w: rows(r * fl, fl, d); return out;
    case models::layers::basic_transformer_block<float>::fc1_b: rows(r * fl, fl, 1); return out;
    case models::layers::basic_transformer_block<float>::fc2_w: cols(d, f, r * fl, fl); return out;
    default: return whole;  // replicated
  }
}


// The tiny ViT the checks share: 2 blocks of width 16, 2 heads, on 28x28 images.
inline models::layers::vit_config tiny_vit(float dropout) {
  return {.patch = 7, .dim = 16, .depth = 2, .heads = 2, .mlp_ratio = 2, .dropout = dropout};
}

template <class Backend, class Model, class Loss>
vit_step run_vit_step(const Backend& be, Model& m, Loss& loss, const synthetic_batch& b, std::uint64_t seed) {
  using space = typename Backend::space;
  using array = typename Backend::template array<float>;
  const std::size_t layers = m.size(), n = b.y.size();
  const auto copy_in = [&](const auto* src, std::size_t count, auto& dst) {
    be.upload(dst.data(), src, count * sizeof(*src));
  };
  std::vector<shape> shapes{b.input().shape()};
  std::vector<array> acts, saved;
  acts.push_back(be.template make<float>(b.x.size()));
  copy_in(b.x.data(), b.x.size(), acts[0]);
  auto labels = be.template make<std::int32_t>(n);
  copy_in(b.y.data(), n, labels);
  for (auto& l : m) {
    l->train(true);
    for (auto& p : l->parameters()) {
      const std::vector<float> zeros(p.grad().size(), 0.0f);
      be.upload(p.grad().data(), zeros.data(), p.grad().size_bytes());
    }
  }
  const auto call = [&](std::size_t i) {
    return layer_call<space>{tensor_view<float, space>(saved[i].data(), shape{saved[i].size()}),
                             detail::layers::call_seed(seed, 0, 0, i)};
  };
  for (std::size_t i = 0; i < layers; ++i) {
    shapes.push_back(m[i]->output_shape(shapes[i]));
    acts.push_back(be.template make<float>(shapes[i + 1].numel()));
    saved.push_back(be.template make<float>(m[i]->saved_size(shapes[i])));
    m[i]->forward(tensor_view<const float, space>(acts[i].data(), shapes[i]),
                  tensor_view<float, space>(acts[i + 1].data(), shapes[i + 1]), call(i));
  }
  vit_step out;
  array gout = be.template make<float>(shapes[layers].numel());
  out.loss_sum = loss.forward_backward(tensor_view<const float, space>(acts[layers].data(), shapes[layers]),
                                       tensor_view<const std::int32_t, space>(labels.data(), n),
                                       tensor_view<float, space>(gout.data(), shapes[layers]),
                                       1.0f / static_cast<float>(n));
  for (std::size_t i = layers; i-- > 0;) {
    array gin = be.template make<float>(shapes[i].numel());
    m[i]->backward(tensor_view<const float, space>(acts[i].data(), shapes[i]),
                   tensor_view<const float, space>(acts[i + 1].data(), shapes[i + 1]), call(i),
                   tensor_view<const float, space>(gout.data(), shapes[i + 1]), tensor_view<float, space>(gin.data(), shapes[i]));
    gout = std::move(gin);
  }
  const auto copy_out = [&](const float* src, std::size_t count) {
    std::vector<float> v(count);
    be.download(v.data(), src, count * sizeof(float));
    return v;
  };
  out.logits = copy_out(acts[layers].data(), shapes[layers].numel());
  out.input_grad = copy_out(gout.data(), shapes[0].numel());
  for (auto& l : m) {
    for (auto& p : l->parameters()) out.grads.push_back(copy_out(p.grad().data(), p.grad().size()));
  }
  be.synchronize();
  return out;
}

// The largest difference between a and b relative to b's largest magnitude.
inline double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double diff = 0, ref = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    REQUIRE(std::isfinite(a[i]));
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    ref = std::max(ref, std::abs(static_cast<double>(b[i])));
  }
  return ref > 0 ? diff / ref : diff;
}

// a (the device layers' step) against b (the host layers'): the same up to the GEMMs' float
// rounding, every tensor within `tol` of its largest magnitude; a wrong index or a missing term
// is off by far more.
inline void check_same_step(const vit_step& a, const vit_step& b, double tol) {
  CHECK(a.loss_sum == Approx(b.loss_sum).epsilon(tol));
  CHECK(relative_difference(a.logits, b.logits) <= tol);
  CHECK(relative_difference(a.input_grad, b.input_grad) <= tol);
  REQUIRE(a.grads.size() == b.grads.size());
  for (std::size_t i = 0; i < a.grads.size(); ++i) {
    INFO("parameter " << i);
    CHECK(relative_difference(a.grads[i], b.grads[i]) <= tol);
  }
}

// Rank r of p's step of a tensor-parallel ViT (config c) against the whole model's: loss, logits
// and input gradient within tol of the largest value, every parameter's gradient within grad_tol
// of its slice of the whole gradient (the blocks' split ones) or of the whole (the rest).
inline void check_tp_step(const vit_step& got, const vit_step& ref, std::size_t r, std::size_t p,
                          const models::layers::vit_config& c, double tol, double grad_tol) {
  const std::size_t per_block = models::layers::basic_transformer_block<float>::param_count;
  CHECK(got.loss_sum == Approx(ref.loss_sum).epsilon(tol));
  CHECK(relative_difference(got.logits, ref.logits) <= tol);
  CHECK(relative_difference(got.input_grad, ref.input_grad) <= tol);
  REQUIRE(got.grads.size() == ref.grads.size());
  for (std::size_t k = 0; k < ref.grads.size(); ++k) {
    CAPTURE(k);
    const bool in_block = k >= 3 && k < 3 + per_block * c.depth;
    const auto want = in_block ? tp_slice(ref.grads[k], (k - 3) % per_block, r, p, c.dim, c.mlp_ratio * c.dim) : ref.grads[k];
    CHECK(relative_difference(got.grads[k], want) <= grad_tol);
  }
}

}  // namespace partrain::test
