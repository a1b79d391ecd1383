#include <catch2/catch.hpp>

#include <partrain/comm/local.hpp>

#include "collective_reference.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <limits>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

using namespace partrain;
using namespace std::chrono_literals;
using partrain::testing::make_input;
using partrain::testing::reference_reduce;

namespace {
template <class T>
void check_all_collectives(int world, std::size_t n) {
  std::atomic<int> failures{0};
  run_local(world, [&](local_group& g) { failures += partrain::testing::collective_failures<T>(g, n); });
  CHECK(failures == 0);
}
}  // namespace

TEMPLATE_TEST_CASE("local: every collective matches the sequential reference", "[comm][local]", float, double, half,
                   bfloat16) {
  for (int world = 1; world <= 4; ++world) {
    for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{10001}}) {
      INFO("world " << world << " n " << n);
      check_all_collectives<TestType>(world, n);
    }
  }
}

TEST_CASE("local: all_reduce is bit-identical on every rank and across runs", "[comm][local]") {
  std::vector<std::vector<float>> results(3);
  for (int run = 0; run < 2; ++run) {
    run_local(3, [&](local_group& g) {
      std::vector<float> v(5000);
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.1f * static_cast<float>(i % 13) / static_cast<float>(g.rank() + 1);
      g.all_reduce(tensor_view<float>(v), reduce_op::avg).wait();
      if (run == 0) results[static_cast<std::size_t>(g.rank())] = v;
      else CHECK(results[static_cast<std::size_t>(g.rank())] == v);
    });
  }
  CHECK(results[0] == results[1]);
  CHECK(results[1] == results[2]);
}

TEST_CASE("local: mismatched sizes across ranks are reported, naming both", "[comm][local][errors]") {
  CHECK_THROWS_WITH(run_local(2, [](local_group& g) {
                      std::vector<float> v(g.rank() == 0 ? 10 : 11);
                      g.all_reduce(tensor_view<float>(v)).wait();
                    }),
                    Catch::Contains("float32 x 10") && Catch::Contains("float32 x 11"));
}

TEST_CASE("local: a missing rank times out with an error naming it", "[comm][local][errors]") {
  process_group_options opts;
  opts.timeout = 300ms;
  for (bool in_line : {false, true}) {  // on the worker, and inline_collectives
    CAPTURE(in_line);
    opts.inline_collectives = in_line;
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH(run_local(3, [](local_group& g) {
                        if (g.rank() == 2) return;  // never joins
                        std::vector<float> v(4);
                        g.all_reduce(tensor_view<float>(v)).wait();
                      }, opts),
                      Catch::Contains("timed out") && Catch::Contains("rank(s) 2") && Catch::Contains("all_reduce"));
    CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  }
  opts.inline_collectives = false;
  // The same facts as fields: the rank that timed out, the operation, the missing peer, the deadline.
  try {
    run_local(2, [](local_group& g) {
      if (g.rank() == 1) return;
      g.barrier().wait();
    }, opts);
    FAIL("the barrier without rank 1 completed");
  } catch (const timeout_error& e) {
    CHECK(e.rank() == 0);
    CHECK(e.operation() == "barrier");
    CHECK(e.peer() == 1);
    CHECK(e.timeout() == 300ms);
  }
}

TEST_CASE("local: a rank that throws releases its peers at once", "[comm][local][errors]") {
  process_group_options opts;
  opts.timeout = 60s;  // far longer than the test may take: release must come from the abort
  for (bool in_line : {false, true}) {  // on the worker, and inline with pinned (polling) ranks
    CAPTURE(in_line);
    opts.inline_collectives = opts.pin_threads = in_line;
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH(run_local(2, [](local_group& g) {
                        if (g.rank() == 1) throw std::runtime_error("model exploded");
                        std::vector<float> v(4);
                        g.all_reduce(tensor_view<float>(v)).wait();
                      }, opts),
                      Catch::Contains("model exploded"));
    CHECK(std::chrono::steady_clock::now() - t0 < 10s);
  }
}

TEST_CASE("local: bad arguments are refused before any communication", "[comm][local][errors]") {
  run_local(2, [](local_group& g) {
    std::vector<float> v(4), out(7);
    CHECK_THROWS_WITH(g.broadcast(tensor_view<float>(v), 2), Catch::Contains("root 2 is out of range"));
    CHECK_THROWS_WITH(g.all_gather(tensor_view<float>(v), tensor_view<float>(out)),
                      Catch::Contains("expected 2 x 4"));
    CHECK_THROWS_AS(g.send(tensor_view<float>(v), -1), invalid_argument_error);
  });
  CHECK_THROWS_AS(make_local_world(0), config_error);
}

