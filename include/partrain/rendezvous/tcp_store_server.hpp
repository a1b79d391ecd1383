// partrain/rendezvous/tcp_store_server.hpp: the server half of the TCP rendezvous store (torch's
// TCPStore). It runs on a background thread of the process that hosts it (rank 0, or the
// launcher's agent, which hosts one without being a client). A server with a job token refuses
// peers that do not present it, and a malformed or oversized message closes only that
// connection.
#pragma once


#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stop_token>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include <partrain/core/error.hpp>
#include <partrain/rendezvous/detail/socket.hpp>
#include <partrain/rendezvous/detail/store_protocol.hpp>

namespace partrain::inline v0 {

struct tcp_store_server_options {
  // Address to bind. Loopback by default: reaching the store from other hosts is opt-in.
  std::string host = "127.0.0.1";
  std::uint16_t port = 0;  // 0 = a free port, chosen by the kernel (read it with port())
  // When set, a connection's first message must be auth with this token, or it is closed.
  std::string token{};
  std::size_t max_message_bytes = detail::kvstore::default_max_message;
  // A connection that has not presented the token by then is closed (token servers only), so
  // idle strangers cannot hold the server's descriptors.
  std::chrono::milliseconds auth_timeout{10'000};
  // A socket already listening on `port` to serve on, taken over when it is one. -1: the one
  // named by PARTRAIN_STORE_LISTEN_FD, if any (spawn binds the port it chooses and hands the
  // socket to rank 0 that way, so no other program can take the port in between).
  int listen_fd = -1;
};

// The server alone: the launcher hosts one without being a client itself.
class tcp_store_server {
 public:
  explicit tcp_store_server(tcp_store_server_options opts = {})
      : opts_(std::move(opts)), listener_(detail::adopt_listener(inherited_fd(opts_.listen_fd), opts_.port)) {
    if (!listener_) listener_ = detail::listen_tcp(opts_.host, opts_.port);
    port_ = detail::local_port(listener_.get());
    detail::set_nonblocking(listener_.get(), true);
    int p[2];
    if (::pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) throw communication_error("pipe2 failed: " + detail::errno_text(errno));
    wake_read_.reset(p[0]);
    wake_write_.reset(p[1]);
    thread_ = std::jthread([this](std::stop_token st) { run(st); });
  }
  tcp_store_server(const tcp_store_server&) = delete;
  tcp_store_server& operator=(const tcp_store_server&) = delete;
  ~tcp_store_server() {
    thread_.request_stop();
    const char b = 1;
    [[maybe_unused]] auto n = ::write(wake_write_.get(), &b, 1);
    thread_.join();
  }

  [[nodiscard]] std::uint16_t port() const noexcept { return port_; }
  [[nodiscard]] const std::string& host() const noexcept { return opts_.host; }
  // Connections closed for a protocol error or a missing/wrong token (for tests and logs).
  [[nodiscard]] std::size_t rejected_connections() const {
    std::lock_guard lock(stats_mutex_);
    return rejected_;
  }

 private:
  [[nodiscard]] static int inherited_fd(int given) {
    if (given >= 0) return given;
    const char* v = std::getenv("PARTRAIN_STORE_LISTEN_FD");
    if (!v || !*v) return -1;
    char* end = nullptr;
    const long fd = std::strtol(v, &end, 10);
    return *end == '\0' && fd >= 0 && fd <= std::numeric_limits<int>::max() ? static_cast<int>(fd) : -1;
  }

  struct connection {
    detail::unique_fd fd;
    std::vector<std::byte> in;
    std::vector<std::byte> out;
    std::size_t out_sent = 0;
    bool authed = false;
    bool closing = false;  // close once out is flushed
    bool blocked = false;  // a get/wait is pending; later frames wait their turn
    detail::deadline_clock::time_point auth_deadline{};
  };
  struct waiter {
    int conn = 0;
    detail::kvstore::request req;
    detail::deadline_clock::time_point deadline;
  };

