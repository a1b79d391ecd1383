// partrain/precision/grad_scaler.hpp: dynamic loss scaling for fp16 training, with the semantics
// of PyTorch's torch.amp.GradScaler. The loss's gradient is multiplied by scale() so that small
// gradients survive fp16; before the optimizer steps, the gradients are divided back (unscale)
// and checked for inf/NaN in the same pass. A step with an overflow is skipped and the scale
// halved; after growth_interval good steps in a row it doubles. In data-parallel training the
// overflow flag is agreed across ranks (one small all_reduce), so every rank skips the same steps.
//
// Per iteration: model.set_loss_scale(scaler.scale()); train step; [scaler.unscale(...); clip;]
// scaler.step(opt, ...); scaler.update(). precision/amp_step.hpp does all of it in one call.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <partrain/comm/reduce_op.hpp>
#include <partrain/core/device.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/memory_space.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/core/work.hpp>
#include <partrain/model/concepts.hpp>
#include <partrain/model/traits.hpp>
#include <partrain/optim/optimizer.hpp>
#include <partrain/optim/state_io.hpp>
#include <partrain/parallel/detail/host_staging.hpp>
#include <partrain/precision/detail/host_kernels.hpp>
#include <partrain/precision/precision.hpp>

#if defined(__CUDACC__)
#include <partrain/precision/detail/kernels.cuh>
#endif
#if PARTRAIN_HAS_CUDA
#include <partrain/cuda/device_guard.hpp>
#endif

namespace partrain::inline v0 {

// GradScaler's constructor arguments and defaults.
struct grad_scaler_options {
  float init_scale = 65536.0f;  // 2^16
  float growth_factor = 2.0f;
  float backoff_factor = 0.5f;
  std::int64_t growth_interval = 2000;
  bool enabled = true;  // false: scale() is 1, nothing is checked, every step runs
};

class grad_scaler {
 public:
  explicit grad_scaler(grad_scaler_options o = {}) : opts_(o), scale_(o.init_scale) { validate(opts_); }

  // The scaler a precision wants by default: scaling for fp16; none for bf16 (float's exponent
  // range) and fp32.
  [[nodiscard]] static grad_scaler for_precision(precision p, grad_scaler_options o = {}) {
    o.enabled = o.enabled && p == precision::fp16;
    return grad_scaler(o);
  }

  [[nodiscard]] bool enabled() const noexcept { return opts_.enabled; }
  // What the loss (its gradient) is multiplied by this iteration; 1 when disabled.
  [[nodiscard]] float scale() const noexcept { return opts_.enabled ? scale_ : 1.0f; }
  // Good steps since the last change of scale.
  [[nodiscard]] std::int64_t growth_tracker() const noexcept { return growth_tracker_; }
  [[nodiscard]] const grad_scaler_options& options() const noexcept { return opts_; }
  [[nodiscard]] double scale_loss(double loss) const noexcept { return loss * static_cast<double>(scale()); }

  // Divides every gradient of the model by scale() and reports whether any was inf or NaN, in
  // one pass over all of them. At most once per iteration (the next update() ends it).
  template <model M>
  [[nodiscard]] bool unscale(M& m) {
    return unscale_impl(m, [](bool found) { return found; });
  }
  // The same, with the flag agreed across the ranks of `comm` (max over ranks): every rank sees
  // an overflow when any rank had one, and skips the step with the others.
  template <model M, class C>
  [[nodiscard]] bool unscale(M& m, C& comm) {
    return unscale_impl(m, [&comm, &m, this](bool found) { return agree(comm, found, flag_device(m)); });
  }

  // Steps the optimizer unless this iteration's gradients overflowed; unscales first when
  // unscale() was not called. Returns true when the optimizer stepped.
  template <optimizer O, model M>
  bool step(O& opt, M& m) {
    if (!opts_.enabled) return run_step(opt);
    if (!unscaled_) (void)unscale(m);
    return found_inf_ ? false : run_step(opt);
  }
  template <optimizer O, model M, class C>
  bool step(O& opt, M& m, C& comm) {
    if (!opts_.enabled) return run_step(opt);
    if (!unscaled_) (void)unscale(m, comm);
    return found_inf_ ? false : run_step(opt);
  }

