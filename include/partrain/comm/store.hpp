// partrain/comm/store.hpp: the rendezvous key-value store (torch's c10d Store). Ranks exchange
// bootstrap data through it: Gloo's addresses, the NCCL unique id. Every call has a deadline.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace partrain::inline v0 {

class store {
 public:
  store() = default;
  store(const store&) = delete;
  store& operator=(const store&) = delete;
  virtual ~store() = default;

  virtual void set(const std::string& key, std::span<const std::byte> value) = 0;
  // Blocks until key exists (or the timeout passes: timeout_error naming the key).
  [[nodiscard]] virtual std::vector<std::byte> get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Atomically adds delta to the integer at key (0 if absent) and returns the new value.
  virtual std::int64_t add(const std::string& key, std::int64_t delta) = 0;
  // Blocks until every key exists; timeout_error names the keys still missing.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  [[nodiscard]] virtual bool check(const std::vector<std::string>& keys) = 0;

  // Conveniences over the byte interface.
  void set(const std::string& key, const std::string& value) {
    set(key, std::span(reinterpret_cast<const std::byte*>(value.data()), value.size()));
  }
  [[nodiscard]] std::string get_string(const std::string& key, std::chrono::milliseconds timeout) {
    auto v = get(key, timeout);
    return {reinterpret_cast<const char*>(v.data()), v.size()};
  }
};

}  // namespace partrain::inline v0
