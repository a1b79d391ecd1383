// partrain/rendezvous/prefix_store.hpp: a view of another store whose keys all live under
// "<prefix>/" (torch's PrefixStore). A restarted job uses a prefix per attempt, and
// sub-groups one per group, so their keys never meet.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <partrain/comm/store.hpp>
#include <partrain/core/error.hpp>

namespace partrain::inline v0 {

class prefix_store final : public store {
 public:
  prefix_store(std::string prefix, std::shared_ptr<store> base) : prefix_(std::move(prefix)), base_(std::move(base)) {
    if (!base_) throw invalid_argument_error("prefix_store '" + prefix_ + "': the underlying store is null");
  }

  [[nodiscard]] const std::string& prefix() const noexcept { return prefix_; }
  [[nodiscard]] const std::shared_ptr<store>& underlying() const noexcept { return base_; }

  using store::set;
  void set(const std::string& key, std::span<const std::byte> value) override { base_->set(full(key), value); }
  [[nodiscard]] std::vector<std::byte> get(const std::string& key, std::chrono::milliseconds timeout) override {
    return base_->get(full(key), timeout);
  }
  std::int64_t add(const std::string& key, std::int64_t delta) override { return base_->add(full(key), delta); }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    base_->wait(full(keys), timeout);
  }
  [[nodiscard]] bool check(const std::vector<std::string>& keys) override { return base_->check(full(keys)); }

 private:
  [[nodiscard]] std::string full(const std::string& key) const { return prefix_ + "/" + key; }
  [[nodiscard]] std::vector<std::string> full(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    out.reserve(keys.size());
    for (const auto& k : keys) out.push_back(full(k));
    return out;
  }

  std::string prefix_;
  std::shared_ptr<store> base_;
};

}  // namespace partrain::inline v0
