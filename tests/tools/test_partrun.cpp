// partrun end to end: the launcher is run as a child process (under a hang guard) with the
// probe program as its ranks.
#include <catch2/catch.hpp>

#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <partrain/launch/process.hpp>
#include <partrain/rendezvous/detail/socket.hpp>

#include "../../tools/partrun/options.hpp"

namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

struct run_result {
  partrain::exit_status status;
  std::string output;
  std::chrono::milliseconds took{};
};

std::vector<std::string> base_env(const std::vector<std::string>& extra) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  env.insert(env.end(), extra.begin(), extra.end());
  return env;
}

run_result launch(std::vector<std::string> args, const std::vector<std::string>& env = {},
                  std::chrono::milliseconds guard = 60s) {
  run_result r;
  partrain::child_options co;
  co.capture_output = true;
  co.on_line = [&](std::string_view l) { r.output.append(l).push_back('\n'); };
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<partrain::child_process> kids;
  kids.push_back(partrain::child_process::exec(PARTRUN_EXE, args, base_env(env), co));
  partrain::supervise_options so;
  so.timeout = guard;  // a hung launcher fails the test instead of hanging it
  so.grace = 2s;
  auto out = partrain::supervise(kids, so);
  r.took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
  r.status = out.statuses[0];
  REQUIRE(out.how != partrain::supervise_outcome::result::timed_out);
  return r;
}

struct pid_dir {
  fs::path path = fs::temp_directory_path() / ("partrun_pids_" + std::to_string(::getpid()) + "_" +
                                               std::to_string(std::chrono::steady_clock::now().time_since_epoch().count()));
  pid_dir() { fs::create_directories(path); }
  ~pid_dir() { fs::remove_all(path); }
  // Every pid a rank recorded is gone (not running, not a zombie of ours).
  [[nodiscard]] int survivors() const {
    int alive = 0;
    for (const auto& f : fs::directory_iterator(path)) {
      pid_t pid = 0;
      std::ifstream(f.path()) >> pid;
      if (pid > 0 && ::kill(pid, 0) == 0) {
        std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
        std::string a, b, state;
        stat >> a >> b >> state;
        if (state != "Z") ++alive;
      }
    }
    return alive;
  }
  [[nodiscard]] std::size_t count() const {
    return static_cast<std::size_t>(std::distance(fs::directory_iterator(path), fs::directory_iterator{}));
  }
};

}  // namespace

TEST_CASE("partrun: ranks agree on rank and world size and see the torchrun variables", "[tools][partrun]") {
  for (int n : {1, 2, 4}) {
    auto r = launch({"--standalone", "--nproc-per-node", std::to_string(n), PROBE_EXE});
    INFO(r.output);
    CHECK(r.status.ok());
    for (int rank = 0; rank < n; ++rank) {
      CHECK_THAT(r.output, Catch::Contains("[rank " + std::to_string(rank) + "] probe rank=" + std::to_string(rank) +
                                           " world=" + std::to_string(n) + " local_rank=" + std::to_string(rank) +
                                           " sum_ranks=" + std::to_string(n * (n - 1) / 2) +
                                           " count=" + std::to_string(n) + " restart=0"));
    }
  }
}

TEST_CASE("partrun: a rank that exits 3 stops the job, is named, and leaves nothing behind", "[tools][partrun]") {
  pid_dir pids;
  auto r = launch({"--standalone", "--nproc-per-node", "3", "--grace", "2", PROBE_EXE},
                  {"PROBE_PID_DIR=" + pids.path.string(), "PROBE_FAIL_RANK=1", "PROBE_FAIL_MODE=exit3",
                   "PROBE_STEPS=1000000"});
  INFO(r.output);
  CHECK_FALSE(r.status.ok());
  CHECK(r.took < 10s);
  CHECK_THAT(r.output, Catch::Contains("rank 1 (local rank 1") && Catch::Contains("exited with code 3"));
  CHECK_THAT(r.output, Catch::Contains("rank 1 misbehaving"));  // its last lines are shown
  CHECK(pids.count() == 3);
  CHECK(pids.survivors() == 0);
}

TEST_CASE("partrun: a rank killed by SIGKILL stops the job", "[tools][partrun]") {
  pid_dir pids;
  auto r = launch({"--standalone", "--nproc-per-node", "2", "--grace", "2", PROBE_EXE},
                  {"PROBE_PID_DIR=" + pids.path.string(), "PROBE_FAIL_RANK=0", "PROBE_FAIL_MODE=sigkill",
                   "PROBE_STEPS=1000000"});
  INFO(r.output);
  CHECK_FALSE(r.status.ok());
  CHECK(r.took < 10s);
  CHECK_THAT(r.output, Catch::Contains("rank 0") && Catch::Contains("SIGKILL"));
  CHECK(pids.survivors() == 0);
}

