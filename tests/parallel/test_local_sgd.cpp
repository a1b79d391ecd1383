// Post-local SGD over the local (threads) backend: period 1 equals DDP, the warm-up is DDP bit
// for bit, ranks diverge between averages and agree right after, the bytes sent, save/load, and
// the option checks; hierarchical (a host's ranks agree every step), join for uneven inputs;
// then fit() over the local policies, and its rank checkpoints resuming bit for bit.
#include <catch2/catch.hpp>

#include <partrain/comm/local.hpp>
#include <partrain/optim/sgd.hpp>
#include <partrain/parallel/diloco.hpp>
#include <partrain/parallel/local_sgd.hpp>
#include <partrain/parallel/powersgd.hpp>
#include <partrain/parallel/streaming_diloco.hpp>
#include <partrain/train/local_sgd_policy.hpp>
#include <partrain/train/trainer.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "comm_efficient_support.hpp"
#include "temp_dir.hpp"

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

// Hierarchical runs on hosts x per_host ranks: every rank's parameters after every step.
template <class T>
history<T> hierarchical_run(int hosts, int per_host, int steps, local_sgd_options o, std::vector<std::uint64_t>* intra_bytes = nullptr,
                            std::vector<std::uint64_t>* world_bytes = nullptr) {
  const int world = hosts * per_host;
  history<T> h(static_cast<std::size_t>(steps), std::vector<std::vector<T>>(static_cast<std::size_t>(world)));
  if (intra_bytes) intra_bytes->assign(static_cast<std::size_t>(world), 0);
  if (world_bytes) world_bytes->assign(static_cast<std::size_t>(world), 0);
  run_local_hosts(hosts, per_host, [&](local_group& g, local_group& host) {
    toy_mlp<T> m(7 + static_cast<std::uint64_t>(g.rank()));
    sgd opt(m, inner_sgd);
    post_local_sgd lsgd(m, opt, g, host, o);
    CHECK(lsgd.hierarchical());
    CHECK(lsgd.intra_host() == &host);
    g.reset_traffic();
    host.reset_traffic();
    for (int s = 0; s < steps; ++s) {
      lsgd.train_step(rank_batch<T>(s, world, g.rank()));
      h[static_cast<std::size_t>(s)][static_cast<std::size_t>(g.rank())] = m.flat_values();
    }
    if (intra_bytes) (*intra_bytes)[static_cast<std::size_t>(g.rank())] = host.traffic().bytes_sent;
    if (world_bytes) (*world_bytes)[static_cast<std::size_t>(g.rank())] = g.traffic().bytes_sent;
  }, {.timeout = std::chrono::seconds(20)});
  return h;
}

}  // namespace

TEST_CASE("local_sgd hierarchical: a host agrees every step, the job right after each period", "[parallel][local_sgd][hierarchical]") {
  constexpr int hosts = 2, per_host = 2, steps = 14;
  constexpr std::int64_t warmup = 2, period = 4;
  std::vector<std::uint64_t> intra, world;
  const auto h = hierarchical_run<float>(hosts, per_host, steps, {.period = period, .warmup_steps = warmup}, &intra, &world);
  for (int s = 0; s < steps; ++s) {
    CAPTURE(s);
    const auto& at = h[static_cast<std::size_t>(s)];
    // Ranks 0 and 1 are host 0, ranks 2 and 3 host 1.
    CHECK(at[1] == at[0]);
    CHECK(at[3] == at[2]);
    const bool synced = s < warmup || (s - warmup) % period == 0;
    if (synced) {
      CHECK(at[2] == at[0]);
    } else {
      CHECK(at[2] != at[0]);  // the hosts trained apart
    }
  }
  // Bytes (toy_mlp<float>: 53 values, 212 bytes): inside a host (2 ranks) one gradient
  // all_reduce per local step, 212 bytes each; over the job (4 ranks) the warm-up's gradients and
  // the averages at steps 2, 6, 10, 2 (n-1)/n * 212 = 318 bytes each.
  const std::uint64_t local_steps = steps - warmup, averages = 3;
  for (int r = 0; r < hosts * per_host; ++r) {
    CAPTURE(r);
    CHECK(intra[static_cast<std::size_t>(r)] == local_steps * 212);
    CHECK(world[static_cast<std::size_t>(r)] == (warmup + averages) * 318);
  }
}

