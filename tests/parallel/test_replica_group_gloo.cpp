// replica_group over Gloo, replicas as processes: one replica is SIGSTOPped past its heartbeat
// timeout (evicted, a spare heals into its slot, it cannot commit when it wakes and waits as a
// spare), another is SIGKILLed at a random step (the woken replica heals into its slot). The
// survivors keep their processes, and the final parameters equal a run without faults bit for bit.
#include <catch2/catch.hpp>

#include <partrain/comm/gloo.hpp>
#include <partrain/parallel/lighthouse.hpp>
#include <partrain/parallel/replica_group.hpp>
#include <partrain/rendezvous/tcp_store.hpp>

#include "fork_ranks.hpp"
#include "replica_toy.hpp"
#include "store_process.hpp"
#include "temp_dir.hpp"

#include <chrono>
#include <csignal>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <signal.h>
#include <unistd.h>

using namespace partrain;
using namespace std::chrono_literals;
using partrain::testing::toy_model;

namespace {

constexpr int slots = 4;
constexpr int replicas = 5;  // one spare
constexpr int steps = 24;

struct faults {
  int stop_replica = -1;  // SIGSTOPs itself before this step, for stop_for (the host wakes it)
  std::int64_t stop_step = -1;
  std::chrono::milliseconds stop_for{0};
  int kill_replica = -1;  // SIGKILLs itself before this step
  std::int64_t kill_step = -1;
};

struct replica_result {
  std::vector<float> w;  // empty unless it finished as a member
  std::string events;    // its event log
};

tcp_store_options client(std::uint16_t port, int who) {
  return {.port = port, .timeout = 10s, .reconnect_timeout = 1s, .who = "replica " + std::to_string(who), .rank = who};
}

// Runs the job: `replicas` processes and a host process that runs the lighthouse and wakes a
// stopped replica. Returns every replica's result; fails the test if a process failed.
std::vector<replica_result> run_job(const faults& f) {
  testing::temp_dir dir("partrain_ft_gloo");
  testing::store_process server;  // its own process: this one stays single-threaded while it forks
  const auto port = server.port();
  auto outcomes = testing::fork_ranks(replicas + 1, [&](int r) {
    if (r == replicas) {  // the host: lighthouse, and the alarm clock of a stopped replica
      auto s = std::make_shared<tcp_store>(client(port, r));
      lighthouse lh(s, {.replicas = replicas, .policy = {.slots = slots}, .heartbeat_timeout = 1500ms, .tick = 5ms});
      bool woke = f.stop_replica < 0;
      const auto deadline = std::chrono::steady_clock::now() + 70s;
      while (!s->check({"ft/finished"})) {
        if (std::chrono::steady_clock::now() > deadline) throw std::runtime_error("host: the job did not finish in 70 s");
        if (!woke && s->check({"test/stopped"})) {
          const auto pid = std::stoi(s->get_string("test/stopped", 1s));
          std::this_thread::sleep_for(f.stop_for);
          ::kill(pid, SIGCONT);
          woke = true;
        }
        std::this_thread::sleep_for(10ms);
      }
      return;
    }
    auto control = std::make_shared<tcp_store>(client(port, r));
    auto rdzv = std::make_shared<tcp_store>(client(port, r));
    toy_model m;
    replica_group rg(control, gloo_groups_by_id(rdzv, {.timeout = 2000ms}), m.io(),
                     {.replica = r, .heartbeat_interval = 50ms, .quorum_timeout = 20s});
    while (rg.current_step() < steps) {
      const bool more = rg.step(
          [&](process_group& g, int slot, std::int64_t step) {
            if (r == f.kill_replica && step == f.kill_step) ::raise(SIGKILL);
            if (r == f.stop_replica && step == f.stop_step && rg.failures() == 0) {
              control->set("test/stopped", std::to_string(::getpid()));
              ::raise(SIGSTOP);
            }
            m.compute(g, slot, step);
          },
          [&] { m.apply(slots); });
      if (!more) break;
    }
    std::string log;
    for (const auto& e : rg.events()) {
      log += std::to_string(static_cast<int>(e.what)) + "@" + std::to_string(e.step) + " ";
    }
    std::ofstream(dir.path / ("events" + std::to_string(r))) << log;
    if (rg.current_step() == steps && rg.slot() >= 0) {
      std::ofstream out(dir.path / ("w" + std::to_string(r)), std::ios::binary);
      out.write(reinterpret_cast<const char*>(m.w.data()), static_cast<std::streamsize>(m.w.size() * sizeof(float)));
    }
    rg.finish();
  }, 90s);
  for (int r = 0; r <= replicas; ++r) {
    const auto& o = outcomes[static_cast<std::size_t>(r)];
    if (r == f.kill_replica) continue;  // killed by design
    INFO("process " << r << ": " << o.message);
    REQUIRE(o.ok);
  }
  std::vector<replica_result> out(static_cast<std::size_t>(replicas));
  for (int r = 0; r < replicas; ++r) {
    auto& res = out[static_cast<std::size_t>(r)];
    std::ifstream w(dir.path / ("w" + std::to_string(r)), std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(w)), std::istreambuf_iterator<char>());
    res.w.resize(bytes.size() / sizeof(float));
    if (!res.w.empty()) std::memcpy(res.w.data(), bytes.data(), bytes.size());
    std::ifstream e(dir.path / ("events" + std::to_string(r)));
    std::getline(e, res.events);
  }
  return out;
}

}  // namespace

TEST_CASE("replica_group over gloo: a stopped replica is evicted, a killed one replaced, the result bit-identical",
          "[parallel][ft][processes]") {
  const auto want = run_job({});
  for (int r = 0; r < slots; ++r) REQUIRE(want[static_cast<std::size_t>(r)].w == want[0].w);
  REQUIRE(want[0].w.size() == toy_model::n);
  CHECK(want[slots].w.empty());  // the spare never trained

  std::mt19937 pick(std::random_device{}());
  const auto kill_step = std::uniform_int_distribution<std::int64_t>(12, 20)(pick);
  INFO("replica 1 is killed before step " << kill_step);
  const auto got = run_job({.stop_replica = 2, .stop_step = 4, .stop_for = 5000ms, .kill_replica = 1, .kill_step = kill_step});
  // Replicas 0 and 3 never stopped; 4 (the spare) took slot 2, then 2 (woken) took slot 1.
  for (int r : {0, 2, 3, 4}) {
    INFO("replica " << r << " events: " << got[static_cast<std::size_t>(r)].events);
    CHECK(got[static_cast<std::size_t>(r)].w == want[0].w);
  }
  CHECK(got[1].w.empty());
  // Event kinds: 0 joined, 1 healed, 2 sent_state, 3 failed, 4 left_as_spare.
  CHECK_THAT(got[4].events, Catch::Contains("1@4"));  // the spare healed to step 4
  CHECK_THAT(got[2].events, Catch::Contains("3@4"));  // the woken replica failed its stale step ...
  CHECK_THAT(got[2].events, Catch::Contains("4@4"));  // ... waited as a spare ...
  CHECK_THAT(got[2].events, Catch::Contains("1@" + std::to_string(kill_step)));  // ... and healed in
}
