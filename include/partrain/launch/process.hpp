// partrain/launch/process.hpp: child-process supervision shared by partrain::spawn and
// the partrun launcher. A child_process is a forked function or an exec'd program in its own
// process group, optionally with its output captured line by line; supervise() watches a set
// of them and, when one fails, stops the rest (SIGTERM, then SIGKILL after a grace period).
// Nothing a child started outlives it: its whole process group is killed when it is reaped,
// and PR_SET_PDEATHSIG takes the child down if the supervisor itself dies.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <partrain/core/detail/fd.hpp>
#include <partrain/core/error.hpp>

namespace partrain::inline v0 {

namespace detail::launch {

// Whether a descriptor's target is one of the NVIDIA driver's device files (/dev/nvidiactl,
// /dev/nvidia0, /dev/nvidia-uvm, ...).
[[nodiscard]] inline bool is_nvidia_device_file(std::string_view target) noexcept {
  return target.starts_with("/dev/nvidia");
}

// Whether CUDA is initialised in this process: the driver opens its device files at cuInit and
// keeps them open. Merely loading libcuda is not enough: the CUDA runtime loads it when a program
// with device code starts (seen on an H200), before any CUDA call, and a fork then is harmless.
// An unreadable descriptor folder (not Linux): false.
[[nodiscard]] inline bool cuda_initialised(const char* fd_dir = "/proc/self/fd") {
  DIR* dir = ::opendir(fd_dir);
  if (!dir) return false;
  bool found = false;
  const std::string base = std::string(fd_dir) + "/";
  while (const dirent* e = ::readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    char target[256];
    const ssize_t n = ::readlink((base + e->d_name).c_str(), target, sizeof target - 1);
    if (n > 0 && is_nvidia_device_file(std::string_view(target, static_cast<std::size_t>(n)))) {
      found = true;
      break;
    }
  }
  ::closedir(dir);
  return found;
}

// A forked child of a process with CUDA initialised inherits a driver state that does not work
// there (every CUDA call fails, or hangs): refuse before forking, saying what to do instead.
inline void refuse_fork_after_cuda(const char* fd_dir = "/proc/self/fd") {
  if (cuda_initialised(fd_dir)) {
    throw config_error(
        "spawn (child_process::fork): CUDA is already initialised in this process (it holds the driver's /dev/nvidia* "
        "files open), and a forked child cannot use CUDA. Launch the ranks with exec instead (partrun, or "
        "child_process::exec), or make no CUDA call in the parent before spawn and initialise CUDA in each rank");
  }
}

}  // namespace detail::launch

// "SIGKILL", "SIGSEGV", ... ("signal 42" for one without a name here).
[[nodiscard]] inline std::string signal_name(int sig) {
  switch (sig) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGTRAP: return "SIGTRAP";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGUSR1: return "SIGUSR1";
    case SIGSEGV: return "SIGSEGV";
    case SIGUSR2: return "SIGUSR2";
    case SIGPIPE: return "SIGPIPE";
    case SIGALRM: return "SIGALRM";
    case SIGTERM: return "SIGTERM";
    case SIGXCPU: return "SIGXCPU";
    case SIGXFSZ: return "SIGXFSZ";
    case SIGSYS: return "SIGSYS";
    default: return "signal " + std::to_string(sig);
  }
}

// How a process ended.
struct exit_status {
  bool signaled = false;
  int code = 0;    // exit code, when !signaled
  int signal = 0;  // terminating signal, when signaled
  bool core_dumped = false;

  [[nodiscard]] bool ok() const noexcept { return !signaled && code == 0; }
  [[nodiscard]] static exit_status from_wait(int status) noexcept {
    exit_status s;
    if (WIFSIGNALED(status)) {
      s.signaled = true;
      s.signal = WTERMSIG(status);
      s.core_dumped = WCOREDUMP(status);
    } else {
      s.code = WEXITSTATUS(status);
    }
    return s;
  }
  // "exited with code 3", "was killed by signal SIGKILL (9)".
  [[nodiscard]] std::string describe() const {
    if (!signaled) return "exited with code " + std::to_string(code);
    return "was killed by signal " + signal_name(signal) + " (" + std::to_string(signal) + ")" +
           (core_dumped ? ", core dumped" : "");
  }
  // The shell's convention: 128 + signal for a signaled process.
  [[nodiscard]] int shell_code() const noexcept { return signaled ? 128 + signal : code; }
};

