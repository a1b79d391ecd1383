// DiLoCo over the local (threads) backend: H = 1 with outer lr 1 and no momentum equals DDP, the
// outer Nesterov step's sign, divergence inside a round and agreement after it, 16- and 8-bit
// outer gradients (bytes and closeness), save/load, and the option checks; then streaming DiLoCo
// (fragments synced in turn, the exchange overlapping the next inner steps).
#include <catch2/catch.hpp>

#include <partrain/comm/local.hpp>
#include <partrain/optim/adamw.hpp>
#include <partrain/optim/sgd.hpp>
#include <partrain/parallel/diloco.hpp>
#include <partrain/parallel/streaming_diloco.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <memory>
#include <vector>

#include "comm_efficient_support.hpp"

using namespace partrain;
using namespace partrain::testing;

namespace {

const adamw_options inner_adamw{.lr = 0.01, .weight_decay = 1e-2};

// Every rank's parameters after every step (index [step][rank]), with an SGD or AdamW inner.
template <class T, bool Adam = false>
std::vector<std::vector<std::vector<T>>> diloco_run(int world, int steps, diloco_options o) {
  std::vector<std::vector<std::vector<T>>> h(static_cast<std::size_t>(steps),
                                             std::vector<std::vector<T>>(static_cast<std::size_t>(world)));
  run_local(world, [&](local_group& g) {
    toy_mlp<T> m(7 + static_cast<std::uint64_t>(g.rank()));
    auto run = [&](auto& inner) {
      diloco dl(m, inner, g, o);
      for (int s = 0; s < steps; ++s) {
        dl.train_step(rank_batch<T>(s, world, g.rank()));
        h[static_cast<std::size_t>(s)][static_cast<std::size_t>(g.rank())] = m.flat_values();
      }
    };
    if constexpr (Adam) {
      adamw inner(m, inner_adamw);
      run(inner);
    } else {
      sgd inner(m, inner_sgd);
      run(inner);
    }
  });
  return h;
}

const diloco_options plain_outer{.inner_steps = 1, .outer_lr = 1, .outer_momentum = 0, .nesterov = false};

}  // namespace

TEST_CASE("diloco: H = 1, outer lr 1 and no momentum equals DDP with the inner SGD", "[parallel][diloco]") {
  constexpr int steps = 20;
  for (int world : {2, 4}) {
    CAPTURE(world);
    const auto ddp = ddp_reference<double>(world, steps);
    const auto got = diloco_run<double>(world, steps, plain_outer);
    for (const auto& r : got.back()) CHECK(r == got.back()[0]);
    // Inner momentum is linear, so the ranks' mean step is DDP's step: equal up to rounding.
    check_close(got.back()[0], ddp[0], 1e-11);
  }
}

TEST_CASE("diloco: the outer step is Nesterov SGD on start minus current", "[parallel][diloco]") {
  // One rank, H = 2: after a round, theta = theta0 - lr (delta + mu delta) with delta = theta0 -
  // theta_H (the momentum buffer starts as delta). A flipped sign would move away from theta_H.
  std::vector<double> start, after_inner, got;
  {
    toy_mlp<double> m(7);
    start = m.flat_values();
    sgd inner(m, inner_sgd);
    for (int s = 0; s < 2; ++s) {
      m.train_step(rank_batch<double>(s, 1, 0));
      inner.step();
    }
    after_inner = m.flat_values();
  }
  run_local(1, [&](local_group& g) {
    toy_mlp<double> m(7);
    sgd inner(m, inner_sgd);
    diloco dl(m, inner, g, {.inner_steps = 2});
    for (int s = 0; s < 2; ++s) dl.train_step(rank_batch<double>(s, 1, 0));
    CHECK(dl.outer_steps() == 1);
    CHECK(dl.inner_step() == 0);
    got = m.flat_values();
  });
  std::vector<double> want(start.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double delta = start[i] - after_inner[i];
    want[i] = start[i] - 0.7 * (delta + 0.9 * delta);
  }
  check_close(got, want, 1e-12);
}

