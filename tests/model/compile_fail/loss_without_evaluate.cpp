// Must not compile: the pipeline's loss has forward_backward but no evaluate.
#include <partrain/parallel/pipeline/stage.hpp>

#include "common.hpp"

struct train_only_loss {
  double forward_backward(partrain::tensor_view<const float>, partrain::tensor_view<const std::int32_t>,
                          partrain::tensor_view<float>, float) const { return 0; }
};

int main() {
  partrain::run_local(1, [](partrain::local_group& g) {
    std::vector<cf::scale_layer> layers(2);
    partrain::pipeline_stage stage(layers, g);
    train_only_loss l;
    std::vector<float> x(4);
    std::vector<std::int32_t> y(4);
    (void)stage.train_step(l, partrain::tensor_view<const float>(x.data(), partrain::shape{4, 1}),
                           partrain::tensor_view<const std::int32_t>(y.data(), 4));
  });
}
