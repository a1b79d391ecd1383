// DDP over the local (threads) backend: equivalence with one big-batch process, buckets, overlap,
// no_sync, hooks, clipping, join, the missing-join timeout and the parameter check.
#include <catch2/catch.hpp>

#include <partrain/comm/local.hpp>
#include <partrain/core/executor.hpp>
#include <partrain/optim/sgd.hpp>
#include <partrain/parallel/ddp.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "toy_models.hpp"

using namespace partrain;
using partrain::testing::concat;
using partrain::testing::make_toy_batch;
using partrain::testing::toy_batch;
using partrain::testing::toy_mlp;

namespace {

constexpr int steps = 20;
constexpr std::size_t per_rank = 4;
const sgd_options opt_options{.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3};

// Rank r's batch at step s: samples [s*N*b + r*b, +b), so the ranks' batches of one step
// together are the one-process batch of that step.
template <class T>
toy_batch<T> rank_batch(int step, int world, int rank, std::size_t b = per_rank) {
  return make_toy_batch<T>(static_cast<std::size_t>(step * world + rank) * b, b);
}

template <class T>
std::vector<T> reference_run(int world, int n_steps = steps) {
  toy_mlp<T, false> m(7);
  sgd opt(m, opt_options);
  for (int s = 0; s < n_steps; ++s) {
    m.train_step(make_toy_batch<T>(static_cast<std::size_t>(s * world) * per_rank, per_rank * static_cast<std::size_t>(world)));
    opt.step();
  }
  return m.flat_values();
}

// Runs DDP on `world` local ranks; every rank starts from its own seed (the broadcast from rank 0
// must make them equal). Returns each rank's final parameters.
template <class T, bool Notify = true>
std::vector<std::vector<T>> ddp_run(int world, ddp_options o = {}, int n_steps = steps, process_group_options g_opts = {}) {
  std::vector<std::vector<T>> out(static_cast<std::size_t>(world));
  run_local(world, [&](local_group& g) {
    toy_mlp<T, Notify> m(7 + static_cast<std::uint64_t>(g.rank()));
    distributed_data_parallel ddp(m, g, o);
    sgd opt(m, opt_options);
    for (int s = 0; s < n_steps; ++s) {
      ddp.train_step(rank_batch<T>(s, world, g.rank()));
      opt.step();
    }
    out[static_cast<std::size_t>(g.rank())] = m.flat_values();
  }, g_opts);
  return out;
}

template <class T>
void check_close(const std::vector<T>& got, const std::vector<T>& want, double rel) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    CHECK(static_cast<double>(got[i]) == Approx(static_cast<double>(want[i])).epsilon(rel).margin(rel));
  }
}

}  // namespace

TEST_CASE("ddp: N ranks on batch b equal one process on batch N*b after 20 steps", "[parallel][ddp]") {
  for (int world : {1, 2, 4}) {
    CAPTURE(world);
    SECTION("float, world " + std::to_string(world)) {
      const auto ref = reference_run<float>(world);
      const auto got = ddp_run<float>(world);
      for (const auto& r : got) CHECK(r == got[0]);  // every rank holds the same bytes
      check_close(got[0], ref, 1e-5);
    }
    SECTION("double, world " + std::to_string(world)) {
      const auto ref = reference_run<double>(world);
      const auto got = ddp_run<double>(world);
      for (const auto& r : got) CHECK(r == got[0]);
      check_close(got[0], ref, 1e-12);
    }
  }
}

TEST_CASE("ddp: bucket caps from tiny to huge give identical results", "[parallel][ddp][buckets]") {
  const auto tiny = ddp_run<float>(2, {.bucket_cap_bytes = 1, .first_bucket_bytes = 1});
  const auto mid = ddp_run<float>(2, {.bucket_cap_bytes = 64, .first_bucket_bytes = 16});
  const auto huge = ddp_run<float>(2, {.bucket_cap_bytes = std::size_t{1} << 40});
  CHECK(tiny[0] == huge[0]);
  CHECK(mid[0] == huge[0]);
}

