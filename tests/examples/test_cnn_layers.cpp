// The example's CNN layers (models/cnn_layers.hpp): conv2d against a direct convolution, the
// whole small network's gradients against finite differences, the gradient rule (parameters
// accumulate, the input gradient is written), max pooling's ties, shapes and their errors, copies,
// and parameters bound elsewhere (as fully sharded data parallel binds them).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <partrain/core/buffer.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/tensor_view.hpp>

#include "cnn_layers.hpp"
#include "pipeline_layers.hpp"

namespace {

using namespace models::layers;
using partrain::host_buffer;
using partrain::shape;
using partrain::tensor_view;

host_buffer<float> random_buffer(shape s, std::uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  host_buffer<float> b(s);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  for (auto& v : b) v = d(gen);
  return b;
}

tensor_view<const float> cview(const host_buffer<float>& b) { return b.view(); }

// Every layer's output for input x, in order.
std::vector<host_buffer<float>> forward_all(host_model& m, tensor_view<const float> x) {
  std::vector<host_buffer<float>> acts;
  tensor_view<const float> cur = x;
  for (auto& l : m) {
    acts.emplace_back(l->output_shape(cur.shape()));
    l->forward(cur, acts.back().view());
    cur = cview(acts.back());
  }
  return acts;
}

// Back-propagates g (the last output's gradient) through every layer; returns d loss / d x.
host_buffer<float> backward_all(host_model& m, tensor_view<const float> x, const std::vector<host_buffer<float>>& acts,
                                host_buffer<float> g) {
  for (std::size_t j = m.size(); j-- > 0;) {
    const tensor_view<const float> in = j == 0 ? x : cview(acts[j - 1]);
    host_buffer<float> gin(in.shape());
    m[j]->backward(in, cview(acts[j]), cview(g), gin.view());
    g = std::move(gin);
  }
  return g;
}

void zero_grads(host_model& m) {
  for (auto& l : m) {
    for (auto& p : l->parameters()) std::ranges::fill(p.grad(), 0.0f);
  }
}

// Every element of got within abs + rel * |want| of want; names the worst one otherwise.
void check_close(tensor_view<const float> got, const std::vector<double>& want, double abs, double rel, const char* what) {
  REQUIRE(got.size() == want.size());
  double worst = 0;  // the largest |got - want| / (abs + rel * |want|)
  std::size_t at = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double e = std::abs(got[i] - want[i]) / (abs + rel * std::abs(want[i]));
    if (e > worst) {
      worst = e;
      at = i;
    }
  }
  INFO(what << ": worst element " << at << ", " << got[at] << " against " << want[at]);
  CHECK(worst <= 1.0);
}

// A direct 3x3, stride 1, padding 1 convolution in double: x [n, c, h, w], wt [m, c*9], b [m].
std::vector<double> direct_conv(const float* x, const float* wt, const float* b, std::size_t n, std::size_t c,
                                std::size_t m, std::size_t h, std::size_t w) {
  std::vector<double> y(n * m * h * w);
  for (std::size_t e = 0; e < n; ++e)
    for (std::size_t o = 0; o < m; ++o)
      for (std::size_t r = 0; r < h; ++r)
        for (std::size_t q = 0; q < w; ++q) {
          double acc = b[o];
          for (std::size_t ci = 0; ci < c; ++ci)
            for (std::size_t ky = 0; ky < 3; ++ky)
              for (std::size_t kx = 0; kx < 3; ++kx) {
                const std::ptrdiff_t yy = static_cast<std::ptrdiff_t>(r + ky) - 1;
                const std::ptrdiff_t xx = static_cast<std::ptrdiff_t>(q + kx) - 1;
                if (yy < 0 || xx < 0 || yy >= static_cast<std::ptrdiff_t>(h) || xx >= static_cast<std::ptrdiff_t>(w)) continue;
                acc += static_cast<double>(wt[o * c * 9 + (ci * 3 + ky) * 3 + kx]) *
                       x[((e * c + ci) * h + static_cast<std::size_t>(yy)) * w + static_cast<std::size_t>(xx)];
              }
          y[((e * m + o) * h + r) * w + q] = acc;
        }
  return y;
}

