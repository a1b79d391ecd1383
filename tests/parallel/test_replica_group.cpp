// Fault-tolerant data parallelism: the quorum rule, and replica_group with its lighthouse on
// threads (a replica's thread ending) and, where Gloo is built, as processes one of which is
// SIGKILLed: the survivors keep going, a spare takes the lost slot after healing from a live peer,
// and the final parameters equal a run without failures bit for bit.
#include <catch2/catch.hpp>

#include <partrain/comm/local.hpp>
#include <partrain/parallel/lighthouse.hpp>
#include <partrain/parallel/quorum.hpp>
#include <partrain/parallel/replica_group.hpp>

#include "replica_toy.hpp"
#include "test_stores.hpp"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

using namespace partrain;
using namespace std::chrono_literals;
using partrain::testing::fault_free;
using partrain::testing::toy_model;

namespace {

struct killed {};  // thrown by a replica the test ends

struct replica_outcome {
  std::vector<float> w;   // its parameters at the end (members)
  bool trained = false;   // finished as a member
  bool ended = false;     // its thread was ended by the test
  int failures = 0;
  int heals = 0;
  std::int64_t step = 0;
  std::string error;
};

// `slots` + `spares` replicas as threads with a lighthouse; dies(replica, step) ends that
// replica's thread before it computes that step.
std::vector<replica_outcome> run_threads(int slots, int spares, int steps,
                                         const std::function<bool(int, std::int64_t)>& dies,
                                         world_size_mode mode = world_size_mode::fixed_with_spares) {
  const int replicas = slots + spares;
  auto s = std::make_shared<testing::memory_store>();
  lighthouse lh(s, {.replicas = replicas,
                    .policy = {.mode = mode, .slots = slots, .min_replicas = 1},
                    .heartbeat_timeout = 400ms,
                    .join_timeout = 5s,
                    .tick = 5ms});
  local_group_registry registry({.timeout = 3000ms});
  std::vector<replica_outcome> out(static_cast<std::size_t>(replicas));
  {
    std::vector<std::jthread> threads;
    for (int r = 0; r < replicas; ++r) {
      threads.emplace_back([&, r] {
        auto& o = out[static_cast<std::size_t>(r)];
        toy_model m;
        try {
          replica_group rg(
              s, [&](std::int64_t id, int rank, int size) { return registry.make(id, rank, size); }, m.io(),
              {.replica = r, .heartbeat_interval = 20ms, .quorum_timeout = 10s});
          try {
            while (rg.current_step() < steps) {
              const bool more = rg.step(
                  [&](process_group& g, int slot, std::int64_t step) {
                    if (dies(r, step)) throw killed{};
                    m.compute(g, slot, step);
                  },
                  [&] { m.apply(slots); });
              if (!more) break;
            }
            o.trained = rg.current_step() == steps && rg.slot() >= 0;
            rg.finish();
          } catch (const killed&) {
            o.ended = true;
          }
          o.failures = rg.failures();
          o.heals = rg.heals();
          o.step = rg.current_step();
          o.w = m.w;
        } catch (const std::exception& e) {
          o.error = e.what();
        }
      });
    }
  }
  return out;
}

}  // namespace

TEST_CASE("quorum: fixed world with spares keeps slots and fills a lost one with the lowest spare", "[parallel][ft]") {
  const quorum_policy p{.mode = world_size_mode::fixed_with_spares, .slots = 3};
  const std::vector<int> all{4, 0, 2, 1, 3};
  const auto first = compute_quorum(quorum{}, all, 5, p);
  REQUIRE(first);
  CHECK(first->id == 0);
  CHECK(first->members == std::vector<int>{0, 1, 2});
  CHECK(first->spares == std::vector<int>{3, 4});
  // Replica 1 is lost: slot 1 goes to spare 3, the others stay where they were.
  const std::vector<int> after{0, 2, 3, 4};
  const auto second = compute_quorum(*first, after, 4, p);
  REQUIRE(second);
  CHECK(second->id == 1);
  CHECK(second->members == std::vector<int>{0, 3, 2});
  CHECK(second->spares == std::vector<int>{4});
  // Not enough replicas for every slot: no quorum.
  CHECK_FALSE(compute_quorum(*second, std::vector<int>{0, 2}, 2, p));
  // A minority of the heartbeating replicas can never form one (no split brain).
  CHECK_FALSE(compute_quorum(*first, std::vector<int>{0, 1, 2}, 7, p));
}

