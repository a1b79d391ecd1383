// Random labelled batches for the example MLP's unit tests (any type with features and labels
// views is a batch to the model).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <partrain/core/tensor_view.hpp>

#include "mlp_host.hpp"

namespace example::testing {

struct test_batch {
  partrain::tensor_view<const float> features;
  partrain::tensor_view<const std::int32_t> labels;
};

struct data {
  std::vector<float> x;
  std::vector<std::int32_t> y;
  test_batch batch(std::size_t in) const { return {{x.data(), {y.size(), in}}, {y.data(), y.size()}}; }
};

// n examples of `in` features uniform in [-1, 1) and labels in [0, classes).
inline data make_data(std::size_t n, std::size_t in, std::size_t classes, std::uint64_t seed) {
  models::splitmix64 rng(seed);
  data d;
  d.x.resize(n * in);
  for (auto& v : d.x) v = rng.uniform(-1.0f, 1.0f);
  for (std::size_t i = 0; i < n; ++i) d.y.push_back(static_cast<std::int32_t>(rng.next() % classes));
  return d;
}

}  // namespace example::testing
