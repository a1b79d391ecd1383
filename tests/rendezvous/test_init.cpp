#include <catch2/catch.hpp>

#include <partrain/launch/spawn.hpp>
#include <partrain/rendezvous/detail/socket.hpp>
#include <partrain/rendezvous/init.hpp>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace partrain;
using namespace std::chrono_literals;

namespace {

env_lookup fake_env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    if (auto it = vars.find(name); it != vars.end()) return it->second;
    return std::nullopt;
  };
}

std::map<std::string, std::string> torchrun_vars() {
  return {{"MASTER_ADDR", "10.1.2.3"}, {"MASTER_PORT", "29500"}, {"RANK", "5"},
          {"WORLD_SIZE", "8"},         {"LOCAL_RANK", "1"},      {"LOCAL_WORLD_SIZE", "4"}};
}

std::string config_message(std::string_view url, const init_options& o, std::map<std::string, std::string> vars) {
  try {
    (void)parse_rendezvous(url, o, fake_env(std::move(vars)));
  } catch (const config_error& e) {
    return e.what();
  }
  FAIL("no config_error for '" << url << "'");
  return {};
}

init_options ranks(int rank, int world) {
  init_options o;
  o.rank = rank;
  o.world_size = world;
  return o;
}

}  // namespace

TEST_CASE("env:// reads the torchrun variables", "[comm][init]") {
  auto info = parse_rendezvous("env://", {}, fake_env(torchrun_vars()));
  CHECK(info.scheme == "env");
  CHECK(info.rank == 5);
  CHECK(info.world_size == 8);
  CHECK(info.local_rank == 1);
  CHECK(info.local_world_size == 4);
  CHECK(info.master_addr == "10.1.2.3");
  CHECK(info.port == 29500);
  CHECK(info.source == "env");  // RANK and WORLD_SIZE with no launcher's marks: set by hand
  CHECK(info.timeout == default_timeout);
  CHECK(info.token.empty());
  CHECK_FALSE(info.agent_store);
  CHECK(info.store == nullptr);

  // Without the local variables: one node.
  auto vars = torchrun_vars();
  vars.erase("LOCAL_RANK");
  vars.erase("LOCAL_WORLD_SIZE");
  auto one_node = parse_rendezvous("env://", {}, fake_env(vars));
  CHECK(one_node.local_rank == 5);
  CHECK(one_node.local_world_size == 8);

  // The launcher's extras.
  vars = torchrun_vars();
  vars["PARTRAIN_TIMEOUT_MS"] = "1500";
  vars["PARTRAIN_STORE_TOKEN"] = "tok";
  vars["PARTRAIN_USE_AGENT_STORE"] = "1";
  vars["PARTRAIN_RESTART_COUNT"] = "2";
  auto launched = parse_rendezvous("env://", {}, fake_env(vars));
  CHECK(launched.timeout == 1500ms);
  CHECK(launched.token == "tok");
  CHECK(launched.agent_store);
  CHECK(launched.restart_count == 2);
  init_options explicit_timeout;
  explicit_timeout.timeout = 20ms;
  explicit_timeout.token = "mine";
  auto overridden = parse_rendezvous("env://", explicit_timeout, fake_env(vars));
  CHECK(overridden.timeout == 20ms);
  CHECK(overridden.token == "mine");
}