struct child_options {
  // Capture stdout and stderr (merged) through a pipe; otherwise the child shares ours.
  bool capture_output = false;
  std::size_t keep_lines = 20;  // the tail kept for error messages
  // Called for every complete captured line (without the newline), in the supervisor.
  std::function<void(std::string_view)> on_line;
};

class child_process {
 public:
  // Forks; the child runs fn and _exits with its result (exceptions are fn's business). Refused
  // (config_error) once CUDA is initialised in this process: see detail::launch::refuse_fork_after_cuda.
  [[nodiscard]] static child_process fork(const std::function<int()>& fn, child_options opts = {}) {
    detail::launch::refuse_fork_after_cuda();
    pipe_pair out = make_output_pipe(opts.capture_output);
    std::fflush(nullptr);  // or buffered output would be written twice, by parent and child
    const pid_t parent = ::getpid();
    signal_block block;
    const pid_t pid = ::fork();
    if (pid < 0) throw communication_error("fork failed: " + detail::errno_text(errno));
    if (pid == 0) {
      enter_child(parent, out, block);
      int code = 1;
      try {
        code = fn();
      } catch (...) {
      }
      std::fflush(nullptr);
      ::_exit(code);
    }
    return child_process(pid, std::move(out.read), std::move(opts));
  }

  // Forks and runs program (found on PATH when it has no '/') with argv and exactly env
  // ("NAME=value" entries). A program that cannot be executed is reported here, by errno.
  [[nodiscard]] static child_process exec(const std::string& program, const std::vector<std::string>& args,
                                          const std::vector<std::string>& env, child_options opts = {}) {
    // Everything the child needs is built before fork: after it, only async-signal-safe calls.
    std::vector<char*> argv, envp;
    argv.push_back(const_cast<char*>(program.c_str()));
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    const char* path_env = std::getenv("PATH");
    const std::string path = path_env ? path_env : "/usr/local/bin:/usr/bin:/bin";
    std::vector<std::string> candidates;
    if (program.find('/') != std::string::npos) {
      candidates.push_back(program);
    } else {
      std::size_t start = 0;
      for (;;) {
        const auto colon = path.find(':', start);
        const auto dir = path.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
        candidates.push_back((dir.empty() ? "." : dir) + "/" + program);
        if (colon == std::string::npos) break;
        start = colon + 1;
      }
    }

    pipe_pair out = make_output_pipe(opts.capture_output);
    int err_pipe[2];  // carries exec's errno; closed by a successful exec (CLOEXEC)
    if (::pipe2(err_pipe, O_CLOEXEC) != 0) throw communication_error("pipe2 failed: " + detail::errno_text(errno));
    detail::unique_fd err_read(err_pipe[0]), err_write(err_pipe[1]);
    std::fflush(nullptr);
    const pid_t parent = ::getpid();
    signal_block block;
    const pid_t pid = ::fork();
    if (pid < 0) throw communication_error("fork failed: " + detail::errno_text(errno));
    if (pid == 0) {
      enter_child(parent, out, block);
      int e = ENOENT;
      for (const auto& c : candidates) {
        ::execve(c.c_str(), argv.data(), envp.data());
        if (errno != ENOENT) e = errno;  // remember "permission denied" over "not found"
      }
      [[maybe_unused]] auto n = ::write(err_write.get(), &e, sizeof e);
      ::_exit(127);
    }
    err_write.reset();
    child_process child(pid, std::move(out.read), std::move(opts));
    int e = 0;
    ssize_t n;
    do {
      n = ::read(err_read.get(), &e, sizeof e);
    } while (n < 0 && errno == EINTR);
    if (n == static_cast<ssize_t>(sizeof e)) {
      child.wait_blocking();
      throw config_error("cannot execute '" + program + "': " + detail::errno_text(e) +
                         " (expected an executable file, or a program on PATH)");
    }
    return child;
  }