TEST_CASE("diloco: ranks diverge inside a round and agree bit for bit after each outer step", "[parallel][diloco]") {
  constexpr int steps = 12, H = 3;
  const auto h = diloco_run<float, true>(3, steps, {.inner_steps = H});
  for (int s = 0; s < steps; ++s) {
    CAPTURE(s);
    const auto& at = h[static_cast<std::size_t>(s)];
    if ((s + 1) % H == 0) {
      CHECK(at[1] == at[0]);
      CHECK(at[2] == at[0]);
    } else {
      CHECK(at[1] != at[0]);
      CHECK(at[2] != at[0]);
    }
  }
}

TEST_CASE("diloco: 16- and 8-bit outer gradients send fewer bytes and stay close", "[parallel][diloco][compression]") {
  constexpr int world = 2, steps = 8, H = 4;
  const auto full = diloco_run<float>(world, steps, {.inner_steps = H});
  for (auto c : {outer_compression::fp16, outer_compression::bf16, outer_compression::int8}) {
    CAPTURE(to_string(c));
    const auto got = diloco_run<float>(world, steps, {.inner_steps = H, .compression = c});
    CHECK(got.back()[1] == got.back()[0]);
    CHECK(got.back()[0] != full.back()[0]);  // the compression really happened
    const double tol = c == outer_compression::fp16 ? 1e-3 : 1e-2;
    check_close(got.back()[0], full.back()[0], tol);
  }
  // Bytes per outer step at 2 ranks, toy_mlp<float> (4 tensors, 53 values): an all_reduce of N
  // bytes sends N; an all_gather of N bytes per rank sends N.
  auto bytes = [&](outer_compression c) {
    std::uint64_t sent = 0;
    run_local(world, [&](local_group& g) {
      toy_mlp<float> m(7);
      sgd inner(m, inner_sgd);
      diloco dl(m, inner, g, {.inner_steps = H, .compression = c});
      g.reset_traffic();
      for (int s = 0; s < steps; ++s) dl.train_step(rank_batch<float>(s, world, g.rank()));
      if (g.rank() == 0) sent = g.traffic().bytes_sent;
    });
    return sent;
  };
  CHECK(bytes(outer_compression::none) == 2 * 53 * 4);
  CHECK(bytes(outer_compression::fp16) == 2 * 53 * 2);
  CHECK(bytes(outer_compression::bf16) == 2 * 53 * 2);
  CHECK(bytes(outer_compression::int8) == 2 * (53 + 4 * 4));  // codes + one float scale per tensor
}

TEST_CASE("diloco: int8 codes round to within half a step of the scale", "[parallel][diloco][compression]") {
  CHECK(detail::diloco::quantize(1.0f, 127.0f) == 127);
  CHECK(detail::diloco::code_value(detail::diloco::quantize(-1.0f, 127.0f)) == -127.0f);
  CHECK(detail::diloco::code_value(detail::diloco::quantize(2.0f, 127.0f)) == 127.0f);  // clamped
  CHECK(detail::diloco::quantize(0.5f, 1.0f) == 0);  // ties to even
  CHECK(detail::diloco::quantize(1.5f, 1.0f) == 2);
  CHECK(detail::diloco::quantize(std::nanf(""), 1.0f) == 0);
  // Two ranks, outer lr 1, no momentum: the outer step lands on start - mean(decode(encode(delta))).
  std::vector<std::vector<float>> h(2);
  float max_delta = 0;
  for (auto c : {outer_compression::none, outer_compression::int8}) {
    run_local(2, [&](local_group& g) {
      toy_mlp<float> m(7);
      sgd inner(m, {.lr = 0.05});
      diloco dl(m, inner, g, {.inner_steps = 3, .outer_lr = 1, .outer_momentum = 0, .nesterov = false, .compression = c});
      for (int s = 0; s < 2; ++s) dl.train_step(rank_batch<float>(s, 2, g.rank()));
      const auto now = m.flat_values();
      float mine = 0;
      for (std::size_t i = 0; i < now.size(); ++i) mine = std::max(mine, std::abs(dl.global_parameters()[i] - now[i]));
      std::vector<float> biggest{mine};
      g.all_reduce(tensor_view<float>(biggest), reduce_op::max).wait();
      dl.sync();  // the round ends early, by hand
      CHECK(dl.inner_step() == 0);
      if (g.rank() == 0) {
        h[c == outer_compression::int8 ? 1 : 0] = m.flat_values();
        max_delta = biggest[0];
      }
    });
  }
  // Each rank's code is off by at most half its scale (its max |delta| / 127), so is their mean.
  REQUIRE(max_delta > 0);
  CHECK(h[1] != h[0]);
  for (std::size_t i = 0; i < h[0].size(); ++i) CHECK(std::abs(h[1][i] - h[0][i]) <= max_delta / 254 * 1.001f + 1e-7f);
}

