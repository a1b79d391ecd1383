// PowerSGD as a DDP comm hook over the local (threads) backend: full rank equals the all_reduce,
// start_iter is the all_reduce bit for bit, error feedback keeps the sum of applied updates equal
// to the sum of the true mean gradients, the bytes sent, save/load, and the option checks.
#include <catch2/catch.hpp>

#include <partrain/comm/local.hpp>
#include <partrain/optim/sgd.hpp>
#include <partrain/parallel/ddp.hpp>
#include <partrain/parallel/powersgd.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <memory>
#include <vector>

#include "comm_efficient_support.hpp"

using namespace partrain;
using namespace partrain::testing;

namespace {

template <class T>
std::vector<std::vector<T>> powersgd_run(int world, int steps, powersgd_options po) {
  std::vector<std::vector<T>> out(static_cast<std::size_t>(world));
  run_local(world, [&](local_group& g) {
    toy_mlp<T> m(7 + static_cast<std::uint64_t>(g.rank()));
    auto state = std::make_shared<powersgd_state>(po);
    distributed_data_parallel ddp(m, g, {.hook = comm_hooks::powersgd(state)});
    sgd opt(m, inner_sgd);
    for (int s = 0; s < steps; ++s) {
      ddp.train_step(rank_batch<T>(s, world, g.rank()));
      opt.step();
    }
    out[static_cast<std::size_t>(g.rank())] = m.flat_values();
  });
  return out;
}

// Rank r's "gradient" at step s: a fixed pseudo-random vector.
std::vector<double> fake_grad(std::size_t n, int step, int rank) {
  std::vector<double> g(n);
  toy_rng r(static_cast<std::uint64_t>(step * 131 + rank * 7 + 1));
  for (auto& x : g) x = r.uniform();
  return g;
}

}  // namespace

TEST_CASE("powersgd: at full rank it equals the all_reduce", "[parallel][powersgd]") {
  constexpr int steps = 10;
  for (int world : {2, 3}) {
    for (bool feedback : {false, true}) {
      CAPTURE(world, feedback);
      const auto ddp = ddp_reference<double>(world, steps);
      // Rank 8 >= min(n, m) of every toy matrix (5 x 6 and 3 x 5); rate 0 compresses them all.
      const auto got = powersgd_run<double>(world, steps, {.matrix_approximation_rank = 8, .start_iter = 0,
                                                           .min_compression_rate = 0, .use_error_feedback = feedback});
      for (const auto& r : got) CHECK(r == got[0]);
      check_close(got[0], ddp[0], 1e-9);
    }
  }
}

TEST_CASE("powersgd: before start_iter it is the plain all_reduce bit for bit", "[parallel][powersgd]") {
  const auto ddp = ddp_reference<float>(2, 5);
  const auto got = powersgd_run<float>(2, 5, {.start_iter = 5});
  CHECK(got[0] == ddp[0]);
  CHECK(got[1] == ddp[1]);
  const auto later = powersgd_run<float>(2, 6, {.start_iter = 5, .min_compression_rate = 0});
  const auto ddp6 = ddp_reference<float>(2, 6);
  CHECK(later[0] != ddp6[0]);  // step 6 compressed at rank 1
  CHECK(later[1] == later[0]);
}

TEST_CASE("powersgd: error feedback keeps the sum of applied updates equal to the sum of true gradients", "[parallel][powersgd][error_feedback]") {
  constexpr int world = 2, steps = 15;
  // An 8 x 6 matrix (compressed at rank 1), a vector of 5, and a 4 x 3 matrix. With no shapes the
  // whole bucket is one near-square matrix (67 is prime: 1 x 67, not compressible, so 7 x 9 = 63).
  for (bool with_shapes : {true, false}) {
    CAPTURE(with_shapes);
    const std::size_t n = with_shapes ? 48 + 5 + 12 : 63;
    run_local(world, [&](local_group& g) {
      std::vector<double> buf(n), applied_sum(n, 0.0), true_sum(n, 0.0);
      grad_bucket gb(0, raw_tensor{buf.data(), n, dtype::float64, false}, detail::ddp::make_all_reduce_fn(g), world);
      gb.set_divisor(world);
      if (with_shapes) gb.set_param_shapes({shape{8, 6}, shape{5}, shape{4, 3}});
      auto state = std::make_shared<powersgd_state>(powersgd_options{.start_iter = 2});
      const auto hook = comm_hooks::powersgd(state);
      bool compressed = false;
      for (int s = 0; s < steps; ++s) {
        const auto mine = fake_grad(n, s, g.rank());
        std::copy(mine.begin(), mine.end(), buf.begin());  // in place: the bucket views buf's memory
        std::vector<double> mean(n, 0.0);
        for (int r = 0; r < world; ++r) {
          const auto gr = fake_grad(n, s, r);
          for (std::size_t i = 0; i < n; ++i) mean[i] += gr[i] / world;
        }
        for (std::size_t i = 0; i < n; ++i) true_sum[i] += mean[i];
        hook(gb).wait();
        if (s >= 2 && buf != mean) compressed = true;
        for (std::size_t i = 0; i < n; ++i) applied_sum[i] += buf[i];
      }
      CHECK(compressed);
      CHECK(state->iteration(0) == steps);
      // sum(applied) = sum(true mean gradients) - mean over ranks of the last error.
      const auto e = state->error<double>(0);
      REQUIRE(e.size() == n);
      std::vector<double> mean_error(e.begin(), e.end());
      for (auto& x : mean_error) x /= world;
      g.all_reduce(tensor_view<double>(mean_error), reduce_op::sum).wait();
      double max_error = 0;
      for (std::size_t i = 0; i < n; ++i) {
        CHECK(applied_sum[i] + mean_error[i] == Approx(true_sum[i]).margin(1e-10));
        max_error = std::max(max_error, std::abs(mean_error[i]));
      }
      CHECK(max_error > 1e-3);  // the feedback really carried something
    });
  }
}

