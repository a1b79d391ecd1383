// partrain/train/lr_schedule.hpp: learning-rate schedules as functions of the epoch, which the
// trainer calls before each epoch (so a resumed run continues on the same curve).
//   cosine_lr{.base = 0.05, .epochs = 8}   base * (1 + cos(pi * epoch / epochs)) / 2, down to 0
//   constant_lr{.base = 0.01}
#pragma once

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

}  // namespace partrain::inline v0