TEST_CASE("local_sgd hierarchical: period 1 equals DDP", "[parallel][local_sgd][hierarchical]") {
  constexpr int steps = 12;
  const auto ddp = ddp_reference<double>(4, steps);
  for (std::int64_t warmup : {0, 3}) {
    CAPTURE(warmup);
    const auto got = hierarchical_run<double>(2, 2, steps, {.period = 1, .warmup_steps = warmup});
    for (const auto& r : got.back()) CHECK(r == got.back()[0]);
    check_close(got.back()[0], ddp[0], 1e-11);
  }
}

TEST_CASE("local_sgd hierarchical: a host group that does not divide the job is refused", "[parallel][local_sgd][hierarchical][errors]") {
  run_local_hosts(1, 3, [](local_group& g, local_group&) {
    // A host of 2 in a job of 3: build a second world of 2 just for the check (no collective runs).
    auto two = make_local_world(2);
    toy_mlp<float> m(7);
    sgd opt(m, inner_sgd);
    auto& host = *two[static_cast<std::size_t>(g.rank() % 2)];
    CHECK_THROWS_WITH((post_local_sgd(m, opt, g, host, {.period = 2})),
                      Catch::Contains("intra-host group has 2 ranks, the job 3"));
  });
}

namespace {

// Ranks with batches[r] batches each, `epochs` times, joining when their data ends. Momentum 0 so
// that a joined rank's untouched optimizer matches a rank stepping at lr 0 (the reference).
struct join_result {
  std::vector<std::vector<float>> params;  // per rank, at the end
  std::vector<std::int64_t> steps;         // per rank, at the end
  std::vector<int> shadowed;               // per rank: join() returned true in the last epoch
};
const sgd_options join_sgd{.lr = 0.05, .momentum = 0, .weight_decay = 1e-3};

join_result local_sgd_join_run(const std::vector<int>& batches, int epochs, local_sgd_options o) {
  const int world = static_cast<int>(batches.size());
  const int most = *std::max_element(batches.begin(), batches.end());
  join_result out{std::vector<std::vector<float>>(batches.size()), std::vector<std::int64_t>(batches.size()),
                  std::vector<int>(batches.size())};
  o.join = true;
  // A hang would wait forever: every collective is bounded by 10 s instead, failing the test.
  run_local(world, [&](local_group& g) {
    const auto r = static_cast<std::size_t>(g.rank());
    toy_mlp<float> m(7 + r);
    sgd opt(m, join_sgd);
    post_local_sgd lsgd(m, opt, g, o);
    for (int e = 0; e < epochs; ++e) {
      for (int s = 0; s < batches[r]; ++s) lsgd.train_step(rank_batch<float>(e * most + s, world, g.rank()));
      out.shadowed[r] = lsgd.join() ? 1 : 0;
    }
    out.params[r] = m.flat_values();
    out.steps[r] = lsgd.steps();
  }, {.timeout = std::chrono::seconds(10)});
  return out;
}

// The same, with every rank stepping `most` times per epoch, at lr 0 once its own data has ended:
// no progress, but there for every average (what join promises).
std::vector<std::vector<float>> local_sgd_lr0_reference(const std::vector<int>& batches, int epochs, local_sgd_options o) {
  const int world = static_cast<int>(batches.size());
  const int most = *std::max_element(batches.begin(), batches.end());
  std::vector<std::vector<float>> out(batches.size());
  run_local(world, [&](local_group& g) {
    const auto r = static_cast<std::size_t>(g.rank());
    toy_mlp<float> m(7 + r);
    sgd opt(m, join_sgd);
    post_local_sgd lsgd(m, opt, g, o);
    for (int e = 0; e < epochs; ++e) {
      for (int s = 0; s < most; ++s) {
        opt.set_lr(s < batches[r] ? join_sgd.lr : 0.0);
        lsgd.train_step(rank_batch<float>(e * most + s, world, g.rank()));
      }
    }
    out[r] = m.flat_values();
  }, {.timeout = std::chrono::seconds(10)});
  return out;
}

}  // namespace

