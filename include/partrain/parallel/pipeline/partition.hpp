// partrain/parallel/pipeline/partition.hpp: which contiguous layers go to which stage. The
// slowest stage sets the pipeline's pace, so the balanced partitioners minimise the largest
// stage cost (exactly, by dynamic programming), not the spread between stages.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <limits>
#include <numeric>
#include <ostream>
#include <ranges>
#include <span>
#include <string>
#include <vector>

#include <partrain/core/buffer.hpp>
#include <partrain/core/error.hpp>
#include <partrain/model/layer.hpp>

namespace partrain::inline v0 {

// Stage s owns layers [bounds[s], bounds[s+1]); costs[s] is the sum of its layers' costs.
struct partition {
  std::vector<std::size_t> bounds;
  std::vector<double> costs;

  [[nodiscard]] int stages() const noexcept { return static_cast<int>(bounds.size()) - 1; }
  [[nodiscard]] std::size_t first(int s) const { return bounds.at(static_cast<std::size_t>(s)); }
  [[nodiscard]] std::size_t last(int s) const { return bounds.at(static_cast<std::size_t>(s) + 1); }
  [[nodiscard]] double bottleneck() const { return costs.empty() ? 0.0 : *std::ranges::max_element(costs); }

  // "stage 0: layers [0, 3) cost 12" one line per stage.
  [[nodiscard]] std::string to_string() const {
    std::string s;
    for (int i = 0; i < stages(); ++i) {
      char cost[64];
      std::snprintf(cost, sizeof cost, "%g", costs.empty() ? 0.0 : costs[static_cast<std::size_t>(i)]);
      s += "stage " + std::to_string(i) + ": layers [" + std::to_string(first(i)) + ", " + std::to_string(last(i)) +
           ") cost " + cost + "\n";
    }
    return s;
  }
  friend std::ostream& operator<<(std::ostream& os, const partition& p) { return os << p.to_string(); }
};

namespace detail::pipeline {

inline void check_partition_request(std::size_t layers, int parts, const char* who) {
  if (parts < 1) throw invalid_argument_error(std::string(who) + ": stages must be at least 1, got " + std::to_string(parts));
  if (layers < static_cast<std::size_t>(parts)) {
    throw invalid_argument_error(std::string(who) + ": cannot split " + std::to_string(layers) + " layers into " +
                                 std::to_string(parts) + " stages (expected at least one layer per stage)");
  }
}

inline partition with_costs(std::vector<std::size_t> bounds, std::span<const double> costs) {
  partition p{std::move(bounds), {}};
  for (int s = 0; s < p.stages(); ++s) {
    double c = 0;
    for (std::size_t i = p.first(s); i < p.last(s); ++i) c += costs.empty() ? 1.0 : costs[i];
    p.costs.push_back(c);
  }
  return p;
}

}  // namespace detail::pipeline

// Equal layer counts; the first (layers % stages) stages get one more (DeepSpeed 'uniform').
[[nodiscard]] inline partition partition_uniform(std::size_t layers, int stages) {
  detail::pipeline::check_partition_request(layers, stages, "partition_uniform");
  const auto p = static_cast<std::size_t>(stages);
  std::vector<std::size_t> b{0};
  for (std::size_t s = 0; s < p; ++s) b.push_back(b.back() + layers / p + (s < layers % p ? 1 : 0));
  return detail::pipeline::with_costs(std::move(b), {});
}

// Contiguous split minimising the largest stage cost: exact O(n^2 p) dynamic program
// best[j][i] = min over k of max(best[j-1][k], S[i] - S[k]). Ties go to the earliest cut.
[[nodiscard]] inline partition partition_balanced(std::span<const double> costs, int stages) {
  detail::pipeline::check_partition_request(costs.size(), stages, "partition_balanced");
  for (std::size_t i = 0; i < costs.size(); ++i) {
    if (!(costs[i] >= 0)) {
      throw invalid_argument_error("partition_balanced: cost of layer " + std::to_string(i) + " is " +
                                   std::to_string(costs[i]) + " (expected a finite value >= 0)");
    }
  }
  const std::size_t n = costs.size();
  const auto p = static_cast<std::size_t>(stages);
  std::vector<double> prefix(n + 1, 0.0);
  for (std::size_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + costs[i];
  constexpr double inf = std::numeric_limits<double>::infinity();
  // best[j][i]: smallest bottleneck for the first i layers in j stages; cut[j][i]: where stage j-1 starts.
  std::vector<std::vector<double>> best(p + 1, std::vector<double>(n + 1, inf));
  std::vector<std::vector<std::size_t>> cut(p + 1, std::vector<std::size_t>(n + 1, 0));
  best[0][0] = 0;
  for (std::size_t j = 1; j <= p; ++j) {
    for (std::size_t i = j; i <= n; ++i) {
      for (std::size_t k = j - 1; k < i; ++k) {
        const double v = std::max(best[j - 1][k], prefix[i] - prefix[k]);
        if (v < best[j][i]) {
          best[j][i] = v;
          cut[j][i] = k;
        }
      }
    }
  }
  std::vector<std::size_t> b(p + 1);
  b[p] = n;
  for (std::size_t j = p; j >= 1; --j) b[j - 1] = cut[j][b[j]];
  return detail::pipeline::with_costs(std::move(b), costs);
}

// Per-layer trainable element counts (DeepSpeed's default 'parameters' method).
template <class Layers>
  requires layer_sequence<Layers>
[[nodiscard]] std::vector<double> parameter_costs(Layers& layers) {
  std::vector<double> c;
  for (auto& e : layers) {
    double n = 0;
    for (auto&& prm : detail::layers::layer_of(e).parameters()) n += static_cast<double>(prm.value().size());
    c.push_back(n);
  }
  return c;
}

[[nodiscard]] inline partition partition_by_parameters(std::span<const double> param_counts, int stages) {
  return partition_balanced(param_counts, stages);
}

// Per-layer forward+backward seconds on a sample input (batch dimension first), the best of
// `repeats` runs (the minimum is the least disturbed by other work on the machine). Parameter
// gradients are restored afterwards.
template <class Layers>
  requires layer_sequence<Layers>
[[nodiscard]] std::vector<double> measure_layer_costs(Layers& layers, tensor_view<const float> sample, int repeats = 3) {
  static_assert(check_layer_sequence<Layers>());
  if (repeats < 1) throw invalid_argument_error("measure_layer_costs: repeats must be at least 1, got " + std::to_string(repeats));
  std::vector<double> out;
  host_buffer<float> in(sample.shape());
  std::copy(sample.begin(), sample.end(), in.begin());
  for (auto& e : layers) {
    auto& l = detail::layers::layer_of(e);
    std::vector<host_buffer<float>> saved;
    for (auto&& prm : l.parameters()) {
      host_buffer<float> g(prm.grad().shape());
      std::copy(prm.grad().begin(), prm.grad().end(), g.begin());
      saved.push_back(std::move(g));
    }
    host_buffer<float> y(l.output_shape(in.shape()));
    host_buffer<float> gy(y.shape());
    std::fill(gy.begin(), gy.end(), 1.0f / static_cast<float>(std::max<std::size_t>(1, gy.size())));
    host_buffer<float> gx(in.shape());
    host_buffer<float> kept(shape{detail::layers::saved_size<host>(l, in.shape())});
    const layer_call<> call{kept.view(), 0};
    double best = std::numeric_limits<double>::infinity();
    for (int r = 0; r < repeats; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      detail::layers::forward<host>(l, tensor_view<const float>(in.view()), y.view(), call);
      detail::layers::backward<host>(l, tensor_view<const float>(in.view()), tensor_view<const float>(y.view()), call,
                                     tensor_view<const float>(gy.view()), gx.view());
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::size_t i = 0;
    for (auto&& prm : l.parameters()) {
      std::copy(saved[i].begin(), saved[i].end(), prm.grad().begin());
      ++i;
    }
    out.push_back(best);
    in = std::move(y);
  }
  return out;
}

template <class Layers>
  requires layer_sequence<Layers>
[[nodiscard]] partition partition_by_time(Layers& layers, tensor_view<const float> sample, int stages, int repeats = 3) {
  const auto c = measure_layer_costs(layers, sample, repeats);
  return partition_balanced(c, stages);
}

}  // namespace partrain::inline v0
