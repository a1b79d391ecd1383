// What the compile-fail cases share: a correct parameter, layer, loss and batch, so each case
// breaks exactly one thing.
#pragma once

#include <cstdint>
#include <vector>

#include <partrain/comm/local.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/data/batch.hpp>
#include <partrain/model/concepts.hpp>

namespace cf {

struct param {
  std::vector<float> v{1.0f}, g{0.0f};
  partrain::tensor_view<float> value() { return {v.data(), v.size()}; }
  partrain::tensor_view<float> grad() { return {g.data(), g.size()}; }
  void bind(partrain::tensor_view<float>, partrain::tensor_view<float>) {}
};

struct scale_layer {
  std::vector<param> ps{param{}};
  [[nodiscard]] partrain::shape output_shape(const partrain::shape& s) const { return s; }
  void forward(partrain::tensor_view<const float>, partrain::tensor_view<float>) {}
  void backward(partrain::tensor_view<const float>, partrain::tensor_view<const float>, partrain::tensor_view<const float>,
                partrain::tensor_view<float>) {}
  std::vector<param>& parameters() { return ps; }
};

struct loss {
  double forward_backward(partrain::tensor_view<const float>, partrain::tensor_view<const std::int32_t>,
                          partrain::tensor_view<float>, float) const { return 0; }
  partrain::eval_result evaluate(partrain::tensor_view<const float>, partrain::tensor_view<const std::int32_t>) const {
    return {};
  }
};

}  // namespace cf
