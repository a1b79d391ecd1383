// The example's CUDA model against its host model: same layout, same seed, same batch, so the
// loss and every gradient must agree (to float rounding: cuBLAS and OpenBLAS sum in other orders).
// Skips, saying so, when no CUDA device is present.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

#include <cuda_runtime.h>

#include "mlp_cuda.cuh"
#include "mlp_host.hpp"

namespace {

struct test_batch {
  partrain::tensor_view<const float> features;
  partrain::tensor_view<const std::int32_t> labels;
};

// Deterministic inputs in [0, 1) and labels 0..classes-1.
void fill(std::vector<float>& x, std::vector<std::int32_t>& y, std::size_t n, std::size_t in, std::size_t classes) {
  models::splitmix64 rng(42);
  x.resize(n * in);
  y.resize(n);
  for (auto& v : x) v = rng.uniform(0.0f, 1.0f);
  for (std::size_t i = 0; i < n; ++i) y[i] = static_cast<std::int32_t>(rng.next() % classes);
}

void compare(const models::mlp_layout& layout, std::size_t n) {
  std::vector<float> x;
  std::vector<std::int32_t> y;
  fill(x, y, n, layout.inputs(), layout.classes());
  test_batch b{{x.data(), {n, layout.inputs()}}, {y.data(), n}};

  models::mlp_host host(layout, 7);
  models::mlp_cuda gpu(layout, 7);
  REQUIRE(gpu.values_to_host() == std::vector<float>(host.flat_values().begin(), host.flat_values().end()));

  std::vector<std::size_t> ready_order;
  const double host_loss = host.train_step(b);
  const double gpu_loss = gpu.train_step(b, [&](std::size_t i) { ready_order.push_back(i); });
  CHECK(gpu_loss == Approx(host_loss).epsilon(1e-5));

  const auto g = gpu.grads_to_host();
  const auto h = host.flat_grads();
  REQUIRE(g.size() == h.size());
  double max_abs = 0, max_ref = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    max_abs = std::max(max_abs, std::abs(static_cast<double>(g[i]) - h[i]));
    max_ref = std::max(max_ref, std::abs(static_cast<double>(h[i])));
  }
  INFO("largest gradient difference " << max_abs << " (largest host gradient " << max_ref << ")");
  CHECK(max_abs <= 1e-4 * max_ref + 1e-7);

  // Last layer first, every parameter exactly once.
  std::vector<std::size_t> expected;
  for (std::size_t l = layout.layers(); l-- > 0;) expected.insert(expected.end(), {2 * l + 1, 2 * l});
  CHECK(ready_order == expected);

  const auto he = host.eval_step(b);
  const auto ge = gpu.eval_step(b);
  CHECK(ge.count == he.count);
  CHECK(ge.correct == he.correct);
  CHECK(ge.loss_sum == Approx(he.loss_sum).epsilon(1e-5));
}

}  // namespace

static_assert(partrain::trainable_on<models::mlp_cuda, test_batch>);
static_assert(partrain::notifies_grad_ready<models::mlp_cuda, test_batch>);
static_assert(partrain::evaluable_on<models::mlp_cuda, test_batch>);
static_assert(partrain::replicable<models::mlp_cuda>);

TEST_CASE("CUDA MLP gradients equal the host MLP's on the same weights and batch", "[cuda][gpu][examples]") {
  SECTION("small layout") { compare(models::mlp_layout{{20, 16, 12, 5}}, 9); }
  SECTION("the example's 784-256-128-10 at batch 64") { compare(models::mlp_layout{}, 64); }
}

TEST_CASE("CUDA MLP refuses a host device and a bad batch", "[cuda][gpu][examples]") {
  CHECK_THROWS_WITH(models::mlp_cuda({}, 0, partrain::device::cpu()), Catch::Contains("not a CUDA device"));
  models::mlp_cuda m(models::mlp_layout{{4, 3, 2}}, 0);
  std::vector<float> x(8, 0.5f);
  std::vector<std::int32_t> y{0, 5};
  test_batch b{{x.data(), {2, 4}}, {y.data(), 2}};
  CHECK_THROWS_WITH(m.train_step(b), Catch::Contains("label 5"));
}
