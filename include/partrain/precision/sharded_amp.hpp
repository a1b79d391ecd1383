// partrain/precision/sharded_amp.hpp: mixed precision under sharded data parallel
// (parallel/zero.hpp, parallel/fsdp.hpp): amp_step's loss scaling, unscale and overflow check
// applied to each rank's reduced gradient slice, the overflow flag agreed across ranks, so every
// rank skips a step that overflowed anywhere (PyTorch's ShardedGradScaler). Under ZeRO the model
// keeps fp32 masters (whole, as the model owns them; the optimizer state is sharded) and a 16-bit
// copy that is refreshed after each update; FSDP scales its loss itself and its fp32 chunks are
// the masters (its reduce_dtype float16 is what the scale protects).
//
//   grad_scaler scaler = mp.make_scaler();
//   for (auto& b : batches) amp_step(zero, scaler, b);   // a sharded_data_parallel or a
//                                                        // fully_sharded_data_parallel
#pragma once

#include <array>
#include <limits>
#include <type_traits>
#include <utility>

#include <partrain/core/error.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/optim/clip.hpp>
#include <partrain/precision/grad_scaler.hpp>
#include <partrain/precision/mixed_precision.hpp>

namespace partrain::inline v0 {

namespace detail::amp {

// A sharded data parallel (ZeRO's module() is the model; FSDP scales the loss itself).
template <class Z>
concept sharded_trainer = requires(Z& z) {
  z.comm();
  { z.last_step_skipped() } -> std::convertible_to<bool>;
  z.set_gradient_hook({});
};

// One rank's reduced gradient slice (in host or CUDA memory, S) as a model of one parameter, so
// the scaler's unscale (one fused pass, flag agreed across ranks) runs on it unchanged.
template <class S>
struct gradient_slice {
  std::array<optim::gradient_only<float, S>, 1> ps;
  [[nodiscard]] std::array<optim::gradient_only<float, S>, 1>& parameters() noexcept { return ps; }
};

}  // namespace detail::amp

// One mixed-precision step of a sharded data parallel: set the loss scale, forward + backward,
// reduce_scatter, unscale and check this rank's slice (agreed across ranks), clip (the
// zero_options' max_grad_norm), step the slice and all_gather unless some gradient overflowed,
// refresh the 16-bit copy, update the scale. Outside no_sync only.
template <detail::amp::sharded_trainer Z, class B>
amp_step_result amp_step(Z& zero, grad_scaler& scaler, const B& batch) {
  if constexpr (requires { zero.options().join; }) {
    // The overflow agreement is a collective a joined rank (shadowing in join()) would not join.
    if (zero.options().join && scaler.enabled()) {
      throw config_error("amp_step: a grad scaler with join enabled is not supported (a rank that joined cannot "
                         "take part in the overflow agreement); disable join or the scaler");
    }
  }
  amp_step_result r;
  r.scale = scaler.scale();
  if constexpr (requires { zero.set_loss_scale(r.scale); }) {
    zero.set_loss_scale(r.scale);  // FSDP: it runs the loss's backward itself
  } else if constexpr (loss_scalable<std::remove_cvref_t<decltype(zero.module())>>) {
    zero.module().set_loss_scale(r.scale);
  } else {
    detail::amp::require_loss_scale<std::remove_cvref_t<decltype(zero.module())>>(&scaler, "amp_step");
  }
  bool checked = false;
  if (scaler.enabled()) {
    zero.set_gradient_hook([&]<class S>(tensor_view<float, S> slice) {
      detail::amp::gradient_slice<S> s;
      s.ps[0].g = slice;
      checked = true;
      return !scaler.unscale(s, zero.comm());
    });
  }
  try {
    r.loss = zero.train_step(batch);
  } catch (...) {
    zero.set_gradient_hook({});
    throw;
  }
  zero.set_gradient_hook({});
  if (scaler.enabled() && !checked) {
    throw invalid_argument_error("amp_step: the sharded data parallel did not synchronize this step (inside "
                                 "no_sync?); amp_step runs whole steps only");
  }
  r.skipped = zero.last_step_skipped();
  r.grad_norm = zero.last_grad_norm();
  if constexpr (requires { zero.module(); }) {
    if (!r.skipped) {
      if constexpr (has_low_precision_copy<std::remove_cvref_t<decltype(zero.module())>>) zero.module().refresh_low_precision();
    }
  }
  if (scaler.enabled()) scaler.update();
  return r;
}

}  // namespace partrain::inline v0