TEST_CASE("partrun: a rank stalled outside a collective is caught by its peers' timeout", "[tools][partrun]") {
  pid_dir pids;
  auto r = launch({"--standalone", "--nproc-per-node", "2", "--grace", "1", PROBE_EXE},
                  {"PROBE_PID_DIR=" + pids.path.string(), "PROBE_FAIL_RANK=1", "PROBE_FAIL_MODE=stall",
                   "PROBE_STEPS=1000000", "PARTRAIN_TIMEOUT_MS=2000"});
  INFO(r.output);
  CHECK_FALSE(r.status.ok());
  CHECK(r.took < 20s);
  CHECK_THAT(r.output, Catch::Contains("rank 0") && Catch::Contains("all_reduce"));
  CHECK(pids.survivors() == 0);
}

TEST_CASE("partrun: restarts the whole group while restarts remain", "[tools][partrun]") {
  // Rank 1 fails in attempt 0 only (PROBE_FAIL_RANK is read per attempt through the restart count).
  auto r = launch({"--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--grace", "1", "sh", "-c",
                   std::string("if [ \"$PARTRAIN_RESTART_COUNT\" = 0 ]; then PROBE_FAIL_RANK=1 PROBE_FAIL_MODE=exit3 exec ") +
                       PROBE_EXE + "; else exec " + PROBE_EXE + "; fi"},
                  {"PROBE_STEPS=5"});
  INFO(r.output);
  CHECK(r.status.ok());
  CHECK_THAT(r.output, Catch::Contains("restarting every rank (restart 1 of 1)"));
  CHECK_THAT(r.output, Catch::Contains("restart=1"));
}

TEST_CASE("partrun: two agents with --nnodes 2 form one world", "[tools][partrun]") {
  const std::string port = std::to_string(partrain::detail::find_free_port());
  partrain::child_options co;
  std::string out1;
  co.capture_output = true;
  co.on_line = [&](std::string_view l) { out1.append(l).push_back('\n'); };
  std::vector<partrain::child_process> node1;
  node1.push_back(partrain::child_process::exec(
      PARTRUN_EXE, {"--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2", "--master-port", port, PROBE_EXE},
      base_env({"PARTRAIN_JOB_TOKEN=t0ken"}), co));
  auto r = launch({"--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "1", "--master-port", port, PROBE_EXE},
                  {"PARTRAIN_JOB_TOKEN=t0ken"});
  partrain::supervise_options so;
  so.timeout = 30s;
  auto o1 = partrain::supervise(node1, so);
  INFO(r.output << "\n--- node 1 ---\n" << out1);
  CHECK(r.status.ok());
  CHECK(o1.ok());
  CHECK_THAT(r.output, Catch::Contains("probe rank=0 world=3 local_rank=0 sum_ranks=3"));
  CHECK_THAT(out1, Catch::Contains("probe rank=2 world=3 local_rank=1 sum_ranks=3"));
}

namespace {
// One agent of a two-node job (one rank each, --grace 1) whose output lines collect in `out`.
partrain::child_process start_agent(const std::string& port, int node, std::string& out,
                                    const std::vector<std::string>& env) {
  partrain::child_options co;
  co.capture_output = true;
  co.on_line = [&out](std::string_view l) { out.append(l).push_back('\n'); };
  return partrain::child_process::exec(PARTRUN_EXE,
                                       {"--nnodes", "2", "--node-rank", std::to_string(node), "--nproc-per-node", "1",
                                        "--master-port", port, "--grace", "1", PROBE_EXE},
                                       base_env(env), co);
}

// Drains both agents' output until done() holds or `within` passes.
template <class Done>
void drain_until(partrain::child_process& a, partrain::child_process& b, Done done, std::chrono::milliseconds within = 30s) {
  const auto until = std::chrono::steady_clock::now() + within;
  while (!done() && std::chrono::steady_clock::now() < until) {
    a.drain_output();
    b.drain_output();
    std::this_thread::sleep_for(20ms);
  }
}

// The agent left after another was killed or stopped, supervised to its end (at most `limit`):
// how it ended, and how long that took from now.
struct survivor_end {
  partrain::supervise_outcome outcome;
  std::chrono::milliseconds took;
};
survivor_end supervise_survivor(partrain::child_process agent, std::chrono::milliseconds limit) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<partrain::child_process> rest;
  rest.push_back(std::move(agent));
  partrain::supervise_options so;
  so.timeout = limit;
  auto outcome = partrain::supervise(rest, so);
  return {std::move(outcome), std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)};
}
}  // namespace