// The same convolution's gradients in double, from gy [n, m, h, w]: weights, bias and input.
struct direct_grads {
  std::vector<double> w, b, x;
};
direct_grads direct_conv_backward(const float* x, const float* wt, const float* gy, std::size_t n, std::size_t c,
                                  std::size_t m, std::size_t h, std::size_t w) {
  direct_grads g{std::vector<double>(m * c * 9), std::vector<double>(m), std::vector<double>(n * c * h * w)};
  for (std::size_t e = 0; e < n; ++e)
    for (std::size_t o = 0; o < m; ++o)
      for (std::size_t r = 0; r < h; ++r)
        for (std::size_t q = 0; q < w; ++q) {
          const double go = gy[((e * m + o) * h + r) * w + q];
          g.b[o] += go;
          for (std::size_t ci = 0; ci < c; ++ci)
            for (std::size_t ky = 0; ky < 3; ++ky)
              for (std::size_t kx = 0; kx < 3; ++kx) {
                const std::ptrdiff_t yy = static_cast<std::ptrdiff_t>(r + ky) - 1;
                const std::ptrdiff_t xx = static_cast<std::ptrdiff_t>(q + kx) - 1;
                if (yy < 0 || xx < 0 || yy >= static_cast<std::ptrdiff_t>(h) || xx >= static_cast<std::ptrdiff_t>(w)) continue;
                const std::size_t xi = ((e * c + ci) * h + static_cast<std::size_t>(yy)) * w + static_cast<std::size_t>(xx);
                const std::size_t wi = o * c * 9 + (ci * 3 + ky) * 3 + kx;
                g.w[wi] += go * x[xi];
                g.x[xi] += go * wt[wi];
              }
        }
  return g;
}

struct conv_case {
  std::size_t n, c, m, h, w;
};

}  // namespace

TEST_CASE("conv2d forward and backward match a direct convolution", "[examples][cnn]") {
  // 5x7 is not square (a swapped height and width fails); 16 channels of 28x28 make the layer
  // put 2 images per GEMM, so 5 images take 3 GEMMs, the last one short.
  const auto cc = GENERATE(conv_case{2, 3, 4, 5, 7}, conv_case{5, 16, 4, 28, 28}, conv_case{3, 2, 3, 1, 4});
  INFO("n " << cc.n << ", " << cc.c << " -> " << cc.m << " channels, " << cc.h << "x" << cc.w);
  conv2d conv(cc.c, cc.m, cc.h, cc.w, 7);
  const auto x = random_buffer({cc.n, cc.c, cc.h, cc.w}, 1);
  const float* wt = conv.parameters()[0].value().data();
  const float* b = conv.parameters()[1].value().data();

  host_buffer<float> y(conv.output_shape(x.shape()));
  CHECK(y.shape() == shape{cc.n, cc.m, cc.h, cc.w});
  conv.forward(cview(x), y.view());
  check_close(cview(y), direct_conv(x.data(), wt, b, cc.n, cc.c, cc.m, cc.h, cc.w), 1e-6, 1e-5, "output");

  // A rank-2 batch [n, c*h*w] (what the data loader gives) is the same images.
  host_buffer<float> y2(y.shape());
  conv.forward(cview(x).reshape({cc.n, cc.c * cc.h * cc.w}), y2.view());
  CHECK(std::ranges::equal(y, y2));

  const auto gy = random_buffer(y.shape(), 2);
  host_buffer<float> gx(x.shape());
  conv.backward(cview(x), cview(y), cview(gy), gx.view());
  const auto want = direct_conv_backward(x.data(), wt, gy.data(), cc.n, cc.c, cc.m, cc.h, cc.w);
  check_close(conv.parameters()[0].grad(), want.w, 1e-5, 1e-5, "weight gradient");
  check_close(conv.parameters()[1].grad(), want.b, 1e-5, 1e-5, "bias gradient");
  check_close(cview(gx), want.x, 1e-6, 1e-5, "input gradient");
}

