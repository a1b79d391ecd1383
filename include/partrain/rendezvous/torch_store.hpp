// partrain/rendezvous/torch_store.hpp: a client of PyTorch's own TCPStore (c10d's, PyTorch 2.5
// and later), meeting partrain's store interface. Under torchrun the launcher's agent hosts such
// a store on MASTER_ADDR:MASTER_PORT and tells every worker so (TORCHELASTIC_USE_AGENT_STORE=True);
// env:// then rendezvouses through it with this client, so Gloo's, NCCL's and partrain's own keys
// go through the agent's store and no rank tries to host one on the agent's port.
//
// The wire protocol (torch/csrc/distributed/c10d/TCPStore*.cpp; facts in
// ../shared/reference/launchers-checkpoints-interop.md 1.3): a request is one query-type byte
// and its arguments in native byte order (little-endian here); a string is a u64 length and its
// bytes. A connection first sends VALIDATE with the magic number (the libuv server ignores a
// connection until then), then PING. Keys travel as PyTorch's client sends them, "/" + key, so
// PyTorch processes on the same store see the same keys; ADD keeps its counter as decimal text.
// A GET is a WAIT then a GET; a WAIT that outlives its timeout is withdrawn with CANCEL_WAIT.
#pragma once

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <poll.h>

#include <partrain/comm/store.hpp>
#include <partrain/core/error.hpp>
#include <partrain/rendezvous/detail/socket.hpp>

namespace partrain::inline v0 {

namespace detail::torch_store {

static_assert(std::endian::native == std::endian::little, "PyTorch's TCPStore speaks in the host's byte order; "
                                                          "this client is written for little-endian hosts");

enum class query : std::uint8_t {
  validate = 0,
  set = 1,
  compare_set = 2,
  get = 3,
  add = 4,
  check = 5,
  wait = 6,
  get_num_keys = 7,
  delete_key = 8,
  append = 9,
  multi_get = 10,
  multi_set = 11,
  cancel_wait = 12,
  ping = 13,
};
inline constexpr std::uint32_t validation_magic = 0x3C85F7CE;
inline constexpr std::uint8_t check_ready = 0;     // CHECK's reply when every key exists
inline constexpr std::uint8_t stop_waiting = 0;    // WAIT's reply once every key exists
inline constexpr std::uint8_t wait_canceled = 1;   // CANCEL_WAIT's reply
// The libuv server's limits (larger messages are dropped with the connection).
inline constexpr std::size_t max_key_bytes = 8 << 10;
inline constexpr std::size_t max_value_bytes = 8 << 20;
// A reply's length field above this is a broken stream, not a value (the server sends at most
// max_value_bytes).
inline constexpr std::uint64_t max_reply_bytes = 64ull << 20;

// One request, built in the server's framing.
class request {
 public:
  explicit request(query q) { out_.push_back(static_cast<std::byte>(q)); }
  request& u32(std::uint32_t v) { return raw(&v, sizeof v); }
  request& i64(std::int64_t v) { return raw(&v, sizeof v); }
  request& u64(std::uint64_t v) { return raw(&v, sizeof v); }
  request& bytes(std::span<const std::byte> v) {
    u64(v.size());
    out_.insert(out_.end(), v.begin(), v.end());
    return *this;
  }
  request& str(const std::string& s) { return bytes(std::as_bytes(std::span(s.data(), s.size()))); }
  [[nodiscard]] std::span<const std::byte> data() const noexcept { return out_; }

 private:
  request& raw(const void* p, std::size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    out_.insert(out_.end(), b, b + n);
    return *this;
  }
  std::vector<std::byte> out_;
};

}  // namespace detail::torch_store

struct torch_store_options {
  std::string host = "127.0.0.1";
  std::uint16_t port = 0;
  // Connecting (with retries while the agent's server comes up) and every call but get/wait,
  // which take their own, are bounded by this.
  std::chrono::milliseconds timeout = std::chrono::milliseconds(300'000);
  std::string who{};  // names the caller in errors' text, e.g. "rank 3"
  int rank = -1;      // the caller's rank, kept in errors' rank()
};

class torch_tcp_store final : public store {
  using query = detail::torch_store::query;
  using request = detail::torch_store::request;

