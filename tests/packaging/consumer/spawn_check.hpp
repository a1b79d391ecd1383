// Two processes that meet through init_process_group("env://") and all_reduce over Gloo: what the
// Gloo consumers run (single_include's, and the compiled mode's). Returns "" when both ranks saw
// the sum, else what went wrong.
#pragma once

#include <chrono>
#include <string>
#include <vector>

inline std::string gloo_all_reduce_over_two_processes() {
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
    return e.what();
  }
  return {};
}
