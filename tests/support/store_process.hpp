// A tcp_store_server in a forked process of its own, for tests that fork ranks. A test process
// must not fork while one of its threads may hold a lock the child needs: under AddressSanitizer
// (GCC 12's libasan takes no allocator locks around fork) a child forked while the parent's server
// thread was allocating inherits the allocator's lock held and deadlocks at its first thread start
// (seen in CI: a replica hung in pthread_getattr_np's free). With the server here, the test process
// keeps a single thread through every fork.
#pragma once

#include <partrain/rendezvous/tcp_store_server.hpp>

#include "fork_ranks.hpp"

#include <csignal>
#include <cstdint>
#include <cstdio>
#include <stdexcept>

#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

namespace partrain::testing {

class store_process {
 public:
  explicit store_process(partrain::tcp_store_server_options opts = {}) {
    require_single_thread();
    int p[2];
    if (::pipe(p) != 0) throw std::runtime_error("store_process: pipe failed");
    std::fflush(nullptr);
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("store_process: fork failed");
    if (pid_ == 0) {
      ::close(p[0]);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlives the test
      std::uint16_t port = 0;
      try {
        partrain::tcp_store_server server(opts);
        port = server.port();
        (void)!::write(p[1], &port, sizeof port);
        ::close(p[1]);
        for (;;) ::pause();  // serves until the test kills it
      } catch (...) {
        ::_exit(1);  // the parent reads no port and says so
      }
    }
    ::close(p[1]);
    const auto got = ::read(p[0], &port_, sizeof port_);
    ::close(p[0]);
    if (got != static_cast<ssize_t>(sizeof port_)) {
      stop();
      throw std::runtime_error("store_process: the server process did not start");
    }
  }
  store_process(const store_process&) = delete;
  store_process& operator=(const store_process&) = delete;
  ~store_process() { stop(); }

  [[nodiscard]] std::uint16_t port() const noexcept { return port_; }

 private:
  void stop() noexcept {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  pid_t pid_ = -1;
  std::uint16_t port_ = 0;
};

}  // namespace partrain::testing