TEST_CASE("quorum: dynamic keeps the members' order, appends joiners, needs min_replicas", "[parallel][ft]") {
  const quorum_policy p{.mode = world_size_mode::dynamic, .min_replicas = 2};
  quorum q{.id = 4, .members = {3, 0, 2}};
  const auto next = compute_quorum(q, std::vector<int>{5, 2, 3, 1}, 4, p);
  REQUIRE(next);
  CHECK(next->id == 5);
  CHECK(next->members == std::vector<int>{3, 2, 1, 5});
  CHECK_FALSE(compute_quorum(q, std::vector<int>{2}, 1, p));
}

TEST_CASE("quorum: the store's text round-trips and bad text is refused by name", "[parallel][ft]") {
  const quorum q{.id = 12, .members = {0, 7, 2}, .spares = {9}};
  CHECK(quorum::decode(q.encode()) == q);
  CHECK(quorum::decode(quorum{.id = 0, .members = {1}}.encode()).spares.empty());
  CHECK_THROWS_WITH(quorum::decode("12;0,x;"), Catch::Contains("expected 'id;members;spares'"));
  CHECK_THROWS_AS(quorum::decode("12"), data_error);
}

TEST_CASE("replica_group on threads: no failure trains exactly as plain data parallel", "[parallel][ft][threads]") {
  const auto want = fault_free(3, 12);
  const auto out = run_threads(3, 1, 12, [](int, std::int64_t) { return false; });
  for (int r = 0; r < 3; ++r) {
    const auto& o = out[static_cast<std::size_t>(r)];
    INFO("replica " << r << ": " << o.error);
    CHECK(o.trained);
    CHECK(o.failures == 0);
    CHECK(o.w == want);
  }
  // The spare never took part, and was told when the job ended.
  CHECK_FALSE(out[3].trained);
  CHECK(out[3].error.empty());
  CHECK(out[3].step == 0);
}

TEST_CASE("replica_group on threads: a spare takes a lost replica's slot, the result is bit-identical",
          "[parallel][ft][threads]") {
  const int steps = 14;
  const auto want = fault_free(3, steps);
  // Replica 1 ends before step 5, replica 2 before step 9: spares 3 and 4 take their slots.
  const auto out = run_threads(3, 2, steps, [](int r, std::int64_t s) { return (r == 1 && s == 5) || (r == 2 && s == 9); });
  for (int r : {0, 3, 4}) {
    const auto& o = out[static_cast<std::size_t>(r)];
    INFO("replica " << r << ": " << o.error);
    CHECK(o.error.empty());
    CHECK(o.trained);
    CHECK(o.w == want);
  }
  CHECK(out[1].ended);
  CHECK(out[2].ended);
  // Replica 0 lived through both failures; each spare healed once from a live peer.
  CHECK(out[0].failures == 2);
  CHECK(out[0].heals == 0);
  CHECK(out[3].heals == 1);
  CHECK(out[4].heals == 1);
}

TEST_CASE("replica_group on threads: with no spare left the survivors wait, then fail naming the quorum",
          "[parallel][ft][threads]") {
  // Two slots, no spare: a lost replica leaves a slot nobody can fill.
  auto s = std::make_shared<testing::memory_store>();
  lighthouse lh(s, {.replicas = 2, .policy = {.slots = 2}, .heartbeat_timeout = 300ms, .join_timeout = 5s, .tick = 5ms});
  local_group_registry registry({.timeout = 3000ms});
  std::string error;
  std::thread lost([&] {
    toy_model m;
    replica_group rg(s, [&](std::int64_t id, int rank, int size) { return registry.make(id, rank, size); }, m.io(),
                     {.replica = 1, .heartbeat_interval = 20ms, .quorum_timeout = 1s});
    rg.step([&](process_group& g, int slot, std::int64_t step) { m.compute(g, slot, step); }, [&] { m.apply(2); });
  });
  {
    toy_model m;
    replica_group rg(s, [&](std::int64_t id, int rank, int size) { return registry.make(id, rank, size); }, m.io(),
                     {.replica = 0, .heartbeat_interval = 20ms, .quorum_timeout = 1s});
    rg.step([&](process_group& g, int slot, std::int64_t step) { m.compute(g, slot, step); }, [&] { m.apply(2); });
    lost.join();  // replica 1 has left
    try {
      rg.step([&](process_group& g, int slot, std::int64_t step) { m.compute(g, slot, step); }, [&] { m.apply(2); });
    } catch (const timeout_error& e) {
      error = e.what();
    }
    CHECK(rg.failures() == 1);
  }
  CHECK_THAT(error, Catch::Contains("replica 0 waited 1000 ms for a quorum after quorum 0 failed"));
}
