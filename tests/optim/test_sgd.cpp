#include <catch2/catch.hpp>

#include <partrain/optim/sgd.hpp>

#include <cmath>
#include <vector>

#include "optim_test_models.hpp"
#include "toy_models.hpp"

using namespace partrain;
using partrain::testing::manual_model;

static_assert(optimizer<sgd<manual_model<float>>>);
static_assert(stateful_optimizer<sgd<manual_model<double>>>);

TEST_CASE("sgd: plain step is p - lr * g", "[optim][sgd]") {
  manual_model<double> m{{{{1.0, -2.0, 0.5}, {0.5, 0.25, -4.0}}}};
  sgd opt(m, {.lr = 0.1});
  opt.step();
  CHECK(m.params[0].v == std::vector<double>{1.0 - 0.05, -2.0 - 0.025, 0.5 + 0.4});
}

TEST_CASE("sgd: momentum buffers start as the gradient, then m*buf + (1-dampening)*g", "[optim][sgd]") {
  manual_model<double> m{{{{0.0}, {1.0}}}};
  SECTION("momentum 0.9, constant gradient 1: steps of 1, 1.9, 2.71 times lr") {
    sgd opt(m, {.lr = 0.1, .momentum = 0.9});
    for (int i = 0; i < 3; ++i) opt.step();
    CHECK(m.params[0].v[0] == Approx(-0.561).epsilon(1e-14));
  }
  SECTION("dampening 0.5: the first step is undamped (PyTorch clones the gradient)") {
    sgd opt(m, {.lr = 1.0, .momentum = 0.5, .dampening = 0.5});
    opt.step();  // buf = 1
    opt.step();  // buf = 0.5*1 + 0.5*1 = 1
    opt.step();  // buf = 1
    CHECK(m.params[0].v[0] == Approx(-3.0));
  }
  SECTION("nesterov: step uses g + m*buf") {
    sgd opt(m, {.lr = 0.1, .momentum = 0.9, .nesterov = true});
    opt.step();  // buf = 1, d = 1 + 0.9 = 1.9
    CHECK(m.params[0].v[0] == Approx(-0.19).epsilon(1e-14));
    opt.step();  // buf = 1.9, d = 1 + 1.71 = 2.71
    CHECK(m.params[0].v[0] == Approx(-0.19 - 0.271).epsilon(1e-14));
  }
}

TEST_CASE("sgd: weight decay adds wd * p to the gradient before momentum", "[optim][sgd]") {
  manual_model<double> m{{{{2.0}, {0.0}}}};
  sgd opt(m, {.lr = 0.5, .momentum = 0.9, .weight_decay = 0.1});
  opt.step();  // d = 0.2, buf = 0.2, p = 2 - 0.1 = 1.9
  CHECK(m.params[0].v[0] == Approx(1.9).epsilon(1e-14));
  opt.step();  // d = 0.19, buf = 0.18 + 0.19 = 0.37, p = 1.9 - 0.185
  CHECK(m.params[0].v[0] == Approx(1.715).epsilon(1e-14));
}

TEST_CASE("sgd: float parameters step in float", "[optim][sgd]") {
  manual_model<float> m{{{{1.0f}, {0.3f}}}};
  sgd opt(m, {.lr = 0.1, .momentum = 0.9});
  opt.step();
  opt.step();
  const float lr = 0.1f, mom = 0.9f, g = 0.3f;
  float buf = g, v = 1.0f + (-lr) * buf;
  buf = buf * mom + 1.0f * g;
  v = v + (-lr) * buf;
  CHECK(m.params[0].v[0] == v);
}

TEST_CASE("sgd: zero_grad clears every gradient", "[optim][sgd]") {
  manual_model<float> m{{{{1.0f, 2.0f}, {3.0f, 4.0f}}, {{5.0f}, {6.0f}}}};
  sgd opt(m, {});
  opt.zero_grad();
  CHECK(m.params[0].g == std::vector<float>{0.0f, 0.0f});
  CHECK(m.params[1].g == std::vector<float>{0.0f});
}

TEST_CASE("sgd: bad options are refused with the reason", "[optim][sgd]") {
  manual_model<float> m{{{{1.0f}, {1.0f}}}};
  CHECK_THROWS_WITH(sgd(m, {.lr = -1}), Catch::Contains("lr must be >= 0"));
  CHECK_THROWS_WITH(sgd(m, {.momentum = -0.5}), Catch::Contains("momentum must be >= 0"));
  CHECK_THROWS_WITH(sgd(m, {.nesterov = true}), Catch::Contains("nesterov momentum requires momentum > 0"));
  CHECK_THROWS_AS(sgd(m, {.momentum = 0.9, .dampening = 0.1, .nesterov = true}), invalid_argument_error);
  m.params[0].g.push_back(2.0f);
  sgd opt(m, {});
  CHECK_THROWS_WITH(opt.step(), Catch::Contains("parameter #0 has 1 values but its gradient has 2"));
}

TEST_CASE("sgd: saved state resumes bit for bit", "[optim][sgd][state]") {
  using partrain::testing::toy_mlp;
  auto batch = partrain::testing::make_toy_batch<float>(0, 8);
  toy_mlp<float, false> a, b;
  sgd oa(a, {.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3, .nesterov = true});
  sgd ob(b, {.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3, .nesterov = true});
  for (int i = 0; i < 3; ++i) {
    a.train_step(batch);
    oa.step();
    b.train_step(batch);
    ob.step();
  }
  state_writer w;
  ob.save_state(w);
  toy_mlp<float, false> c = b;
  sgd oc(c, {.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3, .nesterov = true});
  state_reader r(w.bytes());
  oc.load_state(r);
  CHECK(r.remaining() == 0);
  CHECK(oc.steps() == 3);
  for (int i = 0; i < 4; ++i) {
    a.train_step(batch);
    oa.step();
    c.train_step(batch);
    oc.step();
  }
  CHECK(a.flat_values() == c.flat_values());

  SECTION("state of another optimizer kind is refused") {
    state_writer w2;
    w2.put_string("adamw");
    state_reader r2(w2.bytes());
    CHECK_THROWS_WITH(oc.load_state(r2), Catch::Contains("optimizer state is for 'adamw', expected 'sgd'"));
  }
}

namespace {
// A device model's face, as far as the optimizers look: its stream and its device.
struct streamed_model : manual_model<float> {
  int stream_object = 0;
  [[nodiscard]] int* stream() noexcept { return &stream_object; }  // stands for a cudaStream_t
  [[nodiscard]] partrain::device device() const noexcept { return partrain::device::cuda(3); }
};
}  // namespace

TEST_CASE("optimizers find the model's stream and device (model_stream, model_cuda_device)", "[optim][sgd]") {
  streamed_model m;
  m.params = {{{1.0f, 2.0f}, {2.0f, 4.0f}}};
  CHECK(model_stream(m) == static_cast<void*>(&m.stream_object));
  CHECK(model_cuda_device(m) == 3);
  manual_model<float> plain{{{{1.0f}, {1.0f}}}};
  CHECK(model_stream(plain) == nullptr);
  CHECK(model_cuda_device(plain) == -1);
  // The host loops take the stream and ignore it: the step is the usual one.
  sgd opt(m, {.lr = 0.5});
  opt.step();
  CHECK(m.params[0].v == std::vector<float>{0.0f, 0.0f});
}