TEST_CASE("local_sgd join: ranks with fewer batches take part in every average, nobody hangs", "[parallel][local_sgd][join]") {
  // Rank 0 has 9 batches, rank 1 has 6, rank 2 has 4; averages after steps 0, 3, 6 (period 3).
  const std::vector<int> batches{9, 6, 4};
  const local_sgd_options o{.period = 3};
  const auto got = local_sgd_join_run(batches, 2, o);
  const auto want = local_sgd_lr0_reference(batches, 2, o);
  for (std::size_t r = 0; r < batches.size(); ++r) {
    CAPTURE(r);
    CHECK(got.params[r] == want[r]);  // bit for bit: a joined rank is a rank that makes no progress
    CHECK(got.steps[r] == 18);        // counters realigned: the second epoch averaged in step
  }
  CHECK(got.shadowed == std::vector<int>{0, 1, 1});  // rank 2 shadows the average at step 6
  CHECK(got.params[1] != got.params[0]);            // rank 0's last 2 steps were local
}

TEST_CASE("local_sgd join: a rank that runs out inside the warm-up shadows its DDP steps", "[parallel][local_sgd][join]") {
  // Warm-up of 5 DDP steps; rank 1 has 3 batches. After the warm-up both ranks hold the same
  // model (DDP's join), then rank 0 trains alone with averages that include rank 1.
  const auto got = local_sgd_join_run({8, 3}, 1, {.period = 2, .warmup_steps = 5});
  CHECK(got.steps == std::vector<std::int64_t>{8, 8});
  CHECK(got.shadowed == std::vector<int>{0, 1});
  // The last step (7) is an average ((7 - 5) % 2 == 0): every rank ends on the same model.
  CHECK(got.params[1] == got.params[0]);
  // Uneven inputs without join: the rank left waiting fails with a timeout that says what to do.
  CHECK_THROWS_WITH(run_local(2, [](local_group& g) {
    toy_mlp<float> m(7);
    sgd opt(m, join_sgd);
    post_local_sgd lsgd(m, opt, g, {.period = 2});
    for (int s = 0; s < (g.rank() == 0 ? 4 : 1); ++s) lsgd.train_step(rank_batch<float>(s, 2, g.rank()));
  }, {.timeout = std::chrono::milliseconds(300)}), Catch::Contains("local_sgd_options{.join = true}"));
  run_local(1, [](local_group& g) {
    toy_mlp<float> m(7);
    sgd opt(m, join_sgd);
    post_local_sgd lsgd(m, opt, g, {.period = 2});
    CHECK_THROWS_WITH(lsgd.join(), Catch::Contains("join() needs join enabled"));
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

namespace {

enum class mode { local_sgd, hierarchical, diloco, streaming, powersgd };

// fit over `epochs` epochs of 6 steps on 4 ranks (2 hosts of 2 for the hierarchical mode), float
// models, checkpointing to `ckpt` when given; every rank's parameters at the end. Periods and
// rounds of 4 steps, so every epoch ends inside one.
std::vector<std::vector<float>> fit_checkpointed(mode md, std::size_t epochs, const std::filesystem::path& ckpt,
                                                 std::string* log = nullptr, const std::filesystem::path& metrics = {}) {
  constexpr int world = 4;
  std::vector<std::vector<float>> out(world);
  run_local_hosts(2, 2, [&](local_group& g, local_group& host) {
    const auto r = static_cast<std::size_t>(g.rank());
    toy_mlp<float> m(7 + r);
    struct batches {
      std::vector<toy_batch<float>> b;
      void set_epoch(std::size_t) noexcept {}
      [[nodiscard]] std::size_t size() const noexcept { return b.size(); }
      [[nodiscard]] auto begin() const { return b.begin(); }
      [[nodiscard]] auto end() const { return b.end(); }
    } train, test;
    for (int s = 0; s < 6; ++s) train.b.push_back(rank_batch<float>(s, world, g.rank()));
    test.b.push_back(rank_batch<float>(100, world, g.rank()));
    sgd opt(m, inner_sgd);
    std::ostringstream sink;
    const trainer_options o{.epochs = epochs, .lr = [](std::size_t e) { return 0.05 / static_cast<double>(e + 1); },
                            .checkpoint = ckpt, .metrics = metrics, .log_every = metrics.empty() ? 0u : 4u, .out = &sink};
    auto go = [&](auto& policy) { (void)fit(policy, train, test, o); };
    switch (md) {
      case mode::local_sgd: {
        post_local_sgd a(m, opt, g, {.period = 4, .warmup_steps = 2});
        local_sgd_policy p(a);
        go(p);
        break;
      }
      case mode::hierarchical: {
        post_local_sgd a(m, opt, g, host, {.period = 4, .warmup_steps = 2});
        local_sgd_policy p(a);
        go(p);
        break;
      }
      case mode::diloco: {
        diloco a(m, opt, g, {.inner_steps = 4});
        local_sgd_policy p(a);
        go(p);
        break;
      }
      case mode::streaming: {
        streaming_diloco a(m, opt, g, {.inner_steps = 4, .fragments = 2, .fragment_sync_delay = 1});
        local_sgd_policy p(a);
        go(p);
        break;
      }
      case mode::powersgd: {
        // Error feedback from step 2 on; every rank's differs, so each needs its own back.
        auto state = std::make_shared<powersgd_state>(powersgd_options{.start_iter = 2, .min_compression_rate = 0});
        distributed_data_parallel ddp(m, g, {.hook = comm_hooks::powersgd(state)});
        ddp_policy p(ddp, opt, {.powersgd = state.get()});
        go(p);
        break;
      }
    }
    out[r] = m.flat_values();
    if (log && g.rank() == 0) *log = sink.str();
  }, {.timeout = std::chrono::seconds(20)});
  return out;
}

}  // namespace

TEST_CASE("local policies: fit resumes from its checkpoint bit-identically", "[parallel][local_sgd][train][checkpoint]") {
  const temp_dir tmp("h18_rank_ckpt");
  const auto& dir = tmp.path;
  for (mode md : {mode::local_sgd, mode::hierarchical, mode::diloco, mode::streaming, mode::powersgd}) {
    CAPTURE(static_cast<int>(md));
    const auto file = dir / "model.ckpt";
    std::filesystem::remove(file);
    const auto straight = fit_checkpointed(md, 3, {});
    (void)fit_checkpointed(md, 2, file);  // stops after epoch 2, inside a period or round
    REQUIRE(std::filesystem::exists(file));
    std::string log;
    const auto resumed = fit_checkpointed(md, 3, file, &log);
    CHECK_THAT(log, Catch::Contains("resumed from") && Catch::Contains("at epoch 2, step 12"));
    for (std::size_t r = 0; r < straight.size(); ++r) {
      CAPTURE(r);
      CHECK(resumed[r] == straight[r]);
    }
    if (md != mode::powersgd) CHECK(straight[1] != straight[2]);  // the ranks really held different state
  }
}

TEST_CASE("local policies: a rank checkpoint of another world size or mode is refused by name", "[parallel][local_sgd][train][checkpoint]") {
  const temp_dir tmp("h18_rank_ckpt_bad");
  const auto file = tmp.path / "m.ckpt";
  (void)fit_checkpointed(mode::local_sgd, 1, file);
  // 2 ranks cannot resume what 4 saved; every rank fails, none waits.
  CHECK_THROWS_WITH(run_local(2, [&](local_group& g) {
    toy_mlp<float> m(7);
    sgd opt(m, inner_sgd);
    post_local_sgd a(m, opt, g, {.period = 4, .warmup_steps = 2});
    local_sgd_policy p(a);
    (void)p.load_checkpoint(file);
  }, {.timeout = std::chrono::seconds(10)}), Catch::Contains("saved by 4 ranks, this job has 2"));
  // DiLoCo's state is not post-local SGD's.
  CHECK_THROWS_WITH(run_local(4, [&](local_group& g) {
    toy_mlp<float> m(7);
    sgd opt(m, inner_sgd);
    diloco a(m, opt, g, {.inner_steps = 4});
    local_sgd_policy p(a);
    (void)p.load_checkpoint(file);
  }, {.timeout = std::chrono::seconds(10)}), Catch::Contains("DiLoCo state is for 'post_local_sgd'"));
  // A plain checkpoint reader names the format it did not find.
  toy_mlp<float> m(7);
  sgd opt(m, inner_sgd);
  CHECK_THROWS_AS(load_checkpoint(file, m, opt), checkpoint_error);
}

namespace {

// The bytes_sent field of every record of a metrics file, in order.
std::vector<long long> bytes_sent_column(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::vector<long long> out;
  for (std::string line; std::getline(in, line);) {
    const auto k = line.find("\"bytes_sent\":");
    if (k == std::string::npos) {
      FAIL_CHECK("metrics record without bytes_sent: " << line);
      continue;
    }
    out.push_back(std::stoll(line.substr(k + 13)));
  }
  return out;
}

}  // namespace

TEST_CASE("local policies: fit's metrics record the bytes each rank sent, growing", "[parallel][local_sgd][train][metrics]") {
  const temp_dir tmp("h18_metrics");
  for (mode md : {mode::local_sgd, mode::hierarchical, mode::diloco, mode::streaming, mode::powersgd}) {
    CAPTURE(static_cast<int>(md));
    const auto file = tmp.path / ("m" + std::to_string(static_cast<int>(md)) + ".jsonl");
    (void)fit_checkpointed(md, 3, {}, nullptr, file);
    const auto col = bytes_sent_column(file);
    REQUIRE(col.size() == 4 + 3);  // step records at global steps 4, 8, 12, 16 of 18, and 3 epoch records
    CHECK(col.front() > 0);
    CHECK(std::is_sorted(col.begin(), col.end()));
    CHECK(col.back() > col.front());
  }
}

namespace {

// A toy_mlp whose gradients can be zeroed after its step: the reference's rank out of data, which
// adds nothing to its host's gradient all_reduce (what a joined rank's shadow step adds).
struct idling_mlp {
  toy_mlp<float> m;
  bool idle = false;
  auto& parameters() { return m.parameters(); }
  double train_step(const toy_batch<float>& b) {
    const double loss = m.train_step(b);
    if (idle) {
      for (auto& p : m.parameters()) std::fill(p.grads().begin(), p.grads().end(), 0.0f);
    }
    return loss;
  }
  eval_result eval_step(const toy_batch<float>& b) { return m.eval_step(b); }
};

// Hierarchical post-local SGD on 2 hosts x 2 ranks with batches[r] batches per epoch: joining
// (join = true), or (reference) every rank stepping the longest count, at lr 0 and with zero
// gradients once its data ended, and each host's ranks taking the parameters of the host's rank
// with the most batches (ties: the higher) right after that rank's last step (what the host's
// DDP join does when its last rank joins), and at the end of the warm-up likewise over the job.
join_result hierarchical_join_run(const std::vector<int>& batches, int epochs, local_sgd_options o, bool join) {
  constexpr int per_host = 2;
  const int world = static_cast<int>(batches.size());
  const int most = *std::max_element(batches.begin(), batches.end());
  join_result out{std::vector<std::vector<float>>(batches.size()), std::vector<std::int64_t>(batches.size()),
                  std::vector<int>(batches.size())};
  o.join = join;
  run_local_hosts(world / per_host, per_host, [&](local_group& g, local_group& host) {
    const auto r = static_cast<std::size_t>(g.rank());
    const std::size_t first = r - r % per_host;
    const int host_most = std::max(batches[first], batches[first + 1]);
    const int lead = batches[first] > batches[first + 1] ? 0 : 1;  // the host's rank with the most batches
    // The warm-up is DDP, left through DDP's join: a rank that idled in it takes the parameters
    // of the rank with the most warm-up steps (ties: the highest).
    const bool idle_in_warmup = *std::min_element(batches.begin(), batches.end()) < o.warmup_steps;
    int warmup_lead = 0;
    for (int k = 0; k < world; ++k) {
      if (std::min<std::int64_t>(batches[static_cast<std::size_t>(k)], o.warmup_steps) >=
          std::min<std::int64_t>(batches[static_cast<std::size_t>(warmup_lead)], o.warmup_steps)) {
        warmup_lead = k;
      }
    }
    idling_mlp m{toy_mlp<float>(7 + r)};
    sgd opt(m, join_sgd);
    post_local_sgd lsgd(m, opt, g, host, o);
    for (int e = 0; e < epochs; ++e) {
      for (int s = 0; s < (join ? batches[r] : most); ++s) {
        m.idle = s >= batches[r];
        opt.set_lr(m.idle ? 0.0 : join_sgd.lr);
        lsgd.train_step(rank_batch<float>(e * most + s, world, g.rank()));
        if (!join && e == 0 && s + 1 == o.warmup_steps && idle_in_warmup) {
          for (auto& p : m.parameters()) g.broadcast(p.value(), warmup_lead).wait();
        }
        if (!join && s + 1 == host_most) {
          for (auto& p : m.parameters()) host.broadcast(p.value(), lead).wait();
        }
      }
      if (join) out.shadowed[r] = lsgd.join() ? 1 : 0;
    }
    out.params[r] = m.m.flat_values();
    out.steps[r] = lsgd.steps();
  }, {.timeout = std::chrono::seconds(10)});
  return out;
}

}  // namespace

TEST_CASE("local_sgd hierarchical join: ranks out of data shadow their host's steps and the job's averages", "[parallel][local_sgd][hierarchical][join]") {
  // Hosts {0, 1} and {2, 3}. Rank 3 runs out first, then rank 1, then all of host 1; rank 0 goes
  // on alone. Warm-up 2 (rank 3's data ends inside it in the second case), averages every 3 steps.
  // 10 batches: rank 0's last step (19 of the second epoch) is past the last average either way.
  for (const auto& batches : {std::vector<int>{10, 7, 6, 4}, std::vector<int>{10, 7, 5, 1}}) {
    for (std::int64_t warmup : {0, 2}) {
      CAPTURE(batches, warmup);
      const local_sgd_options o{.period = 3, .warmup_steps = warmup};
      const auto got = hierarchical_join_run(batches, 2, o, true);
      const auto want = hierarchical_join_run(batches, 2, o, false);
      for (std::size_t r = 0; r < batches.size(); ++r) {
        CAPTURE(r);
        CHECK(got.params[r] == want.params[r]);  // bit for bit
        CHECK(got.steps[r] == 20);               // counters realigned every epoch
      }
      CHECK(got.shadowed == std::vector<int>{0, 1, 1, 1});
      CHECK(got.params[0] == got.params[1]);  // the host's join: rank 1 took rank 0's parameters
      CHECK(got.params[2] == got.params[3]);
      CHECK(got.params[0] != got.params[2]);  // rank 0's last steps after the last average
    }
  }
}