TEST_CASE("ddp: overlap on, overlap off and a model without notification give identical results", "[parallel][ddp][overlap]") {
  const ddp_options small{.bucket_cap_bytes = 32, .first_bucket_bytes = 16};
  auto on = small;
  auto off = small;
  off.overlap = false;
  const auto a = ddp_run<double, true>(2, on);
  const auto b = ddp_run<double, true>(2, off);
  const auto c = ddp_run<double, false>(2, on);
  CHECK(a[0] == b[0]);
  CHECK(a[0] == c[0]);
}

TEST_CASE("ddp: the local backend's inline collectives and pinned ranks give the worker's results, bit for bit",
          "[parallel][ddp][inline]") {
  process_group_options fast;
  fast.inline_collectives = true;
  fast.pin_threads = true;
  for (int world : {2, 3}) {
    for (bool overlap : {true, false}) {
      CAPTURE(world, overlap);
      const ddp_options o{.bucket_cap_bytes = 32, .first_bucket_bytes = 16, .overlap = overlap};
      const auto worker = ddp_run<float>(world, o);
      const auto in_line = ddp_run<float>(world, o, steps, fast);
      for (const auto& r : in_line) CHECK(r == worker[0]);
    }
  }
}

TEST_CASE("ddp: bucket layout is reverse parameter order with a small first bucket", "[parallel][ddp][buckets]") {
  // toy_mlp<float>: fc1.weight 30, fc1.bias 5, fc2.weight 15, fc2.bias 3 elements.
  run_local(1, [](local_group& g) {
    toy_mlp<float> m;
    SECTION("default caps: one bucket") {
      distributed_data_parallel ddp(m, g);
      REQUIRE(ddp.stats().buckets.size() == 1);
      CHECK(ddp.stats().buckets[0].params == std::vector<std::size_t>{3, 2, 1, 0});
      CHECK(ddp.stats().buckets[0].bytes == 53 * sizeof(float));
    }
    SECTION("first bucket 12 bytes, then 80") {
      distributed_data_parallel ddp(m, g, {.bucket_cap_bytes = 80, .first_bucket_bytes = 12});
      const auto& b = ddp.stats().buckets;
      REQUIRE(b.size() == 3);
      CHECK(b[0].params == std::vector<std::size_t>{3});
      CHECK(b[1].params == std::vector<std::size_t>{2, 1});
      CHECK(b[2].params == std::vector<std::size_t>{0});
    }
  });
  CHECK(detail::ddp::assign_buckets({}, 4, 1, 1).empty());
}

TEST_CASE("ddp: stats count steps and measure communication", "[parallel][ddp][stats]") {
  run_local(2, [](local_group& g) {
    toy_mlp<float> m;
    distributed_data_parallel ddp(m, g, {.bucket_cap_bytes = 16, .first_bucket_bytes = 16});
    for (int s = 0; s < 3; ++s) ddp.train_step(rank_batch<float>(s, 2, g.rank()));
    {
      auto guard = ddp.no_sync();
      ddp.train_step(rank_batch<float>(3, 2, g.rank()));
    }
    const auto& st = ddp.stats();
    CHECK(st.steps == 4);
    CHECK(st.synced_steps == 3);
    CHECK(st.comm_s > 0);
    CHECK(st.hidden_s >= 0);
    CHECK(st.hidden_s <= st.comm_s);
    CHECK(st.hidden_fraction() <= 1.0);
  });
}

