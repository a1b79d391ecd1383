// Must not compile: the model has a train_step but no parameters().
#include <partrain/parallel/ddp.hpp>

#include "common.hpp"

struct no_parameters {
  double train_step(const partrain::batch&) { return 0; }
};

int main() {
  partrain::run_local(1, [](partrain::local_group& g) {
    no_parameters m;
    partrain::distributed_data_parallel ddp(m, g);
    (void)ddp;
  });
}
