// Post-local SGD over the local (threads) backend: period 1 equals DDP, the warm-up is DDP bit
// for bit, ranks diverge between averages and agree right after, the bytes sent, save/load, and
// the option checks.
#include <catch2/catch.hpp>

#include <partrain/comm/local.hpp>
#include <partrain/optim/sgd.hpp>
#include <partrain/parallel/diloco.hpp>
#include <partrain/parallel/local_sgd.hpp>
#include <partrain/train/local_sgd_policy.hpp>
#include <partrain/train/trainer.hpp>

#include <cmath>
#include <cstddef>
#include <filesystem>
#include <functional>
#include <sstream>
#include <vector>

#include "comm_efficient_support.hpp"

using namespace partrain;
using namespace partrain::testing;

namespace {

// Every rank's parameters after every step (index [step][rank]).
template <class T>
using history = std::vector<std::vector<std::vector<T>>>;

template <class T>
history<T> local_sgd_run(int world, int steps, local_sgd_options o) {
  history<T> h(static_cast<std::size_t>(steps), std::vector<std::vector<T>>(static_cast<std::size_t>(world)));
  run_local(world, [&](local_group& g) {
    toy_mlp<T> m(7 + static_cast<std::uint64_t>(g.rank()));
    sgd opt(m, inner_sgd);
    post_local_sgd lsgd(m, opt, g, o);
    for (int s = 0; s < steps; ++s) {
      lsgd.train_step(rank_batch<T>(s, world, g.rank()));
      h[static_cast<std::size_t>(s)][static_cast<std::size_t>(g.rank())] = m.flat_values();
    }
  });
  return h;
}

}  // namespace

TEST_CASE("local_sgd: period 1 equals DDP", "[parallel][local_sgd]") {
  constexpr int steps = 20;
  for (int world : {2, 4}) {
    CAPTURE(world);
    const auto ddp = ddp_reference<double>(world, steps);
    for (std::int64_t warmup : {0, 5}) {
      CAPTURE(warmup);
      const auto got = local_sgd_run<double>(world, steps, {.period = 1, .warmup_steps = warmup});
      for (const auto& r : got.back()) CHECK(r == got.back()[0]);
      // Momentum is linear, so the mean of the ranks' momenta is DDP's: equal up to rounding.
      check_close(got.back()[0], ddp[0], 1e-11);
    }
  }
}

TEST_CASE("local_sgd: the warm-up is DDP bit for bit", "[parallel][local_sgd]") {
  const auto ddp = ddp_reference<float>(2, 6);
  const auto got = local_sgd_run<float>(2, 6, {.period = 3, .warmup_steps = 6});
  CHECK(got.back()[0] == ddp[0]);
  CHECK(got.back()[1] == ddp[1]);
}

TEST_CASE("local_sgd: ranks diverge between averages and agree bit for bit right after", "[parallel][local_sgd]") {
  constexpr int steps = 16;
  constexpr std::int64_t warmup = 3, period = 4;
  const auto h = local_sgd_run<float>(3, steps, {.period = period, .warmup_steps = warmup});
  for (int s = 0; s < steps; ++s) {
    CAPTURE(s);
    const auto& at = h[static_cast<std::size_t>(s)];
    const bool synced = s < warmup || (s - warmup) % period == 0;
    if (synced) {
      CHECK(at[1] == at[0]);
      CHECK(at[2] == at[0]);
    } else {
      CHECK(at[1] != at[0]);
      CHECK(at[2] != at[0]);
    }
  }
}

