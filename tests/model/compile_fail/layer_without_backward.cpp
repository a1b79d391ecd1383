// Must not compile: a layer without backward, made a model by sequential.
#include <partrain/model/sequential.hpp>

#include "common.hpp"

struct forward_only {
  std::vector<cf::param> ps{cf::param{}};
  [[nodiscard]] partrain::shape output_shape(const partrain::shape& s) const { return s; }
  void forward(partrain::tensor_view<const float>, partrain::tensor_view<float>) {}
  std::vector<cf::param>& parameters() { return ps; }
};

int main() {
  partrain::sequential model(std::vector<forward_only>(2), cf::loss{});
  (void)model;
}
