#include <catch2/catch.hpp>

#include <partrain/optim/clip.hpp>

#include <cmath>
#include <span>
#include <vector>

#include "optim_test_models.hpp"

using namespace partrain;
using partrain::testing::manual_model;

TEST_CASE("clip_grad_norm: returns the global 2-norm and scales by max_norm/(norm+1e-6)", "[optim][clip]") {
  manual_model<double> m{{{{0, 0}, {3, 4}}, {{0}, {12}}}};
  SECTION("above max_norm: scaled") {
    const double norm = clip_grad_norm(m, 6.5);
    CHECK(norm == Approx(13.0).epsilon(1e-15));
    const double coef = 6.5 / (13.0 + 1e-6);
    CHECK(m.params[0].g[0] == Approx(3 * coef).epsilon(1e-15));
    CHECK(m.params[1].g[0] == Approx(12 * coef).epsilon(1e-15));
    double sq = 0;
    for (auto& p : m.params) for (double g : p.g) sq += g * g;
    CHECK(std::sqrt(sq) == Approx(6.5).epsilon(1e-6));
  }
  SECTION("below max_norm: untouched") {
    CHECK(clip_grad_norm(m, 100.0) == Approx(13.0));
    CHECK(m.params[0].g == std::vector<double>{3, 4});
  }
  SECTION("over a range of parameters (here only the first)") {
    std::span first(m.params.data(), 1);
    CHECK(clip_grad_norm(first, 1.0) == Approx(5.0));
    CHECK(m.params[0].g[1] == Approx(4.0 / (5.0 + 1e-6)));
    CHECK(m.params[1].g[0] == 12);
  }
}

TEST_CASE("clip_grad_norm: a non-finite norm is returned and the gradients are left alone", "[optim][clip]") {
  manual_model<float> m{{{{0}, {INFINITY}}, {{0}, {1}}}};
  CHECK(std::isinf(clip_grad_norm(m, 1.0)));
  CHECK(m.params[1].g[0] == 1.0f);
}

TEST_CASE("clip_grad_norm: max_norm must be positive", "[optim][clip]") {
  manual_model<float> m{{{{0}, {1}}}};
  CHECK_THROWS_WITH(clip_grad_norm(m, 0.0), Catch::Contains("max_norm must be a finite number > 0"));
}
