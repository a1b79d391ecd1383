// any_optimizer: sgd and adamw behind one type step, clear, change their learning rate and carry
// their state exactly as they do themselves.
#include <catch2/catch.hpp>

#include <partrain/optim/adamw.hpp>
#include <partrain/optim/any_optimizer.hpp>
#include <partrain/optim/sgd.hpp>

#include <vector>

#include "optim_test_models.hpp"

using namespace partrain;
using partrain::testing::manual_model;

namespace {
// Three steps with changing gradients and a learning rate change, as a training loop would.
template <class O>
std::vector<double> run(manual_model<double>& m, O& opt) {
  const double grads[] = {1.0, -0.5, 2.0};
  for (int s = 0; s < 3; ++s) {
    m.params[0].g.assign(m.params[0].g.size(), grads[s]);
    if (s == 2) opt.set_lr(0.02);
    opt.step();
  }
  opt.zero_grad();
  return m.params[0].v;
}
}  // namespace

TEST_CASE("any_optimizer steps as the optimizer it holds", "[optim][any_optimizer]") {
  for (const bool use_adamw : {false, true}) {
    INFO((use_adamw ? "adamw" : "sgd"));
    manual_model<double> a{{{{0.3, -0.7}, {0.0, 0.0}}}}, b = a;
    any_optimizer erased = use_adamw ? any_optimizer(adamw(a, {.lr = 0.1})) : any_optimizer(sgd(a, {.lr = 0.1, .momentum = 0.9}));
    std::vector<double> direct;
    if (use_adamw) {
      adamw o(b, {.lr = 0.1});
      direct = run(b, o);
    } else {
      sgd o(b, {.lr = 0.1, .momentum = 0.9});
      direct = run(b, o);
    }
    CHECK(run(a, erased) == direct);
    CHECK(a.params[0].g == std::vector<double>{0.0, 0.0});  // zero_grad reached it

    // Its state round-trips: a fresh optimizer loaded from it steps as the original would.
    state_writer w;
    erased.save_state(w);
    manual_model<double> c = a;
    any_optimizer loaded = use_adamw ? any_optimizer(adamw(c, {.lr = 0.02})) : any_optimizer(sgd(c, {.lr = 0.02, .momentum = 0.9}));
    state_reader r(w.bytes());
    loaded.load_state(r);
    CHECK(run(c, loaded) == run(a, erased));
  }
}