TEST_CASE("diloco: save and load mid-round resume bit-identically", "[parallel][diloco][state]") {
  constexpr int world = 2, total = 11, cut = 6, H = 4;
  for (auto c : {outer_compression::none, outer_compression::int8}) {
    CAPTURE(to_string(c));
    const diloco_options o{.inner_steps = H, .compression = c};
    const auto straight = diloco_run<float, true>(world, total, o);
    std::vector<std::vector<float>> resumed(world);
    run_local(world, [&](local_group& g) {
      const auto r = static_cast<std::size_t>(g.rank());
      std::vector<std::byte> saved;
      std::vector<float> params;
      {
        toy_mlp<float> m(7 + r);
        adamw inner(m, inner_adamw);
        diloco dl(m, inner, g, o);
        for (int s = 0; s < cut; ++s) dl.train_step(rank_batch<float>(s, world, g.rank()));
        CHECK(dl.inner_step() == cut % H);
        state_writer w;
        dl.save_state(w);
        saved = w.release();
        params = m.flat_values();
      }
      toy_mlp<float> m(123);
      adamw inner(m, inner_adamw);
      diloco dl(m, inner, g, o);
      set_values(m, params);
      state_reader rd(saved);
      dl.load_state(rd);
      CHECK(rd.remaining() == 0);
      CHECK(dl.inner_step() == cut % H);
      CHECK(dl.steps() == cut);
      for (int s = cut; s < total; ++s) dl.train_step(rank_batch<float>(s, world, g.rank()));
      resumed[r] = m.flat_values();
    });
    CHECK(resumed[0] == straight.back()[0]);
    CHECK(resumed[1] == straight.back()[1]);
  }
}

TEST_CASE("diloco: bad options and mismatched state are refused by name", "[parallel][diloco][errors]") {
  run_local(1, [](local_group& g) {
    toy_mlp<float> m;
    sgd inner(m, inner_sgd);
    auto make = [&](diloco_options o) { diloco dl(m, inner, g, o); };
    CHECK_THROWS_AS(make({.inner_steps = 0}), invalid_argument_error);
    CHECK_THROWS_WITH(make({.inner_steps = 0}), Catch::Contains("inner_steps must be >= 1"));
    CHECK_THROWS_WITH(make({.outer_lr = -1}), Catch::Contains("outer_lr must be >= 0"));
    CHECK_THROWS_WITH(make({.outer_momentum = 1.0}), Catch::Contains("outer_momentum must be in [0, 1)"));
    CHECK_THROWS_WITH(make({.outer_momentum = 0}), Catch::Contains("nesterov needs outer_momentum > 0"));

    diloco a(m, inner, g, {.inner_steps = 2});
    state_writer w;
    a.save_state(w);
    diloco b(m, inner, g, {.inner_steps = 2, .compression = outer_compression::int8});
    state_reader r(w.bytes());
    CHECK_THROWS_WITH(b.load_state(r), Catch::Contains("compression none") && Catch::Contains("int8"));
    state_reader truncated(std::span<const std::byte>(w.bytes()).first(w.bytes().size() / 2));
    CHECK_THROWS_AS(a.load_state(truncated), checkpoint_error);
  });
}

