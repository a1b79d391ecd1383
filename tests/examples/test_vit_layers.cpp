// The example's Vision Transformer layers (models/vit_layers.hpp): every gradient of a tiny ViT in
// double against central differences (with and without dropout), the float model against the
// double one, the saved-activation forms against host_saving_layer's plain ones, dropout's seeded
// masks under recomputation, the gradient rule, shapes and their errors, copies, and parameters
// bound elsewhere (as fully sharded data parallel binds them).
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <cblas.h>

#include <partrain/core/buffer.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/data/batch.hpp>
#include <partrain/model/sequential.hpp>

#include "vit_layers.hpp"
#include "pipeline_layers.hpp"

namespace {

using namespace models::layers;
using partrain::host_buffer;
using partrain::layer_call;
using partrain::shape;
using partrain::tensor_view;

template <class T = float>
host_buffer<T> random_buffer(shape s, std::uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  host_buffer<T> b(s);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  for (auto& v : b) v = static_cast<T>(d(gen));
  return b;
}

template <class T>
tensor_view<const T> cview(const host_buffer<T>& b) {
  return b.view();
}

// The tiny configuration of the gradient checks: 16 tokens of dim 8, 2 blocks of 2 heads.
vit_config tiny(float dropout = 0.0f) {
  return {.patch = 7, .dim = 8, .depth = 2, .heads = 2, .mlp_ratio = 2, .dropout = dropout};
}

// ---- the ViT in T, driven layer by layer (basic_vit<T>) ----

template <class T>
struct vit_pass {
  std::vector<host_buffer<T>> outs;   // patch embedding, each block, logits
  std::vector<host_buffer<T>> saved;  // each block's saved activations
};

// Layer i runs with seed + i (as a runner gives each layer call its own seed): block i is layer i + 1.
template <class T>
vit_pass<T> vit_forward(basic_vit<T>& v, tensor_view<const T> x, std::uint64_t seed) {
  vit_pass<T> r;
  r.outs.emplace_back(v.embed.output_shape(x.shape()));
  v.embed.forward(x, r.outs.back().view());
  for (std::size_t i = 0; i < v.blocks.size(); ++i) {
    const tensor_view<const T> in = r.outs.back().view();  // host_buffer moves keep their memory
    r.saved.emplace_back(shape{v.blocks[i].saved_size(in.shape())});
    r.outs.emplace_back(v.blocks[i].output_shape(in.shape()));
    v.blocks[i].forward(in, r.outs.back().view(), r.saved.back().view(), seed + 1 + i);
  }
  const tensor_view<const T> in = r.outs.back().view();
  r.outs.emplace_back(v.head.output_shape(in.shape()));
  v.head.forward(in, r.outs.back().view());
  return r;
}

// Back-propagates gy (the logits' gradient); returns d loss / d x.
template <class T>
host_buffer<T> vit_backward(basic_vit<T>& v, tensor_view<const T> x, vit_pass<T>& r, std::uint64_t seed,
                            host_buffer<T> gy) {
  const std::size_t depth = v.blocks.size();
  host_buffer<T> g(r.outs[depth].shape());
  v.head.backward(cview(r.outs[depth]), cview(r.outs[depth + 1]), cview(gy), g.view());
  for (std::size_t i = depth; i-- > 0;) {
    host_buffer<T> gin(r.outs[i].shape());
    v.blocks[i].backward(cview(r.outs[i]), cview(r.outs[i + 1]), r.saved[i].view(), seed + 1 + i, cview(g), gin.view());
    g = std::move(gin);
  }
  host_buffer<T> gx(x.shape());
  v.embed.backward(x, cview(r.outs[0]), cview(g), gx.view());
  return gx;
}

// Every parameter of a basic_vit<T>, in make_vit's order (layer by layer).
template <class T>
std::vector<vit_detail::param_t<T>*> params_of(basic_vit<T>& v) {
  std::vector<vit_detail::param_t<T>*> ps;
  for (auto& p : v.embed.parameters()) ps.push_back(&p);
  for (auto& b : v.blocks) {
    for (auto& p : b.parameters()) ps.push_back(&p);
  }
  for (auto& p : v.head.parameters()) ps.push_back(&p);
  return ps;
}

// Softmax cross-entropy summed over the rows, in double; writes its gradient (scale 1) when asked.
template <class T>
double cross_entropy(const host_buffer<T>& z, const std::vector<std::int32_t>& labels, host_buffer<T>* grad = nullptr) {
  const std::size_t n = z.shape()[0], k = z.shape()[1];
  double total = 0;
  for (std::size_t r = 0; r < n; ++r) {
    const T* row = z.data() + r * k;
    const double mx = *std::max_element(row, row + k);
    double sum = 0;
    for (std::size_t c = 0; c < k; ++c) sum += std::exp(static_cast<double>(row[c]) - mx);
    total += std::log(sum) + mx - static_cast<double>(row[labels[r]]);
    if (grad) {
      for (std::size_t c = 0; c < k; ++c) {
        const double p = std::exp(static_cast<double>(row[c]) - mx) / sum;
        (*grad)[r * k + c] = static_cast<T>(p - (static_cast<std::size_t>(labels[r]) == c ? 1.0 : 0.0));
      }
    }
  }
  return total;
}

// ---- the float model, a host_model, through its saved-activation forms ----

struct host_pass {
  std::vector<host_buffer<float>> outs, saved;
};

host_pass model_forward(host_model& m, tensor_view<const float> x, std::uint64_t seed) {
  host_pass r;
  tensor_view<const float> cur = x;
  for (std::size_t i = 0; i < m.size(); ++i) {
    r.saved.emplace_back(shape{m[i]->saved_size(cur.shape())});
    r.outs.emplace_back(m[i]->output_shape(cur.shape()));
    m[i]->forward(cur, r.outs.back().view(), layer_call<>{r.saved.back().view(), seed + i});
    cur = cview(r.outs.back());
  }
  return r;
}

host_buffer<float> model_backward(host_model& m, tensor_view<const float> x, host_pass& r, std::uint64_t seed,
                                  host_buffer<float> g) {
  for (std::size_t j = m.size(); j-- > 0;) {
    const tensor_view<const float> in = j == 0 ? x : cview(r.outs[j - 1]);
    host_buffer<float> gin(in.shape());
    m[j]->backward(in, cview(r.outs[j]), layer_call<>{r.saved[j].view(), seed + j}, cview(g), gin.view());
    g = std::move(gin);
  }
  return g;
}

void zero_grads(host_model& m) {
  for (auto& l : m) {
    for (auto& p : l->parameters()) std::ranges::fill(p.grad(), 0.0f);
  }
}

std::vector<std::vector<float>> grads_of(host_layer& l) {
  std::vector<std::vector<float>> g;
  for (auto& p : l.parameters()) g.emplace_back(p.grad().begin(), p.grad().end());
  return g;
}

bool same_bits(tensor_view<const float> a, tensor_view<const float> b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](float u, float v) {
           return std::bit_cast<std::uint32_t>(u) == std::bit_cast<std::uint32_t>(v);
         });
}

}  // namespace