 public:
  explicit torch_tcp_store(torch_store_options opts) : opts_(std::move(opts)) {
    if (opts_.port == 0) {
      throw config_error(prefix() + "a client of PyTorch's TCPStore needs the server's port (got 0; expected 1..65535)");
    }
    if (opts_.timeout.count() <= 0) {
      throw config_error(prefix() + "torch_tcp_store timeout must be positive (got " + std::to_string(opts_.timeout.count()) +
                         " ms)");
    }
    std::lock_guard lock(mutex_);
    const auto deadline = detail::deadline_clock::now() + opts_.timeout;
    const std::string op = prefix() + "store connect to PyTorch's TCPStore at " + endpoint();
    try {
      fd_ = detail::connect_tcp(opts_.host, opts_.port, deadline, prefix());
      send_locked(request(query::validate).u32(detail::torch_store::validation_magic), deadline, op);
      // PING proves that the peer is a TCPStore that accepted the validation: anything else
      // (our own store, a web server) would not echo the nonce. A fixed nonce keeps the bytes
      // of a session the same on every run (the tests replay a recorded one).
      const std::uint32_t nonce = 0x70617274u;  // "part"
      send_locked(request(query::ping).u32(nonce), deadline, op);
      if (const auto echo = read_locked<std::uint32_t>(deadline, op); echo != nonce) {
        throw communication_error(prefix() + "the server at " + endpoint() + " answered PING with " + std::to_string(echo) +
                                  " instead of " + std::to_string(nonce) + ": it is not a PyTorch TCPStore (2.5 or later)");
      }
    } catch (const communication_error&) {
      fd_.reset();
      detail::rethrow_sited(opts_.rank, "store connect", opts_.timeout);
    }
  }

  [[nodiscard]] const std::string& host() const noexcept { return opts_.host; }
  [[nodiscard]] std::uint16_t port() const noexcept { return opts_.port; }

  using store::set;
  void set(const std::string& key, std::span<const std::byte> value) override {
    check_sizes("set", key, value.size());
    call("store set('" + key + "')", opts_.timeout, [&](auto deadline, const std::string& op) {
      send_locked(request(query::set).str(wire(key)).bytes(value), deadline, op);
    });
  }

  [[nodiscard]] std::vector<std::byte> get(const std::string& key, std::chrono::milliseconds timeout) override {
    wait({key}, timeout);
    check_sizes("get", key, 0);
    return call("store get('" + key + "')", opts_.timeout, [&](auto deadline, const std::string& op) {
      send_locked(request(query::get).str(wire(key)), deadline, op);
      return read_bytes_locked(deadline, op);
    });
  }

  std::int64_t add(const std::string& key, std::int64_t delta) override {
    check_sizes("add", key, 0);
    return call("store add('" + key + "')", opts_.timeout, [&](auto deadline, const std::string& op) {
      send_locked(request(query::add).str(wire(key)).i64(delta), deadline, op);
      return read_locked<std::int64_t>(deadline, op);
    });
  }

  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    if (timeout.count() < 0) throw invalid_argument_error(prefix() + "store wait: negative timeout");
    for (const auto& k : keys) check_sizes("wait", k, 0);
    const bool all_there = call("store wait", timeout + io_allowance(), [&](auto deadline, const std::string& op) {
      send_locked(keys_request(query::wait, keys), deadline, op);
      const auto until = detail::deadline_clock::now() + timeout;
      if (detail::wait_fd(fd_.get(), POLLIN, until)) {
        expect_byte(read_locked<std::uint8_t>(deadline, op), detail::torch_store::stop_waiting, op);
        return true;
      }
      // Withdraw the wait; the keys may have come meanwhile, then STOP_WAITING precedes the
      // cancellation's reply.
      send_locked(request(query::cancel_wait), deadline, op);
      auto reply = read_locked<std::uint8_t>(deadline, op);
      const bool came = reply == detail::torch_store::stop_waiting;
      if (came) reply = read_locked<std::uint8_t>(deadline, op);
      expect_byte(reply, detail::torch_store::wait_canceled, op);
      return came;
    });
    if (all_there) return;
    std::string missing;
    for (const auto& k : keys) {
      if (!check({k})) missing += (missing.empty() ? "'" : ", '") + k + "'";
    }
    throw timeout_error(prefix() + "store wait timed out after " + std::to_string(timeout.count()) + " ms at " + endpoint() +
                            " (PyTorch's TCPStore): still missing " + (missing.empty() ? std::string("nothing now") : missing),
                        site("store wait", timeout));
  }