TEST_CASE("local: all_reduce_divided refuses what it cannot divide, and a rank that does not divide", "[comm][local][errors]") {
  // Refused before any communication, so one rank shows it (Catch's macros on one thread only).
  run_local(1, [](local_group& g) {
    std::vector<float> v(4, 1.0f);
    std::vector<std::int32_t> ints(4, 1);
    CHECK_THROWS_WITH(g.all_reduce_divided(tensor_view<std::int32_t>(ints), 2.0),
                      Catch::Contains("floating-point elements") && Catch::Contains("int32"));
    for (double d : {0.0, -2.0, std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()}) {
      CAPTURE(d);
      CHECK_THROWS_WITH(g.all_reduce_divided(tensor_view<float>(v), d), Catch::Contains("finite divisor > 0"));
    }
    CHECK(v == std::vector<float>(4, 1.0f));  // refused before anything was divided
  });
  for (bool in_line : {false, true}) {
    CAPTURE(in_line);
    process_group_options opts;
    opts.inline_collectives = in_line;
    opts.timeout = 2s;
    // Folded into the reduction, a divisor that differs between ranks would divide half the
    // elements only: the ranks compare it as they compare the sizes.
    CHECK_THROWS_WITH(run_local(2, [](local_group& g) {
                        std::vector<float> v(4, 1.0f);
                        if (g.rank() == 0) g.all_reduce_divided(tensor_view<float>(v), 2.0).wait();
                        else g.all_reduce(tensor_view<float>(v)).wait();
                      }, opts),
                      Catch::Contains("divided by 2") && Catch::Contains("(every rank must issue the same"));
  }
}

TEST_CASE("local: checking mode reports a different collective on another rank", "[comm][local][errors]") {
  process_group_options opts;
  opts.check_collectives = true;
  opts.timeout = 2s;
  for (bool in_line : {false, true}) {  // the fingerprints exchanged on the worker, or inline
    CAPTURE(in_line);
    opts.inline_collectives = in_line;
    CHECK_THROWS_WITH(run_local(2, [](local_group& g) {
                        std::vector<float> v(4);
                        if (g.rank() == 0) g.all_reduce(tensor_view<float>(v)).wait();
                        else g.broadcast(tensor_view<float>(v), 0).wait();
                      }, opts),
                      Catch::Contains("collective mismatch") && Catch::Contains("broadcast"));
  }
}

TEST_CASE("local: inline collectives give the worker's results, finished when the call returns", "[comm][local][inline]") {
  process_group_options opts;
  opts.inline_collectives = true;
  // Pinned where the ranks fill this machine's CPUs: those ranks poll before sleeping at a meeting.
  for (int world = 1; world <= 3; ++world) {
    for (std::size_t n : {std::size_t{1}, std::size_t{1000}, std::size_t{10001}}) {
      opts.pin_threads = n != 1000;
      opts.check_collectives = n == 10001;  // checking mode's fingerprints are inline collectives too
      INFO("world " << world << " n " << n << " pinned " << *opts.pin_threads);
      std::atomic<int> failures{0}, unfinished{0};
      run_local(world, [&](local_group& g) {
        failures += partrain::testing::collective_failures<float>(g, n);
        failures += partrain::testing::collective_failures<half>(g, n);
        std::vector<float> v(n, 1.0f);
        const work w = g.all_reduce(tensor_view<float>(v), reduce_op::sum);
        if (!w.is_completed()) ++unfinished;
        w.wait();
        if (v.front() != static_cast<float>(world)) ++failures;
      }, opts);
      CHECK(failures == 0);
      CHECK(unfinished == 0);
    }
  }
  // A split group inherits the mode.
  std::atomic<int> wrong{0};
  run_local(4, [&](local_group& g) {
    auto sub = g.split(g.rank() % 2);
    std::vector<float> v(3, static_cast<float>(g.rank()));
    const work w = sub->all_reduce(tensor_view<float>(v), reduce_op::sum);
    if (!w.is_completed() || v[0] != (g.rank() % 2 == 0 ? 2.0f : 4.0f)) ++wrong;
  }, opts);
  CHECK(wrong == 0);
}

