// Must not compile: sgd given the pipeline stage itself instead of stage.parameters().
#include <partrain/optim/sgd.hpp>
#include <partrain/parallel/pipeline/stage.hpp>

#include "common.hpp"

int main() {
  partrain::run_local(1, [](partrain::local_group& g) {
    std::vector<cf::scale_layer> layers(2);
    partrain::pipeline_stage stage(layers, g);
    partrain::sgd opt(stage, {.lr = 0.1});
    (void)opt;
  });
}