  void run(std::stop_token st) {
    std::vector<pollfd> fds;
    std::vector<int> ids;
    while (!st.stop_requested()) {
      fds.clear();
      ids.clear();
      fds.push_back({wake_read_.get(), POLLIN, 0});
      // After EMFILE the pending connection keeps the listener readable: pause accepting a
      // little instead of spinning.
      const bool accepting = detail::deadline_clock::now() >= accept_paused_until_;
      fds.push_back({listener_.get(), static_cast<short>(accepting ? POLLIN : 0), 0});
      for (auto& [id, c] : conns_) {
        // A connection whose get/wait is pending is not read past one more frame.
        const bool full = c.blocked && c.in.size() > limit(c) + detail::kvstore::frame_header_bytes;
        short ev = c.closing || full ? 0 : POLLIN;
        if (c.out_sent < c.out.size()) ev |= POLLOUT;
        fds.push_back({c.fd.get(), ev, 0});
        ids.push_back(id);
      }
      int timeout_ms = -1;
      auto next = detail::deadline_clock::time_point::max();
      for (const auto& w : waiters_) next = std::min(next, w.deadline);
      for (const auto& [id, c] : conns_) {
        if (!c.authed) next = std::min(next, c.auth_deadline);
      }
      if (!accepting) next = std::min(next, accept_paused_until_);
      if (next != detail::deadline_clock::time_point::max()) {
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(next - detail::deadline_clock::now()).count();
        timeout_ms = static_cast<int>(std::clamp<long long>(left, 0, 60'000));
      }
      const int rc = ::poll(fds.data(), fds.size(), timeout_ms);
      if (rc < 0 && errno != EINTR) return;  // nothing sensible left to do; clients see EOF
      if (rc > 0) {
        if (fds[1].revents & POLLIN) accept_all();
        for (std::size_t i = 2; i < fds.size(); ++i) {
          if (fds[i].revents == 0) continue;
          auto it = conns_.find(ids[i - 2]);
          if (it == conns_.end()) continue;
          if (fds[i].revents & (POLLIN | POLLERR | POLLHUP)) on_readable(it->first);
          if (auto jt = conns_.find(ids[i - 2]); jt != conns_.end() && (fds[i].revents & POLLOUT)) flush(jt->first);
        }
      }
      resume_waiters();
      expire_waiters();
      resume_waiters();
      drop_unauthenticated();
    }
  }

  void accept_all() {
    for (;;) {
      const int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          accept_paused_until_ = detail::deadline_clock::now() + std::chrono::milliseconds(100);
        }
        return;  // EAGAIN: all accepted
      }
      const int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      connection c;
      c.fd.reset(fd);
      c.authed = opts_.token.empty();
      c.auth_deadline = detail::deadline_clock::now() + opts_.auth_timeout;
      conns_.emplace(next_id_++, std::move(c));
    }
  }

