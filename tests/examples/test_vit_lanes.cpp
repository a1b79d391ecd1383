// The host lanes of the ViT's element math (models/vit_elements.hpp, vit_lane_rules.inc): the float
// exponential's accuracy, and every lane width's loops (4, and 8 and 16 where the CPU has them)
// against the one-element and one-row functions, bit for bit. Built with the build type's flags
// (partrain_add_test's OPTIMISED), not the suite's -O0: fusing a * b + c into one FMA, which would
// change the bits, is the optimiser's doing.
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "vit_elements.hpp"

namespace {

TEST_CASE("the host float exp is within 2 ulp of std::exp, inf above the range, 0 below, NaN kept", "[examples][vit]") {
  namespace el = models::vit_elements;
  // Every 2^12-th float from -87.3 to 88.3 (about 500 thousand values, the dense range softmax and
  // GELU use included), as ulps of the correctly rounded value (std::exp in double, rounded).
  float worst = 0;
  float at = 0;
  for (float x = -87.3f; x < 88.3f; x = std::nextafter(x + std::abs(x) * 0x1p-12f, 100.0f)) {
    const auto want = static_cast<float>(std::exp(static_cast<double>(x)));
    const float ulp = std::nextafter(want, std::numeric_limits<float>::infinity()) - want;
    const float err = std::abs(el::exp_host(x) - want) / ulp;
    if (err > worst) {
      worst = err;
      at = x;
    }
  }
  CAPTURE(at);
  CHECK(worst <= 2.0f);
  CHECK(el::exp_host(0.0f) == 1.0f);
  CHECK(el::exp_host(1.0f) == Approx(std::exp(1.0)).epsilon(2e-7));
  CHECK(el::exp_host(100.0f) == std::numeric_limits<float>::infinity());
  CHECK(el::exp_host(-100.0f) == 0.0f);
  CHECK(std::isnan(el::exp_host(std::numeric_limits<float>::quiet_NaN())));
  CHECK(el::exp_host(-std::numeric_limits<float>::infinity()) == 0.0f);
  // The element rules use it: GELU's gate saturates to 0 and 1 without NaN.
  CHECK(el::gelu(-200.0f) == 0.0f);
  CHECK(el::gelu(200.0f) == 200.0f);
}

namespace lanes_check {
namespace el = models::vit_elements;

std::vector<float> uniform(std::size_t n, std::uint32_t seed, float lo, float hi) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = u(gen);
  return v;
}
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](float x, float y) {
           return std::bit_cast<std::uint32_t>(x) == std::bit_cast<std::uint32_t>(y);
         });
}

