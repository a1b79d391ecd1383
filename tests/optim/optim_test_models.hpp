// A model whose gradients the test sets by hand, for checking update rules element by element.
#pragma once

#include <string>
#include <vector>

#include <partrain/core/tensor_view.hpp>

namespace partrain::testing {

template <class T>
struct manual_param {
  std::vector<T> v, g;
  [[nodiscard]] tensor_view<T> value() { return {v.data(), v.size()}; }
  [[nodiscard]] tensor_view<T> grad() { return {g.data(), g.size()}; }
};

template <class T>
struct manual_model {
  std::vector<manual_param<T>> params;
  [[nodiscard]] std::vector<manual_param<T>>& parameters() { return params; }
};

}  // namespace partrain::testing