TEST_CASE("ddp: no_sync over k micro-batches equals one batch k times as large", "[parallel][ddp][no_sync]") {
  constexpr int k = 3;
  auto run = [](bool micro) {
    std::vector<std::vector<double>> out(2);
    run_local(2, [&](local_group& g) {
      toy_mlp<double> m(7);
      distributed_data_parallel ddp(m, g);
      sgd opt(m, opt_options);
      for (int s = 0; s < 5; ++s) {
        const std::size_t base = static_cast<std::size_t>((s * 2 + g.rank()) * k) * per_rank;
        if (micro) {
          {
            auto guard = ddp.no_sync();
            for (int j = 0; j < k - 1; ++j) ddp.train_step(make_toy_batch<double>(base + j * per_rank, per_rank));
          }
          ddp.train_step(make_toy_batch<double>(base + (k - 1) * per_rank, per_rank));
        } else {
          ddp.train_step(make_toy_batch<double>(base, k * per_rank));
        }
        opt.step();
      }
      out[static_cast<std::size_t>(g.rank())] = m.flat_values();
    });
    CHECK(out[0] == out[1]);
    return out[0];
  };
  check_close(run(true), run(false), 1e-12);
}

TEST_CASE("ddp: fp16 and bf16 compression hooks stay close to the plain all_reduce", "[parallel][ddp][hooks]") {
  const auto plain = ddp_run<float>(2, {}, 5);
  const auto fp16 = ddp_run<float>(2, {.hook = comm_hooks::fp16_compress()}, 5);
  const auto bf16 = ddp_run<float>(2, {.hook = comm_hooks::bf16_compress()}, 5);
  CHECK(fp16[0] == fp16[1]);
  CHECK(bf16[0] == bf16[1]);
  CHECK(fp16[0] != plain[0]);  // the compression really happened
  for (std::size_t i = 0; i < plain[0].size(); ++i) {
    CHECK(fp16[0][i] == Approx(plain[0][i]).margin(2e-3));
    CHECK(bf16[0][i] == Approx(plain[0][i]).margin(2e-2));
  }
}

TEST_CASE("ddp: a user-supplied hook sees every bucket in order and its result is used", "[parallel][ddp][hooks]") {
  std::mutex mu;
  std::vector<std::size_t> seen;
  // Sum first, divide after (the older PyTorch allreduce_hook order).
  comm_hook sum_then_divide = [&](grad_bucket& b) {
    {
      std::lock_guard lock(mu);
      if (b.index() == 0 || !seen.empty()) seen.push_back(b.index());
    }
    auto buf = b.buffer_as<double>();
    return detail::then_work(b.all_reduce(buf), [buf, d = b.divisor()] {
      for (double& x : buf) x /= d;
    });
  };
  const ddp_options small{.bucket_cap_bytes = 8, .first_bucket_bytes = 8};
  auto custom = small;
  custom.hook = sum_then_divide;
  const auto a = ddp_run<double>(2, custom, 3);
  const auto b = ddp_run<double>(2, small, 3);
  check_close(a[0], b[0], 1e-13);
  REQUIRE(seen.size() == 2 * 3 * 4);  // 2 ranks x 3 steps x 4 buckets
  for (std::size_t i = 0; i < seen.size(); ++i) CHECK(seen[i] < 4);
  CHECK_THROWS_AS(grad_bucket(0, raw_tensor{nullptr, 0, dtype::float32, false}, {}, 1).buffer_as<double>(),
                  invalid_argument_error);
}