TEST_CASE("every ViT gradient in double matches central differences", "[examples][vit]") {
  // Dropout 0.1 too: the masks are a function of the seed, so with the seed fixed the loss is
  // smooth in every parameter and the same differences apply.
  const float p = GENERATE(0.0f, 0.1f);
  INFO("dropout " << p);
  basic_vit<double> v(tiny(p), 11);
  const auto x = random_buffer<double>({3, 784}, 12, -1.0f, 2.0f);  // about the range of normalized pixels
  const std::vector<std::int32_t> labels{3, 7, 1};
  const std::uint64_t seed = 99;
  const auto params = params_of(v);

  for (auto* q : params) std::ranges::fill(q->grad(), 0.0);
  auto pass = vit_forward(v, cview(x), seed);
  host_buffer<double> gy(pass.outs.back().shape());
  cross_entropy(pass.outs.back(), labels, &gy);
  const auto gx = vit_backward(v, cview(x), pass, seed, std::move(gy));

  // Central differences of the summed loss (about 7) on 4 points, (8 (f(h) - f(-h)) - (f(2h) -
  // f(-2h))) / 12h: the truncation error is of order h^4 and the rounding error of order
  // 1e-15 / h. At h = 3e-4 the worst absolute error measured is 7e-12, a relative 3.5e-9 on the
  // gradients above 1e-3 (most are 1e-3 to 1). Demanded: relative error 1e-6, measured against
  // 1e-4 for smaller gradients (the worst seen is 4e-8, on an input gradient of 4e-5), so a
  // dropped term of any size shows.
  const double h = 3e-4;
  auto xs = x;
  auto loss = [&] { return cross_entropy(vit_forward(v, cview(xs), seed).outs.back(), labels); };
  auto numeric = [&](double& value) {
    const double saved = value;
    auto at = [&](double dx) {
      value = saved + dx;
      return loss();
    };
    const double d = (8 * (at(h) - at(-h)) - (at(2 * h) - at(-2 * h))) / (12 * h);
    value = saved;
    return d;
  };
  double worst = 0;
  std::string worst_at;
  std::size_t checked = 0, nonzero = 0;
  auto check = [&](double& value, double analytic, const std::string& what) {
    const double n = numeric(value);
    const double err = std::abs(analytic - n) / std::max({std::abs(analytic), std::abs(n), 1e-4});
    if (err > worst) {
      worst = err;
      worst_at = what + ": " + std::to_string(analytic) + " against " + std::to_string(n);
    }
    ++checked;
  };
  for (std::size_t pi = 0; pi < params.size(); ++pi) {
    // Copies: the analytic gradients, before the loss evaluations run the layers again.
    const std::vector<double> grad(params[pi]->grad().begin(), params[pi]->grad().end());
    nonzero += static_cast<std::size_t>(std::ranges::count_if(grad, [](double g) { return std::abs(g) > 1e-6; }));
    auto value = params[pi]->value();
    for (std::size_t i = 0; i < value.size(); ++i) {
      check(value[i], grad[i], "parameter " + std::to_string(pi) + "[" + std::to_string(i) + "]");
    }
  }
  for (std::size_t i = 0; i < xs.size(); ++i) check(xs[i], gx[i], "input " + std::to_string(i));
  // Patch embedding 8*49 + 8 + 16*8, 2 blocks of 12 parameters (600 each), head 8 + 8 + 80 + 10,
  // and the 3 * 784 inputs.
  CHECK(params.size() == 3 + 2 * 12 + 4);
  CHECK(checked == 528 + 2 * 600 + 106 + 3 * 784);
  CHECK(nonzero * 10 > (528 + 2 * 600 + 106) * 9);  // a parameter the loss ignores would show here
  INFO("worst relative error " << worst << " at " << worst_at);
  CHECK(worst <= 1e-6);
}

