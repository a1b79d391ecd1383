// partrain/core/weighted_shares.hpp: the one apportionment rule partrain uses wherever whole rows
// are shared out by weight (the weighted sampler's ranks, data_parallel's devices): the floor of
// each exact quota, then one more row each to the largest fractional remainders, ties to the
// lower index; a zero weight never gets a row. Shares sum to `total` exactly and each is within
// one row of total * weight / sum(weights) (the largest-remainder, or Hamilton, method).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <partrain/core/error.hpp>

namespace partrain::inline v0 {

// `who` names the caller in errors ("weighted_split", "data_parallel").
[[nodiscard]] inline std::vector<std::size_t> weighted_shares(std::size_t total, std::span<const double> weights,
                                                              std::string_view who = "weighted_shares") {
  const std::string w(who);
  if (weights.empty()) throw invalid_argument_error(w + ": no weights given, expected one per rank or device");
  double sum = 0;
  for (std::size_t i = 0; i < weights.size(); ++i) {
    if (!std::isfinite(weights[i]) || weights[i] < 0) {
      throw invalid_argument_error(w + ": weight " + std::to_string(i) + " is " + std::to_string(weights[i]) +
                                   ", expected a finite value >= 0");
    }
    sum += weights[i];
  }
  if (!(sum > 0) || !std::isfinite(sum)) {
    throw invalid_argument_error(w + ": the weights sum to " + std::to_string(sum) + ", expected a positive finite sum");
  }
  std::vector<std::size_t> share(weights.size());
  std::vector<double> remainder(weights.size());
  std::size_t given = 0;
  for (std::size_t i = 0; i < weights.size(); ++i) {
    const double quota = static_cast<double>(total) * (weights[i] / sum);
    // min(): rounding can push a floor past what is left.
    share[i] = std::min(static_cast<std::size_t>(std::floor(quota)), total - given);
    remainder[i] = weights[i] > 0 ? quota - static_cast<double>(share[i]) : -1.0;
    given += share[i];
  }
  std::vector<std::size_t> order(weights.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return remainder[a] > remainder[b]; });
  const auto positive = static_cast<std::size_t>(std::count_if(weights.begin(), weights.end(), [](double x) { return x > 0; }));
  for (std::size_t k = 0; given < total; k = (k + 1) % positive, ++given) ++share[order[k]];
  return share;
}

}  // namespace partrain::inline v0
