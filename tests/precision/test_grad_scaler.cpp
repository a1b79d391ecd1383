// grad_scaler against torch.amp.GradScaler's documented behaviour: initial scale 2^16, halve and
// skip on inf/NaN, double after growth_interval good steps in a row; state through checkpoints.
#include <catch2/catch.hpp>

#include <partrain/comm/local.hpp>
#include <partrain/optim/sgd.hpp>
#include <partrain/precision/grad_scaler.hpp>
#include <partrain/precision/mixed_precision.hpp>
#include <partrain/train/checkpoint.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "temp_dir.hpp"
#include "toy_models.hpp"

using namespace partrain;
using partrain::testing::toy_mlp;

namespace {

constexpr float inf = std::numeric_limits<float>::infinity();

// Counts steps; what grad_scaler::step calls or skips.
struct counting_optimizer {
  int steps = 0;
  void step() { ++steps; }
  void zero_grad() {}
};

// Sets every gradient of the model to `g` (with `bad` put into one element when not 0).
void set_grads(toy_mlp<float>& m, float g, float bad = 0) {
  for (auto& p : m.parameters()) std::fill(p.grads().begin(), p.grads().end(), g);
  if (bad != 0) m.parameters()[1].grads()[2] = bad;
}

// One iteration as a user writes it; returns whether the optimizer stepped.
bool iteration(grad_scaler& s, toy_mlp<float>& m, counting_optimizer& opt, float bad) {
  set_grads(m, 1.0f, bad);
  const bool stepped = s.step(opt, m);
  s.update();
  return stepped;
}

}  // namespace

TEST_CASE("grad_scaler starts at 2^16 and follows GradScaler's growth and backoff", "[precision]") {
  grad_scaler s({.growth_interval = 3});
  toy_mlp<float> m;
  counting_optimizer opt;
  CHECK(s.scale() == 65536.0f);

  // The script: (overflow value or 0, expected step taken, expected scale after update, tracker).
  struct row {
    float bad;
    bool stepped;
    float scale;
    std::int64_t tracker;
  };
  const std::vector<row> script{
      {0, true, 65536, 1},     {0, true, 65536, 2},
      {0, true, 131072, 0},    // third good step in a row: doubled
      {inf, false, 65536, 0},  // overflow: skipped, halved, count restarts
      {0, true, 65536, 1},     {0, true, 65536, 2},
      {std::numeric_limits<float>::quiet_NaN(), false, 32768, 0},  // NaN counts as overflow
      {-inf, false, 16384, 0},                                      // two in a row: halved twice
      {0, true, 16384, 1},     {0, true, 16384, 2},    {0, true, 32768, 0},
  };
  int expected_steps = 0;
  for (std::size_t i = 0; i < script.size(); ++i) {
    INFO("iteration " << i);
    const bool stepped = iteration(s, m, opt, script[i].bad);
    expected_steps += script[i].stepped ? 1 : 0;
    CHECK(stepped == script[i].stepped);
    CHECK(s.scale() == script[i].scale);
    CHECK(s.growth_tracker() == script[i].tracker);
    CHECK(opt.steps == expected_steps);
  }
}

TEST_CASE("grad_scaler with the defaults doubles after exactly 2000 good steps", "[precision]") {
  grad_scaler s;
  toy_mlp<float> m;
  counting_optimizer opt;
  for (int i = 0; i < 1999; ++i) REQUIRE(iteration(s, m, opt, 0));
  CHECK(s.scale() == 65536.0f);
  CHECK(s.growth_tracker() == 1999);
  REQUIRE(iteration(s, m, opt, 0));
  CHECK(s.scale() == 131072.0f);
  CHECK(s.growth_tracker() == 0);
  CHECK_FALSE(iteration(s, m, opt, inf));
  CHECK(s.scale() == 65536.0f);
}

TEST_CASE("grad_scaler unscales every gradient by 1/scale in the same pass as the check", "[precision]") {
  grad_scaler s({.init_scale = 1024.0f});
  toy_mlp<float> m;
  set_grads(m, 512.0f);
  CHECK_FALSE(s.unscale(m));
  for (auto& p : m.parameters()) {
    for (float g : p.grads()) CHECK(g == 0.5f);
  }
  CHECK_THROWS_WITH(s.unscale(m), Catch::Contains("already called this iteration"));
  counting_optimizer opt;
  CHECK(s.step(opt, m));  // uses the recorded check; does not unscale twice
  for (auto& p : m.parameters()) {
    for (float g : p.grads()) CHECK(g == 0.5f);
  }
  s.update();
  CHECK_THROWS_WITH(s.update(), Catch::Contains("no inf/NaN check was recorded"));
}