TEST_CASE("the float ViT's gradients match the double ViT's", "[examples][vit]") {
  openblas_set_num_threads(1);
  const float p = GENERATE(0.0f, 0.1f);
  INFO("dropout " << p);
  auto m = make_vit(tiny(p), 21);
  basic_vit<double> v(tiny(p), 21);
  const auto dparams = params_of(v);
  std::vector<host_param*> fparams;
  for (auto& l : m) {
    for (auto& q : l->parameters()) fparams.push_back(&q);
  }
  REQUIRE(fparams.size() == dparams.size());
  // Drawn in float either way: the same values exactly.
  for (std::size_t i = 0; i < fparams.size(); ++i) {
    CHECK(std::ranges::equal(fparams[i]->value(), dparams[i]->value(), [](float f, double d) { return f == d; }));
  }

  const auto xf = random_buffer({4, 784}, 22, -1.0f, 2.0f);
  const auto xd = random_buffer<double>({4, 784}, 22, -1.0f, 2.0f);
  const std::vector<std::int32_t> labels{0, 9, 4, 4};
  zero_grads(m);
  for (auto* q : dparams) std::ranges::fill(q->grad(), 0.0);
  auto pf = model_forward(m, cview(xf), 5);
  auto pd = vit_forward(v, cview(xd), 5);
  host_buffer<float> gf(pf.outs.back().shape());
  softmax_cross_entropy{}.forward_backward(cview(pf.outs.back()), labels, gf.view(), 1.0f);
  host_buffer<double> gd(pd.outs.back().shape());
  cross_entropy(pd.outs.back(), labels, &gd);
  const auto gxf = model_backward(m, cview(xf), pf, 5, std::move(gf));
  const auto gxd = vit_backward(v, cview(xd), pd, 5, std::move(gd));

  // Float rounding through 4 layers: within 1e-6 + 1e-4 relative (the worst seen is 0.15 of that).
  auto close = [](tensor_view<const float> f, tensor_view<const double> d, const std::string& what) {
    double worst = 0;
    std::size_t at = 0;
    for (std::size_t i = 0; i < d.size(); ++i) {
      const double e = std::abs(f[i] - d[i]) / (1e-6 + 1e-4 * std::abs(d[i]));
      if (e > worst) worst = e, at = i;
    }
    INFO(what << ": worst element " << at << ", " << f[at] << " against " << d[at]);
    CHECK(worst <= 1.0);
  };
  close(cview(pf.outs.back()), cview(pd.outs.back()), "logits");
  for (std::size_t i = 0; i < fparams.size(); ++i) close(fparams[i]->grad(), dparams[i]->grad(), "parameter " + std::to_string(i));
  close(cview(gxf), cview(gxd), "input gradient");
}

