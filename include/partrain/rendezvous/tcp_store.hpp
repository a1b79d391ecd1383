// partrain/rendezvous/tcp_store.hpp: the client of the TCP rendezvous store (torch's TCPStore).
// Every rank, the host included, talks to the server (rendezvous/tcp_store_server.hpp) through
// one; `is_server` makes this process host the server too. Every call has a deadline.
#pragma once


#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
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

#include <partrain/comm/store.hpp>
#include <partrain/core/error.hpp>
#include <partrain/rendezvous/detail/socket.hpp>
#include <partrain/rendezvous/detail/store_protocol.hpp>
#include <partrain/rendezvous/tcp_store_server.hpp>

namespace partrain::inline v0 {

struct tcp_store_options {
  // Where the server is (clients) or what it binds (the host, unless bind_address is set).
  std::string host = "127.0.0.1";
  std::uint16_t port = 0;  // the host may pass 0 for a free port; read it back with port()
  bool is_server = false;  // host the server in this process (rank 0)
  std::string bind_address{};
  std::string token{};  // the job token; must match the server's
  // Connecting (with retries while the server comes up) and set/add/check are bounded by this.
  std::chrono::milliseconds timeout = std::chrono::milliseconds(300'000);
  // After a connection that worked is lost: how long to retry before concluding that the server
  // is gone (within the call's own deadline). Short, so a vanished rank 0 or node-0 agent is
  // reported in seconds instead of after the whole timeout.
  std::chrono::milliseconds reconnect_timeout = std::chrono::milliseconds(3'000);
  // How long a call waits for the reply beyond what the server itself may hold it (a get's or
  // wait's timeout; set, add and check it answers at once): a server that is stopped (SIGSTOP),
  // not gone, keeps the connection and answers nothing, so this alone bounds such a call. 0: set,
  // add and check wait up to timeout, then min(timeout, 30 s) more.
  std::chrono::milliseconds io_timeout = std::chrono::milliseconds(0);
  std::size_t max_message_bytes = detail::kvstore::default_max_message;
  std::string who{};  // names the caller in errors' text, e.g. "rank 3"
  int rank = -1;       // the caller's rank, kept in errors' rank() (-1: not a rank)
  int listen_fd = -1;  // is_server: an inherited listening socket on `port` (tcp_store_server_options)
};

class tcp_store final : public store {
 public:
  explicit tcp_store(tcp_store_options opts) : opts_(std::move(opts)) {
    if (opts_.is_server) {
      server_ = std::make_unique<tcp_store_server>(tcp_store_server_options{
          .host = opts_.bind_address.empty() ? opts_.host : opts_.bind_address,
          .port = opts_.port,
          .token = opts_.token,
          .max_message_bytes = opts_.max_message_bytes,
          .listen_fd = opts_.listen_fd});
      opts_.port = server_->port();
    } else if (opts_.port == 0) {
      throw config_error(prefix() + "a tcp_store client needs the server's port (got 0; expected 1..65535)");
    }
    if (opts_.timeout.count() <= 0 || opts_.reconnect_timeout.count() <= 0) {
      throw config_error(prefix() + "tcp_store timeouts must be positive (got timeout " + std::to_string(opts_.timeout.count()) +
                         " ms, reconnect_timeout " + std::to_string(opts_.reconnect_timeout.count()) + " ms)");
    }
    std::lock_guard lock(mutex_);
    try {
      connect_locked(detail::deadline_clock::now() + opts_.timeout);
    } catch (const communication_error&) {
      detail::rethrow_sited(opts_.rank, "store connect", opts_.timeout);
    }
  }

  [[nodiscard]] std::uint16_t port() const noexcept { return opts_.port; }
  [[nodiscard]] const std::string& host() const noexcept { return opts_.host; }
  [[nodiscard]] bool is_server() const noexcept { return server_ != nullptr; }
  [[nodiscard]] tcp_store_server* server() noexcept { return server_.get(); }

  using store::set;
  void set(const std::string& key, std::span<const std::byte> value) override {
    detail::kvstore::request r{.type = detail::kvstore::request_type::set, .key = key};
    r.value.assign(value.begin(), value.end());
    expect(call(r, instant_wait()), detail::kvstore::response_type::ok, r);
  }

  [[nodiscard]] std::vector<std::byte> get(const std::string& key, std::chrono::milliseconds timeout) override {
    detail::kvstore::request r{.type = detail::kvstore::request_type::get, .key = key, .number = timeout.count()};
    auto resp = call(r, timeout);
    if (resp.type == detail::kvstore::response_type::timeout) {
      throw timeout_error(prefix() + "store get('" + key + "') timed out after " + std::to_string(timeout.count()) +
                              " ms at " + endpoint() + ": the key was never set",
                          site("store get", timeout));
    }
    expect(resp, detail::kvstore::response_type::value, r);
    return std::move(resp.value);
  }

  std::int64_t add(const std::string& key, std::int64_t delta) override {
    detail::kvstore::request r{.type = detail::kvstore::request_type::add, .key = key, .number = delta};
    auto resp = call(r, instant_wait());
    expect(resp, detail::kvstore::response_type::integer, r);
    return resp.number;
  }

  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    detail::kvstore::request r{.type = detail::kvstore::request_type::wait, .keys = keys, .number = timeout.count()};
    auto resp = call(r, timeout);
    if (resp.type == detail::kvstore::response_type::timeout) {
      std::string names;
      for (const auto& k : resp.keys) names += (names.empty() ? "'" : ", '") + k + "'";
      throw timeout_error(prefix() + "store wait timed out after " + std::to_string(timeout.count()) + " ms at " +
                              endpoint() + ": still missing " + names,
                          site("store wait", timeout));
    }
    expect(resp, detail::kvstore::response_type::ok, r);
  }

  [[nodiscard]] bool check(const std::vector<std::string>& keys) override {
    detail::kvstore::request r{.type = detail::kvstore::request_type::check, .keys = keys};
    auto resp = call(r, instant_wait());
    expect(resp, detail::kvstore::response_type::boolean, r);
    return resp.number != 0;
  }

  // Removes key; false when it did not exist.
  bool delete_key(const std::string& key) {
    detail::kvstore::request r{.type = detail::kvstore::request_type::delete_key, .key = key};
    auto resp = call(r, opts_.timeout);
    expect(resp, detail::kvstore::response_type::boolean, r);
    return resp.number != 0;
  }

  [[nodiscard]] std::int64_t num_keys() {
    detail::kvstore::request r{.type = detail::kvstore::request_type::num_keys};
    auto resp = call(r, opts_.timeout);
    expect(resp, detail::kvstore::response_type::integer, r);
    return resp.number;
  }

 private:
  [[nodiscard]] std::string prefix() const { return opts_.who.empty() ? std::string() : opts_.who + ": "; }
  [[nodiscard]] std::string endpoint() const { return detail::endpoint_name(opts_.host, opts_.port); }
  // The text names the caller through `who`; the fields through rank.
  [[nodiscard]] error_site site(std::string operation, std::chrono::milliseconds timeout = {}) const {
    return {.rank = opts_.rank, .operation = std::move(operation), .timeout = timeout};
  }
  // What set, add and check may wait on the server (which answers them at once): nothing when
  // io_timeout bounds the reply, else the whole timeout, as before io_timeout existed.
  [[nodiscard]] std::chrono::milliseconds instant_wait() const noexcept {
    return opts_.io_timeout.count() > 0 ? std::chrono::milliseconds(0) : opts_.timeout;
  }
  [[nodiscard]] static std::string operation_of(const detail::kvstore::request& r) {
    return "store " + std::string(to_string(r.type));
  }

  // The first connection may wait the whole timeout for a server that is still starting; later
  // ones are bounded by the caller (see call()).
  void connect_locked(detail::deadline_clock::time_point deadline) {
    fd_ = detail::connect_tcp(opts_.host, opts_.port, deadline, prefix());
    // With a token: authenticate. Without: an empty check, so a server that wants a token
    // says so now, at connect time, rather than at the first real operation.
    detail::kvstore::request hello = opts_.token.empty() ? detail::kvstore::request{.type = detail::kvstore::request_type::check}
                                                      : detail::kvstore::request{.type = detail::kvstore::request_type::auth, .key = opts_.token};
    detail::kvstore::response resp;
    try {
      resp = round_trip_locked(hello, deadline);
    } catch (...) {
      fd_.reset();
      throw;
    }
    if (resp.type == detail::kvstore::response_type::error) {
      fd_.reset();
      throw communication_error(prefix() + "the store at " + endpoint() + " refused the connection: " + resp.message +
                                    " (every rank needs the job's token, e.g. from PARTRAIN_STORE_TOKEN)",
                                site("store connect"));
    }
  }

  // The connection broke in an earlier call (and was dropped). A server that accepted us before
  // and now refuses for reconnect_timeout has ended: say so instead of retrying for the whole
  // timeout (which held partrun's node 1 for 300 s after node 0 died).
  void reconnect_locked(const detail::kvstore::request& r) {
    const auto window = std::min(opts_.reconnect_timeout, opts_.timeout);
    try {
      connect_locked(detail::deadline_clock::now() + window);
    } catch (const timeout_error& e) {
      throw communication_error(prefix() + operation_of(r) + ": lost the connection to the store at " + endpoint() +
                                    " and it did not come back within " + std::to_string(window.count()) +
                                    " ms; the process hosting it (rank 0, or node 0's partrun) has probably ended (" +
                                    e.what() + ")",
                                site(operation_of(r)));
    }
  }

  // One request, one reply. server_wait is how long the server itself may hold the reply
  // (get/wait); the socket deadline adds the I/O allowance on top.
  detail::kvstore::response call(const detail::kvstore::request& r, std::chrono::milliseconds server_wait) {
    if (server_wait.count() < 0) {
      throw invalid_argument_error(prefix() + "store " + std::string(to_string(r.type)) + ": negative timeout");
    }
    std::lock_guard lock(mutex_);
    if (!fd_) reconnect_locked(r);
    const auto io = opts_.io_timeout.count() > 0 ? opts_.io_timeout : std::min(opts_.timeout, std::chrono::milliseconds(30'000));
    const auto allowance = server_wait + io;
    try {
      return round_trip_locked(r, detail::deadline_clock::now() + allowance);
    } catch (const communication_error&) {
      fd_.reset();  // the stream may be mid-message: never reuse it
      detail::rethrow_sited(opts_.rank, operation_of(r), allowance);
    } catch (...) {
      fd_.reset();
      throw;
    }
  }

  detail::kvstore::response round_trip_locked(const detail::kvstore::request& r, detail::deadline_clock::time_point deadline) {
    const std::string what = prefix() + "store " + std::string(to_string(r.type)) +
                             (r.key.empty() || r.type == detail::kvstore::request_type::auth ? "" : "('" + r.key + "')") + " at " +
                             endpoint();
    auto frame = detail::kvstore::encode(r);
    if (frame.size() - detail::kvstore::frame_header_bytes > opts_.max_message_bytes) {
      throw invalid_argument_error(what + ": message of " + std::to_string(frame.size()) + " bytes exceeds the limit of " +
                                   std::to_string(opts_.max_message_bytes) + " bytes");
    }
    detail::send_all(fd_.get(), frame, deadline, what);
    std::byte header[detail::kvstore::frame_header_bytes];
    detail::recv_all(fd_.get(), header, deadline, what);
    const auto f = detail::kvstore::peek_frame(header, opts_.max_message_bytes + 64);
    if (f.status == detail::kvstore::frame_status::oversized) throw communication_error(what + ": reply too large");
    std::vector<std::byte> payload(f.payload_bytes);
    detail::recv_all(fd_.get(), payload, deadline, what);
    auto parsed = detail::kvstore::parse_response(payload);
    if (auto* err = std::get_if<detail::kvstore::protocol_error>(&parsed)) throw communication_error(what + ": " + err->what);
    auto resp = std::get<detail::kvstore::response>(std::move(parsed));
    if (resp.type == detail::kvstore::response_type::error && resp.message.starts_with("unauthorized")) fd_.reset();
    return resp;
  }

  void expect(const detail::kvstore::response& resp, detail::kvstore::response_type want, const detail::kvstore::request& r) {
    if (resp.type == want) return;
    const std::string what = prefix() + "store " + std::string(to_string(r.type)) + (r.key.empty() ? "" : "('" + r.key + "')") +
                             " at " + endpoint();
    if (resp.type == detail::kvstore::response_type::error) {
      if (resp.message.starts_with("unauthorized")) {
        throw communication_error(what + " refused: " + resp.message +
                                      " (set the same token on every rank, e.g. PARTRAIN_STORE_TOKEN)",
                                  site(operation_of(r)));
      }
      throw communication_error(what + " failed: " + resp.message, site(operation_of(r)));
    }
    throw communication_error(what + ": unexpected reply type " + std::to_string(static_cast<int>(resp.type)),
                              site(operation_of(r)));
  }

  tcp_store_options opts_;
  std::unique_ptr<tcp_store_server> server_;  // before fd_: the client closes first
  std::mutex mutex_;
  detail::unique_fd fd_;
};

}  // namespace partrain::inline v0