TEST_CASE("small CNN gradients match finite differences", "[examples][cnn]") {
  // conv 2->3 on 6x6, relu, maxpool -> 3x3x3, flatten, linear 27->4, softmax cross-entropy.
  host_model m;
  m.push_back(std::make_unique<conv2d>(2, 3, 6, 6, 5));
  m.push_back(std::make_unique<relu>());
  m.push_back(std::make_unique<maxpool2d>(3, 6, 6));
  m.push_back(std::make_unique<flatten>());
  m.push_back(std::make_unique<linear>(27, 4, 6));
  const std::size_t n = 3;
  auto x = random_buffer({n, 72}, 3);  // rank 2, as the loader gives it
  const std::vector<std::int32_t> labels{2, 0, 3};
  const softmax_cross_entropy loss_fn;

  // Analytic: the gradient of the summed loss (scale 1).
  zero_grads(m);
  const auto acts = forward_all(m, cview(x));
  host_buffer<float> g(acts.back().shape());
  loss_fn.forward_backward(cview(acts.back()), labels, g.view(), 1.0f);
  const auto gx = backward_all(m, cview(x), acts, std::move(g));

  // Which side of every ReLU and which element of every pooling window: a difference that
  // crosses one of those kinks measures no derivative, so it is left out (and counted).
  auto kinks = [&] {
    const auto a = forward_all(m, cview(x));
    std::vector<bool> k;
    for (const float v : a[0]) k.push_back(v > 0);
    host_buffer<float> ones(a[2].shape()), routed(a[1].shape());
    std::ranges::fill(ones, 1.0f);
    m[2]->backward(cview(a[1]), cview(a[2]), cview(ones), routed.view());
    for (const float v : routed) k.push_back(v != 0);
    return k;
  };
  auto loss = [&] { return loss_fn.evaluate(cview(forward_all(m, cview(x)).back()), labels).loss_sum; };
  const auto base = kinks();

  // Central differences of the float model's loss (summed over 3 examples, about 4). The network
  // is piecewise linear up to the smooth loss, so between kinks the truncation error is small;
  // eps 3e-3 keeps the float rounding of the loss to a few 1e-6 of a derivative and crosses few
  // kinks (27 of 385 differences here). The worst difference is 1.4e-5, a quarter of the
  // tolerance; the gradients checked are 2e-4 to 0.9 (median 0.03), so a wrong term shows.
  const float eps = 3e-3f;
  std::size_t checked = 0, skipped = 0;
  auto check = [&](float& v, float analytic, const std::string& what) {
    const float saved = v;
    v = saved + eps;
    const double up = loss();
    const bool same_up = kinks() == base;
    v = saved - eps;
    const double down = loss();
    const bool same_down = kinks() == base;
    v = saved;
    if (!same_up || !same_down) {
      ++skipped;
      return;
    }
    const double numeric = (up - down) / (2.0 * static_cast<double>(eps));
    INFO(what);
    CHECK(analytic == Approx(numeric).margin(3e-5).epsilon(3e-3));
    ++checked;
  };
  // Copies: the analytic gradients, before the loss evaluations run the layers again.
  for (std::size_t li = 0; li < m.size(); ++li) {
    auto& params = m[li]->parameters();
    for (std::size_t pi = 0; pi < params.size(); ++pi) {
      const std::vector<float> grad(params[pi].grad().begin(), params[pi].grad().end());
      auto value = params[pi].value();
      for (std::size_t i = 0; i < value.size(); ++i) {
        check(value[i], grad[i], "layer " + std::to_string(li) + " parameter " + std::to_string(pi) + " element " + std::to_string(i));
      }
    }
  }
  for (std::size_t i = 0; i < x.size(); ++i) check(x[i], gx[i], "input element " + std::to_string(i));
  // 54 + 3 conv, 108 + 4 linear parameters and 216 inputs; few differences cross a kink.
  CHECK(checked + skipped == 54 + 3 + 108 + 4 + 216);
  CHECK(skipped * 10 < checked);
}