TEST_CASE("local_sgd: bytes sent are the warm-up's gradients plus one parameter average per period", "[parallel][local_sgd][traffic]") {
  constexpr int steps = 13;
  constexpr std::int64_t warmup = 2, period = 4;
  run_local(2, [&](local_group& g) {
    toy_mlp<float> m(7);
    sgd opt(m, inner_sgd);
    post_local_sgd lsgd(m, opt, g, {.period = period, .warmup_steps = warmup});
    g.reset_traffic();
    std::int64_t averages = 0;
    for (int s = 0; s < steps; ++s) {
      lsgd.train_step(rank_batch<float>(s, 2, g.rank()));
      if (s >= warmup && lsgd.synced_last_step()) ++averages;
      CHECK(lsgd.in_warmup() == (s + 1 < warmup));
      CHECK(lsgd.steps() == s + 1);
    }
    CHECK(averages == 3);  // steps 2, 6, 10
    // toy_mlp<float>: 53 parameters in one bucket; a ring all_reduce of N bytes sends N at 2 ranks.
    const std::uint64_t per_exchange = 53 * sizeof(float);
    CHECK(g.traffic().bytes_sent == static_cast<std::uint64_t>(warmup + averages) * per_exchange);
  });
}

TEST_CASE("local_sgd: save and load resume bit-identically", "[parallel][local_sgd][state]") {
  constexpr int world = 2, total = 14, cut = 7;
  const local_sgd_options o{.period = 3, .warmup_steps = 2};
  const auto straight = local_sgd_run<float>(world, total, o);
  std::vector<std::vector<float>> resumed(world);
  std::vector<std::vector<std::byte>> saved(world);
  std::vector<std::vector<float>> params(world);
  run_local(world, [&](local_group& g) {
    const auto r = static_cast<std::size_t>(g.rank());
    {
      toy_mlp<float> m(7 + r);
      sgd opt(m, inner_sgd);
      post_local_sgd lsgd(m, opt, g, o);
      for (int s = 0; s < cut; ++s) lsgd.train_step(rank_batch<float>(s, world, g.rank()));
      state_writer w;
      lsgd.save_state(w);
      saved[r] = w.release();
      params[r] = m.flat_values();
    }
    toy_mlp<float> m(99);
    sgd opt(m, inner_sgd);
    post_local_sgd lsgd(m, opt, g, o);
    set_values(m, params[r]);  // after the constructor's broadcast: each rank's own parameters
    state_reader rd(saved[r]);
    lsgd.load_state(rd);
    CHECK(rd.remaining() == 0);
    CHECK(lsgd.steps() == cut);
    for (int s = cut; s < total; ++s) lsgd.train_step(rank_batch<float>(s, world, g.rank()));
    resumed[r] = m.flat_values();
  });
  CHECK(resumed[0] == straight.back()[0]);
  CHECK(resumed[1] == straight.back()[1]);
}

TEST_CASE("local_sgd: bad options and mismatched state are refused by name", "[parallel][local_sgd][errors]") {
  run_local(1, [](local_group& g) {
    toy_mlp<float> m;
    sgd opt(m, inner_sgd);
    auto make = [&](local_sgd_options o) { post_local_sgd lsgd(m, opt, g, o); };
    CHECK_THROWS_AS(make({.period = 0}), invalid_argument_error);
    CHECK_THROWS_WITH(make({.period = 0}), Catch::Contains("period must be >= 1") && Catch::Contains("got 0"));
    CHECK_THROWS_WITH(make({.period = 2, .warmup_steps = -1}), Catch::Contains("warmup_steps must be >= 0"));
    local_sgd_options no_hook{.period = 2};
    no_hook.ddp.hook = nullptr;
    CHECK_THROWS_WITH(make(no_hook), Catch::Contains("ddp.hook is empty"));

    post_local_sgd a(m, opt, g, {.period = 2});
    state_writer w;
    a.save_state(w);
    post_local_sgd b(m, opt, g, {.period = 5});
    state_reader r(w.bytes());
    CHECK_THROWS_AS(b.load_state(r), checkpoint_error);
    state_reader r2(w.bytes());
    CHECK_THROWS_WITH(b.load_state(r2), Catch::Contains("period 2") && Catch::Contains("period 5"));
  });
}