  child_process(child_process&& o) noexcept
      : pid_(std::exchange(o.pid_, -1)),
        status_(std::exchange(o.status_, std::nullopt)),
        out_(std::move(o.out_)),
        opts_(std::move(o.opts_)),
        partial_(std::move(o.partial_)),
        tail_(std::move(o.tail_)) {}
  child_process& operator=(child_process&&) = delete;
  child_process(const child_process&) = delete;
  child_process& operator=(const child_process&) = delete;
  ~child_process() {
    if (pid_ > 0 && !status_) {
      signal_group(SIGKILL);
      wait_blocking();
    }
  }

  [[nodiscard]] pid_t pid() const noexcept { return pid_; }
  [[nodiscard]] bool running() const noexcept { return !status_.has_value(); }
  [[nodiscard]] const std::optional<exit_status>& status() const noexcept { return status_; }
  [[nodiscard]] int output_fd() const noexcept { return out_.get(); }
  [[nodiscard]] const std::deque<std::string>& last_lines() const noexcept { return tail_; }

  // Sends sig to the child's whole process group (the child and whatever it started).
  void signal_group(int sig) noexcept {
    if (pid_ > 0 && !status_) {
      if (::kill(-pid_, sig) != 0) ::kill(pid_, sig);  // before the child's setpgid took effect
    }
  }

  // Non-blocking: the exit status once the child has ended (and is reaped), else nullopt.
  std::optional<exit_status> poll() {
    if (status_) return status_;
    siginfo_t info{};
    // WNOWAIT: look without reaping, so the pid (and with it the process group id) stays
    // ours while the group's leftovers are killed below.
    if (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0) {
      return std::nullopt;
    }
    reap();
    return status_;
  }