TEST_CASE("partrun: when node 0's agent dies, node 1 stops within 10 s and says why", "[tools][partrun]") {
  // Node 0's agent hosts the store. Before the fix, node 1's agent reconnected to the vanished
  // store with its whole --rdzv-timeout (300 s) as the deadline.
  const std::string port = std::to_string(partrain::detail::find_free_port());
  std::string out0, out1;
  auto start_node = [&](int node, std::string& out) {
    return start_agent(port, node, out, {"PARTRAIN_JOB_TOKEN=n0de-loss", "PROBE_STEPS=100000000"});
  };
  auto node0 = start_node(0, out0);
  auto node1 = start_node(1, out1);
  drain_until(node0, node1, [&] { return out1.find("probe rank=1 world=2") != std::string::npos; });
  INFO(out0 << "\n--- node 1 ---\n" << out1);
  REQUIRE(out1.find("probe rank=1 world=2") != std::string::npos);
  node0.signal_group(SIGKILL);  // the agent, not its rank: the rank goes with it (PDEATHSIG)
  (void)node0.wait_blocking();
  const auto [o1, took] = supervise_survivor(std::move(node1), 60s);
  UNSCOPED_INFO("node 1 stopped " << took.count() << " ms after node 0's agent was killed");
  std::printf("node loss: node 1 stopped %lld ms after node 0's agent was killed\n", static_cast<long long>(took.count()));
  CHECK(o1.how != partrain::supervise_outcome::result::timed_out);
  CHECK_FALSE(o1.ok());
  CHECK(took < 10s);
  // Whichever node 1 notices first, its rank's failed collective or its watcher's failed store
  // call, it names node 0 as the one lost.
  CHECK_THAT(out1, Catch::Contains("node 1: ") && Catch::Contains("node 0, which hosts the job's store, is unreachable"));
}

TEST_CASE("partrun: when node 0's agent is stopped (SIGSTOP), node 1 stops within 25 s and names it", "[tools][partrun]") {
  // A stopped agent keeps the store's connections open and answers nothing: node 1's store calls
  // waited their whole allowance (30 s, then again), 45 s and more before node 1 stopped.
  const std::string port = std::to_string(partrain::detail::find_free_port());
  std::string out0, out1;
  auto node0 = start_agent(port, 0, out0, {"PARTRAIN_JOB_TOKEN=n0de-st0p", "PROBE_STEPS=100000000"});
  auto node1 = start_agent(port, 1, out1, {"PARTRAIN_JOB_TOKEN=n0de-st0p", "PROBE_STEPS=100000000"});
  drain_until(node0, node1, [&] { return out1.find("probe rank=1 world=2") != std::string::npos; });
  INFO(out0 << "\n--- node 1 ---\n" << out1);
  REQUIRE(out1.find("probe rank=1 world=2") != std::string::npos);
  ::kill(node0.pid(), SIGSTOP);  // the agent alone: its rank trains on, the store is frozen
  const auto [o1, took] = supervise_survivor(std::move(node1), 90s);
  ::kill(node0.pid(), SIGCONT);
  node0.signal_group(SIGKILL);
  (void)node0.wait_blocking();
  UNSCOPED_INFO("node 1 stopped " << took.count() << " ms after node 0's agent was stopped");
  CHECK(o1.how != partrain::supervise_outcome::result::timed_out);
  CHECK_FALSE(o1.ok());
  CHECK(took < 25s);
  CHECK_THAT(out1, Catch::Contains("node 1: ") && Catch::Contains("node 0, which hosts the job's store, is unreachable"));
}