TEST_CASE("powersgd: bytes sent are P, Q and the uncompressed rest", "[parallel][powersgd][traffic]") {
  run_local(2, [](local_group& g) {
    toy_mlp<float> m(7);
    auto state = std::make_shared<powersgd_state>(powersgd_options{.start_iter = 1});
    distributed_data_parallel ddp(m, g, {.hook = comm_hooks::powersgd(state)});
    g.reset_traffic();
    ddp.train_step(rank_batch<float>(0, 2, g.rank()));
    CHECK(g.traffic().bytes_sent == 53 * 4);  // start_iter: the whole bucket
    g.reset_traffic();
    ddp.train_step(rank_batch<float>(1, 2, g.rank()));
    // fc1.weight 5 x 6 at rank 1: P 5 + Q 6 values; fc2.weight 3 x 5 gains nothing at rate 2
    // ((3 + 5) * 2 >= 15) and joins the biases (5 + 3) uncompressed: 11 + 23 = 34 floats.
    CHECK(g.traffic().bytes_sent == 34 * 4);
    CHECK(state->compression_rate() == Approx(53.0 / 34.0));
  });
}

TEST_CASE("powersgd: save and load resume bit-identically", "[parallel][powersgd][state]") {
  constexpr int world = 2, total = 12, cut = 6;
  const powersgd_options po{.start_iter = 2, .min_compression_rate = 0};
  const auto straight = powersgd_run<float>(world, total, po);
  std::vector<std::vector<float>> resumed(world);
  run_local(world, [&](local_group& g) {
    const auto r = static_cast<std::size_t>(g.rank());
    state_writer w;
    std::vector<float> params;
    {
      toy_mlp<float> m(7 + r);
      auto state = std::make_shared<powersgd_state>(po);
      distributed_data_parallel ddp(m, g, {.hook = comm_hooks::powersgd(state)});
      sgd opt(m, inner_sgd);
      for (int s = 0; s < cut; ++s) {
        ddp.train_step(rank_batch<float>(s, world, g.rank()));
        opt.step();
      }
      state->save_state(w);
      opt.save_state(w);
      params = m.flat_values();
    }
    toy_mlp<float> m(5);
    auto state = std::make_shared<powersgd_state>(po);
    distributed_data_parallel ddp(m, g, {.hook = comm_hooks::powersgd(state)});
    sgd opt(m, inner_sgd);
    set_values(m, params);
    state_reader rd(w.bytes());
    state->load_state(rd);
    opt.load_state(rd);
    CHECK(rd.remaining() == 0);
    CHECK(state->iteration(0) == cut);
    for (int s = cut; s < total; ++s) {
      ddp.train_step(rank_batch<float>(s, world, g.rank()));
      opt.step();
    }
    resumed[r] = m.flat_values();
  });
  CHECK(resumed[0] == straight[0]);
  CHECK(resumed[1] == straight[1]);
}

TEST_CASE("powersgd: bad options, a null state and wrong shapes are refused by name", "[parallel][powersgd][errors]") {
  CHECK_THROWS_AS(powersgd_state({.matrix_approximation_rank = 0}), invalid_argument_error);
  CHECK_THROWS_WITH(powersgd_state({.matrix_approximation_rank = 0}), Catch::Contains("matrix_approximation_rank must be >= 1"));
  CHECK_THROWS_WITH(powersgd_state({.start_iter = -1}), Catch::Contains("start_iter must be >= 0"));
  CHECK_THROWS_WITH(powersgd_state({.min_compression_rate = -1}), Catch::Contains("min_compression_rate must be >= 0"));
  CHECK_THROWS_WITH(powersgd_state({.orthogonalization_epsilon = -1}), Catch::Contains("orthogonalization_epsilon"));
  CHECK_THROWS_WITH(comm_hooks::powersgd(nullptr), Catch::Contains("the state is null"));
  CHECK_THROWS_WITH(detail::powersgd::plan(std::vector<shape>{shape{2, 3}}, 7, {}),
                    Catch::Contains("hold 6 elements but the bucket has 7"));
  powersgd_state a({.matrix_approximation_rank = 2});
  state_writer w;
  a.save_state(w);
  powersgd_state b({.matrix_approximation_rank = 4});
  state_reader r(w.bytes());
  CHECK_THROWS_WITH(b.load_state(r), Catch::Contains("matrix_approximation_rank 2") && Catch::Contains("has 4"));
}
