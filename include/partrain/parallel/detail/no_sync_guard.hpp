// partrain/parallel/detail/no_sync_guard.hpp: what no_sync() of DDP, ZeRO and FSDP returns (one
// type for the three, each class names it as its own no_sync_guard).
#pragma once

#include <utility>

namespace partrain::inline v0::detail::ddp {

// RAII: while it lives, the owner's "synchronise this step" flag is false; when it ends the flag
// gets back the value it had, so guards nest.
class no_sync_guard {
 public:
  explicit no_sync_guard(bool& require_sync) noexcept : flag_(&require_sync), prev_(std::exchange(require_sync, false)) {}
  no_sync_guard(const no_sync_guard&) = delete;
  no_sync_guard& operator=(const no_sync_guard&) = delete;
  ~no_sync_guard() { *flag_ = prev_; }

 private:
  bool* flag_;
  bool prev_;
};

}  // namespace partrain::inline v0::detail::ddp