  // Ends the iteration: halves the scale after an overflow (and restarts the count of good
  // steps), doubles it after growth_interval good steps in a row (if the result is finite).
  void update() {
    if (!opts_.enabled) return;
    if (!unscaled_) {
      throw invalid_argument_error("grad_scaler::update: no inf/NaN check was recorded this iteration (call "
                                   "unscale() or step() before update())");
    }
    update(found_inf_);
  }
  // The same with the overflow decision given (what update() applies; handy for a caller that
  // checks gradients itself).
  void update(bool found_inf) {
    unscaled_ = false;
    found_inf_ = false;
    if (!opts_.enabled) return;
    if (found_inf) {
      scale_ *= opts_.backoff_factor;
      growth_tracker_ = 0;
      return;
    }
    if (++growth_tracker_ == opts_.growth_interval) {
      const float grown = scale_ * opts_.growth_factor;
      if (std::isfinite(grown)) scale_ = grown;
      growth_tracker_ = 0;
    }
  }
  // Whether this iteration's unscale found an overflow.
  [[nodiscard]] bool found_inf() const noexcept { return found_inf_; }

  // State for checkpoint_extra::scaler_state: scale, growth tracker and the options.
  [[nodiscard]] std::vector<std::byte> state_bytes() const {
    state_writer w;
    w.put(state_magic);
    w.put(state_version);
    w.put(scale_);
    w.put(growth_tracker_);
    w.put(opts_.growth_factor);
    w.put(opts_.backoff_factor);
    w.put(opts_.growth_interval);
    w.put(static_cast<std::uint8_t>(opts_.enabled ? 1 : 0));
    return w.release();
  }
  // Restores what state_bytes() saved; refuses empty, truncated or implausible state by name.
  void load_state_bytes(std::span<const std::byte> bytes) {
    if (bytes.empty()) {
      throw checkpoint_error("grad_scaler: the checkpoint holds no scaler state (was it saved by a run without "
                             "a gradient scaler, e.g. fp32 or bf16?)");
    }
    state_reader r(bytes);
    if (r.get<std::uint32_t>("grad_scaler magic") != state_magic) {
      throw checkpoint_error("grad_scaler: the scaler state does not start with the grad_scaler marker");
    }
    const auto version = r.get<std::uint32_t>("grad_scaler version");
    if (version != state_version) {
      throw checkpoint_error("grad_scaler: scaler state version " + std::to_string(version) + ", expected " +
                             std::to_string(state_version));
    }
    grad_scaler_options o;
    const auto scale = r.get<float>("grad_scaler scale");
    const auto tracker = r.get<std::int64_t>("grad_scaler growth tracker");
    o.init_scale = scale;
    o.growth_factor = r.get<float>("grad_scaler growth factor");
    o.backoff_factor = r.get<float>("grad_scaler backoff factor");
    o.growth_interval = r.get<std::int64_t>("grad_scaler growth interval");
    o.enabled = r.get<std::uint8_t>("grad_scaler enabled") != 0;
    if (r.remaining() != 0) throw checkpoint_error("grad_scaler: " + std::to_string(r.remaining()) + " unexpected bytes after the scaler state");
    try {
      validate(o);
    } catch (const invalid_argument_error& e) {
      throw checkpoint_error(std::string("grad_scaler: the saved state is not valid: ") + e.what());
    }
    if (tracker < 0 || tracker >= o.growth_interval) {
      throw checkpoint_error("grad_scaler: saved growth tracker " + std::to_string(tracker) + " is outside [0, " +
                             std::to_string(o.growth_interval) + ")");
    }
    opts_ = o;
    scale_ = scale;
    growth_tracker_ = tracker;
    unscaled_ = false;
    found_inf_ = false;
  }

 private:
  static constexpr std::uint32_t state_magic = 0x4c435347u;  // "GSCL"
  static constexpr std::uint32_t state_version = 1;