namespace {

// What fit needs of a batch source: batches, set_epoch and size (a loader's face).
struct toy_batches {
  std::vector<toy_batch<double>> batches;
  void set_epoch(std::size_t) noexcept {}
  [[nodiscard]] std::size_t size() const noexcept { return batches.size(); }
  [[nodiscard]] auto begin() const { return batches.begin(); }
  [[nodiscard]] auto end() const { return batches.end(); }
};

enum class via { ddp, local_sgd, diloco };

// fit over 2 epochs of 6 steps on 2 ranks; rank 0's parameters.
std::vector<double> fit_run(via v, std::function<double(std::size_t)> lr = {}) {
  constexpr int world = 2;
  std::vector<double> out;
  run_local(world, [&](local_group& g) {
    toy_mlp<double> m(7 + static_cast<std::uint64_t>(g.rank()));
    toy_batches train, test;
    for (int s = 0; s < 6; ++s) train.batches.push_back(rank_batch<double>(s, world, g.rank()));
    test.batches.push_back(rank_batch<double>(100, world, g.rank()));
    sgd opt(m, inner_sgd);
    std::ostringstream sink;
    const trainer_options o{.epochs = 2, .lr = lr, .out = &sink};  // a copy per rank
    train_result r;
    if (v == via::ddp) {
      // What fit does with ddp_policy (which steps float models only), written out.
      distributed_data_parallel ddp(m, g);
      for (int e = 0; e < 2; ++e) {
        for (const auto& b : train) {
          ddp.train_step(b);
          opt.step();
        }
      }
      r = {.epochs = 2, .steps = 12};
    } else if (v == via::local_sgd) {
      post_local_sgd lsgd(m, opt, g, {.period = 1});
      local_sgd_policy policy(lsgd);
      static_assert(training_policy<decltype(policy), toy_batch<double>>);
      r = fit(policy, train, test, o);
    } else {
      diloco dl(m, opt, g, {.inner_steps = 1, .outer_lr = 1, .outer_momentum = 0, .nesterov = false});
      local_sgd_policy policy(dl);
      static_assert(training_policy<decltype(policy), toy_batch<double>>);
      r = fit(policy, train, test, o);
    }
    CHECK(r.epochs == 2);
    CHECK(r.steps == 12);
    CHECK(std::isfinite(r.test_loss));
    CHECK(r.test_accuracy >= 0);
    if (g.rank() == 0) out = m.flat_values();
  });
  return out;
}

}  // namespace

TEST_CASE("local_sgd_policy: fit drives post-local SGD and DiLoCo to DDP's parameters", "[parallel][local_sgd][train]") {
  const auto ddp = fit_run(via::ddp);
  check_close(fit_run(via::local_sgd), ddp, 1e-11);
  check_close(fit_run(via::diloco), ddp, 1e-11);
  // The schedule reaches the inner optimizer: at lr 0 nothing moves from rank 0's start.
  const auto start = toy_mlp<double>(7).flat_values();
  CHECK(fit_run(via::local_sgd, [](std::size_t) { return 0.0; }) == start);
  CHECK(fit_run(via::diloco, [](std::size_t) { return 0.0; }) == start);
}

TEST_CASE("local_sgd_policy: fit refuses a checkpoint path by name", "[parallel][local_sgd][train]") {
  run_local(1, [](local_group& g) {
    toy_mlp<double> m(7);
    sgd opt(m, inner_sgd);
    post_local_sgd lsgd(m, opt, g, {.period = 2});
    local_sgd_policy policy(lsgd);
    toy_batches train, test;
    train.batches.push_back(rank_batch<double>(0, 1, 0));
    std::ostringstream sink;
    CHECK_THROWS_WITH(fit(policy, train, test, {.checkpoint = std::filesystem::temp_directory_path() / "h18_never.ckpt", .out = &sink}),
                      Catch::Contains("not supported by this parallel mode"));
  });
}
