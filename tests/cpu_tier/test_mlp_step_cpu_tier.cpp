// The CUDA MLP's whole step (models/mlp_device.hpp) run on the CPU through the host backend
// (models/mlp_host_twin.hpp), against the host model (mlp_host.hpp): same layout, seed and
// batches, so losses, every gradient, the readiness order, evaluation and several optimizer steps
// must agree. What the CUDA build changes is only the backend (cuBLAS instead of OpenBLAS, kernels
// instead of loops, device copies), which tests/cuda/test_mlp_cuda.cu checks where a GPU is.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <partrain/optim/sgd.hpp>
#include <partrain/precision/precision.hpp>

#include "../examples/mlp_test_data.hpp"
#include "mlp_host.hpp"
#include "mlp_host_twin.hpp"

namespace {

using partrain::precision;

using example::testing::test_batch;

// n examples of the layout's inputs and classes (tests/examples/mlp_test_data.hpp).
struct batch_data {
  example::testing::data d;
  std::size_t inputs;
  batch_data(std::size_t n, const models::mlp_layout& layout, std::uint64_t seed)
      : d(example::testing::make_data(n, layout.inputs(), layout.classes(), seed)), inputs(layout.inputs()) {}
  [[nodiscard]] test_batch batch() const { return d.batch(inputs); }
};

// fp32: OpenBLAS on both sides, but the twin sums the bias separately and reads the weights
// transposed through cuBLAS's conventions: float rounding only. 16 bits: the same two units in the
// last place of the largest gradient as tests/cuda/test_precision_cuda.cu argues.
double tolerance(precision p) {
  switch (p) {
    case precision::fp16: return std::ldexp(1.0, -9);
    case precision::bf16: return std::ldexp(1.0, -6);
    default: return 1e-5;
  }
}

struct grad_diff {
  double max_abs = 0, max_ref = 0;
  std::size_t non_finite = 0;
};
grad_diff diff(const std::vector<float>& twin, partrain::tensor_view<float> host) {
  REQUIRE(twin.size() == host.size());
  grad_diff d;
  for (std::size_t i = 0; i < twin.size(); ++i) {
    d.non_finite += !std::isfinite(twin[i]) || !std::isfinite(host.data()[i]);
    d.max_abs = std::max(d.max_abs, std::abs(static_cast<double>(twin[i]) - host.data()[i]));
    d.max_ref = std::max(d.max_ref, std::abs(static_cast<double>(host.data()[i])));
  }
  return d;
}

void compare(const models::mlp_layout& layout, std::size_t n, precision p) {
  CAPTURE(partrain::to_string(p), n, layout.widths.size());
  models::mlp_host host(layout, 7, p);
  models::mlp_host_twin twin(layout, 7, partrain::device::cpu(), p);
  REQUIRE(twin.values_to_host() == std::vector<float>(host.flat_values().begin(), host.flat_values().end()));
  // The first step's gradients scaled as a grad scaler would (backward multiplies by the scale),
  // then unscaled: the optimizer steps on true gradients.
  const float scale = p == precision::fp16 ? 1024.0f : 1.0f;
  partrain::sgd host_opt(host, {.lr = 0.05, .momentum = 0.9});
  partrain::sgd twin_opt(twin, {.lr = 0.05, .momentum = 0.9});

  for (int step = 0; step < 3; ++step) {
    CAPTURE(step);
    const batch_data data(n, layout, 21 + static_cast<std::uint64_t>(step));
    const float s = step == 0 ? scale : 1.0f;
    host.set_loss_scale(s);
    twin.set_loss_scale(s);
    std::vector<std::size_t> ready;
    const double hl = host.train_step(data.batch());
    const double tl = twin.train_step(data.batch(), [&](std::size_t i) { ready.push_back(i); });
    CHECK(std::abs(tl - hl) <= tolerance(p) * std::abs(hl));
    const auto d = diff(twin.grads_to_host(), host.flat_grads());
    INFO("largest gradient difference " << d.max_abs << ", largest host gradient " << d.max_ref);
    CHECK(d.non_finite == 0);
    CHECK(d.max_ref > 0);
    CHECK(d.max_abs <= tolerance(p) * d.max_ref);
    // Last layer first, every parameter exactly once.
    std::vector<std::size_t> expected;
    for (std::size_t l = layout.layers(); l-- > 0;) expected.insert(expected.end(), {2 * l + 1, 2 * l});
    CHECK(ready == expected);
    // The same optimizer on both: the masters stay together step after step (the 16-bit copies
    // are refreshed from them, as amp_step does).
    for (auto& x : host.flat_grads()) x /= s;
    for (auto& prm : twin.parameters()) {
      for (auto& x : prm.grad()) x /= s;
    }
    host_opt.step();
    twin_opt.step();
    host.refresh_low_precision();
    twin.refresh_low_precision();
    const auto v = twin.values_to_host();
    double worst = 0;
    for (std::size_t i = 0; i < v.size(); ++i) worst = std::max(worst, std::abs(static_cast<double>(v[i]) - host.flat_values()[i]));
    CHECK(worst <= 1e-3);
  }

  const batch_data eval(n, layout, 99);
  const auto he = host.eval_step(eval.batch());
  const auto te = twin.eval_step(eval.batch());
  CHECK(te.count == he.count);
  CHECK(std::abs(static_cast<double>(te.correct) - static_cast<double>(he.correct)) <= 1);
  CHECK(std::abs(te.loss_sum - he.loss_sum) <= 4 * tolerance(p) * std::abs(he.loss_sum));
}

}  // namespace

static_assert(partrain::trainable_on<models::mlp_host_twin, test_batch>);
static_assert(partrain::notifies_grad_ready<models::mlp_host_twin, test_batch>);
static_assert(partrain::evaluable_on<models::mlp_host_twin, test_batch>);
static_assert(partrain::replicable<models::mlp_host_twin>);

TEST_CASE("the CUDA MLP's step on the host backend equals the host MLP", "[cpu_tier][examples][mlp]") {
  for (const precision p : {precision::fp32, precision::fp16, precision::bf16}) {
    SECTION(std::string("small layout, ") + std::string(partrain::to_string(p))) {
      compare(models::mlp_layout{{20, 16, 12, 5}}, 9, p);
    }
    SECTION(std::string("the example's 784-256-128-10 at batch 64, ") + std::string(partrain::to_string(p))) {
      compare(models::mlp_layout{}, 64, p);
    }
  }
}

TEST_CASE("the twin's memory, copies and errors", "[cpu_tier][examples][mlp]") {
  const models::mlp_layout layout{{4, 3, 2}};
  models::mlp_host_twin m(layout, 0);
  const batch_data d(5, layout, 3);
  (void)m.train_step(d.batch());
  // masters + gradients + the batch, activations and scratch the step grew.
  CHECK(m.memory_bytes() >= 2 * layout.parameter_count() * sizeof(float) + 5 * 4 * sizeof(float));
  const auto copy = m.replicate_to(partrain::device::cpu());
  CHECK(copy.values_to_host() == m.values_to_host());
  CHECK_THROWS_WITH(models::mlp_host_twin(layout, 0, partrain::device::cuda(0)), Catch::Contains("is not the CPU"));
  std::vector<float> x(4, 0.5f);
  std::vector<std::int32_t> y{5};
  CHECK_THROWS_WITH(m.train_step(test_batch{{x.data(), {1, 4}}, {y.data(), 1}}), Catch::Contains("label 5"));
  CHECK_THROWS_WITH(m.set_values(std::vector<float>(3)), Catch::Contains("mlp_host_twin::set_values: 3 values"));
}