TEST_CASE("ddp: waiting on a chained work runs its source on the waiter where the executor allows",
          "[parallel][ddp][hooks]") {
  // DDP waits on then_work(all_reduce, ...): the wait reaches the all_reduce's own offer, so a
  // Gloo collective not yet started runs on the training thread, then the chained step. Who wins
  // is a race with a fresh executor's starting worker, usually the waiter; under TSan on a busy
  // machine the worker won 50 in a row once, so a waiting::runs executor gets up to 2000 tries
  // to show the waiter winning one (see test_work), a blocking one 50 to show it never does.
  using waiting = detail::executor::waiting;
  for (const waiting mode : {waiting::runs, waiting::blocks}) {
    CAPTURE(mode == waiting::runs);
    int source_here = 0, after_here = 0;
    const int tries = mode == waiting::runs ? 2000 : 50;
    for (int i = 0; i < tries && !(mode == waiting::runs && source_here > 0); ++i) {
      detail::executor ex(1, detail::executor::abandoned_operation, mode);
      std::thread::id source_on, after_on;
      work chained = detail::then_work(ex.submit([&] { source_on = std::this_thread::get_id(); }),
                                       [&] { after_on = std::this_thread::get_id(); });
      chained.wait();
      source_here += source_on == std::this_thread::get_id() ? 1 : 0;
      after_here += after_on == std::this_thread::get_id() ? 1 : 0;
    }
    // The chained step runs where the source completed: on the waiter whenever the source did
    // (and on the caller, too, when a worker finished the source before then_work chained it).
    CHECK(after_here >= source_here);
    if (mode == waiting::runs) {
      CHECK(source_here > 0);
    } else {
      CHECK(source_here == 0);
    }
  }
  // A chained work whose source failed on the waiter carries the error.
  detail::executor ex(1, detail::executor::abandoned_operation, waiting::runs);
  bool after_ran = false;
  work chained = detail::then_work(ex.submit([] { throw communication_error("rank 0 all_reduce: peer gone"); }),
                                   [&] { after_ran = true; });
  CHECK_THROWS_WITH(chained.wait(), Catch::Contains("peer gone"));
  CHECK_FALSE(after_ran);
}

TEST_CASE("ddp: a bucket of a communicator without all_reduce_divided divides, then sums", "[parallel][ddp][hooks]") {
  // What a user's communicator (no process_group) gets: the division in the bucket, then its sum.
  std::vector<float> v{1.0f, 2.0f, 6.0f, -3.0f};
  std::vector<float> seen;
  grad_bucket b(0, raw_tensor{v.data(), v.size(), dtype::float32, false}, [&](raw_tensor t) {
    const auto* p = static_cast<const float*>(t.data);
    seen.assign(p, p + t.count);
    return work::completed();
  }, 2);
  b.all_reduce_divided(b.buffer(), 3.0).wait();
  CHECK(seen == std::vector<float>{1.0f / 3.0f, 2.0f / 3.0f, 2.0f, -1.0f});
  std::vector<std::int32_t> ints(2);
  CHECK_THROWS_WITH(b.all_reduce_divided(raw_tensor{ints.data(), 2, dtype::int32, false}, 2.0),
                    Catch::Contains("float32 or float64") && Catch::Contains("int32"));
  CHECK_THROWS_WITH(b.all_reduce_divided(raw_tensor{v.data(), v.size(), dtype::float32, true}, 2.0),
                    Catch::Contains("host memory"));
  // With a process_group's all_reduce_divided, the bucket hands the division over.
  std::vector<double> got(2);
  run_local(2, [&](local_group& g) {
    std::vector<double> mine{3.0, 1.0};
    grad_bucket gb(0, raw_tensor{mine.data(), 2, dtype::float64, false}, detail::ddp::make_all_reduce_fn(g), 2,
                   detail::ddp::make_all_reduce_divided_fn(g));
    gb.all_reduce_divided(gb.buffer(), 3.0).wait();
    if (g.rank() == 0) got = mine;
  });
  CHECK(got == std::vector<double>{3.0 / 3.0 + 3.0 / 3.0, 1.0 / 3.0 + 1.0 / 3.0});
}

TEST_CASE("ddp: clip_grad_norm gives the same norm and gradients on every rank", "[parallel][ddp][clip]") {
  std::vector<double> norms(2);
  std::vector<std::vector<float>> grads(2);
  run_local(2, [&](local_group& g) {
    toy_mlp<float> m(7);
    distributed_data_parallel ddp(m, g);
    ddp.train_step(rank_batch<float>(0, 2, g.rank()));
    norms[static_cast<std::size_t>(g.rank())] = ddp.clip_grad_norm(0.01);
    grads[static_cast<std::size_t>(g.rank())] = m.flat_grads();
  });
  CHECK(norms[0] == norms[1]);
  CHECK(norms[0] > 0.01);
  CHECK(grads[0] == grads[1]);
  double sq = 0;
  for (float x : grads[0]) sq += static_cast<double>(x) * x;
  CHECK(std::sqrt(sq) == Approx(0.01).epsilon(1e-4));
}

