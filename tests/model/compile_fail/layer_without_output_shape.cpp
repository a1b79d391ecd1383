// Must not compile: a layer without output_shape, cut into pipeline stages.
#include <partrain/parallel/pipeline/stage.hpp>

#include "common.hpp"

struct shapeless : cf::scale_layer {
  void output_shape() = delete;
};

int main() {
  partrain::run_local(1, [](partrain::local_group& g) {
    std::vector<shapeless> layers(2);
    partrain::pipeline_stage stage(layers, g);
    (void)stage;
  });
}
