// Must not compile: fully_sharded_data_parallel owns the layers' parameter storage, so each
// parameter must offer bind(value, grad); this one only has value() and grad().
#include <partrain/comm/local.hpp>
#include <partrain/parallel/fsdp.hpp>

#include <cstdint>
#include <vector>

struct param {
  std::vector<float> v, g;
  partrain::tensor_view<float> value() { return {v.data(), v.size()}; }
  partrain::tensor_view<float> grad() { return {g.data(), g.size()}; }
};
struct scale_layer {
  std::vector<param> ps{param{{1.0f}, {0.0f}}};
  [[nodiscard]] partrain::shape output_shape(const partrain::shape& s) const { return s; }
  void forward(partrain::tensor_view<const float>, partrain::tensor_view<float>) {}
  void backward(partrain::tensor_view<const float>, partrain::tensor_view<const float>, partrain::tensor_view<const float>,
                partrain::tensor_view<float>) {}
  std::vector<param>& parameters() { return ps; }
};
struct loss {
  double forward_backward(partrain::tensor_view<const float>, partrain::tensor_view<const std::int32_t>,
                          partrain::tensor_view<float>, float) const { return 0; }
  partrain::eval_result evaluate(partrain::tensor_view<const float>, partrain::tensor_view<const std::int32_t>) const { return {}; }
};

int main() {
  partrain::run_local(1, [](partrain::local_group& g) {
    std::vector<scale_layer> layers(2);
    partrain::fully_sharded_data_parallel f(layers, g, loss{}, partrain::sgd_options{});
    (void)f;
  });
}