TEST_CASE("ddp: join lets ranks with fewer batches shadow the others to the end", "[parallel][ddp][join]") {
  // Rank 0 has 3 batches, rank 1 has 5: steps 4 and 5 are rank 1's alone.
  for (bool initial : {true, false}) {
    CAPTURE(initial);
    std::vector<std::vector<double>> out(2);
    std::vector<int> shadowed(2);
    std::vector<std::size_t> shadow_steps(2);
    run_local(2, [&](local_group& g) {
      toy_mlp<double> m(7);
      distributed_data_parallel ddp(m, g, {.join = true, .divide_by_initial_world_size = initial});
      sgd opt(m, opt_options);
      const int mine = g.rank() == 0 ? 3 : 5;
      for (int s = 0; s < mine; ++s) {
        ddp.train_step(rank_batch<double>(s, 2, g.rank()));
        opt.step();
      }
      shadowed[static_cast<std::size_t>(g.rank())] = ddp.join() ? 1 : 0;
      shadow_steps[static_cast<std::size_t>(g.rank())] = ddp.stats().shadow_steps;
      out[static_cast<std::size_t>(g.rank())] = m.flat_values();
    });
    // Reference: the big batch for 3 steps, then rank 1's batch with its gradient divided by 2
    // (divide by the initial world size) or by 1 (the ranks still active).
    toy_mlp<double, false> ref(7);
    sgd opt(ref, opt_options);
    for (int s = 0; s < 5; ++s) {
      if (s < 3) {
        ref.train_step(concat<double>({rank_batch<double>(s, 2, 0), rank_batch<double>(s, 2, 1)}));
      } else {
        ref.train_step(rank_batch<double>(s, 2, 1));
        if (initial) {
          for (auto& p : ref.parameters()) for (auto& x : p.grads()) x /= 2;
        }
      }
      opt.step();
    }
    CHECK(shadowed == std::vector<int>{1, 0});
    CHECK(shadow_steps == std::vector<std::size_t>{2, 0});
    CHECK(out[0] == out[1]);  // the last joiner's parameters were broadcast
    check_close(out[1], ref.flat_values(), 1e-12);
  }
}

TEST_CASE("ddp: without join, a rank that stops early makes the others time out naming the op and join",
          "[parallel][ddp][join]") {
  process_group_options pg{.timeout = std::chrono::milliseconds(300)};
  auto body = [](local_group& g) {
    toy_mlp<float> m;
    distributed_data_parallel ddp(m, g);
    const int mine = g.rank() == 0 ? 3 : 2;
    for (int s = 0; s < mine; ++s) ddp.train_step(rank_batch<float>(s, 2, g.rank()));
  };
  try {
    run_local(2, body, pg);
    FAIL("expected a timeout");
  } catch (const timeout_error& e) {
    const std::string msg = e.what();
    CHECK_THAT(msg, Catch::Contains("rank 0 DDP gradient all_reduce"));
    CHECK_THAT(msg, Catch::Contains("join = true"));
    // The backend's fields survive DDP's wrapping: who timed out, in what, waiting for whom.
    CHECK(e.rank() == 0);
    CHECK(e.operation() == "all_reduce");
    CHECK(e.peer() == 1);
    CHECK(e.timeout() == std::chrono::milliseconds(300));
  }
  SECTION("join() without the option is a clear error") {
    run_local(1, [](local_group& g) {
      toy_mlp<float> m;
      distributed_data_parallel ddp(m, g);
      CHECK_THROWS_WITH(ddp.join(), Catch::Contains("join() needs join enabled"));
    });
  }
}

namespace {
// A model that exposes only the first k parameters of a toy_mlp (to make counts differ).
struct truncated_model {
  toy_mlp<double> inner;
  std::size_t k;
  std::span<partrain::testing::toy_param<double>> parameters() { return {inner.parameters().data(), k}; }
  double train_step(const toy_batch<double>& b) { return inner.train_step(b); }
};
}  // namespace