TEST_CASE("env:// falls back to Slurm, Open MPI and PMI variables", "[comm][init]") {
  auto slurm = parse_rendezvous("env://", {}, fake_env({{"SLURM_PROCID", "5"},
                                                        {"SLURM_NTASKS", "8"},
                                                        {"SLURM_LOCALID", "1"},
                                                        {"SLURM_NODEID", "1"},
                                                        {"SLURM_STEP_TASKS_PER_NODE", "4(x2)"},
                                                        {"SLURM_STEP_NODELIST", "gpu[03-04]"},
                                                        {"SLURM_JOB_ID", "123456"}}));
  CHECK(slurm.source == "slurm");
  CHECK(slurm.rank == 5);
  CHECK(slurm.world_size == 8);
  CHECK(slurm.local_rank == 1);
  CHECK(slurm.local_world_size == 4);
  CHECK(slurm.master_addr == "gpu03");
  CHECK(slurm.port == 20000 + 123456 % 20000);

  // MASTER_ADDR/MASTER_PORT set by the batch script win; uneven tasks per node are read per node.
  auto uneven = parse_rendezvous("env://", {}, fake_env({{"SLURM_PROCID", "4"},
                                                         {"SLURM_NTASKS", "5"},
                                                         {"SLURM_LOCALID", "0"},
                                                         {"SLURM_NODEID", "2"},
                                                         {"SLURM_TASKS_PER_NODE", "2(x2),1"},
                                                         {"MASTER_ADDR", "head"},
                                                         {"MASTER_PORT", "1234"}}));
  CHECK(uneven.local_world_size == 1);
  CHECK(uneven.master_addr == "head");
  CHECK(uneven.port == 1234);

  auto ompi = parse_rendezvous("env://", {}, fake_env({{"OMPI_COMM_WORLD_RANK", "3"},
                                                       {"OMPI_COMM_WORLD_SIZE", "4"},
                                                       {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                                       {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                                       {"MASTER_ADDR", "h0"},
                                                       {"MASTER_PORT", "29400"}}));
  CHECK(ompi.source == "openmpi");
  CHECK(ompi.rank == 3);
  CHECK(ompi.world_size == 4);
  CHECK(ompi.local_rank == 1);
  CHECK(ompi.local_world_size == 2);

  auto pmi = parse_rendezvous("env://", {}, fake_env({{"PMI_RANK", "1"}, {"PMI_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "9"}}));
  CHECK(pmi.source == "pmi");
  CHECK(pmi.rank == 1);

  // torchrun's variables win over the others when both are present.
  auto both = torchrun_vars();
  both["SLURM_PROCID"] = "0";
  both["SLURM_NTASKS"] = "1";
  CHECK(parse_rendezvous("env://", {}, fake_env(both)).source == "env");

  // mpirun on one host: the store on this host, its port from Open MPI's job id.
  auto mpirun = parse_rendezvous("env://", {}, fake_env({{"OMPI_COMM_WORLD_RANK", "1"},
                                                         {"OMPI_COMM_WORLD_SIZE", "2"},
                                                         {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                                         {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                                         {"OMPI_MCA_ess_base_jobid", "1402208257"}}));
  CHECK(mpirun.master_addr == "127.0.0.1");
  CHECK(mpirun.port == 20000 + 1402208257 % 20000);
  CHECK(mpirun.token == "ompi-1402208257");
  CHECK_THAT(config_message("env://", {}, {{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                                           {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}),
             Catch::Contains("MASTER_ADDR is not set"));  // several hosts: which one is rank 0's is not known

  CHECK(detail::rdzv::first_slurm_host("node1,node2") == "node1");
  CHECK(detail::rdzv::first_slurm_host("node[009-012,20]-ib,x") == "node009-ib");
  CHECK(detail::rdzv::first_slurm_host("single") == "single");
  CHECK(detail::rdzv::slurm_tasks_on_node("3", 0) == 3);
  CHECK(detail::rdzv::slurm_tasks_on_node("2(x3),1", 2) == 2);
  CHECK(detail::rdzv::slurm_tasks_on_node("2(x3),1", 3) == 1);
  CHECK_FALSE(detail::rdzv::slurm_tasks_on_node("2(x3),1", 4).has_value());
  CHECK_FALSE(detail::rdzv::slurm_tasks_on_node("x(", 0).has_value());
}

TEST_CASE("env:// rejects missing and malformed variables", "[comm][init][errors]") {
  auto without = [](const std::string& name) {
    auto v = torchrun_vars();
    v.erase(name);
    return v;
  };
  auto with = [](const std::string& name, const std::string& value) {
    auto v = torchrun_vars();
    v[name] = value;
    return v;
  };
  CHECK_THAT(config_message("env://", {}, {}), Catch::Contains("RANK is not set") && Catch::Contains("SLURM_PROCID"));
  CHECK_THAT(config_message("env://", {}, without("WORLD_SIZE")), Catch::Contains("WORLD_SIZE is not set"));
  CHECK_THAT(config_message("env://", {}, without("RANK")), Catch::Contains("RANK is not set"));
  CHECK_THAT(config_message("env://", {}, without("MASTER_ADDR")), Catch::Contains("MASTER_ADDR is not set"));
  CHECK_THAT(config_message("env://", {}, without("MASTER_PORT")), Catch::Contains("MASTER_PORT is not set"));
  CHECK_THAT(config_message("env://", {}, with("RANK", "two")), Catch::Contains("RANK='two' is not an integer"));
  CHECK_THAT(config_message("env://", {}, with("RANK", "8")),
             Catch::Contains("rank 8 is out of range for world size 8") && Catch::Contains("expected 0 <= rank < world size"));
  CHECK_THAT(config_message("env://", {}, with("RANK", "-1")), Catch::Contains("RANK=-1 is out of range"));
  CHECK_THAT(config_message("env://", {}, with("WORLD_SIZE", "0")), Catch::Contains("WORLD_SIZE=0 is out of range"));
  CHECK_THAT(config_message("env://", {}, with("MASTER_PORT", "70000")), Catch::Contains("MASTER_PORT=70000 is out of range"));
  CHECK_THAT(config_message("env://", {}, with("MASTER_PORT", "0")), Catch::Contains("MASTER_PORT=0 only works"));
  CHECK_THAT(config_message("env://", {}, with("LOCAL_RANK", "4")), Catch::Contains("local rank 4 is out of range"));
  CHECK_THAT(config_message("env://", {}, with("PARTRAIN_TIMEOUT_MS", "soon")), Catch::Contains("PARTRAIN_TIMEOUT_MS='soon'"));
  CHECK_THAT(config_message("env://", ranks(2, 8), torchrun_vars()), Catch::Contains("options.rank 2 disagrees"));
  CHECK_THAT(config_message("env://extra", {}, torchrun_vars()), Catch::Contains("env:// takes nothing"));
  init_options zero_timeout;
  zero_timeout.timeout = 0ms;
  CHECK_THAT(config_message("env://", zero_timeout, torchrun_vars()), Catch::Contains("timeout must be positive"));
}

TEST_CASE("tcp:// and file:// URLs", "[comm][init]") {
  auto tcp = parse_rendezvous("tcp://10.0.0.7:29501", ranks(1, 3), fake_env({}));
  CHECK(tcp.scheme == "tcp");
  CHECK(tcp.master_addr == "10.0.0.7");
  CHECK(tcp.port == 29501);
  CHECK(tcp.rank == 1);
  CHECK(tcp.world_size == 3);
  CHECK(tcp.local_rank == 1);
  CHECK(tcp.local_world_size == 3);
  auto v6 = parse_rendezvous("tcp://[::1]:80?rank=0&world_size=2", {}, fake_env({}));
  CHECK(v6.master_addr == "::1");
  CHECK(v6.port == 80);
  CHECK(v6.world_size == 2);
  CHECK(v6.source == "url");
  auto file = parse_rendezvous("file:///shared/job/store", ranks(0, 2), fake_env({{"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "1"}}));
  CHECK(file.scheme == "file");
  CHECK(file.path == "/shared/job/store");
  CHECK(file.local_world_size == 1);

  const std::vector<std::pair<std::string, std::string>> bad = {
      {"tcp://host", "no port"},
      {"tcp://:29500", "empty host"},
      {"tcp://host:0", "port '0' is not in 1..65535"},
      {"tcp://host:http", "port 'http'"},
      {"tcp://host:99999", "port '99999'"},
      {"tcp://[::1:80", "bad IPv6"},
      {"tcp://host:1?rank=x", "bad query item 'rank=x'"},
      {"tcp://host:1?color=red", "bad query item 'color=red'"},
      {"file://", "empty path"},
      {"udp://host:1", "unknown scheme 'udp'"},
      {"localhost:29500", "expected env://, tcp://host:port or file://path"},
      {"", "malformed URL"},
  };
  for (const auto& [url, what] : bad) {
    INFO(url);
    CHECK_THAT(config_message(url, ranks(0, 1), {}), Catch::Contains(what));
  }
  CHECK_THAT(config_message("tcp://h:1", {}, {}), Catch::Contains("world_size is not given"));
  CHECK_THAT(config_message("tcp://h:1", ranks(-1, 2), {}), Catch::Contains("rank is not given"));
  CHECK_THAT(config_message("tcp://h:1", ranks(2, 2), {}), Catch::Contains("rank 2 is out of range for world size 2"));
  CHECK_THAT(config_message("tcp://h:1", ranks(0, 0), {}), Catch::Contains("world size must be at least 1, got 0"));
  CHECK_THAT(config_message("tcp://h:1?rank=1", ranks(0, 2), {}), Catch::Contains("options.rank 0 disagrees with the URL's 1"));
  CHECK_THAT(config_message("file:///x", ranks(0, 1), {{"LOCAL_RANK", "3"}, {"LOCAL_WORLD_SIZE", "2"}}),
             Catch::Contains("local rank 3 is out of range"));
}

TEST_CASE("rendezvous connects a store for one rank", "[comm][init][store]") {
  const auto port = detail::find_free_port();
  init_options o = ranks(0, 1);
  o.timeout = 5s;
  auto info = rendezvous("tcp://127.0.0.1:" + std::to_string(port), o, fake_env({}));
  REQUIRE(info.store);
  info.store->set("k", "v");
  CHECK(info.store->get_string("k", 1s) == "v");

  const auto path = std::filesystem::temp_directory_path() / ("partrain_init_" + std::to_string(::getpid()));
  std::filesystem::remove(path);
  auto finfo = rendezvous("file://" + path.string(), o, fake_env({}));
  finfo.store->set("k", "file");
  CHECK(finfo.store->get_string("k", 1s) == "file");
  std::filesystem::remove(path);

  // A launcher's store: every rank a client, keys under the attempt's prefix.
  tcp_store_server agent({.host = "127.0.0.1", .port = 0, .token = "job-token", .max_message_bytes = 1 << 20});
  auto vars = std::map<std::string, std::string>{{"MASTER_ADDR", "127.0.0.1"},
                                                 {"MASTER_PORT", std::to_string(agent.port())},
                                                 {"RANK", "0"},
                                                 {"WORLD_SIZE", "2"},
                                                 {"PARTRAIN_USE_AGENT_STORE", "1"},
                                                 {"PARTRAIN_RESTART_COUNT", "1"},
                                                 {"PARTRAIN_STORE_TOKEN", "job-token"},
                                                 {"PARTRAIN_TIMEOUT_MS", "5000"}};
  auto ainfo = rendezvous("env://", {}, fake_env(vars));
  ainfo.store->set("k", "agent");
  tcp_store_options raw;
  raw.port = agent.port();
  raw.token = "job-token";
  raw.timeout = 5s;
  tcp_store direct(raw);
  CHECK(direct.get_string("/worker/attempt_1/k", 1s) == "agent");
  // Without the token the agent refuses.
  vars.erase("PARTRAIN_STORE_TOKEN");
  CHECK_THROWS_WITH(rendezvous("env://", {}, fake_env(vars)), Catch::Contains("unauthorized"));
}

TEST_CASE("env:// refuses a job of several ranks that nothing tells apart from another job", "[comm][init][errors]") {
  // Two jobs on one port with RANK and WORLD_SIZE set by hand would merge: refused before any
  // connection, saying how to give the job an identity.
  auto vars = torchrun_vars();
  vars["MASTER_ADDR"] = "127.0.0.1";
  CHECK_THROWS_WITH(rendezvous("env://", {}, fake_env(vars)),
                    Catch::Contains("rank 5 of 8 (RANK and WORLD_SIZE set by hand) has no job identity") &&
                        Catch::Contains("set PARTRAIN_STORE_TOKEN"));
  // A job of one merges with nothing; a batch system's job id or a token is an identity.
  CHECK(parse_rendezvous("env://", {}, fake_env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"},
                                                 {"MASTER_PORT", "1"}, {"SLURM_JOB_ID", "7"}}))
            .token == "slurm-7.0");
  vars["RANK"] = "0";
  vars["WORLD_SIZE"] = "1";
  CHECK_NOTHROW(detail::rdzv::refuse_anonymous_job(parse_rendezvous("env://", {}, fake_env(vars))));
  vars["WORLD_SIZE"] = "2";
  vars["PARTRAIN_STORE_TOKEN"] = "t";
  CHECK_NOTHROW(detail::rdzv::refuse_anonymous_job(parse_rendezvous("env://", {}, fake_env(vars))));
}

TEST_CASE("init_process_group rejects backends that are unknown or not compiled in", "[comm][init][errors]") {
  init_options o = ranks(0, 1);
  o.backend = "mpl";
  CHECK_THROWS_WITH(init_process_group("tcp://127.0.0.1:1", o),
                    Catch::Contains("unknown backend 'mpl'") && Catch::Contains("'gloo', 'mpi' or 'nccl'"));
  o.backend = "mpi";  // MPI's launcher is its rendezvous: no store URL
  CHECK_THROWS_WITH(init_process_group("tcp://127.0.0.1:1", o), Catch::Contains("'mpi://' or 'env://'"));
#if !PARTRAIN_INIT_HAS_MPI
  CHECK_THROWS_WITH(init_process_group("mpi://"), Catch::Contains("backend 'mpi' is not compiled in") &&
                                                      Catch::Contains("partrain::mpi"));
#endif
  CHECK_THROWS_AS(init_process_group("bogus", ranks(0, 1)), config_error);
#if !PARTRAIN_INIT_HAS_NCCL
  o.backend = "nccl";
  o.timeout = 5s;
  CHECK_THROWS_WITH(init_process_group("tcp://127.0.0.1:" + std::to_string(detail::find_free_port()), o),
                    Catch::Contains("backend 'nccl' is not compiled in") && Catch::Contains("partrain::nccl"));
#endif
#if !PARTRAIN_INIT_HAS_GLOO
  o.backend = "gloo";
  o.timeout = 5s;
  CHECK_THROWS_WITH(init_process_group("tcp://127.0.0.1:" + std::to_string(detail::find_free_port()), o),
                    Catch::Contains("backend 'gloo' is not compiled in") && Catch::Contains("libgloo-dev"));
#endif
}

TEST_CASE("init_process_group refuses a process partrun started for a fault-tolerant job", "[comm][init][errors]") {
  const char* var = GENERATE("PARTRAIN_FT_SLOTS", "PARTRAIN_FT_MIN_REPLICAS");
  CAPTURE(var);
  struct unset_after {
    const char* name;
    ~unset_after() { ::unsetenv(name); }
  } guard{var};
  ::setenv(var, "2", 1);
  CHECK_THROWS_WITH(init_process_group("tcp://127.0.0.1:1", ranks(0, 1)),
                    Catch::Contains(std::string(var) + " is set") && Catch::Contains("build a replica_group") &&
                        Catch::Contains("not ZeRO, FSDP or a pipeline") && Catch::Contains("not mpi"));
  init_options o = ranks(0, 1);
  o.backend = "mpi";  // refused before MPI is asked
  CHECK_THROWS_WITH(init_process_group("mpi://", o), Catch::Contains("build a replica_group"));
}

TEST_CASE("init_process_group: an unreachable master is a timeout naming host and port", "[comm][init][errors]") {
  init_options o = ranks(1, 2);
  o.timeout = 300ms;
  const auto port = detail::find_free_port();
  CHECK_THROWS_WITH(init_process_group("tcp://127.0.0.1:" + std::to_string(port), o),
                    Catch::Contains("rank 1") && Catch::Contains("127.0.0.1:" + std::to_string(port)));
}

TEST_CASE("init_process_group: rank 0 names a master port already in use", "[comm][init][errors]") {
  tcp_store_server taken({.host = "127.0.0.1", .port = 0});
  init_options o = ranks(0, 2);
  o.timeout = 2s;
  CHECK_THROWS_WITH(init_process_group("tcp://127.0.0.1:" + std::to_string(taken.port()), o),
                    Catch::Contains("port " + std::to_string(taken.port()) + " is already in use"));
}

#if PARTRAIN_INIT_HAS_GLOO
TEST_CASE("init_process_group(env://) builds a gloo group in spawned processes", "[comm][init][gloo][processes]") {
  const int n = GENERATE(2, 3);
  spawn_options so;
  so.timeout = 60s;
  so.grace = 1s;
  so.echo_output = false;
  so.env = {{"PARTRAIN_TIMEOUT_MS", "20000"}};
  const auto result = spawn(n, [n](int rank) {
    auto pg = init_process_group("env://");
    if (pg->rank() != rank || pg->size() != n || pg->backend() != "gloo") throw std::runtime_error("wrong group");
    if (pg->timeout() != 20s) throw std::runtime_error("PARTRAIN_TIMEOUT_MS not applied");
    std::vector<float> v(5, static_cast<float>(rank + 1));
    pg->all_reduce(tensor_view<float>(v)).wait();
    const float want = static_cast<float>(n * (n + 1) / 2);
    for (float x : v) {
      if (x != want) throw std::runtime_error("all_reduce gave " + std::to_string(x));
    }
    pg->barrier().wait();
  }, so);
  CHECK(result.pids.size() == static_cast<std::size_t>(n));  // every rank exited 0, or spawn threw
}

namespace {

// Runs a 2-rank gloo job in which `stop_rank` stops itself (SIGSTOP) after a first all_reduce and
// the other rank all_reduces again with a 120 s timeout; returns the failure and the seconds to it
// (counted from the start of the job: about 1.5 s of it pass before the rank stops).
std::pair<process_error, double> job_with_a_stopped_rank(int stop_rank, const char* silence_ms) {
  spawn_options so;
  so.timeout = 90s;
  so.grace = 30s;  // the stopped rank must end at SIGTERM (SIGCONT follows), not after this
  so.echo_output = false;
  so.env = {{"PARTRAIN_TIMEOUT_MS", "120000"}};
  if (silence_ms) so.env.emplace_back("PARTRAIN_SILENCE_MS", silence_ms);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    (void)spawn(2, [stop_rank](int rank) {
      auto pg = init_process_group("env://", {.backend = "gloo"});
      std::vector<float> v(4, 1.0f);
      pg->all_reduce(tensor_view<float>(v)).wait();
      if (rank == stop_rank) {
        std::this_thread::sleep_for(1500ms);  // a heartbeat after the all_reduce (they come every second)
        ::raise(SIGSTOP);
      }
      pg->all_reduce(tensor_view<float>(v)).wait();  // only the liveness watch can end this wait
    }, so);
  } catch (const process_error& e) {
    return {e, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
  }
  FAIL("the job with a stopped rank ended without an error");
  throw;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string all;
  for (const auto& l : lines) all += l + "\n";
  return all;
}

}  // namespace

TEST_CASE("liveness: a stopped rank ends the whole job within 10 s, naming it and its last operation",
          "[comm][init][gloo][processes][liveness]") {
  const auto [e, seconds] = job_with_a_stopped_rank(1, nullptr);  // the default silence (5 s)
  std::printf("liveness: the job with a SIGSTOPped rank 1 ended %.2f s after the stop (default PARTRAIN_SILENCE_MS)\n",
              seconds - 1.5);
  const std::string out = joined(e.last_lines());
  INFO(e.what() << "\n" << out);
  CHECK(seconds - 1.5 < 10);
  CHECK(e.rank() == 0);
  CHECK_THAT(out, Catch::Contains("rank 1 has been silent for") && Catch::Contains("last operation all_reduce #1") &&
                      Catch::Contains("noticed by rank 0"));
}

TEST_CASE("liveness: a stopped store host (rank 0) ends the job within 10 s", "[comm][init][gloo][processes][liveness]") {
  const auto [e, seconds] = job_with_a_stopped_rank(0, "3000");
  std::printf("liveness: the job with a SIGSTOPped rank 0 (the store's host) ended %.2f s after the stop (silence 3 s)\n",
              seconds - 1.5);
  const std::string out = joined(e.last_lines());
  INFO(e.what() << "\n" << out);
  CHECK(seconds - 1.5 < 10);
  CHECK(e.rank() == 1);
  CHECK_THAT(out, Catch::Contains("hosted by rank 0) has not answered for") && Catch::Contains("noticed by rank 1"));
}

TEST_CASE("liveness: ranks that finish at different times are not taken for silent ones",
          "[comm][init][gloo][processes][liveness]") {
  spawn_options so;
  so.timeout = 60s;
  so.echo_output = false;
  so.env = {{"PARTRAIN_SILENCE_MS", "500"}};
  const auto result = spawn(3, [](int rank) {
    {
      auto pg = init_process_group("env://", {.backend = "gloo"});
      std::vector<float> v(4, 1.0f);
      pg->all_reduce(tensor_view<float>(v)).wait();
    }  // the group, and its watch, end here: rank 0 first, the others later
    std::this_thread::sleep_for(std::chrono::milliseconds(600 * rank));
  }, so);
  CHECK(result.pids.size() == 3);
  CHECK_THROWS_WITH(liveness_options_from_env([](const std::string& k) -> std::optional<std::string> {
                      if (k == "PARTRAIN_SILENCE_MS") return "-1";
                      return std::nullopt;
                    }),
                    Catch::Contains("PARTRAIN_SILENCE_MS") && Catch::Contains("[0, 3600000]"));
}

TEST_CASE("environment values that cannot work are refused by name", "[comm][init]") {
  const auto silence = [](std::string v) {
    return liveness_options_from_env([v](const std::string& k) -> std::optional<std::string> {
      return k == "PARTRAIN_SILENCE_MS" ? std::optional(v) : std::nullopt;
    });
  };
  // A window shorter than five of the fastest heartbeats would stop a healthy job.
  CHECK_THROWS_WITH(silence("10"), Catch::Contains("PARTRAIN_SILENCE_MS=10 is shorter than 250 ms"));
  CHECK(silence("0").silence.count() == 0);  // off
  CHECK(silence("250").silence.count() == 250);
  // A timeout no rendezvous can meet.
  auto vars = torchrun_vars();
  vars["PARTRAIN_TIMEOUT_MS"] = "1";
  CHECK_THAT(config_message("env://", {}, vars),
             Catch::Contains("PARTRAIN_TIMEOUT_MS=1 is out of range") && Catch::Contains("at least 1000"));
  // PARTRAIN_DEBUG takes TORCH_DISTRIBUTED_DEBUG's values in any case, and nothing else.
  CHECK(partrain::debug_detail("DETAIL"));
  CHECK(partrain::debug_detail("detail"));
  CHECK(!partrain::debug_detail("OFF"));
  CHECK(!partrain::debug_detail("info"));
  CHECK(!partrain::debug_detail(""));
  CHECK_THROWS_WITH(partrain::debug_detail("verbose"), Catch::Contains("PARTRAIN_DEBUG is 'verbose', expected OFF, INFO or DETAIL"));
}

TEST_CASE("a collective timeout names the peers that never reached the operation", "[comm][init][gloo][processes][liveness]") {
  // Rank 2 is alive (its heartbeat goes on) but stuck in its own code before the second
  // all_reduce: the liveness watch leaves it alone, and the collective timeout names it.
  spawn_options so;
  so.timeout = 60s;
  so.grace = 2s;
  so.echo_output = false;
  so.env = {{"PARTRAIN_TIMEOUT_MS", "3000"}};
  try {
    (void)spawn(3, [](int rank) {
      auto pg = init_process_group("env://", {.backend = "gloo"});
      std::vector<float> v(4, 1.0f);
      pg->all_reduce(tensor_view<float>(v)).wait();
      if (rank == 2) std::this_thread::sleep_for(30s);
      pg->all_reduce(tensor_view<float>(v)).wait();
    }, so);
    FAIL("the job with a stuck rank ended without an error");
  } catch (const process_error& e) {
    const std::string out = joined(e.last_lines());
    INFO(e.what() << "\n" << out);
    CHECK(e.rank() != 2);
    CHECK_THAT(out, Catch::Contains("timed out after 3000 ms") &&
                        Catch::Contains("1 rank(s) had not reached operation #2 by their heartbeats: rank 2 (heartbeat ") &&
                        Catch::Contains("last operation all_reduce #1)"));
  }
}

TEST_CASE("PARTRAIN_LOG_LEVEL=debug prints per-rank lines, each prefixed with the rank", "[comm][init][gloo][processes]") {
  // docs/troubleshooting.md promises them; nothing logged at debug before.
  spawn_options so;
  so.timeout = 60s;
  so.grace = 1s;
  so.echo_output = false;
  so.env = {{"PARTRAIN_LOG_LEVEL", "DEBUG"}};
  // spawn throws, naming the rank, when a rank did not find its lines.
  CHECK_NOTHROW(spawn(2, [](int rank) {
    std::ostringstream lines;
    set_log_stream(lines);
    set_log_level(log_level_from_env());  // the level the fork inherited may be cached already
    {
      auto pg = init_process_group("env://", {.backend = "gloo"});
      std::vector<float> v(4, 1.0f);
      pg->all_reduce(tensor_view<float>(v)).wait();
    }
    const std::string prefix = "[partrain rank " + std::to_string(rank) + "] debug: rank " + std::to_string(rank);
    for (const char* what : {" of 2: env:// rendezvous done", " gloo group ready", " liveness watch started",
                             " liveness watch ended"}) {
      if (lines.str().find(prefix + what) == std::string::npos) {
        throw std::runtime_error("no line '" + prefix + what + "' in:\n" + lines.str());
      }
    }
  }, so));
}

TEST_CASE("init_process_group(file://) builds a gloo group", "[comm][init][gloo][processes]") {
  const auto path = std::filesystem::temp_directory_path() / ("partrain_init_file_" + std::to_string(::getpid()));
  std::filesystem::remove(path);
  spawn_options so;
  so.timeout = 60s;
  so.echo_output = false;
  const auto result = spawn(2, [&](int rank) {
    init_options o;
    o.rank = rank;
    o.world_size = 2;
    o.timeout = 20s;
    auto pg = init_process_group("file://" + path.string(), o);
    std::vector<double> v{static_cast<double>(rank)};
    pg->all_reduce(tensor_view<double>(v), reduce_op::max).wait();
    if (v[0] != 1.0) throw std::runtime_error("max gave " + std::to_string(v[0]));
  }, so);
  CHECK(result.pids.size() == 2);  // both ranks exited 0, or spawn threw
  std::filesystem::remove(path);
}

TEST_CASE("init_process_group: a missing peer is a timeout, not a hang", "[comm][init][gloo][timeout]") {
  init_options o = ranks(0, 2);
  o.timeout = 500ms;
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(init_process_group("tcp://127.0.0.1:" + std::to_string(detail::find_free_port()), o), timeout_error);
  CHECK(std::chrono::steady_clock::now() - t0 < 10s);
  // Rank 0 waited for the others to join: its rank, the operation and the deadline as fields.
  try {
    (void)init_process_group("tcp://127.0.0.1:" + std::to_string(detail::find_free_port()), o);
    FAIL("init_process_group without rank 1 returned");
  } catch (const timeout_error& e) {
    CHECK(e.rank() == 0);
    CHECK(e.operation() == "init_process_group");
    CHECK(e.timeout() == 500ms);
  }
}
#endif

TEST_CASE("a job's identity: the token falls back to the batch system's job id", "[comm][init][job]") {
  auto vars = torchrun_vars();
  CHECK(parse_rendezvous("env://", {}, fake_env(vars)).token.empty());
  vars["SLURM_JOB_ID"] = "4242";
  vars["SLURM_STEP_ID"] = "3";
  CHECK(parse_rendezvous("env://", {}, fake_env(vars)).token == "slurm-4242.3");
  vars["PARTRAIN_STORE_TOKEN"] = "given";  // the launcher's own token wins
  CHECK(parse_rendezvous("env://", {}, fake_env(vars)).token == "given");
  auto ompi = std::map<std::string, std::string>{{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                                                 {"MASTER_ADDR", "h"}, {"MASTER_PORT", "29500"},
                                                 {"OMPI_MCA_ess_base_jobid", "123456"}};
  CHECK(parse_rendezvous("env://", {}, fake_env(ompi)).token == "ompi-123456");
}

namespace {

// Each thread rendezvous on one tcp:// store and joins; returns every thread's error ("" if none).
std::vector<std::string> join_threads(const std::vector<std::pair<int, int>>& rank_world) {
  const auto port = detail::find_free_port();
  std::vector<std::string> errors(rank_world.size());
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < rank_world.size(); ++i) {
    threads.emplace_back([&, i] {
      try {
        init_options o = ranks(rank_world[i].first, rank_world[i].second);
        o.timeout = 20s;
        auto info = rendezvous("tcp://127.0.0.1:" + std::to_string(port), o, fake_env({}));
        detail::rdzv::join_job(info);
        // Rank 0 hosts the store: it stays until the others are done with it.
        if (info.store->add("done", 1) == static_cast<std::int64_t>(rank_world.size())) info.store->set("release", "1");
        if (info.rank == 0) info.store->wait({"release"}, 20s);
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
    if (i == 0) std::this_thread::sleep_for(100ms);  // rank 0's server first
  }
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace

TEST_CASE("join_job: ranks that agree on the world size join", "[comm][init][job]") {
  const auto errors = join_threads({{0, 3}, {1, 3}, {2, 3}});
  CHECK(errors == std::vector<std::string>(3));
}

TEST_CASE("join_job: world sizes that differ fail every rank at once, naming both", "[comm][init][job][errors]") {
  const auto t0 = std::chrono::steady_clock::now();
  const auto errors = join_threads({{0, 2}, {1, 3}});
  CHECK(std::chrono::steady_clock::now() - t0 < 10s);  // not the 20 s timeout
  for (const auto& e : errors) {
    CHECK_THAT(e, Catch::Contains("rank 1 was started with world size 3, but rank 0 with world size 2"));
  }
}

TEST_CASE("join_job: a rank claimed twice is refused, naming the process that has it", "[comm][init][job][errors]") {
  const auto errors = join_threads({{0, 3}, {1, 3}, {1, 3}});
  CHECK(errors[0].find("rank 1 was already claimed by pid") != std::string::npos);
  const int refused = static_cast<int>((errors[1].find("already claimed") != std::string::npos)) +
                      static_cast<int>((errors[2].find("already claimed") != std::string::npos));
  CHECK(refused >= 1);
}

TEST_CASE("detect_launch: one answer to who launched this process, and as which rank", "[comm][init]") {
  CHECK_FALSE(detect_launch(fake_env({})).launched());
  auto vars = torchrun_vars();
  CHECK(detect_launch(fake_env(vars)).launcher == "env");
  vars["TORCHELASTIC_RUN_ID"] = "none";
  CHECK(detect_launch(fake_env(vars)).to_string() == "rank 5 of 8 (torchrun)");
  vars["PARTRAIN_USE_AGENT_STORE"] = "1";
  CHECK(detect_launch(fake_env(vars)).launcher == "partrun");
  // srun with WORLD_SIZE set by the batch script (it used to say RANK is not set).
  const std::map<std::string, std::string> srun{{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "1"},
                                                {"SLURM_STEP_TASKS_PER_NODE", "2"}};
  auto with = srun;
  with["WORLD_SIZE"] = "2";
  const auto l = detect_launch(fake_env(with));
  CHECK(l.to_string() == "rank 1 of 2 (srun)");
  CHECK((l.local_rank == 1 && l.local_world_size == 2));
  with["WORLD_SIZE"] = "3";
  CHECK_THROWS_WITH(detect_launch(fake_env(with)), Catch::Contains("WORLD_SIZE=3 disagrees with rank 1 of 2 (srun)"));
  with = srun;
  with["RANK"] = "0";
  CHECK_THROWS_WITH(detect_launch(fake_env(with)), Catch::Contains("RANK=0 disagrees with rank 1 of 2 (srun)"));
  // One of the two by hand, and nothing else: named.
  CHECK_THROWS_WITH(detect_launch(fake_env({{"WORLD_SIZE", "2"}})), Catch::Contains("RANK is not set, but WORLD_SIZE is"));
  CHECK_THROWS_WITH(detect_launch(fake_env({{"RANK", "0"}})), Catch::Contains("WORLD_SIZE is not set, but RANK is"));
  CHECK(detect_launch(fake_env({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "3"}})).to_string() ==
        "rank 0 of 3 (mpirun)");

  // The mpi backend under srun without a PMI plugin is refused before MPI starts, saying what to add.
  CHECK_THROWS_WITH(check_mpi_launch(fake_env(srun)), Catch::Contains("srun --mpi=pmix"));
  auto pmix = srun;
  pmix["PMIX_RANK"] = "1";
  CHECK_NOTHROW(check_mpi_launch(fake_env(pmix)));
  CHECK_NOTHROW(check_mpi_launch(fake_env({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}})));
  CHECK_NOTHROW(check_mpi_launch(fake_env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}})));  // a job of one
}
