// Must not compile: the model has no train_step for this batch type.
#include <vector>

#include <partrain/comm/local.hpp>
#include <partrain/parallel/zero.hpp>

struct param {
  std::vector<float> v, g;
  partrain::tensor_view<float> value() { return {v.data(), v.size()}; }
  partrain::tensor_view<float> grad() { return {g.data(), g.size()}; }
};
struct model_without_step {
  std::vector<param> ps;
  std::vector<param>& parameters() { return ps; }
};
struct my_batch {};

int main() {
  partrain::run_local(1, [](partrain::local_group& g) {
    model_without_step m;
    partrain::sharded_data_parallel zero(m, g, partrain::sgd_options{});
    zero.train_step(my_batch{});
  });
}