// One width's host loops against the one-row (or one-element) functions, bit for bit: the tensors
// have whole groups of rows, a partial one, and rows that end in a partial lane at every width.
template <class Loops>
void check_host_loops(Loops loops) {
  // GELU, with the gate's saturated ends inside the lanes.
  auto x = uniform(1027, 7, -12.0f, 12.0f);
  x[5] = -200.0f;
  x[6] = 200.0f;
  std::vector<float> y(x.size()), value(x.size()), grad(x.size()), want_y(x.size()), want_v(x.size()), want_g(x.size());
  loops.gelu_n(x.data(), y.data(), x.size());
  loops.gelu_and_grad_n(x.data(), value.data(), grad.data(), x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    want_y[i] = el::gelu(x[i]);
    el::gelu_and_grad(x[i], want_v[i], want_g[i]);
  }
  CHECK(same_bits(y, want_y));
  CHECK(same_bits(value, want_v));
  CHECK(same_bits(grad, want_g));
  CHECK(y[5] == 0.0f);
  CHECK(y[6] == 200.0f);

  // LayerNorm rows: 19 rows (two groups of 8 and 3 more) of 37, offset so the mean is far from 0.
  const std::size_t rows = 19, d = 37;
  auto xs = uniform(rows * d, 8, 2.0f, 5.0f);
  const auto dy = uniform(rows * d, 9, -1.0f, 1.0f), gamma = uniform(d, 10, 0.5f, 1.5f), beta = uniform(d, 11, -1.0f, 1.0f);
  std::vector<float> mean(rows), rstd(rows), want_mean(rows), want_rstd(rows);
  loops.layernorm_stats_rows(xs.data(), rows, d, 1e-5f, mean.data(), rstd.data());
  for (std::size_t r = 0; r < rows; ++r) el::layernorm_stats(xs.data() + r * d, d, 1e-5f, want_mean[r], want_rstd[r]);
  CHECK(same_bits(mean, want_mean));
  CHECK(same_bits(rstd, want_rstd));
  std::vector<float> out(rows * d), want(rows * d);
  loops.layernorm_apply_rows(xs.data(), rows, d, mean.data(), rstd.data(), gamma.data(), beta.data(), out.data());
  for (std::size_t r = 0; r < rows; ++r) {
    el::layernorm_apply(xs.data() + r * d, d, mean[r], rstd[r], gamma.data(), beta.data(), want.data() + r * d);
  }
  CHECK(same_bits(out, want));
  for (const bool add : {false, true}) {
    std::vector<float> dx = uniform(rows * d, 12, -1.0f, 1.0f), want_dx = dx;
    loops.layernorm_backward_rows(xs.data(), dy.data(), rows, d, mean.data(), rstd.data(), gamma.data(), dx.data(), add);
    for (std::size_t r = 0; r < rows; ++r) {
      el::layernorm_backward(xs.data() + r * d, dy.data() + r * d, d, mean[r], rstd[r], gamma.data(), want_dx.data() + r * d,
                             add);
    }
    CHECK(same_bits(dx, want_dx));
  }

  // Softmax rows of 16 (a ViT's tokens) and 19, with a large spread.
  for (const std::size_t n : {std::size_t{16}, std::size_t{19}}) {
    auto s = uniform(rows * n, 13, -30.0f, 30.0f), want_s = s;
    loops.softmax_rows(s.data(), rows, n, 0.25f);
    for (std::size_t r = 0; r < rows; ++r) el::softmax_row(want_s.data() + r * n, n, 0.25f);
    CHECK(same_bits(s, want_s));
    auto g = uniform(rows * n, 14, -1.0f, 1.0f), want_gs = g;
    loops.softmax_backward_rows(s.data(), g.data(), rows, n);
    for (std::size_t r = 0; r < rows; ++r) el::softmax_backward_row(s.data() + r * n, want_gs.data() + r * n, n);
    CHECK(same_bits(g, want_gs));
  }

  // The element-wise and column loops.
  std::vector<float> biased = xs, want_b = xs;
  loops.add_bias_rows(biased.data(), rows, d, beta.data());
  for (std::size_t r = 0; r < rows; ++r) el::add_bias_row(want_b.data() + r * d, beta.data(), d);
  CHECK(same_bits(biased, want_b));
  std::vector<double> sums(d, 0.5), want_sums(d, 0.5);
  loops.column_sums(dy.data(), rows, d, sums.data());
  for (std::size_t r = 0; r < rows; ++r) el::add_row_to_sums(dy.data() + r * d, d, want_sums.data());
  CHECK(sums == want_sums);
  std::vector<float> res(rows * d), prod = xs, want_res(rows * d), want_prod = xs;
  loops.residual_add(xs.data(), dy.data(), res.data(), rows * d);
  loops.multiply(prod.data(), dy.data(), rows * d);
  for (std::size_t i = 0; i < rows * d; ++i) {
    want_res[i] = xs[i] + dy[i];
    want_prod[i] *= dy[i];
  }
  CHECK(same_bits(res, want_res));
  CHECK(same_bits(prod, want_prod));
}
}  // namespace lanes_check

TEST_CASE("each width of the host loops gives the one-row functions' bits", "[examples][vit]") {
  namespace el = models::vit_elements;
#if MODELS_VIT_HOST_LANES
  SECTION("4 lanes") { lanes_check::check_host_loops(el::host_loops{}); }
#if MODELS_VIT_WIDE_LANES
  // The wide widths run where the CPU has them (this project's machines have AVX-512).
  if (el::host_lane_width() >= 8) {
    SECTION("8 lanes (AVX2)") { lanes_check::check_host_loops(el::wide8::host_loops{}); }
  } else {
    WARN("this CPU has no AVX2: the 8-lane loops are not checked here");
  }
  if (el::host_lane_width() == 16) {
    SECTION("16 lanes (AVX-512)") { lanes_check::check_host_loops(el::wide16::host_loops{}); }
  } else {
    WARN("this CPU has no AVX-512: the 16-lane loops are not checked here");
  }
#endif
#else
  WARN("no host lanes with this compiler: the one-row functions run alone");
  CHECK(el::host_lane_width() == 4);
#endif
}

TEST_CASE("the host lanes of GELU give the scalar rule's bits", "[examples][vit]") {
  namespace el = models::vit_elements;
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> u(-12.0f, 12.0f);
  std::vector<float> x(1027);  // 256 lanes of 4 and a tail of 3
  for (auto& v : x) v = u(gen);
  x[5] = -200.0f;  // the gate's saturated ends inside the lanes
  x[6] = 200.0f;
  std::vector<float> y(x.size()), value(x.size()), grad(x.size());
  el::gelu_n(x.data(), y.data(), x.size());
  el::gelu_and_grad_n(x.data(), value.data(), grad.data(), x.size());
  std::size_t differ = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    float v = 0, g = 0;
    el::gelu_and_grad(x[i], v, g);
    if (std::bit_cast<std::uint32_t>(y[i]) != std::bit_cast<std::uint32_t>(el::gelu(x[i])) ||
        std::bit_cast<std::uint32_t>(value[i]) != std::bit_cast<std::uint32_t>(v) ||
        std::bit_cast<std::uint32_t>(grad[i]) != std::bit_cast<std::uint32_t>(g)) {
      ++differ;
    }
  }
  CHECK(differ == 0);
  CHECK(y[5] == 0.0f);
  CHECK(y[6] == 200.0f);
}

}  // namespace