namespace {

// Ranks with batches[r] batches each, two epochs, joining when their data ends (join = true), or
// (reference, join = false) every rank stepping the longest count with its inner lr at 0 once
// its own data has ended: no progress, but there for every outer step, which is what join
// promises. Inner SGD without momentum, so a joined rank's untouched inner state matches.
struct join_run {
  std::vector<std::vector<float>> params;
  std::vector<std::int64_t> inner_step, outer_steps, steps;
  std::vector<int> shadowed;
};
const sgd_options join_inner{.lr = 0.05, .momentum = 0, .weight_decay = 1e-3};

// make(m, inner, g) builds the policy (diloco or streaming_diloco); `position` after each epoch is
// its inner_step() (DiLoCo) or the fragment in flight (streaming, -1: none).
template <class Make>
join_run uneven_run(const std::vector<int>& batches, bool join, Make make) {
  const int world = static_cast<int>(batches.size());
  const int most = *std::max_element(batches.begin(), batches.end());
  const auto n = batches.size();
  join_run out{std::vector<std::vector<float>>(n), std::vector<std::int64_t>(n), std::vector<std::int64_t>(n),
               std::vector<std::int64_t>(n), std::vector<int>(n)};
  // Every collective bounded by 10 s: a hang fails the test instead of blocking it.
  run_local(world, [&](local_group& g) {
    const auto r = static_cast<std::size_t>(g.rank());
    toy_mlp<float> m(7 + r);
    sgd inner(m, join_inner);
    auto policy = make(m, inner, g);
    for (int e = 0; e < 2; ++e) {
      const int mine = join ? batches[r] : most;
      for (int s = 0; s < mine; ++s) {
        inner.set_lr(s < batches[r] ? join_inner.lr : 0.0);
        policy->train_step(rank_batch<float>(e * most + s, world, g.rank()));
      }
      if (join) out.shadowed[r] = policy->join() ? 1 : 0;
    }
    out.params[r] = m.flat_values();
    if constexpr (requires { policy->in_flight(); }) {
      out.inner_step[r] = policy->in_flight();
    } else {
      out.inner_step[r] = policy->inner_step();
    }
    out.outer_steps[r] = policy->outer_steps();
    out.steps[r] = policy->steps();
  }, {.timeout = std::chrono::seconds(10)});
  return out;
}

join_run diloco_uneven(const std::vector<int>& batches, diloco_options o, bool join) {
  o.join = join;
  return uneven_run(batches, join, [&](toy_mlp<float>& m, sgd<toy_mlp<float>>& inner, local_group& g) {
    return std::make_unique<diloco<toy_mlp<float>, sgd<toy_mlp<float>>, local_group>>(m, inner, g, o);
  });
}

}  // namespace

TEST_CASE("diloco join: ranks with fewer batches take part in every outer step, nobody hangs", "[parallel][diloco][join]") {
  // H = 3; rank 0 has 10 batches, rank 1 has 5, rank 2 has 2: outer steps after steps 2, 5, 8,
  // and (second epoch, counters realigned to 10) 12, 15, 18.
  const std::vector<int> batches{10, 5, 2};
  for (auto c : {outer_compression::none, outer_compression::int8}) {
    CAPTURE(to_string(c));
    const diloco_options o{.inner_steps = 3, .compression = c};
    const auto got = diloco_uneven(batches, o, true);
    const auto want = diloco_uneven(batches, o, false);
    for (std::size_t r = 0; r < batches.size(); ++r) {
      CAPTURE(r);
      CHECK(got.params[r] == want.params[r]);  // bit for bit
      CHECK(got.outer_steps[r] == 6);
      CHECK(got.inner_step[r] == 2);  // 20 steps: 2 into the seventh round on every rank
      CHECK(got.steps[r] == 20);
    }
    CHECK(got.shadowed == std::vector<int>{0, 1, 1});
    CHECK(got.params[1] == got.params[2]);  // both joined before rank 0's last outer step
    CHECK(got.params[0] != got.params[1]);  // rank 0 trained 2 steps past it
  }
}

