// Must not compile: optimizers step float or double parameters only.
#include <cstdint>
#include <vector>

#include <partrain/optim/sgd.hpp>

struct int_param {
  std::vector<std::int32_t> v, g;
  partrain::tensor_view<std::int32_t> value() { return {v.data(), v.size()}; }
  partrain::tensor_view<std::int32_t> grad() { return {g.data(), g.size()}; }
};
struct int_model {
  std::vector<int_param> ps;
  std::vector<int_param>& parameters() { return ps; }
};

int main() {
  int_model m;
  partrain::sgd opt(m, {});
  opt.step();
}