  // Blocks until the child ends (callers kill it first, or know it is ending).
  exit_status wait_blocking() {
    if (!status_) {
      siginfo_t info{};
      while (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOWAIT) != 0 && errno == EINTR) {
      }
      reap();
    }
    return *status_;
  }

  // After the child ended: reads the rest of its output, until EOF or (when something that
  // escaped its process group still holds the pipe) until the deadline.
  void finish_output(std::chrono::milliseconds limit = std::chrono::milliseconds(500)) {
    const auto deadline = detail::deadline_clock::now() + limit;
    while (drain_output()) {
      if (!detail::wait_fd(out_.get(), POLLIN, deadline)) {
        drain_output();
        if (!partial_.empty()) line(partial_);
        partial_.clear();
        out_.reset();
        return;
      }
    }
  }

  // Reads what the child has written so far; returns false once the pipe is at EOF.
  bool drain_output() {
    if (!out_) return false;
    char buf[4096];
    for (;;) {
      const ssize_t n = ::read(out_.get(), buf, sizeof buf);
      if (n > 0) {
        take(std::string_view(buf, static_cast<std::size_t>(n)));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return true;
      // EOF (or a read error): flush the last partial line.
      if (!partial_.empty()) {
        line(partial_);
        partial_.clear();
      }
      out_.reset();
      return false;
    }
  }

 private:
  struct pipe_pair {
    detail::unique_fd read, write;
  };

  child_process(pid_t pid, detail::unique_fd out, child_options opts) : pid_(pid), out_(std::move(out)), opts_(std::move(opts)) {
    ::setpgid(pid_, pid_);  // also done in the child: whichever runs first wins the race
  }

  static pipe_pair make_output_pipe(bool capture) {
    if (!capture) return {};
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) throw communication_error("pipe2 failed: " + detail::errno_text(errno));
    pipe_pair pp{detail::unique_fd(p[0]), detail::unique_fd(p[1])};
    detail::set_nonblocking(pp.read.get(), true);
    return pp;
  }

  // Signals are blocked across fork, so none reaches the child while it still runs the
  // supervisor's handlers (a test framework's SIGTERM handler, say); the child resets them first.
  class signal_block {
   public:
    signal_block() noexcept {
      sigset_t all;
      sigfillset(&all);
      ::pthread_sigmask(SIG_SETMASK, &all, &saved_);
    }
    signal_block(const signal_block&) = delete;
    signal_block& operator=(const signal_block&) = delete;
    ~signal_block() { restore(); }
    void restore() noexcept { ::pthread_sigmask(SIG_SETMASK, &saved_, nullptr); }

   private:
    sigset_t saved_{};
  };

  // In the child, right after fork: default signal handling, own process group, death with
  // the supervisor, output to the pipe.
  static void enter_child(pid_t parent, pipe_pair& out, signal_block& block) noexcept {
    // What exec does: caught signals go back to their default, ignored ones stay ignored.
    for (int sig = 1; sig < NSIG; ++sig) {
      struct sigaction sa {};
      if (sig == SIGKILL || sig == SIGSTOP || ::sigaction(sig, nullptr, &sa) != 0) continue;
      if (!(sa.sa_flags & SA_SIGINFO) && (sa.sa_handler == SIG_DFL || sa.sa_handler == SIG_IGN)) continue;
      ::signal(sig, SIG_DFL);
    }
    block.restore();
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(126);  // the supervisor died before prctl took effect
    if (out.write) {
      ::dup2(out.write.get(), STDOUT_FILENO);
      ::dup2(out.write.get(), STDERR_FILENO);
      static_cast<void>(out.read.release());  // closed by exec (CLOEXEC) or by _exit; no destructor runs
      static_cast<void>(out.write.release());
    }
  }

  void reap() {
    // The leader is a zombie now, so -pid_ still names only its own group: end the stragglers.
    ::kill(-pid_, SIGKILL);
    int st = 0;
    pid_t r;
    do {
      r = ::waitpid(pid_, &st, 0);
    } while (r < 0 && errno == EINTR);
    status_ = exit_status::from_wait(st);
  }

  void take(std::string_view chunk) {
    for (;;) {
      const auto nl = chunk.find('\n');
      if (nl == std::string_view::npos) {
        partial_.append(chunk);
        // One endless line cannot grow without bound.
        if (partial_.size() > 64 * 1024) {
          line(partial_);
          partial_.clear();
        }
        return;
      }
      partial_.append(chunk.substr(0, nl));
      line(partial_);
      partial_.clear();
      chunk.remove_prefix(nl + 1);
    }
  }

  void line(const std::string& l) {
    if (opts_.on_line) opts_.on_line(l);
    if (opts_.keep_lines == 0) return;
    tail_.push_back(l);
    while (tail_.size() > opts_.keep_lines) tail_.pop_front();
  }

  pid_t pid_ = -1;
  std::optional<exit_status> status_;
  detail::unique_fd out_;
  child_options opts_;
  std::string partial_;
  std::deque<std::string> tail_;
};

