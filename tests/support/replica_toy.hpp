// The model of the fault-tolerance tests: 16 parameters and plain SGD, and the run without
// failures every faulty run must equal bit for bit.
#pragma once

#include <partrain/comm/local.hpp>
#include <partrain/parallel/replica_group.hpp>

#include <cmath>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace partrain::testing {

// A replica's model: 16 parameters and plain SGD. The gradient of (slot, step) depends on the
// parameters, so a replica that trained on stale parameters would drift visibly.
struct toy_model {
  static constexpr std::size_t n = 16;
  std::vector<float> w = std::vector<float>(n, 0.5f);
  std::vector<float> grad = std::vector<float>(n, 0.0f);

  void compute(process_group& g, int slot, std::int64_t step) {
    for (std::size_t i = 0; i < n; ++i) {
      grad[i] = std::sin(w[i] * static_cast<float>(slot + 1) + 0.1f * static_cast<float>(step) + static_cast<float>(i));
    }
    g.all_reduce(tensor_view<float>(grad), reduce_op::sum).wait();
  }
  void apply(int slots) {
    for (std::size_t i = 0; i < n; ++i) w[i] -= 0.05f * grad[i] / static_cast<float>(slots);
  }
  [[nodiscard]] replica_state_io io() {
    return {.save = [this] {
              std::vector<std::byte> b(n * sizeof(float));
              std::memcpy(b.data(), w.data(), b.size());
              return b;
            },
            .load = [this](std::span<const std::byte> b) {
              if (b.size() != n * sizeof(float)) throw std::runtime_error("toy_model: state of " + std::to_string(b.size()) + " bytes");
              std::memcpy(w.data(), b.data(), b.size());
            }};
  }
};

// The reference: `slots` ranks, no failures, one local world.
inline std::vector<float> fault_free(int slots, int steps) {
  std::vector<std::vector<float>> out(static_cast<std::size_t>(slots));
  run_local(slots, [&](local_group& g) {
    toy_model m;
    for (int s = 0; s < steps; ++s) {
      m.compute(g, g.rank(), s);
      m.apply(slots);
    }
    out[static_cast<std::size_t>(g.rank())] = m.w;
  });
  for (const auto& w : out)
    if (w != out[0]) throw std::runtime_error("fault_free: the ranks' parameters differ");
  return out[0];
}

}  // namespace partrain::testing
