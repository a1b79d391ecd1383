// partrain/launch/spawn.hpp: partrain::spawn(n, fn), like torch.multiprocessing.spawn. Starts n
// processes of the current program (fork), each calling fn(rank) with the torchrun variables
// set (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, and a fresh
// PARTRAIN_STORE_TOKEN: the job's identity), so fn can call init_process_group("env://"). When one rank fails the others are stopped and the
// error names the rank and how it ended.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <concepts>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <partrain/config.hpp>
#include <partrain/core/error.hpp>
#include <partrain/launch/process.hpp>
// The listener and the job token only where spawn's body is compiled (see partrain/config.hpp).
#if PARTRAIN_DEFINITIONS
#include <partrain/rendezvous/detail/socket.hpp>
#include <partrain/rendezvous/job.hpp>
#endif

namespace partrain::inline v0 {

struct spawn_options {
  // All ranks must have finished within this; then the rest are stopped and timeout_error thrown.
  std::chrono::milliseconds timeout{300'000};
  std::chrono::milliseconds grace{5'000};  // SIGTERM, then SIGKILL after this
  std::string master_addr = "127.0.0.1";
  // 0 = a free one. Either way spawn binds it before starting the ranks and hands the listening
  // socket to rank 0's store, so no other program can take the port in between.
  std::uint16_t master_port = 0;
  std::vector<std::pair<std::string, std::string>> env{};  // more variables for every rank
  // Capture each rank's output: echoed with a "[rank r] " prefix, and its last lines kept
  // for the error. Off: ranks write straight to our stdout/stderr.
  bool capture_output = true;
  bool echo_output = true;
  std::size_t keep_lines = 20;
};

// A rank of spawn() failed (or several did: the first one is named). rank() (error's) is that
// rank, operation() is "spawn".
class process_error : public communication_error {
 public:
  process_error(const std::string& what, int rank, exit_status status, std::vector<std::string> last_lines, std::vector<pid_t> pids)
      : communication_error(what, error_site{.rank = rank, .operation = "spawn"}),
        status_(status),
        last_lines_(std::move(last_lines)),
        pids_(std::move(pids)) {}
  [[nodiscard]] const exit_status& status() const noexcept { return status_; }
  [[nodiscard]] const std::vector<std::string>& last_lines() const noexcept { return last_lines_; }
  [[nodiscard]] const std::vector<pid_t>& pids() const noexcept { return pids_; }

 private:
  exit_status status_;
  std::vector<std::string> last_lines_;
  std::vector<pid_t> pids_;
};

struct spawn_result {
  std::vector<pid_t> pids;  // one per rank, all reaped
  std::uint16_t master_port = 0;
};

namespace detail::launch {
// spawn's body, for any fn: one definition (compiled once in PARTRAIN_COMPILED mode).
PARTRAIN_LINKAGE spawn_result spawn_ranks(int nprocs, const std::function<int(int)>& fn, spawn_options opts);
}  // namespace detail::launch

// fn(rank) runs in n forked processes; its return value (if an int) is the exit code. Refused
// with a config_error when CUDA is already initialised in this process (use partrun then).
// Returns when every rank exited 0; otherwise throws process_error naming the first rank that
// failed (exit code or signal, and its last output lines), or timeout_error naming the ranks
// still running. No rank survives the call either way.
template <class F>
spawn_result spawn(int nprocs, F&& fn, spawn_options opts = {}) {
  static_assert(std::invocable<F&, int>, "partrain::spawn: fn must be callable as fn(int rank)");
  static_assert(std::is_void_v<std::invoke_result_t<F&, int>> || std::convertible_to<std::invoke_result_t<F&, int>, int>,
                "partrain::spawn: fn(rank) must return void or an exit code convertible to int");
  return detail::launch::spawn_ranks(
      nprocs,
      [&fn](int rank) -> int {
        if constexpr (std::is_void_v<std::invoke_result_t<F&, int>>) {
          fn(rank);
          return 0;
        } else {
          return static_cast<int>(fn(rank));
        }
      },
      std::move(opts));
}

#if PARTRAIN_DEFINITIONS
namespace detail::launch {

// Runs in the child: the rank's environment, then fn; an exception is printed and becomes exit 1.
PARTRAIN_LINKAGE int run_rank(const std::function<int(int)>& fn, int rank, int nprocs, const spawn_options& opts,
                              std::uint16_t port, const std::string& token, int listen_fd) {
  ::setenv("RANK", std::to_string(rank).c_str(), 1);
  ::setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
  ::setenv("WORLD_SIZE", std::to_string(nprocs).c_str(), 1);
  ::setenv("LOCAL_WORLD_SIZE", std::to_string(nprocs).c_str(), 1);
  ::setenv("GROUP_RANK", "0", 1);
  ::setenv("MASTER_ADDR", opts.master_addr.c_str(), 1);
  ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  // A job of its own, even inside a rank some launcher started: rank 0 hosts the store (not the
  // outer launcher's agent), and its token keeps other jobs on this port out.
  ::setenv("PARTRAIN_USE_AGENT_STORE", "0", 1);
  ::setenv("PARTRAIN_STORE_TOKEN", token.c_str(), 1);
  ::unsetenv("PARTRAIN_RESTART_COUNT");
  if (rank == 0) {
    ::setenv("PARTRAIN_STORE_LISTEN_FD", std::to_string(listen_fd).c_str(), 1);
  } else {
    ::close(listen_fd);  // rank 0's alone
    ::unsetenv("PARTRAIN_STORE_LISTEN_FD");
  }
  for (const auto& [k, v] : opts.env) ::setenv(k.c_str(), v.c_str(), 1);
  try {
    return fn(rank);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d failed: %s\n", rank, e.what());
  } catch (...) {
    std::fprintf(stderr, "rank %d failed: an exception not derived from std::exception\n", rank);
  }
  return 1;
}

PARTRAIN_LINKAGE spawn_result spawn_ranks(int nprocs, const std::function<int(int)>& fn, spawn_options opts) {
  if (nprocs < 1) throw config_error("spawn: nprocs must be at least 1, got " + std::to_string(nprocs));
  // Bound here, before any rank starts: a port in use is reported now, and a port we chose
  // cannot be taken by another program before rank 0's store listens on it.
  unique_fd listener = listen_tcp(opts.master_addr, opts.master_port);
  const std::uint16_t port = local_port(listener.get());
  const std::string token = rdzv::random_token();

  std::vector<child_process> children;
  children.reserve(static_cast<std::size_t>(nprocs));
  spawn_result result{.pids = {}, .master_port = port};
  for (int r = 0; r < nprocs; ++r) {
    child_options co;
    co.capture_output = opts.capture_output;
    co.keep_lines = opts.keep_lines;
    if (opts.capture_output && opts.echo_output) {
      co.on_line = [r](std::string_view line) {
        std::fprintf(stderr, "[rank %d] %.*s\n", r, static_cast<int>(line.size()), line.data());
      };
    }
    children.push_back(
        child_process::fork([&, r] { return run_rank(fn, r, nprocs, opts, port, token, listener.get()); },
                            std::move(co)));
    result.pids.push_back(children.back().pid());
  }
  listener.reset();  // rank 0 holds it now

  supervise_options so;
  so.timeout = opts.timeout;
  so.grace = opts.grace;
  const auto out = supervise(children, so);
  if (out.ok()) return result;

  if (out.how == supervise_outcome::result::timed_out) {
    std::string running;
    int first_running = -1;
    for (int r = 0; r < nprocs; ++r) {
      if (!out.stopped_by_us[static_cast<std::size_t>(r)]) continue;
      running += (running.empty() ? "" : ", ") + std::to_string(r);
      if (first_running < 0) first_running = r;
    }
    // The parent is no rank: peer() is the first rank still running.
    throw timeout_error("spawn: rank(s) " + running + " still running after " + std::to_string(opts.timeout.count()) +
                            " ms; all ranks were stopped",
                        error_site{.operation = "spawn", .peer = first_running, .timeout = opts.timeout});
  }
  const int bad = out.first_failed;
  const auto& st = out.statuses[static_cast<std::size_t>(bad)];
  const auto& tail = children[static_cast<std::size_t>(bad)].last_lines();
  std::string msg = "spawn: rank " + std::to_string(bad) + " (pid " + std::to_string(result.pids[static_cast<std::size_t>(bad)]) +
                    ") " + st.describe() + "; the other ranks were stopped";
  if (!tail.empty()) {
    msg += "\nlast output of rank " + std::to_string(bad) + ":";
    for (const auto& l : tail) msg += "\n  " + l;
  }
  throw process_error(msg, bad, st, {tail.begin(), tail.end()}, result.pids);
}

}  // namespace detail::launch
#endif

}  // namespace partrain::inline v0
