// Runs a function as N ranks in forked child processes and collects each rank's outcome.
// Children report failures as text through a pipe and leave with _exit (no Catch2 teardown in
// a child); a child still running at the hang guard is killed, so no test leaves one behind.
#pragma once

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

namespace partrain::testing {

struct rank_outcome {
  bool ok = false;
  std::string message;  // what the rank threw, or why it did not finish
};

// A child forked while another thread of this process holds a lock inherits it held: under
// AddressSanitizer (GCC 12's libasan takes no allocator locks around fork) it then deadlocks at its
// first thread start. So forking is refused while this process runs any other thread (a store
// server belongs in store_process.hpp). ThreadSanitizer runs a thread of its own, and handles fork.
inline void require_single_thread() {
#if !defined(__SANITIZE_THREAD__)
  std::size_t threads = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++threads;
  if (threads > 1) {
    throw std::logic_error("fork_ranks: this process runs " + std::to_string(threads) +
                           " threads; fork only from a single-threaded test process (a store server goes in "
                           "store_process)");
  }
#endif
}

// fn(rank) runs in child `rank`; an exception (or a nonzero exit) marks it failed.
inline std::vector<rank_outcome> fork_ranks(int n, const std::function<void(int)>& fn,
                                            std::chrono::milliseconds hang_guard = std::chrono::seconds(60)) {
  require_single_thread();
  std::vector<pid_t> pids(static_cast<std::size_t>(n), -1);
  std::vector<int> fds(static_cast<std::size_t>(n), -1);
  std::vector<rank_outcome> out(static_cast<std::size_t>(n));
  std::fflush(nullptr);
  for (int r = 0; r < n; ++r) {
    int p[2];
    if (::pipe(p) != 0) throw std::runtime_error("fork_ranks: pipe failed");
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork_ranks: fork failed");
    if (pid == 0) {
      ::close(p[0]);
      std::string msg;
      int code = 0;
      try {
        fn(r);
      } catch (const std::exception& e) {
        msg = e.what();
        code = 1;
      } catch (...) {
        msg = "unknown exception";
        code = 1;
      }
      std::size_t off = 0;
      while (off < msg.size()) {
        const auto w = ::write(p[1], msg.data() + off, msg.size() - off);
        if (w <= 0) break;
        off += static_cast<std::size_t>(w);
      }
      ::close(p[1]);
      ::_exit(code);
    }
    ::close(p[1]);
    pids[static_cast<std::size_t>(r)] = pid;
    fds[static_cast<std::size_t>(r)] = p[0];
  }
  const auto deadline = std::chrono::steady_clock::now() + hang_guard;
  std::vector<int> status(static_cast<std::size_t>(n), -1);
  int left = n;
  while (left > 0) {
    for (int r = 0; r < n; ++r) {
      auto& pid = pids[static_cast<std::size_t>(r)];
      if (pid < 0) continue;
      int st = 0;
      if (::waitpid(pid, &st, WNOHANG) == pid) {
        status[static_cast<std::size_t>(r)] = st;
        pid = -1;
        --left;
      }
    }
    if (left == 0) break;
    if (std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < n; ++r) {
        auto& pid = pids[static_cast<std::size_t>(r)];
        if (pid < 0) continue;
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
        out[static_cast<std::size_t>(r)].message = "rank " + std::to_string(r) + " hung past the test's hang guard";
        pid = -1;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (int r = 0; r < n; ++r) {
    auto& o = out[static_cast<std::size_t>(r)];
    std::string msg;
    char buf[4096];
    for (;;) {
      const auto got = ::read(fds[static_cast<std::size_t>(r)], buf, sizeof buf);
      if (got <= 0) break;
      msg.append(buf, static_cast<std::size_t>(got));
    }
    ::close(fds[static_cast<std::size_t>(r)]);
    const int st = status[static_cast<std::size_t>(r)];
    if (st == -1) continue;  // killed: message set above
    o.ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
    o.message = msg;
    if (!o.ok && msg.empty()) {
      o.message = WIFSIGNALED(st) ? "rank " + std::to_string(r) + " died of signal " + std::to_string(WTERMSIG(st))
                                  : "rank " + std::to_string(r) + " exited with " + std::to_string(WEXITSTATUS(st));
    }
  }
  return out;
}

}  // namespace partrain::testing