  void on_readable(int id) {
    auto& c = conns_.at(id);
    std::byte chunk[65536];
    for (;;) {
      const ssize_t n = ::recv(c.fd.get(), chunk, sizeof chunk, 0);
      if (n > 0) {
        c.in.insert(c.in.end(), chunk, chunk + n);
        // Check the announced size as soon as the header is there, before buffering a body.
        if (detail::kvstore::peek_frame(c.in, limit(c)).status == detail::kvstore::frame_status::oversized) break;
        if (c.blocked && c.in.size() > limit(c) + detail::kvstore::frame_header_bytes) break;
        if (static_cast<std::size_t>(n) < sizeof chunk) break;
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      // EOF or error: what was sent before still counts, then the peer is gone.
      process(id);
      drop(id);
      return;
    }
    process(id);
  }

  [[nodiscard]] std::size_t limit(const connection& c) const noexcept {
    return c.authed ? opts_.max_message_bytes : std::min(opts_.max_message_bytes, detail::kvstore::max_unauthenticated_message);
  }

  // Handles the complete frames buffered on a connection, in order.
  void process(int id) {
    auto it = conns_.find(id);
    if (it == conns_.end()) return;
    auto& c = it->second;
    std::size_t used = 0;
    while (!c.blocked && !c.closing) {
      const auto rest = std::span<const std::byte>(c.in).subspan(used);
      const auto f = detail::kvstore::peek_frame(rest, limit(c));
      if (f.status == detail::kvstore::frame_status::incomplete) break;
      if (f.status == detail::kvstore::frame_status::oversized) {
        reject(c, "message of " + std::to_string(f.payload_bytes) + " bytes exceeds the limit of " +
                      std::to_string(limit(c)) + " bytes" + (c.authed ? "" : " before authentication"));
        break;
      }
      const auto payload = rest.subspan(detail::kvstore::frame_header_bytes, f.payload_bytes);
      used += detail::kvstore::frame_header_bytes + f.payload_bytes;
      auto parsed = detail::kvstore::parse_request(payload);
      if (auto* err = std::get_if<detail::kvstore::protocol_error>(&parsed)) {
        reject(c, "protocol error: " + err->what);
        break;
      }
      handle(id, c, std::get<detail::kvstore::request>(std::move(parsed)));
    }
    if (c.closing) {
      c.in.clear();  // nothing after a rejected message is read
    } else {
      c.in.erase(c.in.begin(), c.in.begin() + static_cast<std::ptrdiff_t>(used));
    }
    flush(id);
  }

  void reject(connection& c, const std::string& why) {
    reply(c, detail::kvstore::response{.type = detail::kvstore::response_type::error, .message = why});
    c.closing = true;
    std::lock_guard lock(stats_mutex_);
    ++rejected_;
  }

  void reply(connection& c, const detail::kvstore::response& r) {
    auto frame = detail::kvstore::encode(r);
    c.out.insert(c.out.end(), frame.begin(), frame.end());
  }

  void handle(int id, connection& c, detail::kvstore::request req) {
    using detail::kvstore::request_type;
    using detail::kvstore::response_type;
    if (!c.authed) {
      if (req.type == request_type::auth && detail::kvstore::constant_time_equal(req.key, opts_.token)) {
        c.authed = true;
        reply(c, {.type = response_type::ok});
      } else {
        reject(c, req.type == request_type::auth ? "unauthorized: wrong job token"
                                                 : "unauthorized: this store requires the job token first");
      }
      return;
    }
    switch (req.type) {
      case request_type::auth: reply(c, {.type = response_type::ok}); break;
      case request_type::set:
        data_[req.key] = std::move(req.value);
        reply(c, {.type = response_type::ok});
        wake_waiters();
        break;
      case request_type::add: {
        std::int64_t cur = 0;
        if (auto f = data_.find(req.key); f != data_.end()) {
          const auto* p = reinterpret_cast<const char*>(f->second.data());
          auto [end, ec] = std::from_chars(p, p + f->second.size(), cur);
          if (ec != std::errc{} || end != p + f->second.size()) {
            reply(c, {.type = response_type::error, .message = "add('" + req.key + "'): the key holds a non-integer value"});
            break;
          }
        }
        std::int64_t next = 0;
        if (__builtin_add_overflow(cur, req.number, &next)) {
          reply(c, {.type = response_type::error, .message = "add('" + req.key + "'): int64 overflow"});
          break;
        }
        const std::string s = std::to_string(next);  // decimal text, as torch's TCPStore keeps it
        const auto* b = reinterpret_cast<const std::byte*>(s.data());
        data_[req.key].assign(b, b + s.size());
        reply(c, {.type = response_type::integer, .number = next});
        wake_waiters();
        break;
      }
      case request_type::get:
      case request_type::wait:
        if (satisfied(req)) {
          answer(c, req);
        } else if (req.number == 0) {
          reply(c, {.type = response_type::timeout, .keys = missing(req)});
        } else {
          c.blocked = true;
          const auto deadline = detail::deadline_clock::now() + std::chrono::milliseconds(req.number);
          waiters_.push_back({id, std::move(req), deadline});
        }
        break;
      case request_type::check:
        reply(c, {.type = response_type::boolean, .number = satisfied(req) ? 1 : 0});
        break;
      case request_type::delete_key:
        reply(c, {.type = response_type::boolean, .number = data_.erase(req.key) ? 1 : 0});
        break;
      case request_type::num_keys:
        reply(c, {.type = response_type::integer, .number = static_cast<std::int64_t>(data_.size())});
        break;
    }
  }

  [[nodiscard]] bool satisfied(const detail::kvstore::request& r) const {
    if (r.type == detail::kvstore::request_type::get) return data_.contains(r.key);
    return std::ranges::all_of(r.keys, [&](const std::string& k) { return data_.contains(k); });
  }
  [[nodiscard]] std::vector<std::string> missing(const detail::kvstore::request& r) const {
    if (r.type == detail::kvstore::request_type::get) return {r.key};
    std::vector<std::string> m;
    for (const auto& k : r.keys) {
      if (!data_.contains(k)) m.push_back(k);
    }
    return m;
  }
  void answer(connection& c, const detail::kvstore::request& r) {
    if (r.type == detail::kvstore::request_type::get) {
      reply(c, {.type = detail::kvstore::response_type::value, .value = data_.at(r.key)});
    } else {
      reply(c, {.type = detail::kvstore::response_type::ok});
    }
  }

  // Answers the waiters whose keys now exist; their connections may then go on.
  void wake_waiters() {
    std::erase_if(waiters_, [&](waiter& w) {
      if (!satisfied(w.req)) return false;
      auto& c = conns_.at(w.conn);
      answer(c, w.req);
      c.blocked = false;
      resumed_.push_back(w.conn);
      return true;
    });
  }

  void expire_waiters() {
    const auto now = detail::deadline_clock::now();
    std::erase_if(waiters_, [&](waiter& w) {
      if (w.deadline > now) return false;
      auto& c = conns_.at(w.conn);
      reply(c, {.type = detail::kvstore::response_type::timeout, .keys = missing(w.req)});
      c.blocked = false;
      resumed_.push_back(w.conn);
      return true;
    });
  }

  // Connections whose get/wait was answered: send the reply, then go on with their next frames.
  // Done from the loop rather than recursively, so a chain of waiters cannot deepen the stack.
  void resume_waiters() {
    while (!resumed_.empty()) {
      const int id = resumed_.back();
      resumed_.pop_back();
      process(id);
    }
  }

  void drop_unauthenticated() {
    const auto now = detail::deadline_clock::now();
    std::vector<int> late;
    for (const auto& [id, c] : conns_) {
      if (!c.authed && !c.closing && c.auth_deadline <= now) late.push_back(id);
    }
    for (int id : late) {
      {
        std::lock_guard lock(stats_mutex_);
        ++rejected_;
      }
      drop(id);
    }
  }

  void flush(int id) {
    auto it = conns_.find(id);
    if (it == conns_.end()) return;
    auto& c = it->second;
    while (c.out_sent < c.out.size()) {
      const ssize_t n = ::send(c.fd.get(), c.out.data() + c.out_sent, c.out.size() - c.out_sent, MSG_NOSIGNAL);
      if (n > 0) {
        c.out_sent += static_cast<std::size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        // A peer that stops reading cannot make the server hold unbounded replies.
        if (c.out.size() - c.out_sent > 2 * opts_.max_message_bytes + 1024) drop(id);
        return;
      }
      drop(id);
      return;
    }
    c.out.clear();
    c.out_sent = 0;
    if (c.closing) drop(id);
  }

  void drop(int id) {
    std::erase_if(waiters_, [&](const waiter& w) { return w.conn == id; });
    conns_.erase(id);
  }

  tcp_store_server_options opts_;
  detail::unique_fd listener_;
  detail::unique_fd wake_read_, wake_write_;
  std::uint16_t port_ = 0;
  // Touched only by the server thread.
  std::map<int, connection> conns_;
  std::unordered_map<std::string, std::vector<std::byte>> data_;
  std::vector<waiter> waiters_;
  std::vector<int> resumed_;
  detail::deadline_clock::time_point accept_paused_until_{};
  int next_id_ = 0;
  mutable std::mutex stats_mutex_;
  std::size_t rejected_ = 0;
  std::jthread thread_;  // last: started after, and joined before, everything above
};

}  // namespace partrain::inline v0
