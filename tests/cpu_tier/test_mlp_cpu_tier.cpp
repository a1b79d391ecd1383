// The example CUDA MLP's element functors (models/mlp_elements.hpp) through the
// launch helper, against scalar references written here (softmax cross-entropy in double).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include <partrain/core/for_each_index.hpp>

#include "mlp_elements.hpp"
#include "reference_16.hpp"
#include "tier.hpp"

namespace mlp_cases {
namespace pd = partrain::detail;
namespace el = models::elements;

std::uint16_t r16(float v, bool bf16) { return bf16 ? tier::ref::float_to_bfloat16(v) : tier::ref::float_to_half(v); }
float f16(std::uint16_t b, bool bf16) { return bf16 ? tier::ref::bfloat16_to_float(b) : tier::ref::half_to_float(b); }

}  // namespace mlp_cases

TEST_CASE("bias_activation_fn and relu_backward_fn", "[cpu_tier][examples][mlp]") {
  using namespace mlp_cases;
  for (const std::size_t rows : {std::size_t{0}, std::size_t{1}, std::size_t{33}}) {
    for (const bool relu : {false, true}) {
      const std::size_t cols = 19;
      CAPTURE(rows, relu, tier::name);
      const auto h0 = tier::awkward_floats(rows * cols, 1);
      const auto b0 = tier::awkward_floats(cols, 2);
      tier::vec<float> h(rows * cols), b(cols), d(rows * cols, 1.5f);
      for (std::size_t i = 0; i < h0.size(); ++i) h[i] = h0[i];
      for (std::size_t j = 0; j < cols; ++j) b[j] = b0[j];
      pd::for_each_index(tier::exec(), rows * cols, el::bias_activation_fn{h.data(), b.data(), cols, relu});
      pd::for_each_index(tier::exec(), rows * cols, el::relu_backward_fn{d.data(), h.data()});
      tier::finish();
      std::size_t bad = 0;
      for (std::size_t r = 0; r < rows; ++r) {
        for (std::size_t c = 0; c < cols; ++c) {
          float want = h0[r * cols + c] + b0[c];
          if (relu && want < 0) want = 0;
          const std::size_t i = r * cols + c;
          bad += !tier::close(h[i], want, 0.0f);
          bad += d[i] != (want <= 0 ? 0.0f : 1.5f);
        }
      }
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("softmax_cross_entropy_fn: loss, argmax and the scaled delta", "[cpu_tier][examples][mlp]") {
  using namespace mlp_cases;
  const std::size_t rows = 257, classes = 10;
  std::mt19937 gen(4);
  std::uniform_real_distribution<float> u(-30.0f, 30.0f);
  tier::vec<float> z(rows * classes), delta(rows * classes), loss(rows);
  tier::vec<std::int32_t> y(rows), correct(rows, -1);
  for (std::size_t i = 0; i < rows * classes; ++i) z[i] = u(gen);
  for (std::size_t r = 0; r < rows; ++r) y[r] = static_cast<std::int32_t>(gen() % classes);
  const float scale = 1.0f / rows, loss_scale = 1024.0f;
  pd::for_each_index(tier::exec(), rows,
                     el::softmax_cross_entropy_fn{z.data(), y.data(), classes, scale, loss_scale, delta.data(),
                                                  loss.data(), correct.data()});
  tier::finish();
  std::size_t bad = 0;
  for (std::size_t r = 0; r < rows; ++r) {
    const float* zr = z.data() + r * classes;
    std::size_t best = 0;
    for (std::size_t j = 1; j < classes; ++j) best = zr[j] > zr[best] ? j : best;
    double s = 0;
    for (std::size_t j = 0; j < classes; ++j) s += std::exp(static_cast<double>(zr[j]) - zr[best]);
    const double want_loss = std::log(s) - (static_cast<double>(zr[y[r]]) - zr[best]);
    bad += std::fabs(loss[r] - want_loss) > 1e-5 * (1 + std::fabs(want_loss));
    bad += correct[r] != (best == static_cast<std::size_t>(y[r]) ? 1 : 0);
    for (std::size_t j = 0; j < classes; ++j) {
      const double p = std::exp(static_cast<double>(zr[j]) - zr[best]) / s;
      const double want = (p - (j == static_cast<std::size_t>(y[r]) ? 1.0 : 0.0)) * scale * loss_scale;
      bad += std::fabs(delta[r * classes + j] - want) > 1e-5 * scale * loss_scale;
    }
  }
  CHECK(bad == 0);
}

TEST_CASE("column_sums_fn and column_sums16_fn sum in row order", "[cpu_tier][examples][mlp]") {
  using namespace mlp_cases;
  for (const bool bf16 : {false, true}) {
    const std::size_t rows = 129, cols = 37;
    CAPTURE(bf16, tier::name);
    const auto d0 = tier::awkward_floats(rows * cols, 8);
    tier::vec<float> d(rows * cols), gb(cols), gb16(cols);
    tier::vec<std::uint16_t> d16(rows * cols);
    for (std::size_t i = 0; i < d0.size(); ++i) {
      const float v = std::fabs(d0[i]) > 1e4f ? 1.0f : d0[i];  // keep the 16-bit sums finite
      d[i] = v;
      d16[i] = r16(v, bf16);
    }
    pd::for_each_index(tier::exec(), cols, el::column_sums_fn{d.data(), rows, cols, gb.data()});
    pd::for_each_index(tier::exec(), cols, el::column_sums16_fn{d16.data(), rows, cols, gb16.data(), bf16});
    tier::finish();
    std::size_t bad = 0;
    for (std::size_t j = 0; j < cols; ++j) {
      float s = 0, s16 = 0;
      for (std::size_t i = 0; i < rows; ++i) s += d[i * cols + j], s16 += f16(d16[i * cols + j], bf16);
      bad += gb[j] != s;
      bad += gb16[j] != f16(r16(s16, bf16), bf16);
    }
    CHECK(bad == 0);
  }
}

TEST_CASE("16-bit functors: to_16, round_16, bias_activation16, relu_backward16", "[cpu_tier][examples][mlp]") {
  using namespace mlp_cases;
  for (const bool bf16 : {false, true}) {
    const std::size_t rows = 21, cols = 13, n = rows * cols;
    CAPTURE(bf16, tier::name);
    auto x0 = tier::awkward_floats(n, 21);
    x0[3] = std::numeric_limits<float>::quiet_NaN();  // ReLU maps NaN to 0, as the host's v > 0 ? v : 0
    x0[4] = -std::numeric_limits<float>::infinity();
    const auto b0 = tier::awkward_floats(cols, 22);
    tier::vec<float> x(n), r(n), h(n), h_logits(n), d(n);
    tier::vec<std::uint16_t> y(n), b16(cols), out16(n), back16(n);
    for (std::size_t i = 0; i < n; ++i) x[i] = r[i] = h[i] = h_logits[i] = x0[i], d[i] = x0[(i * 7) % n];
    for (std::size_t j = 0; j < cols; ++j) b16[j] = r16(b0[j], bf16);
    pd::for_each_index(tier::exec(), n, el::to_16_fn{x.data(), y.data(), bf16});
    pd::for_each_index(tier::exec(), n, el::round_16_fn{r.data(), bf16});
    pd::for_each_index(tier::exec(), n, el::bias_activation16_fn{h.data(), b16.data(), cols, true, out16.data(), bf16});
    pd::for_each_index(tier::exec(), n, el::bias_activation16_fn{h_logits.data(), b16.data(), cols, false, nullptr, bf16});
    pd::for_each_index(tier::exec(), n, el::relu_backward16_fn{d.data(), out16.data(), back16.data(), bf16});
    tier::finish();
    std::size_t bad = 0;
    for (std::size_t i = 0; i < n; ++i) {
      bad += y[i] != r16(x0[i], bf16);
      const float rounded = f16(r16(x0[i], bf16), bf16);
      bad += !(std::isnan(rounded) ? std::isnan(r[i]) : r[i] == rounded);
      float v = x0[i] + f16(b16[i % cols], bf16);
      const float logit = v;
      if (!(v > 0)) v = 0;
      bad += out16[i] != r16(v, bf16);
      bad += !(std::isnan(logit) ? std::isnan(h_logits[i]) : h_logits[i] == logit);
      bad += back16[i] != r16(f16(out16[i], bf16) <= 0 ? 0.0f : d[i], bf16);
    }
    CHECK(bad == 0);
  }
}