TEST_CASE("diloco join: without join the rank left waiting times out naming the fix", "[parallel][diloco][join][errors]") {
  CHECK_THROWS_WITH(run_local(2, [](local_group& g) {
    toy_mlp<float> m(7);
    sgd inner(m, join_inner);
    diloco dl(m, inner, g, {.inner_steps = 2});
    for (int s = 0; s < (g.rank() == 0 ? 4 : 1); ++s) dl.train_step(rank_batch<float>(s, 2, g.rank()));
  }, {.timeout = std::chrono::milliseconds(300)}), Catch::Contains("outer gradient exchange") &&
                                                     Catch::Contains("diloco_options{.join = true}"));
  run_local(1, [](local_group& g) {
    toy_mlp<float> m(7);
    sgd inner(m, join_inner);
    diloco dl(m, inner, g, {.inner_steps = 2});
    CHECK_THROWS_WITH(dl.join(), Catch::Contains("join() needs join enabled"));
  });
}

namespace {

// Every rank's parameters after every step, streaming DiLoCo with an AdamW inner; `in_flight`
// records rank 0's fragment in flight after each step.
std::vector<std::vector<std::vector<float>>> streaming_run(int world, int steps, streaming_diloco_options o,
                                                           std::vector<std::int64_t>* in_flight = nullptr) {
  std::vector<std::vector<std::vector<float>>> h(static_cast<std::size_t>(steps),
                                                 std::vector<std::vector<float>>(static_cast<std::size_t>(world)));
  run_local(world, [&](local_group& g) {
    toy_mlp<float> m(7 + static_cast<std::uint64_t>(g.rank()));
    adamw inner(m, inner_adamw);
    streaming_diloco sd(m, inner, g, o);
    for (int s = 0; s < steps; ++s) {
      sd.train_step(rank_batch<float>(s, world, g.rank()));
      h[static_cast<std::size_t>(s)][static_cast<std::size_t>(g.rank())] = m.flat_values();
      if (in_flight && g.rank() == 0) in_flight->push_back(sd.in_flight());
    }
  });
  return h;
}

// The values of the parameters in `params` (toy_mlp: W1 30, b1 5, W2 15, b2 3 values).
std::vector<float> pick(const std::vector<float>& flat, std::initializer_list<std::size_t> params) {
  const std::size_t offset[] = {0, 30, 35, 50, 53};
  std::vector<float> out;
  for (std::size_t k : params) out.insert(out.end(), flat.begin() + offset[k], flat.begin() + offset[k + 1]);
  return out;
}

}  // namespace

TEST_CASE("streaming_diloco: one fragment without delay is DiLoCo bit for bit", "[parallel][diloco][streaming]") {
  const auto plain = diloco_run<float, true>(2, 9, {.inner_steps = 3});
  const auto got = streaming_run(2, 9, {.inner_steps = 3, .fragments = 1, .fragment_sync_delay = 0});
  for (int s = 0; s < 9; ++s) {
    CAPTURE(s);
    CHECK(got[static_cast<std::size_t>(s)][0] == plain[static_cast<std::size_t>(s)][0]);
    CHECK(got[static_cast<std::size_t>(s)][1] == plain[static_cast<std::size_t>(s)][1]);
  }
}

