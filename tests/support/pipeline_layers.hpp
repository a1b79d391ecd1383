// tests/support/pipeline_layers.hpp: for the pipeline tests and benchmark, the example's layered
// MLP (models/mlp_layers.hpp) plus the single-device reference (forward, loss,
// backward over the whole batch; plain SGD) and a synthetic batch.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <partrain/core/buffer.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/model/concepts.hpp>
#include <partrain/model/layer.hpp>

#include "mlp_layers.hpp"

namespace partrain::test {

using namespace ::models::layers;

// One step on one device over the whole batch: gradients written (zeroed first), mean loss back.
inline double reference_step(host_model& m, const softmax_cross_entropy& loss, tensor_view<const float> x,
                             tensor_view<const std::int32_t> y) {
  for (auto& l : m) for (auto& p : l->parameters()) std::ranges::fill(p.g, 0.0f);
  std::vector<host_buffer<float>> acts;
  tensor_view<const float> cur = x;
  for (auto& l : m) {
    acts.emplace_back(l->output_shape(cur.shape()));
    l->forward(cur, acts.back().view());
    cur = tensor_view<const float>(acts.back().view());
  }
  host_buffer<float> g(acts.back().shape());
  const double sum = loss.forward_backward(cur, y, g.view(), 1.0f / static_cast<float>(x.extent(0)));
  for (std::size_t j = m.size(); j-- > 0;) {
    const tensor_view<const float> in = j == 0 ? x : tensor_view<const float>(acts[j - 1].view());
    host_buffer<float> gin(in.shape());
    m[j]->backward(in, tensor_view<const float>(acts[j].view()), tensor_view<const float>(g.view()), gin.view());
    g = std::move(gin);
  }
  return sum / static_cast<double>(x.extent(0));
}

inline eval_result reference_eval(host_model& m, const softmax_cross_entropy& loss, tensor_view<const float> x,
                                  tensor_view<const std::int32_t> y) {
  host_buffer<float> cur(x.shape());
  std::copy(x.begin(), x.end(), cur.begin());
  for (auto& l : m) {
    host_buffer<float> next(l->output_shape(cur.shape()));
    l->forward(tensor_view<const float>(cur.view()), next.view());
    cur = std::move(next);
  }
  return loss.evaluate(tensor_view<const float>(cur.view()), y);
}

// p -= lr * grad for every parameter of the given layers.
template <class Param>
void sgd_update(Param& p, float lr) {
  auto v = p.value();
  auto g = p.grad();
  for (std::size_t i = 0; i < v.size(); ++i) v[i] -= lr * g[i];
}

inline void sgd_step(host_model& m, float lr) {
  for (auto& l : m) for (auto& p : l->parameters()) sgd_update(p, lr);
}

// A deterministic synthetic classification batch.
struct synthetic_batch {
  host_buffer<float> x;
  std::vector<std::int32_t> y;
  synthetic_batch(std::size_t rows, std::size_t features, std::int32_t classes, std::uint32_t seed)
      : x(shape{rows, features}), y(rows) {
    std::mt19937 gen(seed);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (auto& v : x) v = d(gen);
    for (std::size_t r = 0; r < rows; ++r) y[r] = static_cast<std::int32_t>(gen() % static_cast<std::uint32_t>(classes));
  }
  [[nodiscard]] tensor_view<const float> input() const { return x.view(); }
  [[nodiscard]] tensor_view<const std::int32_t> labels() const { return {y.data(), y.size()}; }
};

// Moves every parameter's values to storage of its own, as fully sharded data parallel's bind
// does (the layer's own buffers are freed, so a layer reading them directly would fail); returns
// that storage, values and gradients, parameter by parameter.
struct bound_storage {
  std::vector<host_buffer<float>> values, grads;
};
inline bound_storage bind_elsewhere(host_model& m) {
  bound_storage b;
  for (auto& l : m) {
    for (auto& p : l->parameters()) {
      b.values.emplace_back(p.value().shape());
      b.grads.emplace_back(p.value().shape());
      std::ranges::copy(p.value(), b.values.back().begin());
      p.bind(b.values.back().view(), b.grads.back().view());
    }
  }
  return b;
}

}  // namespace partrain::test
