// Must not compile: a parameter without grad().
#include <partrain/parallel/ddp.hpp>

#include "common.hpp"

struct value_only {
  std::vector<float> v{1.0f};
  partrain::tensor_view<float> value() { return {v.data(), v.size()}; }
};
struct model {
  std::vector<value_only> ps{value_only{}};
  std::vector<value_only>& parameters() { return ps; }
  double train_step(const partrain::batch&) { return 0; }
};

int main() {
  partrain::run_local(1, [](partrain::local_group& g) {
    model m;
    partrain::distributed_data_parallel ddp(m, g);
    (void)ddp;
  });
}
