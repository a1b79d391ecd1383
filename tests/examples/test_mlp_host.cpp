// The example's host MLP: gradients against finite differences (in double, from the float model's
// own loss), the gradient-ready order DDP's overlap relies on, evaluation, copies and errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

#include <partrain/model/concepts.hpp>

#include "mlp_host.hpp"
#include "mlp_test_data.hpp"

namespace {

using example::testing::test_batch;

example::testing::data make_data(std::size_t n, std::size_t in, std::size_t classes, std::uint64_t seed = 3) {
  return example::testing::make_data(n, in, classes, seed);
}

}  // namespace

static_assert(partrain::trainable_on<models::mlp_host, test_batch>);
static_assert(partrain::notifies_grad_ready<models::mlp_host, test_batch>);
static_assert(partrain::evaluable_on<models::mlp_host, test_batch>);
static_assert(partrain::replicable<models::mlp_host>);

TEST_CASE("host MLP gradients match finite differences", "[examples][mlp]") {
  const models::mlp_layout layout{{6, 5, 4, 3}};
  const auto d = make_data(7, 6, 3);
  const auto b = d.batch(6);
  models::mlp_host m(layout, 11);
  m.train_step(b);
  const std::vector<float> analytic(m.flat_grads().begin(), m.flat_grads().end());

  // Central differences on the mean loss (eval_step's summed loss / n, computed in double).
  auto loss = [&] { return m.eval_step(b).mean_loss(); };
  auto values = m.flat_values();
  const float h = 1e-3f;  // small enough to rarely cross a ReLU kink, large against float rounding
  std::size_t checked = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    const float saved = values[i];
    values[i] = saved + h;
    const double up = loss();
    values[i] = saved - h;
    const double down = loss();
    values[i] = saved;
    const double numeric = (up - down) / (2.0 * h);
    INFO("parameter element " << i);
    CHECK(analytic[i] == Approx(numeric).margin(2e-3).epsilon(2e-2));
    ++checked;
  }
  CHECK(checked == layout.parameter_count());
}

TEST_CASE("host MLP reports gradients ready last layer first, each once, after they are final", "[examples][mlp]") {
  const models::mlp_layout layout{{6, 5, 4, 3}};
  const auto d = make_data(5, 6, 3);
  models::mlp_host m(layout, 1);
  std::vector<std::size_t> order;
  std::vector<float> seen_at_ready;
  auto& params = m.parameters();
  const double loss = m.train_step(d.batch(6), [&](std::size_t i) {
    order.push_back(i);
    seen_at_ready.push_back(params[i].grad()[0]);
  });
  CHECK(order == std::vector<std::size_t>{5, 4, 3, 2, 1, 0});
  // The values reported at notification time are the final ones.
  for (std::size_t k = 0; k < order.size(); ++k) CHECK(seen_at_ready[k] == params[order[k]].grad()[0]);
  // The plain step gives the same loss and gradients.
  models::mlp_host m2(layout, 1);
  CHECK(m2.train_step(d.batch(6)) == loss);
  CHECK(std::equal(m2.flat_grads().begin(), m2.flat_grads().end(), m.flat_grads().begin()));
}

TEST_CASE("host MLP parameters are in a stable, named order with matching shapes", "[examples][mlp]") {
  models::mlp_host m;
  const auto& p = m.parameters();
  REQUIRE(p.size() == 6);
  CHECK(p[0].name == "fc1.weight");
  CHECK(p[0].value().shape() == partrain::shape{256, 784});
  CHECK(p[1].value().shape() == partrain::shape{256});
  CHECK(p[4].value().shape() == partrain::shape{10, 128});
  CHECK(p[5].name == "fc3.bias");
  for (const auto& q : p) CHECK(q.value().shape() == q.grad().shape());
  CHECK(m.layout().parameter_count() == 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10);
}

TEST_CASE("host MLP: same seed same weights, a copy is independent, replicate_to refuses CUDA", "[examples][mlp]") {
  models::mlp_host a({}, 5), b({}, 5), c({}, 6);
  CHECK(std::equal(a.flat_values().begin(), a.flat_values().end(), b.flat_values().begin()));
  CHECK_FALSE(std::equal(a.flat_values().begin(), a.flat_values().end(), c.flat_values().begin()));
  models::mlp_host copy = a.replicate_to(partrain::device::cpu());
  copy.flat_values()[0] += 1.0f;
  CHECK(copy.flat_values()[0] != a.flat_values()[0]);
  CHECK(copy.parameters()[0].value().data() == copy.flat_values().data());  // views point into the copy
  CHECK_THROWS_WITH(a.replicate_to(partrain::device::cuda()), Catch::Contains("mlp_cuda"));
}

TEST_CASE("host MLP training lowers the loss and evaluation counts correctly", "[examples][mlp]") {
  const models::mlp_layout layout{{6, 16, 3}};
  const auto d = make_data(32, 6, 3);
  const auto b = d.batch(6);
  models::mlp_host m(layout, 2);
  const double first = m.train_step(b);
  double last = first;
  for (int i = 0; i < 200; ++i) {
    last = m.train_step(b);
    auto v = m.flat_values();
    auto g = m.flat_grads();
    for (std::size_t k = 0; k < v.size(); ++k) v[k] -= 0.5f * g[k];
  }
  CHECK(last < 0.5 * first);
  const auto r = m.eval_step(b);
  CHECK(r.count == 32);
  CHECK(r.correct <= 32);
  CHECK(r.accuracy() > 0.6);
}

TEST_CASE("host MLP refuses malformed batches with a clear message", "[examples][mlp]") {
  models::mlp_host m(models::mlp_layout{{4, 3, 2}}, 0);
  std::vector<float> x(8, 0.1f);
  std::vector<std::int32_t> bad_label{0, 2};
  CHECK_THROWS_WITH(m.train_step(test_batch{{x.data(), {2, 4}}, {bad_label.data(), 2}}),
                    Catch::Contains("label 2 of example 1 is outside [0, 2)"));
  std::vector<std::int32_t> three{0, 1, 1};
  CHECK_THROWS_WITH(m.train_step(test_batch{{x.data(), {2, 4}}, {three.data(), 3}}),
                    Catch::Contains("expected 4 features per example"));
  CHECK_THROWS_WITH(m.train_step(test_batch{{x.data(), std::size_t{0}}, {three.data(), std::size_t{0}}}),
                    Catch::Contains("empty"));
  CHECK_THROWS_WITH(models::mlp_host(models::mlp_layout{{4}}), Catch::Contains("at least an input and an output"));
}
