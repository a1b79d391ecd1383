// partrain/core/error.hpp: one error hierarchy. Messages say what was wrong, where
// (rank, operation, name) and what was expected.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

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

// Base of every exception partrain throws.
class error : public std::runtime_error {
 public:
  error(error_kind kind, const std::string& what) : std::runtime_error("partrain: " + what), kind_(kind) {}
  [[nodiscard]] error_kind kind() const noexcept { return kind_; }

 private:
  error_kind kind_;
};

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

 protected:
  communication_error(error_kind k, const std::string& what) : error(k, what) {}
};

// A blocking wait ran past its deadline: a peer is missing or stalled.
class timeout_error : public communication_error {
 public:
  explicit timeout_error(const std::string& what) : communication_error(error_kind::timeout, what) {}
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

}  // namespace partrain::inline v0