TEST_CASE("partrun: when node 1's agent dies after its ranks finished, node 0 stops within 15 s and names it",
          "[tools][partrun]") {
  // Node 0's ranks succeed, node 1's rank lingers after its group ended, and node 1's agent is
  // killed then: node 0's agent used to wait for node 1's "done" forever.
  const std::string port = std::to_string(partrain::detail::find_free_port());
  std::string out0, out1;
  auto start_node = [&](int node, std::string& out) {
    return start_agent(port, node, out, {"PARTRAIN_JOB_TOKEN=agent-loss", "PROBE_LINGER_RANK=1", "PROBE_LINGER_MS=60000"});
  };
  auto node0 = start_node(0, out0);
  auto node1 = start_node(1, out1);
  drain_until(node0, node1, [&] {
    return out0.find("probe rank=0 done") != std::string::npos && out1.find("probe rank=1 done") != std::string::npos;
  });
  INFO(out0 << "\n--- node 1 ---\n" << out1);
  REQUIRE(out1.find("probe rank=1 done") != std::string::npos);
  std::this_thread::sleep_for(300ms);  // node 0's rank exits and its agent waits for node 1
  node1.signal_group(SIGKILL);  // the agent; its lingering rank goes with it (PDEATHSIG)
  (void)node1.wait_blocking();
  const auto [o0, took] = supervise_survivor(std::move(node0), 40s);
  CHECK(o0.how != partrain::supervise_outcome::result::timed_out);
  CHECK_FALSE(o0.ok());
  CHECK(took < 15s);
  CHECK_THAT(out0, Catch::Contains("node 1's agent has been silent for") &&
                       Catch::Contains("before reporting its ranks' outcome"));
}

TEST_CASE("partrun: a rank that exits 0 before it joins is told to the others at once", "[tools][partrun]") {
  // Rank 0 used to wait in the rendezvous for the whole timeout (300 s by default).
  auto r = launch({"--standalone", "--nproc-per-node", "2", "--grace", "1", PROBE_EXE},
                  {"PROBE_EXIT_BEFORE_JOIN=1", "PARTRAIN_TIMEOUT_MS=120000"}, 60s);
  INFO(r.output);
  CHECK_FALSE(r.status.ok());
  CHECK(r.took < 20s);
  CHECK_THAT(r.output, Catch::Contains("rank 1 (local rank 1 on node 0") &&
                           Catch::Contains("exited with code 0 before it joined the job's rendezvous"));
  CHECK_THAT(r.output, Catch::Contains("probe rank 0 failed"));
}

