// Fault-tolerant data parallelism: the quorum rule, and replica_group with its lighthouse on
// threads (a replica's thread ending) and, where Gloo is built, as processes one of which is
// SIGKILLed: the survivors keep going, a spare takes the lost slot after healing from a live peer,
// and the final parameters equal a run without failures bit for bit.
#include <catch2/catch.hpp>

#include <partrain/comm/local.hpp>
#include <partrain/parallel/lighthouse.hpp>
#include <partrain/parallel/quorum.hpp>
#include <partrain/parallel/replica_group.hpp>
#include <partrain/rendezvous/tcp_store.hpp>
#include <partrain/rendezvous/tcp_store_server.hpp>

#include "replica_toy.hpp"
#include "test_stores.hpp"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
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
  std::int64_t failed_at = -1;  // the step of its first failure
  std::int64_t step = 0;
  std::string error;
};

// `slots` + `spares` replicas as threads with a lighthouse; dies(replica, step) ends that
// replica's thread before it computes that step.
// save_fails(replica) true: that replica's state save throws (it dies while sending its state).
// dies_after(replica, step) true: that replica's thread ends after computing the step, where its
// peers are in the step's agreement round (every quorum_round_every-th step) or applying it.
std::vector<replica_outcome> run_threads(int slots, int spares, int steps,
                                         const std::function<bool(int, std::int64_t)>& dies,
                                         const std::function<bool(int)>& save_fails = [](int) { return false; },
                                         const std::function<bool(int, std::int64_t)>& dies_after =
                                             [](int, std::int64_t) { return false; }) {
  const int replicas = slots + spares;
  auto s = std::make_shared<testing::memory_store>();
  lighthouse lh(s, {.replicas = replicas,
                    .policy = {.mode = world_size_mode::fixed_with_spares, .slots = slots},
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
        auto io = m.io();
        io.save = [&, save = io.save] {
          if (save_fails(r)) throw killed{};
          return save();
        };
        try {
          replica_group rg(
              s, [&](std::int64_t id, int rank, int size) { return registry.make(id, rank, size); }, io,
              {.replica = r, .heartbeat_interval = 20ms, .quorum_timeout = 10s});
          try {
            while (rg.current_step() < steps) {
              const bool more = rg.step(
                  [&](process_group& g, int slot, std::int64_t step) {
                    if (dies(r, step)) throw killed{};
                    m.compute(g, slot, step);
                    if (dies_after(r, step)) throw killed{};
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
          for (const auto& e : rg.events()) {
            if (e.what == replica_event::kind::failed && o.failed_at < 0) o.failed_at = e.step;
          }
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
  std::vector<replica_event::kind> heard;
  std::thread lost([&] {
    toy_model m;
    replica_group rg(s, [&](std::int64_t id, int rank, int size) { return registry.make(id, rank, size); }, m.io(),
                     {.replica = 1, .heartbeat_interval = 20ms, .quorum_timeout = 1s});
    rg.step([&](process_group& g, int slot, std::int64_t step) { m.compute(g, slot, step); }, [&] { m.apply(2); });
  });
  {
    toy_model m;
    replica_group rg(s, [&](std::int64_t id, int rank, int size) { return registry.make(id, rank, size); }, m.io(),
                     {.replica = 0,
                      .heartbeat_interval = 20ms,
                      .quorum_timeout = 1s,
                      .on_event = [&](const replica_event& e) { heard.push_back(e.what); }});
    rg.step([&](process_group& g, int slot, std::int64_t step) { m.compute(g, slot, step); }, [&] { m.apply(2); });
    lost.join();  // replica 1 has left
    try {
      rg.step([&](process_group& g, int slot, std::int64_t step) { m.compute(g, slot, step); }, [&] { m.apply(2); });
    } catch (const timeout_error& e) {
      error = e.what();
    }
    CHECK(rg.failures() == 1);
    // The callback heard every event as it happened: joined, then failed.
    CHECK(heard == std::vector<replica_event::kind>{replica_event::kind::joined, replica_event::kind::failed});
  }
  CHECK_THAT(error, Catch::Contains("replica 0 waited 1000 ms for a quorum after quorum 0 failed"));
}

TEST_CASE("replica_group on threads: a last step that commits on one member and fails on the other still ends "
          "with both at the job's end", "[parallel][ft][threads]") {
  // Two slots, no spare. Replica 1's last step fails after its all-reduce completed everywhere
  // (its peer commits and finishes): the last step's agreement fails on replica 0, which joins the
  // next quorum, where replica 1 heals from it.
  constexpr int steps = 6;
  auto s = std::make_shared<testing::memory_store>();
  lighthouse lh(s, {.replicas = 2, .policy = {.slots = 2}, .heartbeat_timeout = 400ms, .join_timeout = 5s, .tick = 5ms,
                    .recovery_timeout = 3s});
  local_group_registry registry({.timeout = 3000ms});
  replica_outcome out[2];
  {
    std::vector<std::jthread> threads;
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, r] {
        auto& o = out[r];
        toy_model m;
        try {
          replica_group rg(s, [&](std::int64_t id, int rank, int size) { return registry.make(id, rank, size); }, m.io(),
                           {.replica = r, .heartbeat_interval = 20ms, .quorum_timeout = 10s});
          bool failed_once = false;
          while (rg.current_step() < steps) {
            if (!rg.step(
                    [&](process_group& g, int slot, std::int64_t step) {
                      m.compute(g, slot, step);
                      if (r == 1 && step == steps - 1 && !failed_once) {
                        failed_once = true;
                        throw communication_error("injected: the last step's collective failed on replica 1 alone");
                      }
                    },
                    [&] { m.apply(2); }))
              break;
          }
          o.trained = rg.current_step() == steps && rg.slot() >= 0;
          rg.finish();
          o.failures = rg.failures();
          o.heals = rg.heals();
          o.w = m.w;
        } catch (const std::exception& e) {
          o.error = e.what();
        }
      });
    }
  }
  const auto want = fault_free(2, steps);
  for (int r = 0; r < 2; ++r) {
    INFO("replica " << r << ": " << out[r].error);
    CHECK(out[r].error.empty());
    CHECK(out[r].trained);
    CHECK(out[r].w == want);
    CHECK(out[r].failures == 1);  // replica 1 its last step; replica 0 the agreement
  }
  CHECK(out[1].heals == 1);
}

namespace {

// `started` replicas (ids 0 ..) as threads under a lighthouse of `lo`, each training 10 steps of
// the toy with long waits of its own, so only the lighthouse's verdict can end them in time;
// dies(replica, step) ends one. Returns each replica's error; the test fails past 10 s.
std::vector<std::string> run_until_given_up(const lighthouse_options& lo, int started,
                                            const std::function<bool(int, std::int64_t)>& dies) {
  auto s = std::make_shared<testing::memory_store>();
  lighthouse lh(s, lo);
  local_group_registry registry({.timeout = 3000ms});
  std::vector<std::string> errors(static_cast<std::size_t>(started));
  const auto start = std::chrono::steady_clock::now();
  {
    std::vector<std::jthread> threads;
    for (int r = 0; r < started; ++r) {
      threads.emplace_back([&, r] {
        toy_model m;
        try {
          replica_group rg(s, [&](std::int64_t id, int rank, int size) { return registry.make(id, rank, size); }, m.io(),
                           {.replica = r, .heartbeat_interval = 20ms, .quorum_timeout = 20s});
          while (rg.current_step() < 10) {
            if (!rg.step(
                    [&](process_group& g, int slot, std::int64_t step) {
                      if (dies(r, step)) throw killed{};
                      m.compute(g, slot, step);
                    },
                    [&] { m.apply(lo.policy.slots); }))
              break;
          }
        } catch (const killed&) {
        } catch (const std::exception& e) {
          errors[static_cast<std::size_t>(r)] = e.what();
        }
      });
    }
  }
  CHECK(std::chrono::steady_clock::now() - start < 10s);
  return errors;
}

}  // namespace

TEST_CASE("replica_group on threads: a lighthouse that cannot form a quorum gives the job up, and every replica says why",
          "[parallel][ft][threads]") {
  // Replica 0 is lost at step 3, the spare (2) at step 6: two slots, one replica left.
  const auto errors = run_until_given_up({.replicas = 3, .policy = {.slots = 2}, .heartbeat_timeout = 300ms,
                                          .join_timeout = 5s, .tick = 5ms, .recovery_timeout = 300ms},
                                         3, [](int r, std::int64_t step) { return (r == 0 && step == 3) || (r == 2 && step == 6); });
  INFO(errors[1]);
  CHECK_THAT(errors[1], Catch::Contains("the lighthouse gave the job up: no quorum could replace quorum") &&
                            Catch::Contains("2 slots to fill"));
}

TEST_CASE("replica_group on threads: a first quorum that cannot form ends the job with the reason", "[parallel][ft][threads]") {
  // Three slots, two replicas ever start: the lighthouse gives up after join_timeout + recovery_timeout.
  const auto errors = run_until_given_up({.replicas = 3, .policy = {.slots = 3}, .heartbeat_timeout = 300ms,
                                          .join_timeout = 200ms, .tick = 5ms, .recovery_timeout = 300ms},
                                         2, [](int, std::int64_t) { return false; });
  for (const auto& e : errors) {
    CHECK_THAT(e, Catch::Contains("the lighthouse gave the job up: the first quorum could not form in 500 ms") &&
                      Catch::Contains("2 replica(s) ready of 2 alive, 3 slots to fill"));
  }
}

TEST_CASE("replica_group on threads: two replicas lost at once, and a source lost while healing", "[parallel][ft][threads]") {
  const int steps = 12;
  const auto want = fault_free(3, steps);
  SECTION("two at once") {
    const auto out = run_threads(3, 2, steps, [](int r, std::int64_t s) { return (r == 1 || r == 2) && s == 4; });
    for (int r : {0, 3, 4}) {
      INFO("replica " << r << ": " << out[static_cast<std::size_t>(r)].error);
      CHECK(out[static_cast<std::size_t>(r)].trained);
      CHECK(out[static_cast<std::size_t>(r)].w == want);
    }
    CHECK(out[0].failures == 1);  // one new quorum filled both slots
  }
  SECTION("the replica sending the state dies") {
    // Replica 1 is lost at step 5; replica 0, the source of the spare's heal, dies sending it;
    // the next quorum heals both spares from replica 2.
    const auto out = run_threads(3, 2, steps, [](int r, std::int64_t s) { return r == 1 && s == 5; },
                                 [](int r) { return r == 0; });
    CHECK_FALSE(out[0].trained);
    for (int r : {2, 3, 4}) {
      INFO("replica " << r << ": " << out[static_cast<std::size_t>(r)].error);
      CHECK(out[static_cast<std::size_t>(r)].trained);
      CHECK(out[static_cast<std::size_t>(r)].w == want);
    }
    CHECK(out[2].failures == 2);  // the step, then the heal
    CHECK(out[3].heals == 1);     // healed once, from replica 2
    CHECK(out[4].heals == 1);
  }
  SECTION("a replica lost in the agreement round") {
    // Step 7 is the first round (quorum_round_every 8): replica 1 computes it with its peers, then
    // leaves while they all-reduce their votes. The step is applied nowhere; the spare heals to 7.
    const auto out = run_threads(3, 1, steps, [](int, std::int64_t) { return false; }, [](int) { return false; },
                                 [](int r, std::int64_t s) { return r == 1 && s == 7; });
    CHECK(out[1].ended);
    CHECK(out[1].step == 7);
    for (int r : {0, 2, 3}) {
      INFO("replica " << r << ": " << out[static_cast<std::size_t>(r)].error);
      CHECK(out[static_cast<std::size_t>(r)].trained);
      CHECK(out[static_cast<std::size_t>(r)].w == want);
    }
    CHECK(out[0].failures == 1);  // the round failed: the step was dropped, not applied
    CHECK(out[0].failed_at == 7);
    CHECK(out[2].failed_at == 7);
    CHECK(out[3].heals == 1);
  }
}

namespace {

// A group of another backend, for the refusals: never asked to communicate.
class other_backend final : public process_group {
 public:
  other_backend(std::string_view name, bool host_memory) : process_group(0, 1, {}), name_(name), host_(host_memory) {}
  [[nodiscard]] std::string_view backend() const noexcept override { return name_; }
  [[nodiscard]] bool accepts(device_kind k) const noexcept override { return (k == device_kind::cpu) == host_; }

 protected:
  work do_all_reduce(raw_tensor, reduce_op) override { throw std::logic_error("unused"); }
  work do_broadcast(raw_tensor, int) override { throw std::logic_error("unused"); }
  work do_reduce(raw_tensor, int, reduce_op) override { throw std::logic_error("unused"); }
  work do_all_gather(raw_tensor, raw_tensor) override { throw std::logic_error("unused"); }
  work do_reduce_scatter(raw_tensor, raw_tensor, reduce_op) override { throw std::logic_error("unused"); }
  work do_barrier() override { throw std::logic_error("unused"); }
  work do_send(raw_tensor, int, int) override { throw std::logic_error("unused"); }
  work do_recv(raw_tensor, int, int) override { throw std::logic_error("unused"); }

 private:
  std::string_view name_;
  bool host_;
};

}  // namespace

TEST_CASE("replica_group refuses an mpi group and a device-only group by name", "[parallel][ft][errors]") {
  const bool mpi = GENERATE(true, false);
  CAPTURE(mpi);
  auto s = std::make_shared<testing::memory_store>();
  lighthouse lh(s, {.replicas = 1, .policy = {.slots = 1}, .tick = 5ms});
  toy_model m;
  replica_group rg(
      s, [&](std::int64_t, int, int) { return std::make_unique<other_backend>(mpi ? "mpi" : "nccl", /*host_memory=*/mpi); }, m.io(),
      {.replica = 0, .heartbeat_interval = 20ms, .quorum_timeout = 5s});
  const auto step = [&] {
    (void)rg.step([&](process_group& g, int slot, std::int64_t k) { m.compute(g, slot, k); }, [&] { m.apply(1); });
  };
  if (mpi) {
    CHECK_THROWS_WITH(step(), Catch::Contains("an mpi group cannot be a quorum's group") &&
                                  Catch::Contains("Open MPI cannot rebuild a communicator"));
  } else {
    CHECK_THROWS_WITH(step(), Catch::Contains("the nccl backend carries device memory only") && Catch::Contains("use gloo"));
  }
  CHECK(rg.current_step() == 0);
}

TEST_CASE("replica_rows shares a global batch out exactly, whatever the membership", "[parallel][ft]") {
  for (int members = 1; members <= 5; ++members) {
    std::size_t next = 0;
    for (int slot = 0; slot < members; ++slot) {
      const auto r = replica_rows(13, slot, members);
      CHECK(r.first == next);
      CHECK(r.count + 1 >= 13 / static_cast<std::size_t>(members));
      next += r.count;
    }
    CHECK(next == 13);
  }
  CHECK_THROWS_WITH(replica_rows(8, 2, 2), Catch::Contains("slot 2 of 2 members"));
}

namespace {
// Dynamic mode's model: a gradient summed over rows (each row its own term), normalized by the
// global batch, so any membership computes the same sum.
struct row_model {
  static constexpr std::size_t n = 8;
  static constexpr std::size_t global = 12;
  std::vector<float> w = std::vector<float>(n, 0.25f);
  std::vector<float> grad = std::vector<float>(n, 0.0f);
  std::vector<std::size_t> rows{};  // the rows of the step in flight

  void compute(process_group& g, std::int64_t step) {
    const auto share = replica_rows(global, g.rank(), g.size());
    rows.clear();
    std::ranges::fill(grad, 0.0f);
    for (std::size_t k = 0; k < share.count; ++k) {
      const std::size_t row = static_cast<std::size_t>(step) * global + share.first + k;
      rows.push_back(row);
      for (std::size_t i = 0; i < n; ++i) grad[i] += std::sin(w[i] + 0.01f * static_cast<float>(row + i));
    }
    g.all_reduce(tensor_view<float>(grad), reduce_op::sum).wait();
  }
  void apply() {
    for (std::size_t i = 0; i < n; ++i) w[i] -= 0.1f * grad[i] / static_cast<float>(global);
  }
};
}  // namespace

TEST_CASE("replica_group dynamic: a lost member, a late joiner, every row trained exactly once", "[parallel][ft][threads]") {
  constexpr int steps = 48;
  constexpr std::int64_t join_at = 20;
  // The reference: two members throughout.
  std::vector<float> want;
  run_local(2, [&](local_group& g) {
    row_model m;
    for (int s = 0; s < steps; ++s) {
      m.compute(g, s);
      m.apply();
    }
    if (g.rank() == 0) want = m.w;
  });

  auto s = std::make_shared<testing::memory_store>();
  lighthouse lh(s, {.replicas = 4, .policy = {.mode = world_size_mode::dynamic, .min_replicas = 2},
                    .heartbeat_timeout = 1000ms, .join_timeout = 300ms, .tick = 5ms});
  local_group_registry registry({.timeout = 3000ms});
  std::vector<std::atomic<int>> seen(static_cast<std::size_t>(steps) * row_model::global);
  std::vector<std::vector<float>> final_w(4);
  std::vector<std::string> errors(4);
  std::vector<int> heals(4, 0);
  std::atomic<bool> joiner_started{false};
  auto replica = [&](int r) {
    row_model m;
    try {
      replica_group rg(s, [&](std::int64_t id, int rank, int size) { return registry.make(id, rank, size); },
                       {.save = [&] { return std::vector<std::byte>(reinterpret_cast<const std::byte*>(m.w.data()),
                                                                    reinterpret_cast<const std::byte*>(m.w.data() + m.w.size())); },
                        .load = [&](std::span<const std::byte> b) { std::memcpy(m.w.data(), b.data(), b.size()); }},
                       {.replica = r, .heartbeat_interval = 20ms, .quorum_timeout = 10s});
      while (rg.current_step() < steps) {
        const bool more = rg.step(
            [&](process_group& g, int, std::int64_t step) {
              if (r == 2 && step == 5) throw killed{};
              // The members wait at join_at until the lighthouse has admitted the joiner and their
              // heartbeats have seen it, so the test does not depend on how fast the steps run.
              if (step == join_at) {
                joiner_started = true;
                const auto until = std::chrono::steady_clock::now() + 10s;
                auto admitted = [&] {
                  const auto q = lh.current();
                  return q.slot_of(3) >= 0 && rg.newest_quorum_seen() >= q.id;
                };
                while (!admitted() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(2ms);
              }
              m.compute(g, step);
            },
            [&] {
              m.apply();
              for (auto row : m.rows) ++seen[row];
            });
        if (!more) break;
      }
      heals[static_cast<std::size_t>(r)] = rg.heals();
      rg.finish();
      final_w[static_cast<std::size_t>(r)] = m.w;
    } catch (const killed&) {
    } catch (const std::exception& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
    }
  };
  {
    std::vector<std::jthread> threads;
    for (int r = 0; r < 3; ++r) threads.emplace_back(replica, r);
    const auto until = std::chrono::steady_clock::now() + 20s;
    while (!joiner_started && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(2ms);
    threads.emplace_back(replica, 3);
  }
  for (int r = 0; r < 4; ++r) {
    INFO("replica " << r << ": " << errors[static_cast<std::size_t>(r)]);
    CHECK(errors[static_cast<std::size_t>(r)].empty());
  }
  // Every row of every step trained exactly once.
  int wrong = 0;
  for (auto& c : seen) wrong += c.load() == 1 ? 0 : 1;
  CHECK(wrong == 0);
  // Members agree bit for bit; the joiner healed in; the sum equals two members' up to rounding.
  CHECK(final_w[0] == final_w[1]);
  CHECK(final_w[3] == final_w[0]);
  CHECK(heals[3] == 1);
  REQUIRE(final_w[0].size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) CHECK(final_w[0][i] == Approx(want[i]).epsilon(1e-5));
}

TEST_CASE("replica_group: the store's host dying is a clear error on every replica, not a hang", "[parallel][ft][threads]") {
  auto server = std::make_unique<tcp_store_server>();
  const auto port = server->port();
  auto connect = [&] {
    return std::make_shared<tcp_store>(tcp_store_options{.port = port, .timeout = 2000ms, .reconnect_timeout = 300ms});
  };
  lighthouse lh(connect(), {.replicas = 3, .policy = {.slots = 3}, .heartbeat_timeout = 1000ms, .tick = 5ms});
  local_group_registry registry({.timeout = 3000ms});
  std::atomic<bool> store_gone{false};
  std::atomic<int> at_step_4{0};
  std::vector<std::string> errors(3);
  const auto start = std::chrono::steady_clock::now();
  {
    std::vector<std::jthread> threads;
    for (int r = 0; r < 3; ++r) {
      threads.emplace_back([&, r] {
        toy_model m;
        try {
          replica_group rg(connect(), [&](std::int64_t id, int rank, int size) { return registry.make(id, rank, size); },
                           m.io(), {.replica = r, .heartbeat_interval = 20ms, .quorum_timeout = 5s});
          while (rg.current_step() < 40) {
            rg.step(
                [&](process_group& g, int slot, std::int64_t step) {
                  if (step == 4) {
                    ++at_step_4;
                    while (!store_gone) std::this_thread::sleep_for(1ms);
                    if (r == 1) throw killed{};  // a failure after the store is gone: recovery needs it
                  }
                  m.compute(g, slot, step);
                },
                [&] { m.apply(3); });
          }
          rg.finish();
        } catch (const killed&) {
        } catch (const std::exception& e) {
          errors[static_cast<std::size_t>(r)] = e.what();
        }
      });
    }
    while (at_step_4 < 3 && std::chrono::steady_clock::now() - start < 10s) std::this_thread::sleep_for(1ms);
    server.reset();  // the store's host dies
    store_gone = true;
  }
  for (int r : {0, 2}) {
    INFO("replica " << r);
    CHECK_THAT(errors[static_cast<std::size_t>(r)], Catch::Contains("store"));
  }
  CHECK(std::chrono::steady_clock::now() - start < 15s);
  CHECK(lh.error() != nullptr);  // the lighthouse stopped with the store's error
}
