#include <catch2/catch.hpp>

#include <partrain/optim/adamw.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "optim_test_models.hpp"
#include "toy_models.hpp"

using namespace partrain;
using partrain::testing::manual_model;

static_assert(stateful_optimizer<adamw<manual_model<float>>>);

TEST_CASE("adamw: bias correction makes every step with a constant gradient lr * g/(|g|+eps)", "[optim][adamw]") {
  manual_model<double> m{{{{1.0, -1.0}, {0.5, -2.0}}}};
  const adamw_options o{.lr = 0.01, .eps = 1e-8, .weight_decay = 0.1};
  adamw opt(m, o);
  std::vector<double> expect = m.params[0].v;
  for (int step = 0; step < 5; ++step) {
    opt.step();
    for (std::size_t i = 0; i < expect.size(); ++i) {
      const double g = m.params[0].g[i];
      expect[i] = expect[i] * (1 - o.lr * o.weight_decay) - o.lr * g / (std::abs(g) + o.eps);
    }
    for (std::size_t i = 0; i < expect.size(); ++i) CHECK(m.params[0].v[i] == Approx(expect[i]).epsilon(1e-12));
  }
  CHECK(opt.steps() == 5);
}

TEST_CASE("adamw: moments follow the PyTorch recurrences", "[optim][adamw]") {
  // Gradients change per step; recompute the reference with the textbook formulas in double.
  manual_model<double> m{{{{0.3}, {0.0}}}};
  const adamw_options o{.lr = 0.1, .beta1 = 0.8, .beta2 = 0.9, .eps = 1e-6, .weight_decay = 0.05};
  adamw opt(m, o);
  double p = 0.3, mm = 0, s = 0;
  const double grads[] = {1.0, -0.5, 2.0, 0.25};
  for (int t = 1; t <= 4; ++t) {
    const double g = grads[t - 1];
    m.params[0].g[0] = g;
    opt.step();
    p *= 1 - o.lr * o.weight_decay;
    mm = o.beta1 * mm + (1 - o.beta1) * g;
    s = o.beta2 * s + (1 - o.beta2) * g * g;
    const double mhat = mm / (1 - std::pow(o.beta1, t));
    const double denom = std::sqrt(s) / std::sqrt(1 - std::pow(o.beta2, t)) + o.eps;
    p -= o.lr * mhat / denom;
    CHECK(m.params[0].v[0] == Approx(p).epsilon(1e-12));
  }
}

TEST_CASE("adamw: the host loop (four lanes at a time where it can) equals the scalar rule bit for bit",
          "[optim][adamw]") {
  // 37 elements: nine packets and a tail of one. Both of lerp's branches (beta1 0.9 and 0.3).
  for (const double beta1 : {0.9, 0.3}) {
    const std::size_t n = 37;
    std::mt19937 gen(static_cast<unsigned>(beta1 * 10));
    std::uniform_real_distribution<float> d(-2.0f, 2.0f);
    std::vector<float> v(n), g(n), m(n), s(n);
    for (std::size_t i = 0; i < n; ++i) {
      v[i] = d(gen);
      g[i] = d(gen) * (i % 5 == 0 ? 1e-6f : 1.0f);
      m[i] = d(gen) * 0.1f;
      s[i] = std::abs(d(gen)) * (i % 7 == 0 ? 0.0f : 0.01f);
    }
    auto rv = v, rm = m, rs = s;
    const auto c = detail::optim::adamw_coeffs_of<float>({.lr = 1e-2, .beta1 = beta1, .weight_decay = 0.1}, 3);
    for (std::size_t i = 0; i < n; ++i) detail::optim::adamw_element(rv[i], g[i], rm[i], rs[i], c);
    detail::optim::adamw_update(tensor_view<float>(v), tensor_view<const float>(g), m.data(), s.data(), c);
    CHECK(std::memcmp(v.data(), rv.data(), n * sizeof(float)) == 0);
    CHECK(std::memcmp(m.data(), rm.data(), n * sizeof(float)) == 0);
    CHECK(std::memcmp(s.data(), rs.data(), n * sizeof(float)) == 0);
    CHECK(v != std::vector<float>(n, 0.0f));
  }
}

TEST_CASE("adamw: bad options are refused with the reason", "[optim][adamw]") {
  manual_model<float> m{{{{1.0f}, {1.0f}}}};
  CHECK_THROWS_WITH(adamw(m, {.beta1 = 1.0}), Catch::Contains("beta1 must be in [0, 1)"));
  CHECK_THROWS_WITH(adamw(m, {.beta2 = -0.1}), Catch::Contains("beta2 must be in [0, 1)"));
  CHECK_THROWS_WITH(adamw(m, {.eps = -1}), Catch::Contains("eps must be >= 0"));
}

TEST_CASE("adamw: saved state (moments and step count) resumes bit for bit", "[optim][adamw][state]") {
  using partrain::testing::toy_mlp;
  auto batch = partrain::testing::make_toy_batch<double>(0, 8);
  toy_mlp<double, false> a, b;
  adamw oa(a, {.lr = 0.01}), ob(b, {.lr = 0.01});
  for (int i = 0; i < 3; ++i) {
    a.train_step(batch);
    oa.step();
    b.train_step(batch);
    ob.step();
  }
  state_writer w;
  ob.save_state(w);
  toy_mlp<double, false> c = b;
  adamw oc(c, {.lr = 0.01});
  state_reader r(w.bytes());
  oc.load_state(r);
  for (int i = 0; i < 4; ++i) {
    a.train_step(batch);
    oa.step();
    c.train_step(batch);
    oc.step();
  }
  CHECK(a.flat_values() == c.flat_values());

  SECTION("a truncated state is refused") {
    auto bytes = w.bytes();
    bytes.resize(bytes.size() - 3);
    adamw od(c, {});
    state_reader r2(bytes);
    CHECK_THROWS_AS(od.load_state(r2), checkpoint_error);
  }
}