TEST_CASE("partrun: a --tee log that cannot be written is an error, not an empty file", "[tools][partrun]") {
  const fs::path dir = fs::temp_directory_path() / ("partrun_tee_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "attempt_0");
  SECTION("a folder where the log goes") {
    fs::create_directories(dir / "attempt_0" / "rank_0.log");
    auto r = launch({"--standalone", "--tee", "--log-dir", dir.string(), PROBE_EXE});
    INFO(r.output);
    CHECK_FALSE(r.status.ok());
    CHECK_THAT(r.output, Catch::Contains("--tee: cannot write rank 0's log") && Catch::Contains("it is a folder"));
    CHECK_THAT(r.output, !Catch::Contains("probe rank=0"));  // refused before any rank started
  }
  SECTION("a full disk (/dev/full)") {
    fs::create_symlink("/dev/full", dir / "attempt_0" / "rank_0.log");
    auto r = launch({"--standalone", "--tee", "--log-dir", dir.string(), PROBE_EXE});
    INFO(r.output);
    CHECK(r.status.code == 1);
    CHECK_THAT(r.output, Catch::Contains("probe rank=0 done"));  // the output still reached the terminal
    CHECK_THAT(r.output, Catch::Contains("--tee: writing rank 0's log") && Catch::Contains("No space left on device"));
    CHECK_THAT(r.output, Catch::Contains("a --tee log is incomplete"));
  }
  fs::remove_all(dir);
}

namespace {
// Starts one agent per argument list (same port and token) and waits for all of them.
std::vector<std::string> run_agents(const std::vector<std::vector<std::string>>& agents, std::chrono::milliseconds& took) {
  std::vector<std::string> outs(agents.size());
  std::vector<partrain::child_process> kids;
  for (std::size_t i = 0; i < agents.size(); ++i) {
    partrain::child_options co;
    co.capture_output = true;
    co.on_line = [&outs, i](std::string_view l) { outs[i].append(l).push_back('\n'); };
    kids.push_back(partrain::child_process::exec(PARTRUN_EXE, agents[i], base_env({"PARTRAIN_JOB_TOKEN=agents"}), co));
    std::this_thread::sleep_for(100ms);  // node 0 first: it hosts the store
  }
  const auto t0 = std::chrono::steady_clock::now();
  partrain::supervise_options so;
  so.timeout = 60s;
  so.settle = 20s;  // every agent should end on its own, and quickly
  auto out = partrain::supervise(kids, so);
  took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
  REQUIRE(out.how != partrain::supervise_outcome::result::timed_out);
  for (std::size_t i = 0; i < agents.size(); ++i) {
    outs[i] += "exit: " + out.statuses[i].describe() + "\n";
  }
  return outs;
}
}  // namespace

TEST_CASE("partrun: agents that disagree on --nnodes or claim one node rank twice stop at once", "[tools][partrun]") {
  const std::string port = std::to_string(partrain::detail::find_free_port());
  auto agent = [&](int nnodes, int node_rank) {
    return std::vector<std::string>{"--nnodes", std::to_string(nnodes), "--node-rank", std::to_string(node_rank),
                                    "--master-port", port, "--rdzv-timeout", "60", PROBE_EXE};
  };
  std::chrono::milliseconds took{};
  SECTION("--nnodes differs") {
    const auto outs = run_agents({agent(2, 0), agent(3, 1)}, took);
    INFO(outs[0] << "--- node 1 ---\n" << outs[1]);
    CHECK(took < 10s);
    for (const auto& out : outs) {
      CHECK_THAT(out, Catch::Contains("--nnodes 3") && Catch::Contains("--nnodes 2"));
      CHECK_THAT(out, !Catch::Contains("exit: exited with code 0"));
    }
  }
  SECTION("two agents claim node rank 1") {
    const auto outs = run_agents({agent(3, 0), agent(3, 1), agent(3, 1)}, took);
    INFO(outs[0] << "--- node 1 ---\n" << outs[1] << "--- node 1 again ---\n" << outs[2]);
    CHECK(took < 10s);
    for (const auto& out : outs) {
      CHECK_THAT(out, Catch::Contains("node 1 was claimed by two agents"));
      CHECK_THAT(out, !Catch::Contains("exit: exited with code 0"));
    }
  }
}

TEST_CASE("partrun: a node that never comes is named within the rendezvous timeout", "[tools][partrun]") {
  auto r = launch({"--nnodes", "2", "--master-port", std::to_string(partrain::detail::find_free_port()), "--rdzv-timeout",
                   "1", PROBE_EXE},
                  {"PARTRAIN_JOB_TOKEN=x"});
  CHECK_FALSE(r.status.ok());
  CHECK_THAT(r.output, Catch::Contains("node(s) 1 never joined"));
}

TEST_CASE("partrun: options follow torchrun and bad ones are refused clearly", "[tools][partrun]") {
  auto o = partrun::parse({"--nproc_per_node=4", "--nnodes", "2:2", "--node-rank", "1", "--max-restarts", "3",
                           "--monitor-interval", "0.5", "prog", "--lr", "0.1"});
  REQUIRE(o);
  CHECK(o->nproc_per_node == 4);
  CHECK(o->nnodes == 2);
  CHECK(o->node_rank == 1);
  CHECK(o->max_restarts == 3);
  CHECK(o->monitor_interval == 500ms);
  CHECK(o->program == "prog");
  CHECK(o->args == std::vector<std::string>{"--lr", "0.1"});
  CHECK(partrun::parse({"--standalone", "p"})->master_port == 0);
  CHECK_THROWS_WITH(partrun::parse({"--node-rank", "2", "p"}), Catch::Contains("out of range for --nnodes 1"));
  CHECK_THROWS_WITH(partrun::parse({"--nnodes", "1:4", "p"}), Catch::Contains("not supported"));
  CHECK_THROWS_WITH(partrun::parse({"--nnodes", "2", "--master-port", "0", "p"}), Catch::Contains("one node"));
  CHECK_THROWS_WITH(partrun::parse({"--nproc-per-node", "x", "p"}), Catch::Contains("expected an integer"));
  CHECK_THROWS_WITH(partrun::parse({"--frobnicate"}), Catch::Contains("unknown option"));
  CHECK_THROWS_WITH(partrun::parse({}), Catch::Contains("no PROGRAM"));
  // Durations: finite and bounded; a rendezvous timeout of 0 could never succeed.
  for (const char* bad : {"nan", "inf", "-1", "1e300"}) {
    CHECK_THROWS_WITH(partrun::parse({"--monitor-interval", bad, "p"}), Catch::Contains("--monitor-interval"));
    CHECK_THROWS_WITH(partrun::parse({"--grace", bad, "p"}), Catch::Contains("at most 604800"));
  }
  CHECK_THROWS_WITH(partrun::parse({"--rdzv-timeout", "0", "p"}), Catch::Contains("greater than 0"));
  CHECK_THROWS_WITH(partrun::parse({"--rdzv-timeout", "nan", "p"}), Catch::Contains("--rdzv-timeout"));
  CHECK(partrun::parse({"--grace", "0.5", "p"})->grace == std::chrono::milliseconds(500));
  CHECK_FALSE(partrun::parse({"--help"}));
}
