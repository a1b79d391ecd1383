// partrain/comm/detail/sigpipe.hpp: keeps a write to a dead peer's socket from killing the rank.
// Gloo writes with writev(), which cannot pass MSG_NOSIGNAL: when the peer has just died, the
// kernel raises SIGPIPE, whose default action ends the process before Gloo can report the broken
// connection (and before our error can name the rank and operation). Python ignores SIGPIPE at
// start-up, so torch.distributed never meets this; a C++ program must opt out itself.
#pragma once

#include <signal.h>

namespace partrain::inline v0::detail::gloo {

inline void swallow_signal(int) noexcept {}

// Where SIGPIPE still has its default action, installs a handler that does nothing: the write
// then fails with EPIPE. A user's own choice (SIG_IGN or a handler) is kept. A handler rather
// than SIG_IGN because exec resets handlers but keeps SIG_IGN: programs the rank starts later
// still get the default behaviour. Returns whether it installed the handler.
inline bool survive_sigpipe() noexcept {
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) != 0) return false;
  if ((current.sa_flags & SA_SIGINFO) != 0 || current.sa_handler != SIG_DFL) return false;
  struct sigaction mine {};
  mine.sa_handler = &swallow_signal;
  mine.sa_flags = SA_RESTART;  // other system calls of the writing thread go on undisturbed
  ::sigemptyset(&mine.sa_mask);
  return ::sigaction(SIGPIPE, &mine, nullptr) == 0;
}

}  // namespace partrain::inline v0::detail::gloo
