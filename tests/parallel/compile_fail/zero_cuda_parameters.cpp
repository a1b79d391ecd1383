// Must not compile: sharded_data_parallel with CUDA parameters runs its element loops as kernels,
// so g++ (no nvcc) refuses it with a sentence naming nvcc.
#include <partrain/comm/local.hpp>
#include <partrain/parallel/zero.hpp>

struct param {
  partrain::tensor_view<float, partrain::cuda> value() { return {}; }
  partrain::tensor_view<float, partrain::cuda> grad() { return {}; }
};
struct cuda_model {
  param ps[1];
  auto& parameters() { return ps; }
};

int main() {
  partrain::run_local(1, [](partrain::local_group& g) {
    cuda_model m;
    partrain::sharded_data_parallel zero(m, g, partrain::sgd_options{});
    (void)zero;
  });
}
