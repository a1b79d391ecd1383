// A FIFO in a test folder, and a deadline for calls that must refuse it without opening it: a call
// that opens a FIFO for reading blocks until a writer comes, so after the deadline the test opens
// it for writing and closes it again, which lets the blocked call (and the test) go on and fail.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <filesystem>
#include <future>
#include <stdexcept>
#include <string>
#include <utility>

namespace partrain::testing {

inline std::filesystem::path make_fifo(const std::filesystem::path& p) {
  if (::mkfifo(p.c_str(), 0600) != 0) throw std::runtime_error("mkfifo '" + p.string() + "': " + std::strerror(errno));
  return p;
}

// Runs f() on another thread and returns the what() of the exception it throws ("(no error)" if
// none). When f has not returned within `limit` (blocked on `fifo`), the FIFO is opened for
// writing until f returns, and the text says it blocked.
template <class F>
[[nodiscard]] std::string error_within(std::chrono::milliseconds limit, const std::filesystem::path& fifo, F f) {
  auto result = std::async(std::launch::async, [f = std::move(f)]() mutable -> std::string {
    try {
      f();
    } catch (const std::exception& e) {
      return e.what();
    }
    return "(no error)";
  });
  if (result.wait_for(limit) == std::future_status::ready) return result.get();
  while (result.wait_for(std::chrono::milliseconds(20)) != std::future_status::ready) {
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0) ::close(fd);
  }
  return "blocked for more than " + std::to_string(limit.count()) + " ms on '" + fifo.string() + "' (then: " +
         result.get() + ")";
}

}  // namespace partrain::testing
