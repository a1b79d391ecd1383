// Must not compile: fully_sharded_data_parallel owns the layers' parameter storage, so each
// parameter must offer bind(value, grad); this one only has value() and grad().
#include <partrain/parallel/fsdp.hpp>

#include "common.hpp"

struct unbindable {
  std::vector<float> v{1.0f}, g{0.0f};
  partrain::tensor_view<float> value() { return {v.data(), v.size()}; }
  partrain::tensor_view<float> grad() { return {g.data(), g.size()}; }
};
struct layer : cf::scale_layer {
  std::vector<unbindable> own{unbindable{}};
  std::vector<unbindable>& parameters() { return own; }
};

int main() {
  partrain::run_local(1, [](partrain::local_group& g) {
    std::vector<layer> layers(2);
    partrain::fully_sharded_data_parallel f(layers, g, cf::loss{}, partrain::sgd_options{});
    (void)f;
  });
}