TEST_CASE("transformer_block's plain forms equal its saved-activation forms bit for bit", "[examples][vit]") {
  openblas_set_num_threads(1);
  // Dropout too: host_saving_layer's plain forms call with seed 0, as the saved ones are called here.
  const float p = GENERATE(0.0f, 0.1f);
  INFO("dropout " << p);
  transformer_block saved_form(16, 4, 32, p, 5);
  transformer_block plain_form(16, 4, 32, p, 5);
  const auto x = random_buffer({3, 5, 16}, 1);
  const auto gy = random_buffer({3, 5, 16}, 2);

  host_buffer<float> y1(x.shape()), gx1(x.shape()), saved(shape{saved_form.saved_size(x.shape())});
  const layer_call<> call{saved.view(), 0};
  saved_form.forward(cview(x), y1.view(), call);
  saved_form.backward(cview(x), cview(y1), call, cview(gy), gx1.view());

  host_buffer<float> y2(x.shape()), gx2(x.shape());
  plain_form.forward(cview(x), y2.view());
  plain_form.backward(cview(x), cview(y2), cview(gy), gx2.view());

  CHECK(same_bits(cview(y1), cview(y2)));
  CHECK(same_bits(cview(gx1), cview(gx2)));
  auto& a = saved_form.parameters();
  auto& b = plain_form.parameters();
  REQUIRE(a.size() == 12);
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO("parameter " << i);
    CHECK(same_bits(a[i].grad(), b[i].grad()));
    CHECK(std::ranges::any_of(a[i].grad(), [](float v) { return v != 0.0f; }));
  }
}

TEST_CASE("dropout masks come from the call's seed: recomputing the forward repeats them bit for bit", "[examples][vit]") {
  openblas_set_num_threads(1);
  transformer_block blk(16, 4, 32, 0.1f, 5);
  const auto x = random_buffer({4, 6, 16}, 3);
  const auto gy = random_buffer(x.shape(), 4);
  const std::size_t floats = blk.saved_size(x.shape());
  struct pass {
    host_buffer<float> y, saved;
  };
  auto run = [&](std::uint64_t seed) {
    pass r{host_buffer<float>(x.shape()), host_buffer<float>(shape{floats})};
    blk.forward(cview(x), r.y.view(), layer_call<>{r.saved.view(), seed});
    return r;
  };
  auto first = run(7);
  const auto again = run(7);
  CHECK(same_bits(cview(first.y), cview(again.y)));
  CHECK(same_bits(cview(first.saved), cview(again.saved)));
  CHECK(!std::ranges::equal(first.y, run(8).y));

  // Backward from the original saved activations, then from a recomputed forward's (the runner's
  // activation recomputation): the same gradients, bit for bit.
  struct grads {
    host_buffer<float> gx;
    std::vector<std::vector<float>> params;
  };
  auto backward = [&](pass& f, std::uint64_t seed) {
    for (auto& q : blk.parameters()) std::ranges::fill(q.grad(), 0.0f);
    grads g{host_buffer<float>(x.shape()), {}};
    blk.backward(cview(x), cview(f.y), layer_call<>{f.saved.view(), seed}, cview(gy), g.gx.view());
    g.params = grads_of(blk);
    return g;
  };
  const auto g1 = backward(first, 7);
  auto recomputed = run(7);
  const auto g2 = backward(recomputed, 7);
  CHECK(same_bits(cview(g1.gx), cview(g2.gx)));
  CHECK(g1.params == g2.params);
  // Another seed's masks give other gradients.
  auto other = run(8);
  CHECK(!std::ranges::equal(g1.gx, backward(other, 8).gx));

  // In eval mode dropout is off: the output is that of the same block without dropout.
  transformer_block no_dropout(16, 4, 32, 0.0f, 5);
  host_buffer<float> y0(x.shape()), s0(shape{floats}), y_eval(x.shape());
  no_dropout.forward(cview(x), y0.view(), layer_call<>{s0.view(), 7});
  blk.train(false);
  blk.forward(cview(x), y_eval.view(), layer_call<>{first.saved.view(), 7});
  CHECK(same_bits(cview(y0), cview(y_eval)));
  CHECK(!std::ranges::equal(y0, first.y));

  // The mask drops about p of the elements, independently per site and seed.
  namespace el = models::vit_elements;
  const auto threshold = el::dropout_threshold(0.1f);
  std::size_t dropped = 0, both = 0;
  const std::size_t draws = 200000;
  for (std::size_t i = 0; i < draws; ++i) {
    const bool a = !el::dropout_keep(el::dropout_stream(7, 0), i, threshold);
    const bool b = !el::dropout_keep(el::dropout_stream(7, 1), i, threshold);
    dropped += a;
    both += a && b;
  }
  CHECK(static_cast<double>(dropped) / draws == Approx(0.1).margin(0.003));
  CHECK(static_cast<double>(both) / draws == Approx(0.01).margin(0.001));
  CHECK(el::dropout_threshold(0.0f) == 0);
}

