// The optimizers' element functors (optim/detail/elements.hpp) through the launch helper, against
// torch.optim's update rules written out here as scalar loops.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <random>

#include <partrain/optim/detail/elements.hpp>

#include "tier.hpp"

namespace optim_cases {

namespace pd = partrain::detail;

struct sgd_case {
  float lr, momentum, dampening, weight_decay;
  bool nesterov, first;
};

// torch.optim.SGD, single-tensor path, one element.
void sgd_reference(float& v, float g, float& buf, const sgd_case& o) {
  float d = g;
  if (o.weight_decay != 0) d = d + o.weight_decay * v;
  if (o.momentum != 0) {
    buf = o.first ? d : o.momentum * buf + (1 - o.dampening) * d;
    d = o.nesterov ? d + o.momentum * buf : buf;
  }
  v = v - o.lr * d;
}

std::vector<float> randoms(std::size_t n, std::uint32_t seed, float lo, float hi) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> r(n);
  for (auto& x : r) x = u(gen);
  return r;
}

}  // namespace optim_cases

TEST_CASE("sgd_update_fn matches torch.optim.SGD's rule", "[cpu_tier][optim][sgd]") {
  using namespace optim_cases;
  const sgd_case cases[] = {{0.1f, 0, 0, 0, false, false},      {0.05f, 0.9f, 0, 0, false, true},
                            {0.05f, 0.9f, 0.1f, 1e-2f, false, false}, {0.01f, 0.9f, 0, 1e-4f, true, false},
                            {0.01f, 0.5f, 0, 0, true, true}};
  for (const auto& o : cases) {
    for (const std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{257}, std::size_t{4099}}) {
      CAPTURE(n, o.momentum, o.nesterov, o.first, tier::name);
      const auto v0 = randoms(n, 1, -1, 1), g0 = randoms(n, 2, -3, 3), b0 = randoms(n, 3, -1, 1);
      tier::vec<float> v(n), g(n), buf(n);
      for (std::size_t i = 0; i < n; ++i) v[i] = v0[i], g[i] = g0[i], buf[i] = b0[i];
      const pd::optim::sgd_coeffs<float> c{o.lr, o.momentum, 1 - o.dampening, o.weight_decay,
                                    o.nesterov, o.momentum != 0, o.weight_decay != 0};
      pd::for_each_index(tier::exec(), n,
                         pd::optim::sgd_update_fn<float>{v.data(), g.data(), o.momentum != 0 ? buf.data() : nullptr, c, o.first});
      tier::finish();
      std::size_t bad = 0;
      for (std::size_t i = 0; i < n; ++i) {
        float rv = v0[i], rb = b0[i];
        sgd_reference(rv, g0[i], rb, o);
        // The terms: v, lr * d and the momentum buffer (|g| <= 3, |v|, |buf| <= 1, lr <= 0.1).
        const float terms = std::fabs(v0[i]) + std::fabs(g0[i]) + std::fabs(b0[i]);
        bad += !tier::close(v[i], rv, tier::float_rel, terms) || !tier::close(buf[i], rb, tier::float_rel, terms);
      }
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("adamw_update_fn matches torch.optim.AdamW's rule over several steps", "[cpu_tier][optim][adamw]") {
  using namespace optim_cases;
  const std::size_t n = 1023;
  const double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, wd = 1e-2;
  for (const double b1 : {beta1, 0.3}) {  // both branches of lerp (weight < 0.5 and >= 0.5)
    CAPTURE(b1, tier::name);
    const auto v0 = randoms(n, 4, -1, 1);
    tier::vec<float> v(n), g(n), m(n, 0.0f), s(n, 0.0f);
    std::vector<float> rv(v0), rm(n, 0.0f), rs(n, 0.0f);
    for (std::size_t i = 0; i < n; ++i) v[i] = v0[i];
    for (int step = 1; step <= 3; ++step) {
      const auto gs = randoms(n, 10 + step, -2, 2);
      for (std::size_t i = 0; i < n; ++i) g[i] = gs[i];
      const double bc1 = 1 - std::pow(b1, step), bc2 = 1 - std::pow(beta2, step);
      const float w = static_cast<float>(1 - b1);
      const pd::optim::adamw_coeffs<float> c{static_cast<float>(1 - lr * wd), w, 1.0f - w, static_cast<float>(beta2),
                                      static_cast<float>(1 - beta2), static_cast<float>(std::sqrt(bc2)),
                                      static_cast<float>(eps), static_cast<float>(-(lr / bc1))};
      pd::for_each_index(tier::exec(), n, pd::optim::adamw_update_fn<float>{v.data(), g.data(), m.data(), s.data(), c});
      tier::finish();
      for (std::size_t i = 0; i < n; ++i) {  // ATen's lerp, addcmul and addcdiv, one element at a time
        rv[i] *= static_cast<float>(1 - lr * wd);
        rm[i] = w < 0.5f ? rm[i] + w * (gs[i] - rm[i]) : gs[i] - (gs[i] - rm[i]) * (1.0f - w);
        rs[i] = rs[i] * static_cast<float>(beta2) + static_cast<float>(1 - beta2) * gs[i] * gs[i];
        const float denom = std::sqrt(rs[i]) / static_cast<float>(std::sqrt(bc2)) + static_cast<float>(eps);
        rv[i] += static_cast<float>(-(lr / bc1)) * rm[i] / denom;
      }
    }
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) {
      // The terms that may cancel: v and its updates (each under lr = 1e-3 over |m / sqrt(s)| <~ 3),
      // m's lerp between g and m (|g|, |m| <= 2). s sums positive terms.
      bad += !tier::close(v[i], rv[i], tier::float_rel, 1e-2f) || !tier::close(m[i], rm[i], tier::float_rel, 4.0f) ||
             !tier::close(s[i], rs[i], tier::float_rel);
    }
    CHECK(bad == 0);
  }
}

TEST_CASE("clipping's sum of squares, scale and zero functors", "[cpu_tier][optim][clip]") {
  using namespace optim_cases;
  for (const std::size_t n : tier::ragged_sizes) {
    CAPTURE(n, tier::name);
    const auto g0 = randoms(n, 7, -5, 5);
    tier::vec<float> g(n);
    for (std::size_t i = 0; i < n; ++i) g[i] = g0[i];
    double want = 0;
    for (const float x : g0) want += static_cast<double>(x) * x;
    const double got =
        pd::transform_reduce_index(tier::exec(), n, 0.0, pd::optim::square_as_double_fn<float>{g.data()}, pd::plus_fn{});
    CHECK(std::fabs(got - want) <= 1e-12 * want);
    pd::for_each_index(tier::exec(), n, pd::optim::scale_fn<float>{g.data(), 0.25f});
    tier::finish();
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) bad += g[i] != g0[i] * 0.25f;
    CHECK(bad == 0);
    pd::for_each_index(tier::exec(), n, pd::optim::fill_zero_fn<float>{g.data()});
    tier::finish();
    bad = 0;
    for (std::size_t i = 0; i < n; ++i) bad += g[i] != 0.0f;
    CHECK(bad == 0);
  }
  // A non-finite gradient makes the sum non-finite (clip_grad_norm then leaves the step alone).
  tier::vec<float> g(5, 1.0f);
  g[3] = std::numeric_limits<float>::infinity();
  CHECK(std::isinf(pd::transform_reduce_index(tier::exec(), 5, 0.0, pd::optim::square_as_double_fn<float>{g.data()}, pd::plus_fn{})));
  g[3] = std::numeric_limits<float>::quiet_NaN();
  CHECK(std::isnan(pd::transform_reduce_index(tier::exec(), 5, 0.0, pd::optim::square_as_double_fn<float>{g.data()}, pd::plus_fn{})));
}
