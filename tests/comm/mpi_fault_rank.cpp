// A rank of an MPI job that goes wrong on purpose, started by test_mpi_faults under mpirun:
//   stall   rank 1 stops answering (sleeps) while rank 0 all_reduces with a 2 s timeout
//   stop    the same, but rank 1 stops as a whole (SIGSTOP): its progress thread cannot answer
//   silent  rank 1 stops as a whole; rank 0's all_reduce has a 30 s timeout, and the silence
//           window (PARTRAIN_SILENCE_MS) must end the job long before it
//   silent-throw  the same with abort_on_timeout = false: rank 0 catches the timeout_error,
//           prints it and exits 4 (MPI_Finalize would wait for the stopped rank)
//   busy    rank 1 is busy for 8 s in its own code (4 s in a callback on the group's completing
//           thread, 4 s on its main thread) while rank 0 waits, with a 30 s timeout and a short
//           silence window: a busy rank still answers, so both finish
//   done-early  3 ranks: rank 2 is done with the group (destroyed it) while rank 0 waits 5 s in a
//           recv from rank 1, which is busy: only the recv's peer is asked, so rank 0 completes
//   throw   rank 1 throws inside run_ranks while rank 0 waits in a barrier with a 120 s timeout
#include <partrain/comm/mpi.hpp>
#include <partrain/launch/run_ranks.hpp>
#include <partrain/rendezvous/liveness.hpp>

#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string_view>
#include <thread>
#include <vector>

using namespace partrain;
using namespace std::chrono_literals;

namespace {

// As init_process_group makes it: the silence window from PARTRAIN_SILENCE_MS.
mpi_group make_group(std::chrono::milliseconds timeout, bool abort_on_timeout = true) {
  return mpi_group(process_group_options{.timeout = timeout},
                   mpi_options{.abort_on_timeout = abort_on_timeout, .silence = liveness_options_from_env().silence});
}

}  // namespace

int main(int argc, char** argv) {
  const std::string_view scenario = argc > 1 ? argv[1] : "";
  std::vector<float> v(1024, 1.0f);
  if (scenario == "stall" || scenario == "stop") {
    mpi_group g = make_group(2s);
    g.all_reduce(tensor_view<float>(v)).wait();  // both ranks: the job works
    if (g.rank() == 1 && scenario == "stop") ::raise(SIGSTOP);
    if (g.rank() == 1) std::this_thread::sleep_for(120s);
    g.all_reduce(tensor_view<float>(v)).wait();  // rank 0: times out, aborts the job
    std::puts("unreachable: the stalled all_reduce completed");
    return 3;
  }
  if (scenario == "silent" || scenario == "silent-throw") {
    mpi_group g = make_group(30s, scenario == "silent");
    g.all_reduce(tensor_view<float>(v)).wait();
    if (g.rank() == 1) ::raise(SIGSTOP);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      g.all_reduce(tensor_view<float>(v)).wait();  // rank 0: rank 1 goes silent
    } catch (const timeout_error& e) {
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("caught timeout_error after %.1f s naming peer %d: %s\n", s, e.site().peer, e.what());
      std::fflush(stdout);
      ::_exit(4);
    }
    std::puts("unreachable: the all_reduce without rank 1 completed");
    return 3;
  }
  if (scenario == "busy") {
    mpi_group g = make_group(30s);
    if (g.rank() == 0) std::this_thread::sleep_for(500ms);  // rank 1's callback is in place first
    work first = g.all_reduce(tensor_view<float>(v));
    if (g.rank() == 1) {
      first.then([main = std::this_thread::get_id()] {
        if (std::this_thread::get_id() != main) std::puts("rank 1: busy for 4 s in a callback on another thread");
        std::this_thread::sleep_for(4s);
      });
    }
    first.wait();
    if (g.rank() == 1) std::this_thread::sleep_for(4s);
    const auto t0 = std::chrono::steady_clock::now();
    g.all_reduce(tensor_view<float>(v)).wait();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("rank %d: the all_reduce completed after %.1f s, value %g\n", g.rank(), s, double(v[0]));
    return 0;
  }
  if (scenario == "done-early") {
    int rank = -1;
    {
      mpi_group g = make_group(30s);
      rank = g.rank();
      g.barrier().wait();
      if (rank == 0) {
        const auto t0 = std::chrono::steady_clock::now();
        g.recv(tensor_view<float>(v), 1).wait();
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::printf("rank 0: the recv from rank 1 completed after %.1f s\n", s);
      } else if (rank == 1) {
        std::this_thread::sleep_for(5s);
        g.send(tensor_view<float>(v), 0).wait();
      }
    }
    if (rank == 2) std::puts("rank 2: done with the group");
    return 0;
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
  std::fprintf(stderr, "usage: mpi_fault_rank stall|stop|silent|silent-throw|busy|done-early|throw\n");
  return 2;
}