TEST_CASE("ViT layers add to parameter gradients and write the input gradient", "[examples][vit]") {
  openblas_set_num_threads(1);
  auto m = make_vit(tiny(0.1f), 31);
  const auto x = random_buffer({2, 784}, 32);
  auto pass = model_forward(m, cview(x), 3);
  for (std::size_t j = 0; j < m.size(); ++j) {
    INFO("layer " << j);
    zero_grads(m);
    const tensor_view<const float> in = j == 0 ? cview(x) : cview(pass.outs[j - 1]);
    const auto gy = random_buffer(pass.outs[j].shape(), 33);
    const layer_call<> call{pass.saved[j].view(), 3 + j};
    host_buffer<float> gin1(in.shape()), gin2(in.shape());
    m[j]->backward(in, cview(pass.outs[j]), call, cview(gy), gin1.view());
    const auto once = grads_of(*m[j]);
    // The second call starts from garbage in gin: it must overwrite it, not add to it.
    std::ranges::fill(gin2, std::numeric_limits<float>::quiet_NaN());
    m[j]->backward(in, cview(pass.outs[j]), call, cview(gy), gin2.view());
    CHECK(same_bits(cview(gin1), cview(gin2)));
    const auto twice = grads_of(*m[j]);
    for (std::size_t pi = 0; pi < once.size(); ++pi) {
      INFO("parameter " << pi);
      bool doubled = true;  // (to float rounding: a BLAS may add its partial sums in another order)
      for (std::size_t i = 0; i < once[pi].size(); ++i) {
        doubled = doubled && std::abs(twice[pi][i] - 2.0f * once[pi][i]) <= 1e-6f * std::abs(once[pi][i]);
      }
      CHECK(doubled);
      CHECK(std::ranges::any_of(once[pi], [](float v) { return v != 0.0f; }));
    }
  }
}