  [[nodiscard]] bool check(const std::vector<std::string>& keys) override {
    for (const auto& k : keys) check_sizes("check", k, 0);
    return call("store check", opts_.timeout, [&](auto deadline, const std::string& op) {
      send_locked(keys_request(query::check, keys), deadline, op);
      return read_locked<std::uint8_t>(deadline, op) == detail::torch_store::check_ready;
    });
  }

  // The rest of PyTorch's commands, for programs that share the agent's store with PyTorch code.
  // Sets key to desired when its value is expected (or when it is absent and expected is
  // empty); returns the value now stored.
  [[nodiscard]] std::vector<std::byte> compare_set(const std::string& key, std::span<const std::byte> expected,
                                                   std::span<const std::byte> desired) {
    check_sizes("compare_set", key, std::max(expected.size(), desired.size()));
    return call("store compare_set('" + key + "')", opts_.timeout, [&](auto deadline, const std::string& op) {
      send_locked(request(query::compare_set).str(wire(key)).bytes(expected).bytes(desired), deadline, op);
      return read_bytes_locked(deadline, op);
    });
  }
  // Removes key; false when it did not exist.
  bool delete_key(const std::string& key) {
    check_sizes("delete_key", key, 0);
    return call("store delete_key('" + key + "')", opts_.timeout, [&](auto deadline, const std::string& op) {
      send_locked(request(query::delete_key).str(wire(key)), deadline, op);
      return read_locked<std::int64_t>(deadline, op) > 0;
    });
  }
  [[nodiscard]] std::int64_t num_keys() {
    return call("store num_keys", opts_.timeout, [&](auto deadline, const std::string& op) {
      send_locked(request(query::get_num_keys), deadline, op);
      return read_locked<std::int64_t>(deadline, op);
    });
  }
  // Several keys' values at once, waiting for them first (PyTorch's multi_get).
  [[nodiscard]] std::vector<std::vector<std::byte>> multi_get(const std::vector<std::string>& keys,
                                                              std::chrono::milliseconds timeout) {
    wait(keys, timeout);
    return call("store multi_get", opts_.timeout, [&](auto deadline, const std::string& op) {
      send_locked(keys_request(query::multi_get, keys), deadline, op);
      std::vector<std::vector<std::byte>> out;
      out.reserve(keys.size());
      for (std::size_t i = 0; i < keys.size(); ++i) out.push_back(read_bytes_locked(deadline, op));
      return out;
    });
  }
  void multi_set(const std::vector<std::string>& keys, const std::vector<std::vector<std::byte>>& values) {
    if (keys.size() != values.size()) {
      throw invalid_argument_error(prefix() + "store multi_set: " + std::to_string(keys.size()) + " keys and " +
                                   std::to_string(values.size()) + " values (expected one value per key)");
    }
    for (std::size_t i = 0; i < keys.size(); ++i) check_sizes("multi_set", keys[i], values[i].size());
    call("store multi_set", opts_.timeout, [&](auto deadline, const std::string& op) {
      request r(query::multi_set);
      r.u64(keys.size());
      for (std::size_t i = 0; i < keys.size(); ++i) r.str(wire(keys[i])).bytes(values[i]);
      send_locked(r, deadline, op);
    });
  }

