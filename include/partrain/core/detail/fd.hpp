// partrain/core/detail/fd.hpp: an owned POSIX file descriptor and the small helpers around it
// (errno text, non-blocking mode, the clock every deadline is counted on).
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <utility>

#include <partrain/core/error.hpp>

namespace partrain::inline v0::detail {

using deadline_clock = std::chrono::steady_clock;

// An owned file descriptor; closed on destruction.
class unique_fd {
 public:
  unique_fd() noexcept = default;
  explicit unique_fd(int fd) noexcept : fd_(fd) {}
  unique_fd(unique_fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  unique_fd& operator=(unique_fd&& o) noexcept {
    if (this != &o) reset(std::exchange(o.fd_, -1));
    return *this;
  }
  unique_fd(const unique_fd&) = delete;
  unique_fd& operator=(const unique_fd&) = delete;
  ~unique_fd() { reset(); }

  [[nodiscard]] int get() const noexcept { return fd_; }
  [[nodiscard]] explicit operator bool() const noexcept { return fd_ >= 0; }
  [[nodiscard]] int release() noexcept { return std::exchange(fd_, -1); }
  void reset(int fd = -1) noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

[[nodiscard]] inline std::string errno_text(int err) { return std::string(std::strerror(err)); }

inline void set_nonblocking(int fd, bool on) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags < 0 || ::fcntl(fd, F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK)) < 0) {
    throw communication_error("fcntl(O_NONBLOCK) failed: " + errno_text(errno));
  }
}

// Waits for events on fd until deadline; false on timeout.
[[nodiscard]] inline bool wait_fd(int fd, short events, deadline_clock::time_point deadline) {
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - deadline_clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1000)));
    if (rc > 0) return true;
    if (rc < 0 && errno != EINTR) throw communication_error("poll failed: " + errno_text(errno));
  }
}

}  // namespace partrain::inline v0::detail
