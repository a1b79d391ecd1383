// A rank of an MPI job that goes wrong on purpose, started by test_mpi_faults under mpirun:
//   stall   rank 1 stops answering (sleeps) while rank 0 all_reduces with a 2 s timeout
//   throw   rank 1 throws inside run_ranks while rank 0 waits in a barrier with a 120 s timeout
#include <partrain/comm/mpi.hpp>
#include <partrain/launch/run_ranks.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string_view>
#include <thread>
#include <vector>

using namespace partrain;
using namespace std::chrono_literals;

int main(int argc, char** argv) {
  const std::string_view scenario = argc > 1 ? argv[1] : "";
  if (scenario == "stall") {
    mpi_group g(process_group_options{.timeout = 2s});
    std::vector<float> v(1024, 1.0f);
    g.all_reduce(tensor_view<float>(v)).wait();  // both ranks: the job works
    if (g.rank() == 1) std::this_thread::sleep_for(120s);
    g.all_reduce(tensor_view<float>(v)).wait();  // rank 0: times out, aborts the job
    std::puts("unreachable: the stalled all_reduce completed");
    return 3;
  }
  if (scenario == "throw") {
    setenv("PARTRAIN_TIMEOUT_MS", "120000", 1);
    run_ranks({.backend = "mpi"}, [](process_group& pg) {
      if (pg.rank() == 1) throw std::runtime_error("model exploded on purpose");
      pg.barrier().wait();
    });
    std::puts("unreachable: the barrier without rank 1 completed");
    return 3;
  }
  std::fprintf(stderr, "usage: mpi_fault_rank stall|throw\n");
  return 2;
}
