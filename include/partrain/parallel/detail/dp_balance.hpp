// partrain/parallel/detail/dp_balance.hpp: the "balance" mode of data_parallel. Each device's
// speed is its examples over its measured step time; shares follow the smoothed speeds so that
// devices finish their part of a batch together (the data-parallel form of b_i = B * s_i / sum s).
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

namespace partrain::inline v0::detail::dp {

class balancer {
 public:
  balancer(std::size_t devices, std::size_t warmup_steps, double smoothing, double min_share)
      : speed_(devices, 0.0), warmup_(warmup_steps), alpha_(smoothing), min_share_(min_share) {}

  // One step's measurements. Devices that got no examples (or were not timed) keep their speed.
  // Returns true when the caller should recompute shares (after warm-up and once every device
  // with a non-zero share has been measured at least once).
  bool observe(std::span<const std::size_t> counts, std::span<const double> seconds) {
    if (++steps_ <= warmup_) return false;  // cold caches, first allocations: not representative
    for (std::size_t i = 0; i < speed_.size(); ++i) {
      if (counts[i] == 0 || seconds[i] <= 0) continue;
      const double s = static_cast<double>(counts[i]) / seconds[i];
      speed_[i] = speed_[i] == 0 ? s : (1 - alpha_) * speed_[i] + alpha_ * s;
    }
    return std::all_of(speed_.begin(), speed_.end(), [](double s) { return s > 0; });
  }

  // Shares proportional to speed, each at least min_share (so a slow device still gets a few
  // examples and keeps being measured), normalised to sum 1.
  [[nodiscard]] std::vector<double> shares() const {
    double total = 0;
    for (double s : speed_) total += s;
    std::vector<double> out(speed_.size(), 1.0 / static_cast<double>(speed_.size()));
    if (total <= 0) return out;
    double sum = 0;
    for (std::size_t i = 0; i < out.size(); ++i) {
      out[i] = std::max(min_share_, speed_[i] / total);
      sum += out[i];
    }
    for (double& v : out) v /= sum;
    return out;
  }

  [[nodiscard]] std::span<const double> speeds() const noexcept { return speed_; }

 private:
  std::vector<double> speed_;  // examples per second, smoothed
  std::size_t warmup_;
  double alpha_;
  double min_share_;
  std::size_t steps_ = 0;
};

}  // namespace partrain::inline v0::detail::dp