TEST_CASE("ViT layers refuse wrong shapes and configurations with a message naming them", "[examples][vit]") {
  using partrain::invalid_argument_error;
  auto m = make_vit({}, 0);
  auto& embed = *m.front();
  auto& block = *m[1];
  auto& head = *m.back();
  CHECK(embed.output_shape(shape{2, 784}) == shape{2, 16, 64});
  CHECK(embed.output_shape(shape{2, 1, 28, 28}) == shape{2, 16, 64});
  CHECK_THROWS_AS(embed.output_shape(shape{2, 783}), invalid_argument_error);
  CHECK_THROWS_WITH(embed.output_shape(shape{2, 783}),
                    Catch::Contains("patch_embed: input shape [2, 783], expected [batch, 784] or [batch, 1, 28, 28]"));
  CHECK_THROWS_WITH(block.output_shape(shape{2, 16, 32}),
                    Catch::Contains("transformer_block: input shape [2, 16, 32], expected [batch, tokens, 64]"));
  CHECK_THROWS_WITH(block.saved_size(shape{2, 1024}), Catch::Contains("transformer_block: input shape [2, 1024]"));
  CHECK_THROWS_WITH(head.output_shape(shape{2, 0, 64}),
                    Catch::Contains("vit_head: input shape [2, 0, 64], expected [batch, tokens, 64] with tokens >= 1"));

  // forward and backward check what they are given too.
  std::vector<float> x(2 * 16 * 64), small(10), saved(block.saved_size(shape{2, 16, 64}));
  const tensor_view<const float> tokens(x.data(), shape{2, 16, 64});
  CHECK_THROWS_WITH(block.forward(tokens, tensor_view<float>(small.data(), 10), layer_call<>{saved, 0}),
                    Catch::Contains("transformer_block::forward: the output has 10 elements, expected 2048"));
  CHECK_THROWS_WITH(block.forward(tokens, tensor_view<float>(x.data(), shape{2, 16, 64}), layer_call<>{small, 0}),
                    Catch::Contains("transformer_block::forward: the saved buffer has 10 elements, expected at least " +
                                    std::to_string(saved.size())));
  std::vector<float> gx(x.size());
  CHECK_THROWS_WITH(block.backward(tokens, tokens, layer_call<>{saved, 0}, tensor_view<const float>(small.data(), 10),
                                   tensor_view<float>(gx.data(), tokens.shape())),
                    Catch::Contains("transformer_block::backward: the output gradient has 10 elements, expected 2048"));
  CHECK_THROWS_WITH(head.forward(tokens, tensor_view<float>(small.data(), 10)),
                    Catch::Contains("vit_head::forward: the output has 10 elements, expected 20"));
  std::vector<float> img(2 * 784);
  CHECK_THROWS_WITH(embed.forward(tensor_view<const float>(img.data(), shape{2, 784}), tensor_view<float>(small.data(), 10)),
                    Catch::Contains("patch_embed::forward: the output has 10 elements, expected 2048"));

  CHECK_THROWS_WITH(make_vit({.patch = 5}, 0),
                    Catch::Contains("vit_config: patch 5 on a 28x28 image (expected a patch size > 0 that divides the image side)"));
  CHECK_THROWS_WITH(make_vit({.dim = 64, .heads = 3}, 0),
                    Catch::Contains("vit_config: dim 64 with 3 heads (expected heads > 0 dividing dim > 0)"));
  CHECK_THROWS_WITH(make_vit({.dropout = 1.0f}, 0), Catch::Contains("vit_config: dropout 1.000000 (expected 0 <= dropout < 1)"));
  CHECK_THROWS_WITH(make_vit({.mlp_ratio = 0}, 0), Catch::Contains("vit_config: mlp_ratio 0"));
  CHECK_THROWS_WITH(transformer_block(64, 3, 128, 0.0f, 0),
                    Catch::Contains("transformer_block: dim 64, 3 heads, hidden 128 (expected heads > 0 dividing dim > 0"));
  CHECK_THROWS_WITH(transformer_block(64, 4, 128, -0.5f, 0),
                    Catch::Contains("transformer_block: dropout -0.500000 (expected 0 <= dropout < 1)"));
  CHECK_THROWS_WITH(patch_embed(28, 6, 64, 0), Catch::Contains("patch_embed: 6x6 patches of a 28x28 image to dim 64"));
  CHECK_THROWS_WITH(vit_head(64, 0, 0), Catch::Contains("vit_head: dim 64 to 0 classes (expected both > 0)"));
  CHECK_THROWS_WITH(make_vit({.compute = partrain::dtype::float16}, 0),
                    Catch::Contains("vit_config: compute float16 (expected float32 or bfloat16)"));
  CHECK_THROWS_WITH(vit_head(64, 10, 0, partrain::dtype::float16),
                    Catch::Contains("vit_head: matrix products in float16 (expected float32 or bfloat16)"));
}