TEST_CASE("conv2d, maxpool2d and flatten backward add to parameter gradients and write the input gradient", "[examples][cnn]") {
  host_model m;
  m.push_back(std::make_unique<conv2d>(3, 4, 6, 8, 1));
  m.push_back(std::make_unique<maxpool2d>(4, 6, 8));
  m.push_back(std::make_unique<flatten>());
  const auto x = random_buffer({2, 3, 6, 8}, 4);
  for (std::size_t j = 0; j < m.size(); ++j) {
    INFO("layer " << j);
    zero_grads(m);
    const auto acts = forward_all(m, cview(x));
    const tensor_view<const float> in = j == 0 ? cview(x) : cview(acts[j - 1]);
    const auto gy = random_buffer(acts[j].shape(), 5);
    host_buffer<float> gin1(in.shape()), gin2(in.shape());
    m[j]->backward(in, cview(acts[j]), cview(gy), gin1.view());
    std::vector<std::vector<float>> once;
    for (auto& p : m[j]->parameters()) once.emplace_back(p.grad().begin(), p.grad().end());
    // The second call starts from garbage in gin: it must overwrite it, not add to it.
    std::ranges::fill(gin2, std::numeric_limits<float>::quiet_NaN());
    m[j]->backward(in, cview(acts[j]), cview(gy), gin2.view());
    CHECK(std::ranges::equal(gin1, gin2));
    auto& params = m[j]->parameters();
    for (std::size_t pi = 0; pi < params.size(); ++pi) {
      const auto twice = params[pi].grad();
      bool doubled = true;  // (to float rounding: a BLAS may add its partial sums in another order)
      for (std::size_t i = 0; i < twice.size(); ++i) {
        doubled = doubled && std::abs(twice[i] - 2.0f * once[pi][i]) <= 1e-6f * std::abs(once[pi][i]);
      }
      CHECK(doubled);
      CHECK(std::ranges::any_of(once[pi], [](float v) { return v != 0.0f; }));
    }
  }
}

TEST_CASE("maxpool2d takes each window's maximum, the first of equal values", "[examples][cnn]") {
  maxpool2d pool(2, 2, 6);
  // Two channels of 2x6: three windows each. Channel 0: a plain maximum, three equal 7s, four 0s.
  // Channel 1: two equal 4s in the bottom row, a maximum bottom right, 9 top right against two 9s below.
  const std::vector<float> x{1, 5, 7, 7, 0, 0,    //
                             3, 2, 7, 6, 0, 0,    //
                             1, 2, -1, -3, 2, 9,  //
                             4, 4, -2, -0.5f, 9, 9};
  const tensor_view<const float> in(x.data(), shape{1, 2, 2, 6});
  REQUIRE(pool.output_shape(in.shape()) == shape{1, 2, 1, 3});
  std::vector<float> y(6);
  pool.forward(in, tensor_view<float>(y.data(), shape{1, 2, 1, 3}));
  CHECK(y == std::vector<float>{5, 7, 0, 4, -0.5f, 9});

  const std::vector<float> gy{10, 20, 30, 40, 50, 60};
  std::vector<float> gx(x.size(), 99.0f);  // every element must be written
  pool.backward(in, tensor_view<const float>(y.data(), shape{1, 2, 1, 3}), tensor_view<const float>(gy.data(), shape{1, 2, 1, 3}),
                tensor_view<float>(gx.data(), in.shape()));
  CHECK(gx == std::vector<float>{0, 10, 20, 0, 30, 0,  //
                                 0, 0, 0, 0, 0, 0,     //
                                 0, 0, 0, 0, 0, 60,    //
                                 40, 0, 0, 50, 0, 0});

  // The same images as a rank-2 batch.
  std::vector<float> y2(6);
  pool.forward(in.reshape({1, 24}), tensor_view<float>(y2.data(), shape{1, 2, 1, 3}));
  CHECK(y2 == y);
}

TEST_CASE("flatten keeps the batch and copies the rest in order", "[examples][cnn]") {
  flatten f;
  CHECK(f.output_shape(shape{3, 2, 4, 5}) == shape{3, 40});
  CHECK(f.output_shape(shape{3, 7}) == shape{3, 7});
  const auto x = random_buffer({3, 2, 4, 5}, 6);
  host_buffer<float> y(f.output_shape(x.shape()));
  f.forward(cview(x), y.view());
  CHECK(std::ranges::equal(x, y));
  host_buffer<float> gx(x.shape());
  f.backward(cview(x), cview(y), cview(x), gx.view());
  CHECK(std::ranges::equal(x, gx));
  CHECK(f.parameters().empty());
}

