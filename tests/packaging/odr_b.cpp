// ODR check, second TU: the same facade again. A non-inline definition in any header makes the
// link fail with a duplicate symbol.
#include <partrain/partrain.hpp>

#include <cstdio>
#include <vector>

double odr_sum_a();

int main() {
  std::vector<double> v{3.0, 4.0};
  partrain::run_local(1, [&](partrain::process_group& g) { g.all_reduce(partrain::tensor_view<double>(v)).wait(); });
  const double total = odr_sum_a() + v[0] + v[1];
  if (total != 10.5) {
    std::printf("odr: expected 10.5, got %g\n", total);
    return 1;
  }
  std::printf("odr ok: two TUs with the whole facade link and agree (%g)\n", total);
  return 0;
}