TEST_CASE("local: an inline collective's failure is its work's, rethrown by wait()", "[comm][local][inline][errors]") {
  // Pinned ranks, which poll before sleeping, time out as the others do.
  process_group_options opts;
  opts.inline_collectives = true;
  opts.pin_threads = true;
  opts.timeout = 300ms;
  std::atomic<int> thrown_by_call{0};
  CHECK_THROWS_AS(run_local(2, [&](local_group& g) {
                    if (g.rank() == 1) return;
                    work w;
                    try {
                      w = g.barrier();
                    } catch (...) {
                      ++thrown_by_call;
                      throw;
                    }
                    w.wait();
                  }, opts),
                  timeout_error);
  CHECK(thrown_by_call == 0);
}

#if defined(__linux__)
TEST_CASE("local: by default run_local runs collectives inline and pins when the ranks fit the CPUs", "[comm][local][pin]") {
  const std::vector<int> allowed = allowed_cpus();
  REQUIRE_FALSE(allowed.empty());
  const int fits = static_cast<int>(allowed.size());
  for (const int world : {fits, fits + 1}) {
    CAPTURE(world);
    std::atomic<int> done_on_return{0}, pinned{0};
    run_local(world, [&](local_group& g) {
      std::vector<float> x{1.0f};
      work w = g.all_reduce(tensor_view<float>(x), reduce_op::sum);
      done_on_return += w.is_completed() ? 1 : 0;  // inline: finished when the call returns
      w.wait();
      pinned += allowed_cpus().size() == 1 && fits > 1 ? 1 : 0;
    });
    if (world == fits) {
      CHECK(done_on_return == world);
      if (fits > 1) CHECK(pinned == world);
    } else {
      CHECK(pinned == 0);  // more ranks than CPUs: nothing pinned, collectives on the workers
    }
  }
  // An explicit false is kept.
  process_group_options worker;
  worker.inline_collectives = false;
  worker.pin_threads = false;
  std::atomic<int> narrowed{0};
  run_local(fits, [&](local_group&) { narrowed += allowed_cpus() != allowed ? 1 : 0; }, worker);
  CHECK(narrowed == 0);
}

TEST_CASE("local: pin_threads puts each rank on its own allowed CPU when the ranks fill them", "[comm][local][pin]") {
  const std::vector<int> allowed = allowed_cpus();
  REQUIRE_FALSE(allowed.empty());
  process_group_options opts;
  opts.pin_threads = true;
  const int fits = static_cast<int>(allowed.size());
  std::vector<std::vector<int>> seen(static_cast<std::size_t>(fits));
  std::mutex m;
  run_local(fits, [&](local_group& g) {
    auto mine = allowed_cpus();  // this rank's thread's mask
    std::lock_guard lock(m);
    seen[static_cast<std::size_t>(g.rank())] = std::move(mine);
  }, opts);
  for (int r = 0; r < fits; ++r) CHECK(seen[static_cast<std::size_t>(r)] == std::vector<int>{allowed[static_cast<std::size_t>(r)]});
  // One rank more or fewer than the CPUs: nothing is pinned (a spare CPU stays usable).
  for (const int world : {fits + 1, fits - 1}) {
    if (world < 1) continue;
    CAPTURE(world);
    std::atomic<int> narrowed{0};
    run_local(world, [&](local_group&) {
      if (allowed_cpus() != allowed) ++narrowed;
    }, opts);
    CHECK(narrowed == 0);
  }
}
#endif

TEST_CASE("traffic: every rank counts the bytes a ring algorithm sends", "[comm][local][traffic]") {
  constexpr int world = 4;
  std::atomic<int> failures{0};
  run_local(world, [&](local_group& g) {
    std::vector<float> v(1000, 1.0f);             // 4000 bytes
    std::vector<float> all(4000);                 // 16000 bytes
    g.all_reduce(tensor_view<float>(v)).wait();   // 2 * 3/4 * 4000 = 6000
    g.all_gather(tensor_view<float>(v), tensor_view<float>(all)).wait();      // 3/4 * 16000 = 12000
    g.reduce_scatter(tensor_view<float>(all), tensor_view<float>(v)).wait();  // 12000
    g.broadcast(tensor_view<float>(v), 0).wait();                              // 4000
    g.barrier().wait();                                                        // nothing
    const auto t = g.traffic();
    if (t.calls != 4 || t.bytes_sent != 6000 + 12000 + 12000 + 4000) ++failures;
    g.reset_traffic();
    if (g.traffic().calls != 0 || g.traffic().bytes_sent != 0) ++failures;
  });
  CHECK(failures == 0);
  run_local(1, [&](local_group& g) {
    std::vector<float> v(10);
    g.all_reduce(tensor_view<float>(v)).wait();
    if (g.traffic().calls != 1 || g.traffic().bytes_sent != 0) ++failures;
  });
  CHECK(failures == 0);
}

