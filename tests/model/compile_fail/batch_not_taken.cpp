// Must not compile: the model trains on partrain::batch, the step is given another batch type.
#include <partrain/parallel/ddp.hpp>

#include "common.hpp"

struct model {
  std::vector<cf::param> ps{cf::param{}};
  std::vector<cf::param>& parameters() { return ps; }
  double train_step(const partrain::batch&) { return 0; }
};
struct my_batch {};

int main() {
  partrain::run_local(1, [](partrain::local_group& g) {
    model m;
    partrain::distributed_data_parallel ddp(m, g);
    ddp.train_step(my_batch{});
  });
}