TEST_CASE("streaming_diloco: fragments sync in turn, overlapped, and agree right after their outer step", "[parallel][diloco][streaming]") {
  // H = 4, F = 2 (fragment 0: W1 and W2, fragment 1: b1 and b2), tau = 1: fragment 0 starts its
  // exchange at step 1 of each round and steps at 2, fragment 1 starts at 3 and steps at 4.
  constexpr int steps = 12;
  std::vector<std::int64_t> in_flight;
  const auto h = streaming_run(3, steps, {.inner_steps = 4, .fragments = 2, .fragment_sync_delay = 1}, &in_flight);
  for (int s = 0; s < steps; ++s) {
    CAPTURE(s);
    const int t = s + 1;  // steps taken
    const auto& at = h[static_cast<std::size_t>(s)];
    CHECK(in_flight[static_cast<std::size_t>(s)] == (t % 4 == 1 ? 0 : t % 4 == 3 ? 1 : -1));
    for (int r = 1; r < 3; ++r) {
      const auto& mine = at[static_cast<std::size_t>(r)];
      if (t % 4 == 2) {
        CHECK(pick(mine, {0, 2}) == pick(at[0], {0, 2}));  // fragment 0 just stepped
        CHECK(pick(mine, {1, 3}) != pick(at[0], {1, 3}));
      } else if (t % 4 == 0) {
        CHECK(pick(mine, {1, 3}) == pick(at[0], {1, 3}));  // fragment 1 just stepped
        CHECK(pick(mine, {0, 2}) != pick(at[0], {0, 2}));
      } else {
        CHECK(mine != at[0]);
      }
    }
  }
  // Bytes: each round sends every parameter once (split over the two fragments).
  run_local(2, [](local_group& g) {
    toy_mlp<float> m(7);
    sgd inner(m, inner_sgd);
    streaming_diloco sd(m, inner, g, {.inner_steps = 4, .fragments = 2, .fragment_sync_delay = 1});
    g.reset_traffic();
    for (int s = 0; s < 8; ++s) sd.train_step(rank_batch<float>(s, 2, g.rank()));
    CHECK(sd.outer_steps() == 4);
    CHECK(g.traffic().bytes_sent == 2 * 53 * 4);
  });
}

TEST_CASE("streaming_diloco: save and load with an exchange in flight resume bit-identically", "[parallel][diloco][streaming][state]") {
  constexpr int world = 2, total = 11, cut = 5;  // after step 5, fragment 0's exchange is in flight
  for (auto c : {outer_compression::none, outer_compression::int8}) {
    CAPTURE(to_string(c));
    const streaming_diloco_options o{.inner_steps = 4, .fragments = 2, .fragment_sync_delay = 1, .compression = c};
    const auto straight = streaming_run(world, total, o);
    std::vector<std::vector<float>> resumed(world);
    run_local(world, [&](local_group& g) {
      const auto r = static_cast<std::size_t>(g.rank());
      std::vector<std::byte> saved;
      std::vector<float> params;
      {
        toy_mlp<float> m(7 + r);
        adamw inner(m, inner_adamw);
        streaming_diloco sd(m, inner, g, o);
        for (int s = 0; s < cut; ++s) sd.train_step(rank_batch<float>(s, world, g.rank()));
        CHECK(sd.in_flight() == 0);
        state_writer w;
        sd.save_state(w);
        saved = w.release();
        params = m.flat_values();
      }
      toy_mlp<float> m(11);
      adamw inner(m, inner_adamw);
      streaming_diloco sd(m, inner, g, o);
      set_values(m, params);
      state_reader rd(saved);
      sd.load_state(rd);
      CHECK(rd.remaining() == 0);
      CHECK(sd.in_flight() == 0);
      for (int s = cut; s < total; ++s) sd.train_step(rank_batch<float>(s, world, g.rank()));
      resumed[r] = m.flat_values();
    });
    CHECK(resumed[0] == straight.back()[0]);
    CHECK(resumed[1] == straight.back()[1]);
  }
}

namespace {

// Streaming DiLoCo's join against the same reference as DiLoCo's (inner_step: the fragment in
// flight at the end, -1: none).
join_run streaming_uneven(const std::vector<int>& batches, streaming_diloco_options o, bool join) {
  o.join = join;
  return uneven_run(batches, join, [&](toy_mlp<float>& m, sgd<toy_mlp<float>>& inner, local_group& g) {
    return std::make_unique<streaming_diloco<toy_mlp<float>, sgd<toy_mlp<float>>, local_group>>(m, inner, g, o);
  });
}

}  // namespace

