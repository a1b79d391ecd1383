// ODR check, first TU: the whole facade, and a use of inline and template code from it.
#include <partrain/partrain.hpp>

#include <vector>

double odr_sum_a() {
  std::vector<float> v{1.0f, 2.0f};
  partrain::run_local(1, [&](partrain::process_group& g) { g.all_reduce(partrain::tensor_view<float>(v)).wait(); });
  return static_cast<double>(v[0] + v[1]) + static_cast<float>(partrain::bfloat16(0.5f));
}
