// The overflow decision agreed across ranks: with one rank's gradient forced to inf, every rank
// skips that step and the parameters stay identical on all ranks (local backend, ranks as threads).
#include <catch2/catch.hpp>

#include <partrain/comm/local.hpp>
#include <partrain/optim/sgd.hpp>
#include <partrain/parallel/ddp.hpp>
#include <partrain/precision/mixed_precision.hpp>

#include <chrono>
#include <cmath>
#include <string>
#include <limits>
#include <mutex>
#include <vector>

#include "toy_models.hpp"

using namespace partrain;
using partrain::testing::make_toy_batch;
using partrain::testing::toy_batch;
using partrain::testing::toy_mlp;

namespace {

constexpr float inf = std::numeric_limits<float>::infinity();

// The toy model with a loss scale applied to its gradients, and an overflow that a test can
// plant in one rank's gradients at one step.
class scaled_toy : public toy_mlp<float, false> {
 public:
  using toy_mlp::toy_mlp;
  void set_loss_scale(float s) { scale_ = s; }
  double train_step(const toy_batch<float>& b) {
    const double loss = toy_mlp::train_step(b);
    for (auto& p : parameters()) {
      for (float& g : p.grads()) g *= scale_;
    }
    if (steps_run == poison_at) parameters()[0].grads()[3] = inf;
    return loss;
  }
  int poison_at = -1;  // steps_run value (1-based) at which to plant inf
  int refreshes = 0;
  void refresh_low_precision() { ++refreshes; }

 private:
  float scale_ = 1;
};

}  // namespace

TEST_CASE("unscale with a communicator: one rank's inf makes every rank see an overflow", "[precision][threads]") {
  constexpr int world = 3;
  std::vector<int> found(world, -1);
  run_local(world, [&](local_group& g) {
    toy_mlp<float> m(static_cast<std::uint64_t>(g.rank() + 1));  // different gradients per rank
    m.train_step(make_toy_batch<float>(0, 4));
    if (g.rank() == 2) m.parameters()[3].grads()[0] = inf;
    grad_scaler s;
    found[static_cast<std::size_t>(g.rank())] = s.unscale(m, g) ? 1 : 0;
    // Without the agreement only rank 2 would see it.
    toy_mlp<float> solo(static_cast<std::uint64_t>(g.rank() + 1));
    solo.train_step(make_toy_batch<float>(0, 4));
    grad_scaler s2;
    CHECK_FALSE(s2.unscale(solo));
  });
  CHECK(found == std::vector<int>{1, 1, 1});
}

TEST_CASE("amp_step under DDP: every rank skips the step one rank overflowed, parameters stay identical",
          "[precision][threads]") {
  constexpr int world = 2;
  constexpr int steps = 6;
  std::mutex mu;
  std::vector<std::vector<float>> finals(world);
  std::vector<std::vector<int>> skipped(world);
  std::vector<std::vector<float>> scales(world);
  std::vector<int> refreshes(world);
  std::vector<float> before_poison;
  run_local(world, [&](local_group& g) {
    scaled_toy m(static_cast<std::uint64_t>(11));
    if (g.rank() == 1) m.poison_at = 3;  // only rank 1 overflows, at its third step
    distributed_data_parallel ddp(m, g);
    sgd opt(m, {.lr = 0.05, .momentum = 0.9});
    grad_scaler scaler({.init_scale = 1024.0f, .growth_interval = 2});
    std::vector<int> sk;
    std::vector<float> sc;
    for (int s = 0; s < steps; ++s) {
      if (s == 2 && g.rank() == 0) {
        std::lock_guard lock(mu);
        before_poison = m.flat_values();
      }
      const auto b = make_toy_batch<float>(static_cast<std::size_t>((s * world + g.rank()) * 4), 4);
      const amp_step_result r = amp_step(ddp, opt, scaler, b);
      sk.push_back(r.skipped ? 1 : 0);
      sc.push_back(r.scale);
      if (s == 2 && g.rank() == 0) {
        std::lock_guard lock(mu);
        CHECK(m.flat_values() == before_poison);  // the skipped step left the masters alone
      }
    }
    std::lock_guard lock(mu);
    finals[static_cast<std::size_t>(g.rank())] = m.flat_values();
    skipped[static_cast<std::size_t>(g.rank())] = sk;
    scales[static_cast<std::size_t>(g.rank())] = sc;
    refreshes[static_cast<std::size_t>(g.rank())] = m.refreshes;
  });
  const std::vector<int> expect_skipped{0, 0, 1, 0, 0, 0};
  // 1024, two good steps -> 2048, overflow -> 1024, two good -> 2048, then 2048 again.
  const std::vector<float> expect_scales{1024, 1024, 2048, 1024, 1024, 2048};
  for (int r = 0; r < world; ++r) {
    INFO("rank " << r);
    CHECK(skipped[static_cast<std::size_t>(r)] == expect_skipped);
    CHECK(scales[static_cast<std::size_t>(r)] == expect_scales);
    CHECK(refreshes[static_cast<std::size_t>(r)] == steps - 1);
    for (float v : finals[static_cast<std::size_t>(r)]) REQUIRE(std::isfinite(v));
  }
  CHECK(finals[0] == finals[1]);  // bit-identical
}

TEST_CASE("a rank that never reaches the overflow check fails the others by timeout, naming the operation",
          "[precision][threads]") {
  std::string message;
  std::mutex mu;
  process_group_options opts;
  opts.timeout = std::chrono::milliseconds(300);
  run_local(
      2,
      [&](local_group& g) {
        if (g.rank() == 1) return;  // stalls (here: leaves) before unscale
        toy_mlp<float> m;
        m.train_step(make_toy_batch<float>(0, 4));
        grad_scaler s;
        try {
          (void)s.unscale(m, g);
        } catch (const timeout_error& e) {
          std::lock_guard lock(mu);
          message = e.what();
        }
      },
      opts);
  CHECK_THAT(message, Catch::Contains("rank 0 grad_scaler: the overflow-flag all_reduce failed"));
}
