// partrain/precision/mixed_precision.hpp: the mixed-precision policy and the step that applies it.
//
// The policy (PyTorch's autocast + GradScaler, or FSDP's MixedPrecision, as one value): the model
// keeps fp32 master weights and computes with a 16-bit copy; gradients reach the masters in fp32
// and are reduced in fp32 or, through DDP's communication hooks, in 16 bits; the optimizer steps
// the masters; the copy is refreshed after each step. fp16 needs loss scaling, bf16 does not.
//
// What the model offers (both optional for fp32, see the concepts below):
//   void set_loss_scale(float s);   // multiply the gradient of the loss by s in backward
//   void refresh_low_precision();   // re-cast the masters into the 16-bit copy
#pragma once

#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>

#include <partrain/core/error.hpp>
#include <partrain/model/concepts.hpp>
#include <partrain/optim/clip.hpp>
#include <partrain/optim/optimizer.hpp>
#include <partrain/parallel/comm_hooks.hpp>
#include <partrain/precision/grad_scaler.hpp>
#include <partrain/precision/precision.hpp>

namespace partrain::inline v0 {

// A model that applies a loss scale in its backward (what `scaler.scale(loss).backward()` does).
template <class M>
concept loss_scalable = requires(M& m, float s) { m.set_loss_scale(s); };

// A model with a 16-bit copy of its weights to refresh after the masters change.
template <class M>
concept has_low_precision_copy = requires(M& m) { m.refresh_low_precision(); };

struct mixed_precision_policy {
  precision compute = precision::fp32;
  // false: DDP all_reduces fp32 gradients; true: in the compute's 16-bit type (comm hook).
  bool reduce_in_low_precision = false;
  // Loss scaling: by default on for fp16 only.
  std::optional<bool> loss_scaling{};
  grad_scaler_options scaler{};

  [[nodiscard]] bool scales_loss() const noexcept { return loss_scaling.value_or(compute == precision::fp16); }
  [[nodiscard]] grad_scaler make_scaler() const {
    grad_scaler_options o = scaler;
    o.enabled = o.enabled && scales_loss();
    return grad_scaler(o);
  }
  // The ddp_options::hook that reduces as configured.
  [[nodiscard]] comm_hook ddp_hook() const {
    if (!reduce_in_low_precision || compute == precision::fp32) return comm_hooks::allreduce();
    return compute == precision::fp16 ? comm_hooks::fp16_compress() : comm_hooks::bf16_compress();
  }
};

struct amp_step_options {
  double max_grad_norm = 0;  // > 0: clip the unscaled gradients to this global norm
};

struct amp_step_result {
  double loss = 0;       // the model's (unscaled) mean loss
  bool skipped = false;  // inf/NaN gradients (on some rank): the optimizer did not step
  float scale = 1;       // the loss scale this step used
  double grad_norm = std::numeric_limits<double>::quiet_NaN();  // before clipping, when clipped
};

namespace detail::amp {

// An enabled scaler needs a model that applies the scale in backward: checked where the two first
// meet (a policy's construction, before any step; amp_step), in one sentence.
template <class M>
void require_loss_scale(const grad_scaler* s, const char* who) {
  if constexpr (!loss_scalable<M>) {
    if (s && s->enabled()) {
      throw config_error(std::string(who) + ": the gradient scaler is enabled but the model has no `void "
                         "set_loss_scale(float)` to apply it in backward (add it, or disable loss scaling)");
    }
  }
}

template <class T>
concept ddp_like = requires(T& t) {
  t.module();
  t.comm();
};

template <class T>
decltype(auto) module_of(T& t) {
  if constexpr (ddp_like<T>) {
    return (t.module());
  } else {
    return (t);
  }
}

}  // namespace detail::amp

// One mixed-precision training step on `trainer`, a distributed_data_parallel (gradients averaged
// across ranks, the overflow flag agreed across ranks) or a bare model (one process):
// set the loss scale, forward + backward, unscale and check, optionally clip, step the masters
// unless some gradient overflowed, refresh the 16-bit copy, update the scale.
template <class Trainer, optimizer O, class B>
amp_step_result amp_step(Trainer& trainer, O& opt, grad_scaler& scaler, const B& batch, amp_step_options o = {}) {
  auto& m = detail::amp::module_of(trainer);
  using M = std::remove_cvref_t<decltype(m)>;
  amp_step_result r;
  r.scale = scaler.scale();
  if constexpr (loss_scalable<M>) {
    m.set_loss_scale(r.scale);
  } else {
    detail::amp::require_loss_scale<M>(&scaler, "amp_step");
  }
  r.loss = trainer.train_step(batch);
  bool found = false;
  if (scaler.enabled()) {
    if constexpr (detail::amp::ddp_like<Trainer>) {
      found = scaler.unscale(m, trainer.comm());
    } else {
      found = scaler.unscale(m);
    }
  }
  if (!found && o.max_grad_norm > 0) r.grad_norm = clip_grad_norm(m, o.max_grad_norm);
  const bool stepped = scaler.enabled() ? scaler.step(opt, m) : (opt.step(), true);
  if (stepped) {
    if constexpr (has_low_precision_copy<M>) m.refresh_low_precision();
  }
  if (scaler.enabled()) scaler.update();
  r.skipped = !stepped;
  return r;
}

}  // namespace partrain::inline v0
