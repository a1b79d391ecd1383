// partrain/train/detail/sharded_scaler.hpp: the optional grad scaler the sharded policies
// (zero_policy, fsdp_policy) share: with one, each step is amp_step (precision/sharded_amp.hpp)
// and the skipped ones are counted; its state travels in the checkpoint's extra.
#pragma once

#include <cstddef>
#include <string>

#include <partrain/core/error.hpp>

#include <partrain/precision/grad_scaler.hpp>
#include <partrain/precision/sharded_amp.hpp>
#include <partrain/train/checkpoint.hpp>

namespace partrain::inline v0::detail {

// The loss scale may change between micro-batches: accumulation runs without a scaler (every
// policy that accumulates says so in these words).
inline void refuse_scaled_accumulation(bool scaled, const char* policy) {
  if (scaled) {
    throw config_error(std::string(policy) + ": gradient accumulation with a grad scaler is not supported (the loss "
                       "scale may change between micro-batches); use fp32, or bf16 without a scaler");
  }
}

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
  // A micro-batch of an accumulated step: inside z's no_sync, no optimizer step.
  template <class Z, class B>
  double accumulate(Z& z, const B& b, const char* policy) {
    refuse_scaled_accumulation(s_ && s_->enabled(), policy);
    auto guard = z.no_sync();
    return z.train_step(b);
  }

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
