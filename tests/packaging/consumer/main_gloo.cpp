// A user's program built from single_include/ alone with the gloo backend compiled in: two
// processes meet through init_process_group("env://") and all_reduce over Gloo.
#include <partrain/partrain.hpp>

#include <cstdio>
#include <vector>

#if !defined(PARTRAIN_WITH_GLOO)
#error "this consumer is built with partrain::gloo's definition PARTRAIN_WITH_GLOO"
#endif

int main() {
  try {
    partrain::spawn(2, [](int rank) {
      auto g = partrain::init_process_group("env://", {.backend = "gloo", .timeout = std::chrono::milliseconds(60'000)});
      std::vector<float> v(5, static_cast<float>(rank + 1));
      g->all_reduce(partrain::tensor_view<float>(v), partrain::reduce_op::sum).wait();
      for (float x : v) {
        if (x != 3.0f) return 1;  // 1 + 2
      }
      return g->backend() == "gloo" ? 0 : 2;
    });
  } catch (const partrain::error& e) {
    std::printf("consumer FAILED (single_include, gloo): %s\n", e.what());
    return 1;
  }
  std::printf("consumer ok (single_include, gloo): init_process_group + all_reduce over 2 processes\n");
  return 0;
}