TEST_CASE("ddp: ranks with different parameters fail at construction, naming the rank and parameter",
          "[parallel][ddp][verify]") {
  SECTION("different shapes") {
    try {
      run_local(2, [](local_group& g) {
        toy_mlp<double> m(7, 6, g.rank() == 1 ? 4 : 5);
        distributed_data_parallel ddp(m, g);
      });
      FAIL("expected a config_error");
    } catch (const config_error& e) {
      const std::string msg = e.what();
      CHECK_THAT(msg, Catch::Contains("parameter 0 (fc1.weight)"));
      CHECK_THAT(msg, Catch::Contains("rank 1"));
    }
  }
  SECTION("different counts") {
    try {
      run_local(3, [](local_group& g) {
        truncated_model m{toy_mlp<double>(7), g.rank() == 2 ? 3u : 4u};
        distributed_data_parallel ddp(m, g);
      });
      FAIL("expected a config_error");
    } catch (const config_error& e) {
      CHECK_THAT(std::string(e.what()), Catch::Contains("rank 2 has 3 parameters while rank 0 has 4"));
    }
  }
  SECTION("the mismatching rank itself reports both shapes") {
    std::string rank1_msg;
    try {
      run_local(2, [&](local_group& g) {
        toy_mlp<double> m(7, 6, 5, g.rank() == 1 ? 2 : 3);
        try {
          distributed_data_parallel ddp(m, g);
        } catch (const config_error& e) {
          if (g.rank() == 1) rank1_msg = e.what();
          throw;
        }
      });
    } catch (const config_error&) {
    }
    CHECK_THAT(rank1_msg, Catch::Contains("parameter 2 (fc2.weight) has shape [2, 5] float64 on rank 1 but [3, 5] float64 on rank 0"));
  }
}

TEST_CASE("ddp: evaluate sums loss, correct and count over ranks", "[parallel][ddp][eval]") {
  // 10 test samples over 3 ranks: 4, 3, 3.
  toy_mlp<double> ref(7);
  const auto all = ref.eval_step(make_toy_batch<double>(0, 10));
  std::vector<eval_result> got(3);
  run_local(3, [&](local_group& g) {
    toy_mlp<double> m(100 + static_cast<std::uint64_t>(g.rank()));  // rank 0's weights get broadcast... from seed 100
    distributed_data_parallel ddp(m, g, {.broadcast_parameters = false});
    m = toy_mlp<double>(7);
    const std::size_t first = g.rank() == 0 ? 0 : 4 + 3 * static_cast<std::size_t>(g.rank() - 1);
    const std::size_t n = g.rank() == 0 ? 4 : 3;
    std::vector<toy_batch<double>> batches{make_toy_batch<double>(first, n)};
    got[static_cast<std::size_t>(g.rank())] = ddp.evaluate(batches);
  });
  for (const auto& r : got) {
    CHECK(r.count == 10);
    CHECK(r.correct == all.correct);
    CHECK(r.loss_sum == Approx(all.loss_sum).epsilon(1e-12));
  }
}

namespace {
// Records whether the model's own step was still running when each bucket was handed to the hook.
struct watched_model {
  toy_mlp<double> inner{7};
  bool in_step = false;
  std::vector<partrain::testing::toy_param<double>>& parameters() { return inner.parameters(); }
  double train_step(const toy_batch<double>& b) {
    in_step = true;
    const double l = inner.train_step(b);
    in_step = false;
    return l;
  }
  double train_step(const toy_batch<double>& b, const grad_ready_fn& f) {
    in_step = true;
    const double l = inner.train_step(b, f);
    in_step = false;
    return l;
  }
};
}  // namespace