TEST_CASE("CNN layers refuse wrong shapes with a message naming them", "[examples][cnn]") {
  using partrain::invalid_argument_error;
  conv2d conv(1, 8, 28, 28, 0);
  CHECK(conv.output_shape(shape{2, 784}) == shape{2, 8, 28, 28});
  CHECK(conv.output_shape(shape{2, 1, 28, 28}) == shape{2, 8, 28, 28});
  CHECK_THROWS_AS(conv.output_shape(shape{2, 783}), invalid_argument_error);
  CHECK_THROWS_WITH(conv.output_shape(shape{2, 783}),
                    Catch::Contains("conv2d: input shape [2, 783], expected [batch, 784] or [batch, 1, 28, 28]"));
  CHECK_THROWS_WITH(conv.output_shape(shape{2, 1, 28, 27}), Catch::Contains("input shape [2, 1, 28, 27]"));
  CHECK_THROWS_WITH(conv.output_shape(shape{2, 28, 28}), Catch::Contains("input shape [2, 28, 28]"));

  // forward and backward check what they are given too.
  std::vector<float> x(2 * 784), small(10), gx(2 * 784);
  CHECK_THROWS_WITH(conv.forward(tensor_view<const float>(x.data(), shape{2, 28, 28}), tensor_view<float>(small.data(), 10)),
                    Catch::Contains("conv2d: input shape [2, 28, 28]"));
  CHECK_THROWS_WITH(conv.forward(tensor_view<const float>(x.data(), shape{2, 784}), tensor_view<float>(small.data(), 10)),
                    Catch::Contains("conv2d::forward: the output has 10 elements, expected 12544"));
  CHECK_THROWS_WITH(conv.backward(tensor_view<const float>(x.data(), shape{2, 784}), {}, tensor_view<const float>(small.data(), 10),
                                  tensor_view<float>(gx.data(), shape{2, 784})),
                    Catch::Contains("conv2d::backward: the output gradient has 10 elements, expected 12544"));

  maxpool2d pool(8, 28, 28);
  CHECK(pool.output_shape(shape{2, 8, 28, 28}) == shape{2, 8, 14, 14});
  CHECK_THROWS_WITH(pool.output_shape(shape{2, 4, 28, 28}),
                    Catch::Contains("maxpool2d: input shape [2, 4, 28, 28], expected [batch, 6272] or [batch, 8, 28, 28]"));
  CHECK_THROWS_WITH(maxpool2d(1, 5, 4), Catch::Contains("maxpool2d: 1 channels of 5x4 (expected channels > 0 and an even height"));
  CHECK_THROWS_AS(maxpool2d(1, 4, 3), invalid_argument_error);
  CHECK_THROWS_WITH(conv2d(0, 8, 28, 28, 0), Catch::Contains("conv2d: 0 -> 8 channels on 28x28 (expected every size > 0)"));
  CHECK_THROWS_WITH(flatten{}.output_shape(shape(std::span<const std::size_t>{})), Catch::Contains("flatten: input shape []"));
}