TEST_CASE("make_vit maps 784 features to 10 logits, and clone_model copies it independently", "[examples][vit]") {
  const vit_config c;
  auto m = make_vit(c, 42);
  REQUIRE(m.size() == c.depth + 2);
  shape s{2, 784};
  std::size_t params = 0;
  for (auto& l : m) {
    s = l->output_shape(s);
    for (auto& p : l->parameters()) params += p.value().size();
  }
  CHECK(s == shape{2, 10});
  const std::size_t d = 64, f = 128;
  const std::size_t block = 2 * d + (3 * d * d + 3 * d) + (d * d + d) + 2 * d + (f * d + f) + (d * f + d);
  CHECK(params == (d * 49 + d + 16 * d) + c.depth * block + (2 * d + 10 * d + 10));
  // The saved activations of one block: 4M + 5MD + MF + nHt^2 (M = n t rows).
  CHECK(m[1]->saved_size(shape{64, 16, 64}) == 528384);

  const auto x = random_buffer({2, 784}, 7, -1.0f, 2.0f);
  auto c2 = clone_model(m);
  const auto y = model_forward(m, cview(x), 1).outs.back();
  CHECK(std::ranges::all_of(y, [](float v) { return std::isfinite(v); }));
  CHECK(std::ranges::equal(y, model_forward(c2, cview(x), 1).outs.back()));
  auto same = make_vit(c, 42), other = make_vit(c, 43);
  CHECK(std::ranges::equal(y, model_forward(same, cview(x), 1).outs.back()));
  CHECK(!std::ranges::equal(y, model_forward(other, cview(x), 1).outs.back()));

  // Changing the copy's weights and gradients leaves the original alone.
  zero_grads(m);
  c2[2]->parameters()[2].value()[0] += 1.0f;
  CHECK(!std::ranges::equal(y, model_forward(c2, cview(x), 1).outs.back()));
  CHECK(std::ranges::equal(y, model_forward(m, cview(x), 1).outs.back()));
  auto pc = model_forward(c2, cview(x), 1);
  model_backward(c2, cview(x), pc, 1, random_buffer(pc.outs.back().shape(), 8));
  for (auto& l : m) {
    for (auto& p : l->parameters()) CHECK(std::ranges::all_of(p.grad(), [](float v) { return v == 0.0f; }));
  }
}

TEST_CASE("ViT layers read and write parameters bound elsewhere through value() and grad()", "[examples][vit]") {
  auto m = make_vit(tiny(0.1f), 3);
  auto ref = clone_model(m);
  const auto [values, grads] = partrain::test::bind_elsewhere(m);
  for (auto& l : m) {
    for (auto& p : l->parameters()) CHECK(p.v.size() == 0);
  }
  const auto x = random_buffer({3, 784}, 9);
  zero_grads(ref);
  auto pm = model_forward(m, cview(x), 4);
  auto pr = model_forward(ref, cview(x), 4);
  CHECK(same_bits(cview(pm.outs.back()), cview(pr.outs.back())));
  const auto gy = random_buffer(pm.outs.back().shape(), 10);
  const auto gx = model_backward(m, cview(x), pm, 4, gy);
  const auto gxr = model_backward(ref, cview(x), pr, 4, gy);
  CHECK(same_bits(cview(gx), cview(gxr)));
  std::size_t k = 0;
  for (auto& l : ref) {
    for (auto& p : l->parameters()) CHECK(same_bits(p.grad(), cview(grads[k++])));
  }
}

TEST_CASE("sequential's eval_step switches the ViT's dropout off, and train_step on again", "[examples][vit]") {
  std::mt19937 gen(5);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> x(6 * 784);
  for (auto& v : x) v = u(gen);
  const std::vector<std::int32_t> y{0, 1, 2, 3, 4, 5};
  const partrain::batch b{tensor_view<const float>(x.data(), shape{6, 784}), tensor_view<const std::int32_t>(y), {}};
  partrain::sequential with(make_vit(tiny(0.5f), 41), softmax_cross_entropy{});
  partrain::sequential without(make_vit(tiny(0.0f), 41), softmax_cross_entropy{});  // the same weights
  const auto e = with.eval_step(b);
  CHECK(e.loss_sum == without.eval_step(b).loss_sum);
  CHECK(with.training());
  // Training: dropout on, so the loss is not the dropout-free one.
  CHECK(with.train_step(b) != Approx(without.train_step(b)).epsilon(1e-9));
}

