// partrain/rendezvous/detail/socket.hpp: the few POSIX socket pieces the TCP store needs (built on
// core/detail/fd.hpp), with a deadline on every blocking step (connect, send, receive).
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <thread>
#include <utility>

#include <partrain/core/detail/fd.hpp>
#include <partrain/core/error.hpp>

namespace partrain::inline v0::detail {

// "host:port", with brackets around an IPv6 literal.
[[nodiscard]] inline std::string endpoint_name(const std::string& host, std::uint16_t port) {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

// getaddrinfo as a RAII list.
class address_list {
 public:
  address_list(const std::string& host, std::uint16_t port, bool passive) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = passive ? AI_PASSIVE : 0;
    const std::string service = std::to_string(port);
    const int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &list_);
    if (rc != 0) {
      throw config_error("cannot resolve host '" + host + "': " + ::gai_strerror(rc) +
                         " (expected a host name or an IPv4/IPv6 address)");
    }
  }
  address_list(const address_list&) = delete;
  address_list& operator=(const address_list&) = delete;
  ~address_list() {
    if (list_) ::freeaddrinfo(list_);
  }
  [[nodiscard]] const addrinfo* begin() const noexcept { return list_; }

 private:
  addrinfo* list_ = nullptr;
};

[[nodiscard]] inline std::uint16_t local_port(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    throw communication_error("getsockname failed: " + errno_text(errno));
  }
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&ss)->sin6_port);
  return ntohs(reinterpret_cast<const sockaddr_in*>(&ss)->sin_port);
}

// A listening socket on host:port (port 0 = the kernel picks one; read it with local_port).
[[nodiscard]] inline unique_fd listen_tcp(const std::string& host, std::uint16_t port, int backlog = 512) {
  address_list addrs(host, port, true);
  int last_err = 0;
  for (const addrinfo* a = addrs.begin(); a; a = a->ai_next) {
    unique_fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!fd) {
      last_err = errno;
      continue;
    }
    const int one = 1;
    // SO_REUSEADDR lets a restarted job rebind a port in TIME_WAIT; it does not allow two
    // live listeners on one port, so "port in use" is still reported.
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0) {
      last_err = errno;
      continue;
    }
    if (::listen(fd.get(), backlog) != 0) {
      last_err = errno;
      continue;
    }
    return fd;
  }
  if (last_err == EADDRINUSE) {
    throw communication_error("cannot listen on " + endpoint_name(host, port) + ": port " + std::to_string(port) +
                              " is already in use (another job or program holds it: choose another MASTER_PORT; "
                              "a single process may also pass 0 for a free one)");
  }
  throw communication_error("cannot listen on " + endpoint_name(host, port) + ": " + errno_text(last_err));
}

// fd, when it is a listening TCP socket bound to `port` (a launcher bound it and let this process
// inherit it, so no other program can take the port in between): that socket, owned; else none.
[[nodiscard]] inline unique_fd adopt_listener(int fd, std::uint16_t port) {
  if (fd < 0 || port == 0) return unique_fd{};
  int listening = 0;
  socklen_t len = sizeof listening;
  if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening) return unique_fd{};
  sockaddr_storage ss{};
  socklen_t slen = sizeof ss;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &slen) != 0) return unique_fd{};
  if (ss.ss_family != AF_INET && ss.ss_family != AF_INET6) return unique_fd{};
  if (local_port(fd) != port) return unique_fd{};
  return unique_fd(fd);
}

// A port that was free a moment ago on host (bind to 0, read, close). Another process may
// still take it before it is used: callers that can, pass port 0 to the server instead.
[[nodiscard]] inline std::uint16_t find_free_port(const std::string& host = "127.0.0.1") {
  unique_fd fd = listen_tcp(host, 0, 1);
  return local_port(fd.get());
}

// Connects to host:port, retrying (the server may not be up yet) until deadline.
// who (e.g. "rank 3: ") prefixes the error.
[[nodiscard]] inline unique_fd connect_tcp(const std::string& host, std::uint16_t port, deadline_clock::time_point deadline,
                                           const std::string& who = {}) {
  std::string last = "no address";
  auto backoff = std::chrono::milliseconds(10);
  for (;;) {
    {
      address_list addrs(host, port, false);
      for (const addrinfo* a = addrs.begin(); a; a = a->ai_next) {
        unique_fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
        if (!fd) {
          last = errno_text(errno);
          continue;
        }
        int rc = ::connect(fd.get(), a->ai_addr, a->ai_addrlen);
        if (rc != 0 && errno == EINPROGRESS) {
          if (!wait_fd(fd.get(), POLLOUT, deadline)) {
            last = "connect timed out";
            continue;
          }
          int err = 0;
          socklen_t len = sizeof err;
          ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
          rc = err == 0 ? 0 : -1;
          errno = err;
        }
        if (rc == 0) {
          const int one = 1;
          ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          return fd;
        }
        last = errno_text(errno);
      }
    }
    const auto now = deadline_clock::now();
    if (now >= deadline) break;
    std::this_thread::sleep_for(std::min<deadline_clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
  }
  throw timeout_error(who + "cannot connect to the store at " + endpoint_name(host, port) + " (" + last +
                      "); is the master (rank 0 or the launcher) running and reachable?");
}

// Writes all bytes or throws; the socket is non-blocking, so a stuck peer hits the deadline.
inline void send_all(int fd, std::span<const std::byte> data, deadline_clock::time_point deadline, const std::string& what) {
  while (!data.empty()) {
    const ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n > 0) {
      data = data.subspan(static_cast<std::size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait_fd(fd, POLLOUT, deadline)) throw timeout_error(what + ": timed out sending");
      continue;
    }
    throw communication_error(what + ": send failed: " + errno_text(errno));
  }
}

// Reads exactly out.size() bytes or throws (timeout_error at the deadline, communication_error
// when the peer closed).
inline void recv_all(int fd, std::span<std::byte> out, deadline_clock::time_point deadline, const std::string& what) {
  while (!out.empty()) {
    const ssize_t n = ::recv(fd, out.data(), out.size(), 0);
    if (n > 0) {
      out = out.subspan(static_cast<std::size_t>(n));
      continue;
    }
    if (n == 0) throw communication_error(what + ": connection closed by the store");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!wait_fd(fd, POLLIN, deadline)) throw timeout_error(what + ": timed out waiting for the store's reply");
      continue;
    }
    throw communication_error(what + ": receive failed: " + errno_text(errno));
  }
}

// Rethrows the communication_error in flight (the socket layer's, which knows no caller) with
// the calling client's rank and operation (and, for a timeout, the deadline); the text stays.
// Both store clients (tcp_store.hpp, torch_store.hpp) call it from their catch blocks.
[[noreturn]] inline void rethrow_sited(int rank, std::string operation, std::chrono::milliseconds timeout) {
  try {
    throw;
  } catch (const timeout_error& e) {
    throw timeout_error(unprefixed(e.what()), error_site{.rank = rank, .operation = std::move(operation), .timeout = timeout});
  } catch (const communication_error& e) {
    throw communication_error(unprefixed(e.what()), error_site{.rank = rank, .operation = std::move(operation)});
  }
}

}  // namespace partrain::inline v0::detail