TEST_CASE("ddp: with overlap, buckets launch while the model's backward is still running", "[parallel][ddp][overlap]") {
  for (bool overlap : {true, false}) {
    CAPTURE(overlap);
    std::vector<std::vector<int>> during(2);
    run_local(2, [&](local_group& g) {
      watched_model m;
      auto& mine = during[static_cast<std::size_t>(g.rank())];
      ddp_options o{.bucket_cap_bytes = 8, .first_bucket_bytes = 8, .overlap = overlap};
      o.hook = [&m, &mine, plain = comm_hooks::allreduce()](grad_bucket& b) {
        mine.push_back(m.in_step ? 1 : 0);
        return plain(b);
      };
      distributed_data_parallel ddp(m, g, o);
      ddp.train_step(rank_batch<double>(0, 2, g.rank()));
    });
    // 4 buckets (one per parameter); the model reports all four before returning.
    const std::vector<int> want = overlap ? std::vector<int>{1, 1, 1, 1} : std::vector<int>{0, 0, 0, 0};
    CHECK(during[0] == want);
    CHECK(during[1] == want);
  }
}

namespace {

// toy_mlp with its gradients back to back in one buffer (as a model with a flat gradient buffer
// keeps them): each gradient is copied into its slot before it is reported ready.
template <class T>
class flat_grad_mlp {
 public:
  struct param {
    partrain::testing::toy_param<T>* inner;
    T* flat;
    [[nodiscard]] tensor_view<T> value() { return inner->value(); }
    [[nodiscard]] tensor_view<T> grad() { return {flat, inner->value().shape()}; }
    [[nodiscard]] const std::string& name() const noexcept { return inner->name(); }
  };

  explicit flat_grad_mlp(std::uint64_t seed) : inner_(seed) {
    std::size_t n = 0;
    for (auto& p : inner_.parameters()) n += p.values().size();
    grads_.assign(n, T(0));
    std::size_t off = 0;
    for (auto& p : inner_.parameters()) {
      params_.push_back({&p, grads_.data() + off});
      off += p.values().size();
    }
  }
  [[nodiscard]] std::vector<param>& parameters() noexcept { return params_; }
  double train_step(const toy_batch<T>& b) {
    const double loss = inner_.train_step(b);
    for (std::size_t i = 0; i < params_.size(); ++i) publish(i);
    return loss;
  }
  double train_step(const toy_batch<T>& b, const grad_ready_fn& ready) {
    return inner_.train_step(b, [&](std::size_t i) {
      publish(i);
      ready(i);
    });
  }
  [[nodiscard]] eval_result eval_step(const toy_batch<T>& b) { return inner_.eval_step(b); }
  [[nodiscard]] std::vector<T> flat_values() const { return inner_.flat_values(); }
  [[nodiscard]] const std::vector<T>& flat_grads() const noexcept { return grads_; }

 private:
  void publish(std::size_t i) {
    const auto& g = inner_.parameters()[i].grads();
    std::copy(g.begin(), g.end(), params_[i].flat);
  }
  toy_mlp<T> inner_;
  std::vector<T> grads_;
  std::vector<param> params_;
};

struct flat_run {
  std::vector<double> values;
  ddp_stats stats;
};

// 12 steps on `world` local ranks; every third step after two no_sync micro-steps if `micro`.
template <class Model>
flat_run run_for_in_place(int world, ddp_options o, bool micro = false) {
  flat_run out;
  std::mutex mu;
  std::vector<std::vector<double>> values(static_cast<std::size_t>(world));
  run_local(world, [&](local_group& g) {
    Model m(7 + static_cast<std::uint64_t>(g.rank()));
    distributed_data_parallel ddp(m, g, o);
    sgd opt(m, opt_options);
    for (int s = 0; s < 12; ++s) {
      if (micro && s % 3 == 0) {
        auto guard = ddp.no_sync();
        for (int j = 0; j < 2; ++j) ddp.train_step(rank_batch<double>(100 + 2 * s + j, world, g.rank()));
      }
      ddp.train_step(rank_batch<double>(s, world, g.rank()));
      opt.step();
    }
    std::lock_guard lock(mu);
    values[static_cast<std::size_t>(g.rank())] = m.flat_values();
    if (g.rank() == 0) out.stats = ddp.stats();
  });
  for (const auto& v : values) CHECK(v == values[0]);
  out.values = values[0];
  return out;
}

}  // namespace

