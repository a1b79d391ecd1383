// partrain/core/affinity.hpp: which CPUs the calling thread may run on (what torchrun and
// os.sched_getaffinity read), and pinning a thread to one of them. The local backend pins its
// ranks with these; a program sizes its own threads by them (the example's loader does).
#pragma once

#include <vector>

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#endif

namespace partrain::inline v0 {

// The CPUs the calling thread may run on (its affinity mask, which the threads it starts
// inherit), lowest first; empty where unknown. Under `mpirun --bind-to core` or a pinned local
// rank, one CPU.
[[nodiscard]] inline std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c) {
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
    }
  }
#endif
  return cpus;
}

namespace detail {

// Pins the calling thread to one CPU. A hint: where the system refuses, the thread runs unpinned.
inline void pin_this_thread(int cpu) {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  (void)pthread_setaffinity_np(pthread_self(), sizeof set, &set);
#else
  (void)cpu;
#endif
}

}  // namespace detail

}  // namespace partrain::inline v0