 private:
  // PyTorch's client prefixes every user key with "/".
  [[nodiscard]] static std::string wire(const std::string& key) { return "/" + key; }
  [[nodiscard]] static request keys_request(query q, const std::vector<std::string>& keys) {
    request r(q);
    r.u64(keys.size());
    for (const auto& k : keys) r.str(wire(k));
    return r;
  }
  [[nodiscard]] std::string prefix() const { return opts_.who.empty() ? std::string() : opts_.who + ": "; }
  [[nodiscard]] std::string endpoint() const { return detail::endpoint_name(opts_.host, opts_.port); }
  [[nodiscard]] error_site site(std::string operation, std::chrono::milliseconds timeout = {}) const {
    return {.rank = opts_.rank, .operation = std::move(operation), .timeout = timeout};
  }
  [[nodiscard]] std::chrono::milliseconds io_allowance() const { return std::min(opts_.timeout, std::chrono::milliseconds(30'000)); }

  void check_sizes(const char* op, const std::string& key, std::size_t value_bytes) const {
    if (key.size() + 1 > detail::torch_store::max_key_bytes || value_bytes > detail::torch_store::max_value_bytes) {
      throw invalid_argument_error(prefix() + "store " + op + "('" + key.substr(0, 64) + "'): a key of " +
                                   std::to_string(key.size()) + " bytes and a value of " + std::to_string(value_bytes) +
                                   " bytes; PyTorch's TCPStore takes keys under " +
                                   std::to_string(detail::torch_store::max_key_bytes) + " bytes and values up to " +
                                   std::to_string(detail::torch_store::max_value_bytes));
    }
  }

  // One exchange under the lock, within `budget`. A broken or timed-out exchange leaves the
  // stream mid-message, so the connection is dropped; the agent's store does not come back for
  // a client (a restarted agent makes a new one), so a later call says so.
  template <class F>
  auto call(const std::string& operation, std::chrono::milliseconds budget, F&& f)
      -> std::invoke_result_t<F&, detail::deadline_clock::time_point, const std::string&> {
    std::lock_guard lock(mutex_);
    if (!fd_) {
      throw communication_error(prefix() + operation + ": the connection to PyTorch's TCPStore at " + endpoint() +
                                    " was lost earlier (the torchrun agent hosting it has probably ended)",
                                site(operation));
    }
    const std::string op = prefix() + operation + " at " + endpoint();
    try {
      return f(detail::deadline_clock::now() + budget, op);
    } catch (const communication_error&) {
      fd_.reset();
      detail::rethrow_sited(opts_.rank, operation, budget);
    }
  }

  void send_locked(const request& r, detail::deadline_clock::time_point deadline, const std::string& op) {
    detail::send_all(fd_.get(), r.data(), deadline, op);
  }
  template <class T>
  T read_locked(detail::deadline_clock::time_point deadline, const std::string& op) {
    std::array<std::byte, sizeof(T)> b{};
    detail::recv_all(fd_.get(), b, deadline, op);
    T v;
    std::memcpy(&v, b.data(), sizeof v);
    return v;
  }
  std::vector<std::byte> read_bytes_locked(detail::deadline_clock::time_point deadline, const std::string& op) {
    const auto n = read_locked<std::uint64_t>(deadline, op);
    if (n > detail::torch_store::max_reply_bytes) {
      throw communication_error(op + ": a reply of " + std::to_string(n) + " bytes (more than the store ever sends: the "
                                     "stream is broken)");
    }
    std::vector<std::byte> v(static_cast<std::size_t>(n));
    detail::recv_all(fd_.get(), v, deadline, op);
    return v;
  }
  void expect_byte(std::uint8_t got, std::uint8_t want, const std::string& op) const {
    if (got != want) {
      throw communication_error(op + ": reply " + std::to_string(got) + " where " + std::to_string(want) +
                                " was expected (not the TCPStore protocol of PyTorch 2.5 or later)");
    }
  }

  torch_store_options opts_;
  std::mutex mutex_;
  detail::unique_fd fd_;
};

}  // namespace partrain::inline v0