TEST_CASE("a disabled grad_scaler (bf16's default) scales by 1 and always steps", "[precision]") {
  auto s = grad_scaler::for_precision(precision::bf16);
  CHECK_FALSE(s.enabled());
  CHECK(s.scale() == 1.0f);
  CHECK(grad_scaler::for_precision(precision::fp16).enabled());
  toy_mlp<float> m;
  counting_optimizer opt;
  set_grads(m, 2.0f, inf);
  CHECK(s.step(opt, m));
  s.update();
  CHECK(opt.steps == 1);
  CHECK(m.parameters()[0].grads()[0] == 2.0f);  // not touched
  CHECK(mixed_precision_policy{.compute = precision::bf16}.make_scaler().enabled() == false);
  CHECK(mixed_precision_policy{.compute = precision::bf16, .loss_scaling = true}.make_scaler().enabled());
  CHECK(mixed_precision_policy{.compute = precision::fp16}.make_scaler().enabled());
}

TEST_CASE("grad_scaler options are checked", "[precision]") {
  CHECK_THROWS_WITH(grad_scaler({.init_scale = 0}), Catch::Contains("init_scale must be finite and > 0"));
  CHECK_THROWS_WITH(grad_scaler({.growth_factor = 1.0f}), Catch::Contains("growth_factor must be finite and > 1"));
  CHECK_THROWS_WITH(grad_scaler({.backoff_factor = 1.0f}), Catch::Contains("backoff_factor must be in (0, 1)"));
  CHECK_THROWS_WITH(grad_scaler({.growth_interval = 0}), Catch::Contains("growth_interval must be > 0"));
}

TEST_CASE("a checkpoint restores the scale and the growth tracker", "[precision]") {
  partrain::testing::temp_dir dir("scaler");
  toy_mlp<float> m;
  sgd opt(m, {.lr = 0.1});
  grad_scaler s({.growth_interval = 5});
  counting_optimizer counter;
  for (float bad : {0.0f, inf, 0.0f, 0.0f, 0.0f}) (void)iteration(s, m, counter, bad);
  REQUIRE(s.scale() == 32768.0f);
  REQUIRE(s.growth_tracker() == 3);

  checkpoint_extra extra;
  extra.scaler_state = s.state_bytes();
  auto group = make_local_world(1);
  save_checkpoint(*group[0], dir.path / "c.ckpt", m, opt, extra);

  toy_mlp<float> m2;
  sgd opt2(m2, {.lr = 0.1});
  const checkpoint_extra back = load_checkpoint(dir.path / "c.ckpt", m2, opt2);
  grad_scaler restored;
  restored.load_state_bytes(back.scaler_state);
  CHECK(restored.scale() == 32768.0f);
  CHECK(restored.growth_tracker() == 3);
  CHECK(restored.options().growth_interval == 5);
  // Both continue identically: two more good steps double the scale.
  for (auto* x : {&s, &restored}) {
    (void)iteration(*x, m, counter, 0);
    (void)iteration(*x, m, counter, 0);
    CHECK(x->scale() == 65536.0f);
    CHECK(x->growth_tracker() == 0);
  }
}

TEST_CASE("grad_scaler refuses empty, truncated or foreign state", "[precision]") {
  grad_scaler s;
  CHECK_THROWS_WITH(s.load_state_bytes({}), Catch::Contains("holds no scaler state"));
  auto bytes = grad_scaler().state_bytes();
  bytes.pop_back();
  CHECK_THROWS_AS(s.load_state_bytes(bytes), checkpoint_error);
  auto foreign = grad_scaler().state_bytes();
  foreign[0] = std::byte{0};
  CHECK_THROWS_WITH(s.load_state_bytes(foreign), Catch::Contains("grad_scaler marker"));
  CHECK(s.scale() == 65536.0f);  // untouched by the failed loads
}

TEST_CASE("amp_step refuses an enabled scaler on a model that cannot apply a loss scale", "[precision]") {
  toy_mlp<float> m;
  sgd opt(m, {.lr = 0.1});
  grad_scaler s;
  const auto b = partrain::testing::make_toy_batch<float>(0, 4);
  CHECK_THROWS_WITH(amp_step(m, opt, s, b), Catch::Contains("no `void set_loss_scale(float)`"));
  grad_scaler off({.enabled = false});
  const auto r = amp_step(m, opt, off, b);
  CHECK_FALSE(r.skipped);
  CHECK(r.loss > 0);
}