TEST_CASE("streaming_diloco join: ranks with fewer batches take part in every exchange, nobody hangs", "[parallel][diloco][streaming][join]") {
  // H = 4, F = 2: with tau = 1 fragment 0's exchange runs over steps 1-2 of each round, fragment
  // 1's over 3-4; with tau = 0 each exchange starts and ends at steps 2 and 4. The longest rank
  // ends epoch 1 at step 10 (no exchange in flight) or 9 (fragment 0's in flight, on every rank).
  for (const std::int64_t tau : {1, 0}) {
    for (const int longest : {10, 9}) {
      for (auto c : {outer_compression::none, outer_compression::int8}) {
        CAPTURE(tau, longest, to_string(c));
        const std::vector<int> batches{longest, 5, 2};
        const streaming_diloco_options o{.inner_steps = 4, .fragments = 2, .fragment_sync_delay = tau, .compression = c};
        const auto got = streaming_uneven(batches, o, true);
        const auto want = streaming_uneven(batches, o, false);
        for (std::size_t r = 0; r < batches.size(); ++r) {
          CAPTURE(r);
          CHECK(got.params[r] == want.params[r]);  // bit for bit
          CHECK(got.steps[r] == 2 * longest);
          CHECK(got.outer_steps[r] == want.outer_steps[0]);
          CHECK(got.inner_step[r] == want.inner_step[0]);  // the same exchange in flight as the reference's
        }
        CHECK(got.shadowed == std::vector<int>{0, 1, 1});
        CHECK(want.outer_steps[0] == longest);  // one outer step every H / F = 2 steps
      }
    }
  }
}

TEST_CASE("streaming_diloco join: without join the rank left waiting times out naming the fix", "[parallel][diloco][streaming][join][errors]") {
  CHECK_THROWS_WITH(run_local(2, [](local_group& g) {
    toy_mlp<float> m(7);
    sgd inner(m, join_inner);
    streaming_diloco sd(m, inner, g, {.inner_steps = 4, .fragments = 2, .fragment_sync_delay = 0});
    for (int s = 0; s < (g.rank() == 0 ? 6 : 1); ++s) sd.train_step(rank_batch<float>(s, 2, g.rank()));
  }, {.timeout = std::chrono::milliseconds(300)}), Catch::Contains("exchange failed") &&
                                                     Catch::Contains("streaming_diloco_options{.join = true}"));
  run_local(1, [](local_group& g) {
    toy_mlp<float> m(7);
    sgd inner(m, join_inner);
    streaming_diloco sd(m, inner, g, {.inner_steps = 4, .fragments = 2});
    CHECK_THROWS_WITH(sd.join(), Catch::Contains("join() needs join enabled"));
  });
}

TEST_CASE("streaming_diloco: bad options are refused by name", "[parallel][diloco][streaming][errors]") {
  run_local(1, [](local_group& g) {
    toy_mlp<float> m;
    sgd inner(m, inner_sgd);
    auto make = [&](streaming_diloco_options o) { streaming_diloco sd(m, inner, g, o); };
    CHECK_THROWS_AS(make({.fragments = 0}), invalid_argument_error);
    CHECK_THROWS_WITH(make({.fragments = 0}), Catch::Contains("fragments must be >= 1"));
    CHECK_THROWS_WITH(make({.inner_steps = 6, .fragments = 4}), Catch::Contains("must be a multiple of fragments"));
    CHECK_THROWS_WITH(make({.inner_steps = 10, .fragments = 5}), Catch::Contains("must not exceed the model's 4 parameters"));
    CHECK_THROWS_WITH(make({.inner_steps = 4, .fragments = 2, .fragment_sync_delay = 2}),
                      Catch::Contains("fragment_sync_delay must be in [0, inner_steps / fragments) = [0, 2)"));
    CHECK_THROWS_WITH(make({.inner_steps = 0}), Catch::Contains("inner_steps must be >= 1"));
  });
}