TEST_CASE("local exchange: every rank sees every rank's buffers, and a mismatched call is named", "[comm][local][shared]") {
  std::vector<std::vector<int>> seen(3);
  run_local(3, [&](local_group& g) {
    std::vector<int> in(4, g.rank() + 1), out(4, 0);
    g.reset_traffic();
    g.exchange(in.data(), out.data(), in.size(), dtype::int32, [&](std::span<const local_group::peer_buffers> peers) {
      // Each rank writes its rank into slot `rank` of every rank's out.
      for (const auto& p : peers) static_cast<int*>(p.out)[g.rank()] = g.rank() + 10;
      auto& s = seen[static_cast<std::size_t>(g.rank())];
      for (const auto& p : peers) s.push_back(static_cast<const int*>(p.in)[3]);
    }).wait();
    CHECK(out == std::vector<int>{10, 11, 12, 0});
    CHECK(g.traffic().bytes_sent == 2 * 2 * 16 / 3);  // as an all_reduce of 16 bytes over 3 ranks
  });
  for (const auto& s : seen) CHECK(s == std::vector<int>{1, 2, 3});
  CHECK_THROWS_WITH(run_local(2, [](local_group& g) {
    std::vector<float> v(8);
    if (g.rank() == 0) {
      g.exchange(v.data(), v.data(), v.size(), dtype::float32, [](auto) {}).wait();
    } else {
      g.all_reduce(tensor_view<float>(v)).wait();
    }
  }), Catch::Contains("exchange(float32 x 8"));
}

TEMPLATE_TEST_CASE("host sum of divided inputs: the first pair in one pass gives the bits of one input at a time",
                   "[comm][local][reduce]", float, double, half, bfloat16) {
  using T = TestType;
  using F = std::conditional_t<std::is_same_v<T, double>, double, float>;
  // Awkward values as well as plain ones: subnormals, the largest finite, infinities, NaN, zeros of
  // both signs, values whose quotient rounds.
  const std::vector<F> specials{F(0), -F(0), F(1), F(-3), F(0.1), F(1e-3), std::numeric_limits<F>::denorm_min(),
                                std::numeric_limits<F>::min(), std::numeric_limits<F>::max(),
                                std::numeric_limits<F>::infinity(), -std::numeric_limits<F>::infinity(),
                                std::numeric_limits<F>::quiet_NaN(), F(65504), F(7.0 / 3.0)};
  const std::size_t n = 1000;
  std::vector<std::vector<T>> inputs(4, std::vector<T>(n));
  for (std::size_t q = 0; q < inputs.size(); ++q) {
    for (std::size_t i = 0; i < n; ++i) {
      const F v = i < specials.size() * specials.size() ? specials[(i + q * 5) % specials.size()]
                                                        : F(static_cast<double>((i * 37 + q * 11) % 1001) / 7.0 - 60.0);
      inputs[q][i] = T(v);
    }
  }
  auto bits = [](const std::vector<T>& v) {
    std::vector<unsigned char> b(v.size() * sizeof(T));
    std::memcpy(b.data(), v.data(), b.size());
    return b;
  };
  for (std::size_t count = 1; count <= inputs.size(); ++count) {
    for (double d : {2.0, 3.0, 4.0, 0.5}) {
      INFO("inputs " << count << ", divisor " << d);
      std::vector<T> one_at_a_time(n), fused(n);
      for (std::size_t q = 0; q < count; ++q) {
        detail::add_divided_typed(one_at_a_time.data(), inputs[q].data(), n, d, q == 0);
      }
      detail::sum_divided_typed(fused.data(), [&](std::size_t q) { return inputs[q].data(); }, count, n, d);
      CHECK(bits(fused) == bits(one_at_a_time));
      std::vector<T> tagged(n);
      detail::host_sum_divided(tagged.data(), [&](std::size_t q) -> const void* { return inputs[q].data(); }, count, n,
                               dtype_of<T>, d);
      CHECK(bits(tagged) == bits(one_at_a_time));
    }
  }
}
