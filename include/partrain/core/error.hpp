// partrain/core/error.hpp: one error hierarchy. Messages say what was wrong, where
// (rank, operation, name) and what was expected; where the place is known it is also kept in
// fields (error_site), so callers test the type and read e.rank(), never search the text.
#pragma once

#include <chrono>
#include <exception>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace partrain::inline v0 {

enum class error_kind { config, communication, timeout, data, checkpoint, invalid_argument, internal };

[[nodiscard]] constexpr std::string_view to_string(error_kind k) noexcept {
  switch (k) {
    case error_kind::config: return "config";
    case error_kind::communication: return "communication";
    case error_kind::timeout: return "timeout";
    case error_kind::data: return "data";
    case error_kind::checkpoint: return "checkpoint";
    case error_kind::invalid_argument: return "invalid_argument";
    case error_kind::internal: return "internal";
  }
  return "unknown";
}

// Where an error happened, as far as the thrower knows: -1, empty or zero where unknown.
struct error_site {
  int rank = -1;           // the rank that raised it
  std::string operation{};  // "all_reduce", "recv", "store get", ...
  int peer = -1;           // the peer it was waiting on or talking to
  std::chrono::milliseconds timeout{0};  // the deadline that ran out (timeouts)
};

namespace detail {
// The one place a sited message is built: "rank 2 all_reduce (peer 1): <detail>".
[[nodiscard]] inline std::string site_message(const error_site& s, std::string_view detail) {
  std::string out;
  if (s.rank >= 0) out = "rank " + std::to_string(s.rank);
  if (!s.operation.empty()) out += (out.empty() ? "" : " ") + s.operation;
  if (s.peer >= 0) out += " (peer " + std::to_string(s.peer) + ")";
  if (!out.empty()) out += ": ";
  return out + std::string(detail);
}
// An error's message without the "partrain: " every what() starts with, for wrapping it in a
// message of a layer above.
[[nodiscard]] inline std::string unprefixed(std::string_view what) {
  if (what.starts_with("partrain: ")) what.remove_prefix(10);
  return std::string(what);
}
}  // namespace detail

// Base of every exception partrain throws.
class error : public std::runtime_error {
 public:
  error(error_kind kind, const std::string& what) : std::runtime_error("partrain: " + what), kind_(kind) {}
  error(error_kind kind, error_site site, std::string_view detail)
      : std::runtime_error("partrain: " + detail::site_message(site, detail)), kind_(kind), site_(std::move(site)) {}
  // A whole message, with the fields of the error it wraps.
  error(error_kind kind, const std::string& what, error_site site)
      : std::runtime_error("partrain: " + what), kind_(kind), site_(std::move(site)) {}
  [[nodiscard]] error_kind kind() const noexcept { return kind_; }
  [[nodiscard]] const error_site& site() const noexcept { return site_; }
  [[nodiscard]] int rank() const noexcept { return site_.rank; }
  [[nodiscard]] const std::string& operation() const noexcept { return site_.operation; }
  [[nodiscard]] int peer() const noexcept { return site_.peer; }

 private:
  error_kind kind_;
  error_site site_{};
};

namespace detail {
// The site of an error a layer above wraps: the inner error's fields (its peer, its deadline),
// with the wrapping layer's rank and operation where the inner error knew none.
[[nodiscard]] inline error_site site_or(const error& inner, int rank, std::string_view operation) {
  error_site s = inner.site();
  if (s.rank < 0) s.rank = rank;
  if (s.operation.empty()) s.operation = operation;
  return s;
}
}  // namespace detail

// Bad configuration: a malformed URL, a missing environment variable, world size 0.
class config_error : public error {
 public:
  explicit config_error(const std::string& what) : error(error_kind::config, what) {}
};

// Bad arguments to a call: mismatched sizes, rank out of range.
class invalid_argument_error : public error {
 public:
  explicit invalid_argument_error(const std::string& what) : error(error_kind::invalid_argument, what) {}
};

// A collective or point-to-point operation failed: a peer died, sizes disagree across ranks.
class communication_error : public error {
 public:
  explicit communication_error(const std::string& what) : error(error_kind::communication, what) {}
  communication_error(error_site site, std::string_view detail) : error(error_kind::communication, std::move(site), detail) {}
  communication_error(const std::string& what, error_site site) : error(error_kind::communication, what, std::move(site)) {}

 protected:
  communication_error(error_kind k, const std::string& what) : error(k, what) {}
  communication_error(error_kind k, error_site site, std::string_view detail) : error(k, std::move(site), detail) {}
  communication_error(error_kind k, const std::string& what, error_site site) : error(k, what, std::move(site)) {}
};

// A blocking wait ran past its deadline: a peer is missing or stalled. site().timeout says
// which deadline (where the thrower knew it).
class timeout_error : public communication_error {
 public:
  explicit timeout_error(const std::string& what) : communication_error(error_kind::timeout, what) {}
  timeout_error(error_site site, std::string_view detail) : communication_error(error_kind::timeout, std::move(site), detail) {}
  timeout_error(const std::string& what, error_site site) : communication_error(error_kind::timeout, what, std::move(site)) {}
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return site().timeout; }
};

// This rank stopped because its group was aborted after another rank failed: an echo, not the
// root cause. origin() names the rank whose failure aborted the group (-1 when unknown).
class aborted_error : public communication_error {
 public:
  aborted_error(error_site site, int origin, std::string_view reason)
      : communication_error(std::move(site), "group aborted: " + std::string(reason)), origin_(origin) {}
  // The same echo seen from a layer above: "<context>: <inner's message>", inner's fields.
  aborted_error(std::string_view context, const aborted_error& inner) : aborted_error(context, inner, inner.site()) {}
  // ... where the layer above knows its own place (its rank, operation, peer).
  aborted_error(std::string_view context, const aborted_error& inner, error_site site)
      : communication_error(error_kind::communication, std::string(context) + ": " + detail::unprefixed(inner.what()),
                            std::move(site)),
        origin_(inner.origin()) {}
  [[nodiscard]] int origin() const noexcept { return origin_; }

 private:
  int origin_;
};

// A dataset file or sample is unreadable or malformed.
class data_error : public error {
 public:
  explicit data_error(const std::string& what) : error(error_kind::data, what) {}
};

// A checkpoint is corrupted, truncated or does not match the model.
class checkpoint_error : public error {
 public:
  explicit checkpoint_error(const std::string& what) : error(error_kind::checkpoint, what) {}
};

namespace detail {
// Of the errors some ranks raised (null where a rank raised none), the one to report: the first
// that is not an aborted_error echo of another's failure, else the first echo; null when none.
[[nodiscard]] inline std::exception_ptr root_cause(std::span<const std::exception_ptr> errors) {
  std::exception_ptr first, first_echo;
  for (const auto& e : errors) {
    if (!e) continue;
    bool echo = false;
    try {
      std::rethrow_exception(e);
    } catch (const aborted_error&) {
      echo = true;
    } catch (...) {
    }
    if (!echo && !first) first = e;
    if (echo && !first_echo) first_echo = e;
  }
  return first ? first : first_echo;
}
}  // namespace detail

}  // namespace partrain::inline v0
