// partrain/comm/detail/gloo_store.hpp: Gloo's rendezvous Store implemented over partrain's
// store, so Gloo's full-mesh connect exchanges its addresses through whatever store the job
// uses (TCP, file, in-memory). Keys get a prefix so several groups can share one store.
#pragma once

#if !__has_include(<gloo/rendezvous/store.h>)
#error "partrain/comm/detail/gloo_store.hpp needs Gloo (Debian libgloo-dev); link partrain::gloo"
#endif

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <gloo/rendezvous/store.h>

#include <partrain/comm/store.hpp>
#include <partrain/core/error.hpp>

namespace partrain::inline v0::detail::gloo {

class store_adapter final : public ::gloo::rendezvous::Store {
 public:
  store_adapter(std::shared_ptr<store> s, std::string prefix, std::chrono::milliseconds timeout)
      : store_(std::move(s)), prefix_(std::move(prefix)), timeout_(timeout) {
    if (!store_) throw invalid_argument_error("gloo rendezvous: the store is null (expected a connected store)");
  }

  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(prefix_ + key, std::span(reinterpret_cast<const std::byte*>(data.data()), data.size()));
  }
  std::vector<char> get(const std::string& key) override {
    auto bytes = store_->get(prefix_ + key, timeout_);
    std::vector<char> out(bytes.size());
    if (!bytes.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
    return out;
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    std::vector<std::string> full;
    full.reserve(keys.size());
    for (const auto& k : keys) full.push_back(prefix_ + k);
    // Gloo passes its context timeout; never wait longer than the group's own bound.
    store_->wait(full, timeout.count() > 0 ? std::min(timeout, timeout_) : timeout_);
  }

 private:
  std::shared_ptr<store> store_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

}  // namespace partrain::inline v0::detail::gloo
