// A rank program for the partrun tests: joins the job through env://, agrees on ranks with an
// all_reduce, and misbehaves on request:
//   PROBE_PID_DIR=dir        write this process's pid to dir/<rank>.pid
//   PROBE_FAIL_RANK=r        rank r misbehaves after PROBE_FAIL_STEP (default 2) all_reduces:
//   PROBE_FAIL_MODE=exit3|sigkill|stall
//   PROBE_STEPS=n            all_reduces to run (default 5)
//   PROBE_EXIT_BEFORE_JOIN=r rank r exits 0 at once, before it joins the job
//   PROBE_LINGER_RANK=r      rank r stays PROBE_LINGER_MS ms (default 60000) after its group ended
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <partrain/rendezvous/init.hpp>

namespace {
int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}
}  // namespace

int main() {
  const int rank = env_int("RANK", -1);
  if (const char* dir = std::getenv("PROBE_PID_DIR")) {
    std::ofstream(std::string(dir) + "/" + std::to_string(rank) + ".pid") << ::getpid() << "\n";
  }
  if (rank == env_int("PROBE_EXIT_BEFORE_JOIN", -1)) return 0;
  try {
    auto pg = partrain::init_process_group("env://", {.backend = "gloo"});
    const int fail_rank = env_int("PROBE_FAIL_RANK", -1);
    const int fail_step = env_int("PROBE_FAIL_STEP", 2);
    const std::string mode = std::getenv("PROBE_FAIL_MODE") ? std::getenv("PROBE_FAIL_MODE") : "";
    const int steps = env_int("PROBE_STEPS", 5);
    for (int step = 0; step < steps; ++step) {
      if (pg->rank() == fail_rank && step == fail_step) {
        std::printf("rank %d misbehaving: %s\n", pg->rank(), mode.c_str());
        std::fflush(stdout);
        if (mode == "exit3") return 3;
        if (mode == "sigkill") ::raise(SIGKILL);
        if (mode == "stall") std::this_thread::sleep_for(std::chrono::hours(1));
      }
      std::vector<float> v{static_cast<float>(pg->rank()), 1.0f};
      pg->all_reduce(partrain::tensor_view<float>(v)).wait();
      if (step == 0) {
        std::printf("probe rank=%d world=%d local_rank=%s sum_ranks=%d count=%d restart=%s\n", pg->rank(), pg->size(),
                    std::getenv("LOCAL_RANK"), static_cast<int>(v[0]), static_cast<int>(v[1]),
                    std::getenv("PARTRAIN_RESTART_COUNT") ? std::getenv("PARTRAIN_RESTART_COUNT") : "-");
        std::fflush(stdout);
      }
    }
    std::printf("probe rank=%d done\n", pg->rank());
    std::fflush(stdout);
    pg.reset();
    if (rank == env_int("PROBE_LINGER_RANK", -1)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(env_int("PROBE_LINGER_MS", 60000)));
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "probe rank %d failed: %s\n", rank, e.what());
    return 1;
  }
}
