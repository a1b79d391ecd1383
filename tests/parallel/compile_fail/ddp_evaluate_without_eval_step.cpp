// Must not compile: evaluate needs the model's eval_step.
#include <vector>

#include <partrain/comm/local.hpp>
#include <partrain/parallel/ddp.hpp>

struct param {
  std::vector<float> v, g;
  partrain::tensor_view<float> value() { return {v.data(), v.size()}; }
  partrain::tensor_view<float> grad() { return {g.data(), g.size()}; }
};
struct my_batch {};
struct model_without_eval {
  std::vector<param> ps;
  std::vector<param>& parameters() { return ps; }
  double train_step(const my_batch&) { return 0; }
};

int main() {
  partrain::run_local(1, [](partrain::local_group& g) {
    model_without_eval m;
    partrain::distributed_data_parallel ddp(m, g);
    std::vector<my_batch> test(1);
    (void)ddp.evaluate(test);
  });
}