TEST_CASE("make_cnn maps 784 features to 10 logits, and clone_model copies it independently", "[examples][cnn]") {
  auto m = make_cnn(42);
  REQUIRE(m.size() == 8);
  std::vector<shape> shapes;
  shape s{2, 784};
  std::size_t params = 0;
  for (auto& l : m) {
    s = l->output_shape(s);
    shapes.push_back(s);
    for (auto& p : l->parameters()) params += p.value().size();
  }
  CHECK(shapes == std::vector<shape>{{2, 8, 28, 28}, {2, 8, 28, 28}, {2, 8, 14, 14}, {2, 16, 14, 14}, {2, 16, 14, 14},
                                     {2, 16, 7, 7}, {2, 784}, {2, 10}});
  CHECK(params == (8 * 9 + 8) + (16 * 72 + 16) + (784 * 10 + 10));
  // The first conv is initialised as a linear layer of fan-in 9.
  const auto w0 = m[0]->parameters()[0].value();
  CHECK(std::ranges::all_of(w0, [](float v) { return std::abs(v) <= 1.0f / 3.0f; }));
  CHECK(std::ranges::any_of(w0, [](float v) { return std::abs(v) > 0.25f; }));

  const auto x = random_buffer({2, 784}, 7, 0.0f, 1.0f);
  auto c = clone_model(m);
  const auto y = forward_all(m, cview(x));
  CHECK(std::ranges::all_of(y.back(), [](float v) { return std::isfinite(v); }));
  CHECK(std::ranges::equal(y.back(), forward_all(c, cview(x)).back()));
  // Same seed, same model; another seed, another model.
  auto same = make_cnn(42), other = make_cnn(43);
  CHECK(std::ranges::equal(y.back(), forward_all(same, cview(x)).back()));
  CHECK(!std::ranges::equal(y.back(), forward_all(other, cview(x)).back()));

  // Changing the copy's weights and gradients leaves the original alone.
  zero_grads(m);
  c[3]->parameters()[0].value()[0] += 1.0f;
  CHECK(!std::ranges::equal(y.back(), forward_all(c, cview(x)).back()));
  CHECK(std::ranges::equal(y.back(), forward_all(m, cview(x)).back()));
  const auto yc = forward_all(c, cview(x));
  backward_all(c, cview(x), yc, random_buffer(yc.back().shape(), 8));
  for (auto& l : m) {
    for (auto& p : l->parameters()) CHECK(std::ranges::all_of(p.grad(), [](float v) { return v == 0.0f; }));
  }
}

TEST_CASE("CNN layers read and write parameters bound elsewhere through value() and grad()", "[examples][cnn]") {
  auto m = make_cnn(3);
  auto ref = clone_model(m);
  const auto [values, grads] = partrain::test::bind_elsewhere(m);
  for (auto& l : m) {
    for (auto& p : l->parameters()) CHECK(p.v.size() == 0);
  }
  const auto x = random_buffer({3, 784}, 9, 0.0f, 1.0f);
  zero_grads(ref);
  const auto y = forward_all(m, cview(x)), yr = forward_all(ref, cview(x));
  CHECK(std::ranges::equal(y.back(), yr.back()));
  const auto gy = random_buffer(y.back().shape(), 10);
  const auto gx = backward_all(m, cview(x), y, gy);
  const auto gxr = backward_all(ref, cview(x), yr, gy);
  CHECK(std::ranges::equal(gx, gxr));
  std::size_t k = 0;
  for (auto& l : ref) {
    for (auto& p : l->parameters()) CHECK(std::ranges::equal(p.grad(), grads[k++]));
  }
  CHECK(k == grads.size());
}

TEST_CASE("make_cnn learns a small batch by gradient descent", "[examples][cnn]") {
  auto m = make_cnn(1);
  // 20 noisy 28x28 images; the class says which pair of rows is bright.
  const std::size_t n = 20;
  auto x = random_buffer({n, 784}, 11, 0.0f, 0.5f);
  std::vector<std::int32_t> labels(n);
  for (std::size_t i = 0; i < n; ++i) {
    labels[i] = static_cast<std::int32_t>(i % 10);
    for (std::size_t r = 4 + 2 * (i % 10); r < 6 + 2 * (i % 10); ++r) {
      for (std::size_t c = 0; c < 28; ++c) x[i * 784 + r * 28 + c] += 1.0f;
    }
  }
  const softmax_cross_entropy loss_fn;
  double first = 0, last = 0;
  for (int step = 0; step < 25; ++step) {
    zero_grads(m);
    const auto acts = forward_all(m, cview(x));
    host_buffer<float> g(acts.back().shape());
    const double mean = loss_fn.forward_backward(cview(acts.back()), labels, g.view(), 1.0f / n) / n;
    backward_all(m, cview(x), acts, std::move(g));
    for (auto& l : m) {
      for (auto& p : l->parameters()) {
        auto v = p.value();
        const auto gr = p.grad();
        for (std::size_t i = 0; i < v.size(); ++i) v[i] -= 0.1f * gr[i];
      }
    }
    if (step == 0) first = mean;
    last = mean;
  }
  INFO("mean loss " << first << " -> " << last);
  CHECK(first == Approx(std::log(10.0)).margin(0.3));
  CHECK(last < 0.25);  // about 0.03 here
}