TEST_CASE("ddp: gradients back to back in the model's memory are reduced in place, bit for bit as through the buckets",
          "[parallel][ddp][in_place]") {
  for (int world : {2, 3}) {
    CAPTURE(world);
    for (bool overlap : {true, false}) {
      CAPTURE(overlap);
      // One bucket over the four gradients (reverse order, still one span of the flat buffer).
      const ddp_options one{.bucket_cap_bytes = std::size_t{1} << 20, .first_bucket_bytes = std::size_t{1} << 20,
                            .overlap = overlap};
      const auto flat = run_for_in_place<flat_grad_mlp<double>>(world, one);
      const auto separate = run_for_in_place<toy_mlp<double>>(world, one);
      CHECK(flat.values == separate.values);
      CHECK(flat.stats.in_place_buckets == 12);
      CHECK(flat.stats.copied_buckets == 0);
      // toy_mlp's gradients are four separate vectors: copied.
      CHECK(separate.stats.in_place_buckets == 0);
      CHECK(separate.stats.copied_buckets == 12);
      // Any other hook than the built-in allreduce gets the bucket buffer, in bucket order.
      auto wrapped = one;
      const comm_hook builtin = comm_hooks::allreduce();
      wrapped.hook = [builtin](grad_bucket& b) { return builtin(b); };
      const auto hooked = run_for_in_place<flat_grad_mlp<double>>(world, wrapped);
      CHECK(hooked.values == flat.values);
      CHECK(hooked.stats.in_place_buckets == 0);
    }
  }
}

TEST_CASE("ddp: a step after no_sync micro-steps adds into the buckets, then the next reduces in place again",
          "[parallel][ddp][in_place][no_sync]") {
  const ddp_options one{.bucket_cap_bytes = std::size_t{1} << 20, .first_bucket_bytes = std::size_t{1} << 20};
  const auto flat = run_for_in_place<flat_grad_mlp<double>>(2, one, true);
  const auto separate = run_for_in_place<toy_mlp<double>>(2, one, true);
  CHECK(flat.values == separate.values);
  CHECK(flat.stats.copied_buckets == 4);    // steps 0, 3, 6, 9 follow micro-steps
  CHECK(flat.stats.in_place_buckets == 8);  // the other eight
}

TEST_CASE("ddp: a joined rank shadows with zeros, not with the gradients its last in-place step reduced",
          "[parallel][ddp][in_place][join]") {
  // Rank 0 has 3 batches, rank 1 has 5: rank 0 shadows steps 4 and 5 after reducing in place.
  auto run = [](auto model_tag) {
    using Model = typename decltype(model_tag)::type;
    std::vector<std::vector<double>> out(2);
    std::vector<std::size_t> in_place(2);
    run_local(2, [&](local_group& g) {
      Model m(7);
      distributed_data_parallel ddp(m, g, {.join = true});
      sgd opt(m, opt_options);
      for (int s = 0; s < (g.rank() == 0 ? 3 : 5); ++s) {
        ddp.train_step(rank_batch<double>(s, 2, g.rank()));
        opt.step();
      }
      (void)ddp.join();
      out[static_cast<std::size_t>(g.rank())] = m.flat_values();
      in_place[static_cast<std::size_t>(g.rank())] = ddp.stats().in_place_buckets;
    });
    CHECK(out[0] == out[1]);
    return std::pair{out[1], in_place};
  };
  const auto [flat, flat_in_place] = run(std::type_identity<flat_grad_mlp<double>>{});
  const auto [separate, separate_in_place] = run(std::type_identity<toy_mlp<double>>{});
  CHECK(flat_in_place == std::vector<std::size_t>{3, 5});
  CHECK(separate_in_place == std::vector<std::size_t>{0, 0});
  CHECK(flat == separate);
}
