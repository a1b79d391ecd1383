// partrain/train/lr_schedule.hpp: learning-rate schedules as functions of the epoch, which the
// trainer calls before each epoch (trainer_options::lr), or of the global step, called before
// every optimizer step (trainer_options::step_lr); a resumed run continues on the same curve.
//   cosine_lr{.base = 0.05, .epochs = 8}   base * (1 + cos(pi * epoch / epochs)) / 2, down to 0
//   constant_lr{.base = 0.01}
//   warmup_cosine_lr{.base = 0.05, .warmup_steps = 100, .total_steps = 7500}   per step
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <numbers>
#include <string>

#include <partrain/core/error.hpp>

namespace partrain::inline v0 {

namespace detail::lr {
inline void check_base(double base, const char* who) {
  if (!std::isfinite(base) || base <= 0) {
    throw invalid_argument_error(std::string(who) + ": the learning rate must be a finite number > 0, got " +
                                 std::to_string(base));
  }
}
}  // namespace detail::lr

struct cosine_lr {
  double base = 0;
  std::size_t epochs = 0;
  [[nodiscard]] double operator()(std::size_t epoch) const {
    detail::lr::check_base(base, "cosine_lr");
    if (epochs == 0) throw invalid_argument_error("cosine_lr: epochs must be at least 1, got 0");
    return base * 0.5 * (1 + std::cos(std::numbers::pi * static_cast<double>(epoch) / static_cast<double>(epochs)));
  }
};

struct constant_lr {
  double base = 0;
  [[nodiscard]] double operator()(std::size_t) const {
    detail::lr::check_base(base, "constant_lr");
    return base;
  }
};

// Per step: a linear warm-up to base over warmup_steps (base * (step + 1) / (warmup_steps + 1),
// torchtitan's), then a cosine from base down to min at total_steps (and min after it).
struct warmup_cosine_lr {
  double base = 0;
  std::size_t warmup_steps = 0;
  std::size_t total_steps = 0;
  double min = 0;
  [[nodiscard]] double operator()(std::size_t step) const {
    detail::lr::check_base(base, "warmup_cosine_lr");
    if (total_steps <= warmup_steps) {
      throw invalid_argument_error("warmup_cosine_lr: total_steps (" + std::to_string(total_steps) +
                                   ") must be greater than warmup_steps (" + std::to_string(warmup_steps) + ")");
    }
    if (!(min >= 0) || !(min <= base)) {
      throw invalid_argument_error("warmup_cosine_lr: min must be in [0, base], got " + std::to_string(min));
    }
    if (step < warmup_steps) {
      return base * static_cast<double>(step + 1) / static_cast<double>(warmup_steps + 1);
    }
    const double progress = std::min(1.0, static_cast<double>(step - warmup_steps) /
                                              static_cast<double>(total_steps - warmup_steps));
    return min + (base - min) * 0.5 * (1 + std::cos(std::numbers::pi * progress));
  }
};

}  // namespace partrain::inline v0