struct supervise_options {
  std::chrono::milliseconds timeout{0};     // 0 = no limit on the whole run
  std::chrono::milliseconds grace{5'000};   // SIGTERM to SIGKILL
  // After the first failure, how long the others may take to end on their own before they are
  // stopped. A rank that fails makes its peers fail a moment later, and the rank noticed first
  // may be such a peer while the real cause is still running its exit path: the window lets
  // the cause be reported as failed by itself rather than as stopped by us.
  std::chrono::milliseconds settle{2'000};
  std::chrono::milliseconds poll_interval{20};
  const std::atomic<bool>* stop = nullptr;  // set (e.g. by a SIGINT handler) to stop every child
  // Called on supervise's thread once for each child that ends on its own (not stopped by us),
  // with its index and status, before anything is stopped: a launcher tells the other ranks that
  // one ended (partrun: a rank gone before it joined). Must not throw.
  std::function<void(std::size_t, const exit_status&)> on_exit{};
};

struct supervise_outcome {
  enum class result { success, failed, timed_out, interrupted };
  result how = result::success;
  int first_failed = -1;  // index of the child whose failure stopped the others
  std::vector<exit_status> statuses;
  std::vector<bool> stopped_by_us;  // ended by our SIGTERM/SIGKILL rather than by itself
  [[nodiscard]] bool ok() const noexcept { return how == result::success; }
};

// Waits on every child's output pipe (up to poll_interval) and drains what arrived.
inline void pump_output(std::span<child_process> children, std::chrono::milliseconds wait) {
  std::vector<pollfd> fds;
  std::vector<std::size_t> idx;
  for (std::size_t i = 0; i < children.size(); ++i) {
    if (children[i].output_fd() >= 0) {
      fds.push_back({children[i].output_fd(), POLLIN, 0});
      idx.push_back(i);
    }
  }
  if (fds.empty()) {
    std::this_thread::sleep_for(wait);
    return;
  }
  const int rc = ::poll(fds.data(), fds.size(), static_cast<int>(wait.count()));
  if (rc <= 0) return;
  for (std::size_t k = 0; k < fds.size(); ++k) {
    if (fds[k].revents) children[idx[k]].drain_output();
  }
}

// SIGTERM to every running child's group, SIGKILL to those still there after grace; all reaped.
// SIGCONT follows the SIGTERM (as a shell's kill does): a stopped process (SIGSTOP, a debugger's
// stop) acts on no signal but SIGKILL, and would otherwise hold the teardown for its whole grace.
inline void stop_all(std::span<child_process> children, std::chrono::milliseconds grace, std::vector<bool>* stopped = nullptr,
                     std::chrono::milliseconds poll_interval = std::chrono::milliseconds(20)) {
  for (std::size_t i = 0; i < children.size(); ++i) {
    // poll() first: a child that already ended on its own (not yet reaped) was not stopped by us.
    if (!children[i].poll().has_value()) {
      children[i].signal_group(SIGTERM);
      children[i].signal_group(SIGCONT);
      if (stopped) (*stopped)[i] = true;
    }
  }
  const auto deadline = detail::deadline_clock::now() + grace;
  for (;;) {
    bool any = false;
    for (auto& c : children) any |= !c.poll().has_value();
    if (!any || detail::deadline_clock::now() >= deadline) break;
    pump_output(children, poll_interval);
  }
  for (auto& c : children) {
    if (c.running()) c.signal_group(SIGKILL);
  }
  for (auto& c : children) {
    c.wait_blocking();
    c.finish_output();
  }
}

// Watches children until all exit 0, one fails (the rest are stopped), the timeout passes or
// stop is set. Every child is reaped, with its output drained, when this returns.
[[nodiscard]] inline supervise_outcome supervise(std::span<child_process> children, const supervise_options& opts = {}) {
  supervise_outcome out;
  out.statuses.resize(children.size());
  out.stopped_by_us.assign(children.size(), false);
  const auto deadline = opts.timeout.count() > 0 ? detail::deadline_clock::now() + opts.timeout : detail::deadline_clock::time_point::max();
  for (;;) {
    std::size_t done = 0;
    for (std::size_t i = 0; i < children.size(); ++i) {
      const bool was_running = children[i].running();
      auto st = children[i].poll();
      if (!st) continue;
      ++done;
      if (was_running && opts.on_exit) opts.on_exit(i, *st);
      if (was_running && !st->ok() && out.first_failed < 0) {
        out.first_failed = static_cast<int>(i);
        out.how = supervise_outcome::result::failed;
      }
    }
    if (out.how == supervise_outcome::result::success && done == children.size()) break;
    if (out.how == supervise_outcome::result::success) {
      if (opts.stop && opts.stop->load()) {
        out.how = supervise_outcome::result::interrupted;
      } else if (detail::deadline_clock::now() >= deadline) {
        out.how = supervise_outcome::result::timed_out;
      }
    }
    if (out.how != supervise_outcome::result::success) {
      if (out.how == supervise_outcome::result::failed) {
        const auto settle_end = detail::deadline_clock::now() + opts.settle;
        while (detail::deadline_clock::now() < settle_end && !(opts.stop && opts.stop->load())) {
          bool any = false;
          for (auto& c : children) any |= !c.poll().has_value();
          if (!any) break;
          pump_output(children, opts.poll_interval);
        }
      }
      stop_all(children, opts.grace, &out.stopped_by_us, opts.poll_interval);
      break;
    }
    pump_output(children, opts.poll_interval);
  }
  for (std::size_t i = 0; i < children.size(); ++i) {
    children[i].finish_output();
    out.statuses[i] = *children[i].status();
  }
  return out;
}

}  // namespace partrain::inline v0