  static void validate(const grad_scaler_options& o) {
    auto bad = [](const std::string& what) { throw invalid_argument_error("grad_scaler_options: " + what); };
    if (!(o.init_scale > 0) || !std::isfinite(o.init_scale)) bad("init_scale must be finite and > 0, got " + std::to_string(o.init_scale));
    if (!(o.growth_factor > 1) || !std::isfinite(o.growth_factor)) bad("growth_factor must be finite and > 1, got " + std::to_string(o.growth_factor));
    if (!(o.backoff_factor > 0 && o.backoff_factor < 1)) bad("backoff_factor must be in (0, 1), got " + std::to_string(o.backoff_factor));
    if (o.growth_interval <= 0) bad("growth_interval must be > 0, got " + std::to_string(o.growth_interval));
  }

  template <optimizer O>
  static bool run_step(O& opt) {
    opt.step();
    return true;
  }

  template <model M, class Agree>
  bool unscale_impl(M& m, Agree&& agree_fn) {
    if (!opts_.enabled) return false;
    if (unscaled_) {
      throw invalid_argument_error("grad_scaler::unscale: already called this iteration (call update() to end it)");
    }
    using S = model_space_t<M>;
    using T = model_element_t<M>;
    static_assert(std::same_as<T, float>, "partrain: grad_scaler unscales fp32 gradients (the master weights' gradients)");
    static_assert(std::same_as<S, host> || detail::amp::is_nvcc_compiled,
                  "partrain: unscaling CUDA gradients needs the translation unit compiled by nvcc "
                  "(the kernel is in partrain/precision/detail/kernels.cuh)");
    std::vector<tensor_view<float, S>> grads;
    for (auto&& p : m.parameters()) grads.push_back(p.grad());
    // 1/scale in double, rounded once to float (as GradScaler computes it).
    const auto inv = static_cast<float>(1.0 / static_cast<double>(scale_));
    const bool local = detail::amp::unscale_and_check(std::span<const tensor_view<float, S>>(grads), inv, model_stream(m));
    found_inf_ = agree_fn(local);
    unscaled_ = true;
    return found_inf_;
  }

  // A stalled or dead rank surfaces as the backend's timeout; say which operation it was.
  template <class C>
  static void wait_named(C& comm, work w) {
    try {
      w.wait();
    } catch (const aborted_error& e) {
      throw aborted_error("rank " + std::to_string(comm.rank()) + " grad_scaler: the overflow-flag all_reduce failed", e);
    } catch (const timeout_error& e) {
      throw timeout_error("rank " + std::to_string(comm.rank()) + " grad_scaler: the overflow-flag all_reduce failed: " +
                          e.what());
    } catch (const communication_error& e) {
      throw communication_error("rank " + std::to_string(comm.rank()) +
                                " grad_scaler: the overflow-flag all_reduce failed: " + e.what());
    }
  }

  // The device for the flag's device copy: that of the gradients' memory (cudaPointerGetAttributes;
  // the model concepts expose no device); -1 otherwise, and detail::host_collective takes the
  // communicator's (nccl_group), else the current one, and only where a copy is needed.
  template <model M>
  [[nodiscard]] static int flag_device(M& m) {
    (void)m;
#if PARTRAIN_HAS_CUDA
    if constexpr (std::same_as<model_space_t<M>, cuda>) {
      for (auto&& p : m.parameters()) {
        const auto g = p.grad();
        if (!g.empty()) return cuda_device_of(g.data(), "grad_scaler (overflow flag placement)").index;
      }
    }
#endif
    return -1;
  }

  // Max over ranks of the flag. A backend that takes only CUDA memory (NCCL) gets a device copy
  // on `cuda_device` (-1: see flag_device).
  template <class C>
  bool agree(C& comm, bool found, int cuda_device) {
    float flag = found ? 1.0f : 0.0f;
    detail::host_collective(
        comm, std::span<float>(&flag, 1), [&](auto t) { return comm.all_reduce(t, reduce_op::max); },
        [&](work w) { wait_named(comm, std::move(w)); }, cuda_device);
    return flag != 0.0f;
  }

  grad_scaler_options opts_;
  float scale_;
  std::int64_t growth_tracker_ = 0;
  bool unscaled_ = false;   // unscale() ran this iteration
  bool found_inf_ = false;  // and found an overflow (on any rank, when agreed)
};

}  // namespace partrain::inline v0
