// A user's program built from single_include/ alone with the gloo backend compiled in: two
// processes meet through init_process_group("env://") and all_reduce over Gloo.
#include <partrain/partrain.hpp>

#include <cstdio>
#include <string>

#include "spawn_check.hpp"

#if !defined(PARTRAIN_WITH_GLOO)
#error "this consumer is built with partrain::gloo's definition PARTRAIN_WITH_GLOO"
#endif

int main() {
  if (const std::string failed = gloo_all_reduce_over_two_processes(); !failed.empty()) {
    std::printf("consumer FAILED (single_include, gloo): %s\n", failed.c_str());
    return 1;
  }
  std::printf("consumer ok (single_include, gloo): init_process_group + all_reduce over 2 processes\n");
  return 0;
}
