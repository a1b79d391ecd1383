// Schedules as data (orders, validation, replay) and the partitioner.
#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <partrain/parallel/pipeline/partition.hpp>
#include <partrain/parallel/pipeline/schedule.hpp>

using namespace partrain;

TEST_CASE("1F1B orders for p=4, m=8 match the known table", "[parallel][pipeline][schedule]") {
  const auto s = make_1f1b_schedule(4, 8);
  CHECK(s.to_string(0) == "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
  CHECK(s.to_string(1) == "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7");
  CHECK(s.to_string(2) == "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7");
  CHECK(s.to_string(3) == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
  CHECK(s.to_string().find("stage 3: F0 B0 F1 B1") != std::string::npos);
}

TEST_CASE("GPipe runs all forwards then all backwards", "[parallel][pipeline][schedule]") {
  const auto s = make_gpipe_schedule(3, 4);
  for (int r = 0; r < 3; ++r) CHECK(s.to_string(r) == "F0 F1 F2 F3 B0 B1 B2 B3");
}

TEST_CASE("peak in-flight micro-batches: min(p-s, m) for 1F1B, m for GPipe", "[parallel][pipeline][schedule]") {
  for (int p : {1, 2, 3, 4, 6}) {
    for (int m : {1, 2, 4, 8, 16}) {
      const auto f = make_1f1b_schedule(p, m).simulate();
      const auto g = make_gpipe_schedule(p, m).simulate();
      for (int s = 0; s < p; ++s) {
        INFO("p=" << p << " m=" << m << " s=" << s);
        CHECK(f.peak_in_flight[static_cast<std::size_t>(s)] == std::min(p - s, m));
        CHECK(g.peak_in_flight[static_cast<std::size_t>(s)] == m);
      }
    }
  }
}

TEST_CASE("replay with unit costs reproduces the known makespans", "[parallel][pipeline][schedule]") {
  // p=4, m=8, T_F=1, T_B=2: 33 for GPipe and 1F1B; interleaving divides the bubble by v.
  CHECK(make_gpipe_schedule(4, 8).simulate(1, 2).makespan == Approx(33));
  CHECK(make_1f1b_schedule(4, 8).simulate(1, 2).makespan == Approx(33));
  CHECK(make_interleaved_1f1b_schedule(4, 8, 2).simulate(1, 2).makespan == Approx(28.5));
  CHECK(make_interleaved_1f1b_schedule(4, 8, 4).simulate(1, 2).makespan == Approx(26.25));
  for (int p : {2, 4}) {
    for (int m : {1, 2, 4, 8, 16}) {
      const auto st = make_1f1b_schedule(p, m).simulate(1, 2);
      CHECK(st.bubble_fraction == Approx(static_cast<double>(p - 1) / (m + p - 1)));
    }
  }
}

TEST_CASE("interleaved 1F1B follows Megatron's order and passes the dependency checks", "[parallel][pipeline][schedule]") {
  const auto s = make_interleaved_1f1b_schedule(4, 8, 2);
  CHECK(s.to_string(0).rfind("F0.s0 F1.s0 F2.s0 F3.s0 F0.s4 F1.s4 F2.s4 F3.s4 F4.s0 F5.s0 F6.s0 B0.s4 F7.s0 B1.s4 "
                             "F4.s4 B2.s4",
                             0) == 0);
  for (int p : {2, 3, 4}) {
    for (int v : {2, 3, 4}) {
      for (int k : {1, 2, 3}) {
        const int m = k * p;
        INFO("p=" << p << " m=" << m << " v=" << v);
        const auto t = make_interleaved_1f1b_schedule(p, m, v);  // the constructor validates
        const auto st = t.simulate(1, 2);
        // Bubble (idle time) is at most the 1F1B bubble divided by v.
        CHECK(st.makespan - st.ideal <= (p - 1) * 3.0 / v + 1e-9);
        // Every rank's order still holds every (F, B) x (micro-batch, chunk) once.
        CHECK(t.order(0).size() == static_cast<std::size_t>(2 * m * v));
      }
    }
  }
  CHECK_THROWS_WITH(make_interleaved_1f1b_schedule(4, 6, 2), Catch::Contains("multiple of the stages"));
}

TEST_CASE("a user's schedule is parsed, printed back and validated", "[parallel][pipeline][schedule]") {
  const auto s = parse_schedule("mine", 2, 2, 1, "stage 0: F0 F1 B0 B1\nstage 1: F0 B0 F1 B1\n");
  CHECK(s.to_string(0) == "F0 F1 B0 B1");
  CHECK(s.to_string(1) == "F0 B0 F1 B1");
  // Round trip of a generated interleaved table.
  const auto i = make_interleaved_1f1b_schedule(2, 4, 2);
  std::string text;
  for (int r = 0; r < 2; ++r) text += i.to_string(r) + "\n";
  const auto back = parse_schedule("copy", 2, 4, 2, text);
  for (int r = 0; r < 2; ++r) CHECK(std::ranges::equal(back.order(r), i.order(r)));
}

TEST_CASE("bad user schedules are refused with a clear error", "[parallel][pipeline][schedule]") {
  using Catch::Contains;
  CHECK_THROWS_WITH(parse_schedule("dup", 2, 2, 1, "F0 F0 B0 B1\nF0 B0 F1 B1"), Contains("runs F0 twice"));
  CHECK_THROWS_WITH(parse_schedule("missing", 2, 2, 1, "F0 F1 B0\nF0 B0 F1 B1"), Contains("never runs B1"));
  CHECK_THROWS_WITH(parse_schedule("early", 2, 2, 1, "F0 B1 F1 B0\nF0 B0 F1 B1"), Contains("before its forward"));
  CHECK_THROWS_WITH(parse_schedule("range", 2, 2, 1, "F0 F1 F2 B0 B1\nF0 B0 F1 B1"), Contains("micro-batch 2"));
  CHECK_THROWS_WITH(parse_schedule("short", 2, 2, 1, "F0 F1 B0 B1"), Contains("orders for 1 stages, expected 2"));
  CHECK_THROWS_WITH(parse_schedule("junk", 2, 2, 1, "F0 X1 B0 B1\nF0 B0 F1 B1"), Contains("cannot read 'X1'"));
  // Stage 0 wants B0 before sending F1; stage 1 wants F1 before B0: neither can move.
  CHECK_THROWS_WITH(parse_schedule("deadlock", 2, 2, 1, "F0 B0 F1 B1\nF1 B1 F0 B0"), Contains("deadlocks"));
  CHECK_THROWS_WITH(parse_schedule("deadlock", 2, 2, 1, "F0 B0 F1 B1\nF1 B1 F0 B0"),
                    Contains("stage 0 waits at B0 for B0 of global stage 1"));
  CHECK_THROWS_AS(make_1f1b_schedule(0, 4), invalid_argument_error);
}

namespace {
// Smallest bottleneck over every contiguous split (exponential; fine for n <= 10).
double brute_bottleneck(const std::vector<double>& c, int parts) {
  const std::size_t n = c.size();
  double best = std::numeric_limits<double>::infinity();
  std::function<void(std::size_t, int, double)> go = [&](std::size_t start, int left, double worst) {
    if (left == 1) {
      double s = 0;
      for (std::size_t i = start; i < n; ++i) s += c[i];
      best = std::min(best, std::max(worst, s));
      return;
    }
    double s = 0;
    for (std::size_t end = start + 1; n - end >= static_cast<std::size_t>(left - 1); ++end) {
      s += c[end - 1];
      go(end, left - 1, std::max(worst, s));
    }
  };
  go(0, parts, 0);
  return best;
}
}  // namespace

TEST_CASE("partitioner returns the optimal bottleneck", "[parallel][pipeline][partition]") {
  const std::vector<double> c{1, 2, 3, 4, 5, 6, 7, 8, 9};
  const auto p = partition_balanced(c, 3);
  CHECK(p.bottleneck() == 17);
  CHECK(p.bounds.front() == 0);
  CHECK(p.bounds.back() == 9);
  CHECK(p.to_string().find("stage 2: layers [7, 9) cost 17") != std::string::npos);
  // One heavy layer must sit alone.
  CHECK(partition_balanced(std::vector<double>{1, 1, 10, 1, 1}, 3).bottleneck() == 10);
  std::mt19937 gen(7);
  for (int trial = 0; trial < 200; ++trial) {
    const std::size_t n = 1 + gen() % 10;
    const int parts = 1 + static_cast<int>(gen() % n);
    std::vector<double> w(n);
    for (auto& x : w) x = static_cast<double>(gen() % 20);
    const auto q = partition_balanced(w, parts);
    INFO("trial " << trial);
    REQUIRE(q.stages() == parts);
    for (int s = 0; s < parts; ++s) CHECK(q.first(s) < q.last(s));
    CHECK(q.bottleneck() == brute_bottleneck(w, parts));
  }
}

TEST_CASE("uniform partition and bad requests", "[parallel][pipeline][partition]") {
  const auto u = partition_uniform(10, 4);
  CHECK(u.bounds == std::vector<std::size_t>{0, 3, 6, 8, 10});
  CHECK_THROWS_WITH(partition_uniform(3, 4), Catch::Contains("cannot split 3 layers into 4 stages"));
  CHECK_THROWS_WITH(partition_balanced(std::vector<double>{1, -2}, 1), Catch::Contains("cost of layer 1"));
}
