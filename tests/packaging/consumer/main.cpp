// A user's program: one include, two ranks on threads, an all_reduce checked against the sum; with
// PARTRAIN_CONSUMER_SPAWN (the compiled-mode consumer, which has Gloo), also two processes that
// meet through init_process_group: the compiled mode's library bodies, each run.
#include <partrain/partrain.hpp>

#include <atomic>
#include <cstdio>
#include <string>
#include <vector>

#include "spawn_check.hpp"

#ifndef PARTRAIN_CONSUMER_MODE
#define PARTRAIN_CONSUMER_MODE "unknown"
#endif

int main() {
  std::atomic<int> wrong{0};
  partrain::run_local(2, [&](partrain::process_group& g) {
    std::vector<float> v(5, static_cast<float>(g.rank() + 1));
    g.all_reduce(partrain::tensor_view<float>(v), partrain::reduce_op::sum).wait();
    for (float x : v) {
      if (x != 3.0f) ++wrong;  // 1 + 2
    }
  });
#if defined(PARTRAIN_CONSUMER_SPAWN)
  static_assert(PARTRAIN_COMPILED, "the spawning consumer is the compiled mode's");
  if (const std::string failed = gloo_all_reduce_over_two_processes(); !failed.empty()) {
    std::printf("consumer FAILED (%s): spawn over gloo: %s\n", PARTRAIN_CONSUMER_MODE, failed.c_str());
    return 1;
  }
#endif
  if (wrong != 0) {
    std::printf("consumer FAILED (%s): %d wrong elements\n", PARTRAIN_CONSUMER_MODE, wrong.load());
    return 1;
  }
  std::printf("consumer ok (%s): partrain %d.%d.%d, all_reduce over 2 ranks\n", PARTRAIN_CONSUMER_MODE,
              PARTRAIN_VERSION_MAJOR, PARTRAIN_VERSION_MINOR, PARTRAIN_VERSION_PATCH);
  return 0;
}
