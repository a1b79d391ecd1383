// partrain/train/detail/sharded_scaler.hpp: the optional grad scaler the sharded policies
// (zero_policy, fsdp_policy) share: with one, each step is amp_step (precision/sharded_amp.hpp)
// and the skipped ones are counted; its state travels in the checkpoint's extra.
#pragma once

#include <cstddef>

#include <partrain/precision/grad_scaler.hpp>
#include <partrain/precision/sharded_amp.hpp>
#include <partrain/train/checkpoint.hpp>

namespace partrain::inline v0::detail {

class sharded_scaler {
 public:
  explicit sharded_scaler(grad_scaler* s) noexcept : s_(s) {}

  // One step of the sharded policy z (its train_step holds the optimizer step); this rank's loss.
  template <class Z, class B>
  double step(Z& z, const B& b) {
    if (!s_) return z.train_step(b);
    const amp_step_result r = amp_step(z, *s_, b);
    skipped_ += r.skipped ? 1 : 0;
    return r.loss;
  }
  [[nodiscard]] std::size_t skipped() const noexcept { return skipped_; }

  void save(checkpoint_extra& extra) const {
    if (s_ && s_->enabled()) extra.scaler_state = s_->state_bytes();
  }
  void load(const checkpoint_extra& extra) {
    if (s_ && s_->enabled()) s_->load_state_bytes(extra.scaler_state);
  }

 private:
  grad_scaler* s_;
  std::size_t skipped_ = 0;
};

}  // namespace partrain::inline v0::detail
