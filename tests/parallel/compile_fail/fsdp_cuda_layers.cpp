// Must not compile with g++: fully_sharded_data_parallel runs its element loops on CUDA layers'
// device as kernels, so layers whose parameters are in CUDA memory need nvcc.
#include <partrain/comm/local.hpp>
#include <partrain/parallel/fsdp.hpp>

#include <cstdint>
#include <vector>

struct param {
  partrain::tensor_view<float, partrain::cuda> v, g;
  partrain::tensor_view<float, partrain::cuda> value() { return v; }
  partrain::tensor_view<float, partrain::cuda> grad() { return g; }
  void bind(partrain::tensor_view<float, partrain::cuda> value, partrain::tensor_view<float, partrain::cuda> grad) {
    v = value;
    g = grad;
  }
};
using in_view = partrain::tensor_view<const float, partrain::cuda>;
using out_view = partrain::tensor_view<float, partrain::cuda>;
struct cuda_layer {
  std::vector<param> ps{param{}};
  [[nodiscard]] partrain::shape output_shape(const partrain::shape& s) const { return s; }
  void forward(in_view, out_view) {}
  void backward(in_view, in_view, in_view, out_view) {}
  std::vector<param>& parameters() { return ps; }
};
struct loss {
  double forward_backward(in_view, partrain::tensor_view<const std::int32_t, partrain::cuda>, out_view, float) const { return 0; }
  partrain::eval_result evaluate(in_view, partrain::tensor_view<const std::int32_t, partrain::cuda>) const { return {}; }
};

int main() {
  partrain::run_local(1, [](partrain::local_group& g) {
    std::vector<cuda_layer> layers(2);
    partrain::fully_sharded_data_parallel f(layers, g, loss{}, partrain::sgd_options{.lr = 0.1});
  });
}
