// partrain/launch/run_ranks.hpp: runs a function on every rank of a job, the three ways a
// program usually starts its ranks, with one call:
//   {.nproc = N, .backend = "local"}  N threads of this process over the local backend
//   {.nproc = N, .backend = "gloo"}   N forked processes (spawn), each joining through
//                                     init_process_group("env://") (what torch.multiprocessing
//                                     .spawn plus init_process_group do)
//   {.nproc = 0}                      this process is one rank of a job a launcher started
//                                     (partrun, torchrun, Slurm, mpirun): env:// says which
//   {.nproc = 0, .backend = "mpi"}    a rank of an MPI job (mpirun -np N, srun): a rank that
//                                     fails aborts the whole job at once (MPI_Abort), since its
//                                     peers would otherwise wait in MPI until their timeout
//
//   run_ranks({.nproc = 2}, [](process_group& pg) { ... DDP over pg ... });
#pragma once

#include <sys/resource.h>

#include <exception>
#include <fstream>
#include <string>
#include <utility>

#include <partrain/comm/local.hpp>
#include <partrain/comm/process_group.hpp>
#include <partrain/core/error.hpp>
#include <partrain/launch/error_file.hpp>
#include <partrain/launch/spawn.hpp>
#include <partrain/rendezvous/init.hpp>
#include <partrain/rendezvous/launcher.hpp>

namespace partrain::inline v0 {

struct run_ranks_options {
  int nproc = 0;                  // ranks to start here; 0: take rank and world size from the environment
  std::string backend = "gloo";   // "local" (threads), or a process backend for init_process_group
  spawn_options spawn{};          // how forked ranks are supervised (nproc > 0, process backends)
  process_group_options local{};  // the local backend's options (timeout, checking mode)
};

// Returns when every rank's fn returned; a failing rank's error is rethrown here (threads: the
// root cause, not its peers' echoes; processes: spawn's process_error naming the rank).
namespace detail::launch {

// "" when this process is not a rank of a job some launcher started with several ranks; else
// who started it and as which rank (detect_launch's).
[[nodiscard]] inline std::string launched_rank(const env_lookup& env = process_env) {
  const launch_env l = detect_launch(env);
  return l.world_size > 1 ? l.to_string() : std::string();
}

// Refuses, before anything starts, a number of ranks on one host that a process backend cannot
// connect: Gloo connects every pair of ranks, so n ranks hold n(n-1)/2 TCP connections, each
// taking an ephemeral port, and each rank n-1 descriptors. (--nproc 1000 used to end in
// "bind: Address already in use" after two minutes.) Raises the descriptor limit when it can.
inline void check_host_capacity(int nproc, const std::string& backend) {
  if (nproc <= 1 || backend != "gloo") return;
  const auto n = static_cast<unsigned long long>(nproc);
  const unsigned long long connections = n * (n - 1) / 2;
  unsigned long long lo = 32768, hi = 60999;  // Linux's default range
  if (std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range"); range) range >> lo >> hi;
  const unsigned long long ports = hi >= lo ? hi - lo + 1 : 0;
  // Leave half the range to everything else on the host (and to connections in TIME_WAIT).
  if (connections > ports / 2) {
    unsigned long long fit = 1;
    while ((fit + 1) * fit / 2 <= ports / 2) ++fit;
    throw config_error("run_ranks: " + std::to_string(nproc) + " gloo ranks on one host need " + std::to_string(connections) +
                       " TCP connections (every rank connects to every other), more than half of this host's " +
                       std::to_string(ports) + " ephemeral ports (/proc/sys/net/ipv4/ip_local_port_range); start at most " +
                       std::to_string(fit) + " ranks per host, or use the local (threads) or mpi backend");
  }
  const rlim_t need = static_cast<rlim_t>(n) + 256;  // peers, plus the store, data files and the runtime's own
  ::rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY && lim.rlim_cur < need) {
    if (lim.rlim_max != RLIM_INFINITY && lim.rlim_max < need) {
      throw config_error("run_ranks: " + std::to_string(nproc) + " gloo ranks each need about " + std::to_string(need) +
                         " open files, but this host allows " + std::to_string(lim.rlim_max) +
                         " (ulimit -Hn); raise the limit or start fewer ranks");
    }
    lim.rlim_cur = need;
    (void)::setrlimit(RLIMIT_NOFILE, &lim);  // inherited by the ranks
  }
}

}  // namespace detail::launch

template <class F>
void run_ranks(run_ranks_options o, F fn) {
  static_assert(std::invocable<F&, process_group&>, "partrain::run_ranks: fn must be callable as fn(process_group&)");
  if (o.nproc < 0) throw config_error("run_ranks: nproc must be >= 0 (0: ranks from the environment), got " + std::to_string(o.nproc));
  if (o.nproc > 0) {
    // Starting ranks (threads or processes) inside a rank would make a second job beside the
    // launcher's, silently (threads) or waiting for peers of the outer one; say so at once.
    if (auto outer = detail::launch::launched_rank(); !outer.empty()) {
      throw config_error("run_ranks: nproc " + std::to_string(o.nproc) + " asks to start " +
                         (o.backend == "local" ? "threads" : "ranks") + " here, but this process is already " + outer +
                         "; let the launcher start the ranks (nproc 0 with a process backend such as gloo or mpi, "
                         "e.g. drop --nproc)");
    }
    if (o.backend != "local") detail::launch::check_host_capacity(o.nproc, o.backend);
  }
  if (o.backend == "local") {
    if (o.nproc == 0) throw config_error("run_ranks: the local backend needs nproc >= 1 (its ranks are threads of this process)");
    run_local(o.nproc, [&](local_group& g) { fn(g); }, o.local);
    return;
  }
  if (o.backend == "mpi") {
    if (o.nproc > 0) {
      throw config_error("run_ranks: the mpi backend's ranks are started by MPI's launcher, not forked here: run "
                         "`mpirun -np " + std::to_string(o.nproc) + " <program>` (or srun) with nproc 0");
    }
    auto pg = init_process_group("mpi://", {.backend = "mpi"});
#if PARTRAIN_INIT_HAS_MPI
    try {
      fn(*pg);
    } catch (const std::exception& e) {
      detail::mpi::runtime::abort_job("rank " + std::to_string(pg->rank()) + " failed: " + e.what());
    }
#endif
    return;
  }
  auto rank_main = [&] {
    auto pg = init_process_group("env://", {.backend = o.backend});
    fn(*pg);
  };
  if (o.nproc > 0) {
    spawn(o.nproc, [&](int) { rank_main(); }, std::move(o.spawn));
    return;
  }
  try {
    rank_main();
  } catch (const std::exception& e) {
    write_error_file(e);  // torchrun's summary names this rank's error (no-op elsewhere)
    throw;
  }
}

}  // namespace partrain::inline v0
