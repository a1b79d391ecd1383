#include <catch2/catch.hpp>

#include <partrain/launch/process.hpp>
#include <partrain/launch/run_ranks.hpp>
#include <partrain/launch/spawn.hpp>
#include <partrain/rendezvous/tcp_store.hpp>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using namespace partrain;
using namespace std::chrono_literals;

namespace {

std::string env_or(const char* name, const char* fallback = "") {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

// Alive = exists and is not a zombie (in a container nobody may reap a reparented zombie).
bool alive(pid_t pid) {
  if (::kill(pid, 0) != 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const auto close = line.rfind(')');
  return close == std::string::npos || close + 2 >= line.size() || line[close + 2] != 'Z';
}

bool eventually_dead(pid_t pid) {
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (alive(pid)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

std::filesystem::path scratch(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("partrain_spawn_" + std::to_string(::getpid()) + "_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

spawn_options quick() {
  spawn_options o;
  o.timeout = 30s;
  o.grace = 500ms;
  o.echo_output = false;
  return o;
}

}  // namespace

TEST_CASE("spawn runs n ranks that see the torchrun variables", "[comm][spawn][processes]") {
  const int n = GENERATE(1, 2, 4);
  const auto dir = scratch("env" + std::to_string(n));
  auto res = spawn(n, [&](int rank) {
    std::ofstream(dir / std::to_string(rank)) << env_or("RANK") << ' ' << env_or("WORLD_SIZE") << ' ' << env_or("LOCAL_RANK")
                                              << ' ' << env_or("LOCAL_WORLD_SIZE") << ' ' << env_or("MASTER_ADDR") << ' '
                                              << env_or("MASTER_PORT") << ' ' << ::getpid();
  }, quick());
  REQUIRE(res.pids.size() == static_cast<std::size_t>(n));
  CHECK(res.master_port != 0);
  for (int r = 0; r < n; ++r) {
    std::ifstream in(dir / std::to_string(r));
    REQUIRE(in);
    std::string rank, world, local, local_world, addr, port;
    pid_t pid = 0;
    in >> rank >> world >> local >> local_world >> addr >> port >> pid;
    CHECK(rank == std::to_string(r));
    CHECK(world == std::to_string(n));
    CHECK(local == std::to_string(r));
    CHECK(local_world == std::to_string(n));
    CHECK(addr == "127.0.0.1");
    CHECK(port == std::to_string(res.master_port));
    CHECK(pid == res.pids[static_cast<std::size_t>(r)]);
    CHECK_FALSE(alive(pid));
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("spawned ranks rendezvous through a tcp_store on MASTER_PORT", "[comm][spawn][store][processes]") {
  const int n = 3;
  spawn(n, [&](int rank) {
    tcp_store_options o;
    o.host = env_or("MASTER_ADDR");
    o.port = static_cast<std::uint16_t>(std::stoi(env_or("MASTER_PORT")));
    o.is_server = rank == 0;
    o.timeout = 10s;
    tcp_store s(o);
    s.add("arrived", 1);
    s.set("rank/" + std::to_string(rank), std::to_string(rank * rank));
    s.wait({"rank/0", "rank/1", "rank/2"}, 10s);
    if (s.get_string("rank/" + std::to_string((rank + 1) % n), 1s) != std::to_string(((rank + 1) % n) * ((rank + 1) % n))) {
      throw std::runtime_error("wrong value");
    }
    // Rank 0 hosts the server: it leaves only after everyone has read.
    s.add("finished", 1);
    if (rank == 0) {
      while (s.get_string("finished", 1s) != std::to_string(n)) std::this_thread::sleep_for(5ms);
    }
  }, quick());
  SUCCEED("all ranks exited 0");
}

TEST_CASE("spawn binds the port before the ranks start and hands it to rank 0's store", "[comm][spawn][store][processes]") {
  SECTION("nothing else can take the chosen port while the ranks start") {
    spawn(2, [&](int rank) {
      const auto port = static_cast<std::uint16_t>(std::stoi(env_or("MASTER_PORT")));
      if (rank == 1) {
        // Another program trying the port before rank 0's store is up: it is already taken.
        try {
          (void)detail::listen_tcp("127.0.0.1", port);
          return 3;
        } catch (const communication_error& e) {
          if (std::string(e.what()).find("already in use") == std::string::npos) return 4;
        }
      }
      tcp_store s(tcp_store_options{.host = "127.0.0.1", .port = port, .is_server = rank == 0, .timeout = 10s});
      s.add("ready", 1);
      s.wait({"ready"}, 10s);
      while (s.add("ready", 0) < 2) std::this_thread::sleep_for(5ms);
      s.add("finished", 1);
      if (rank == 0) {
        while (s.add("finished", 0) < 2) std::this_thread::sleep_for(5ms);
      }
      return 0;
    }, quick());
    SUCCEED("rank 1 found the port bound and both ranks met on rank 0's store");
  }
  SECTION("a port in use is reported before any rank starts") {
    auto held = detail::listen_tcp("127.0.0.1", 0);
    auto o = quick();
    o.master_port = detail::local_port(held.get());
    bool ran = false;
    CHECK_THROWS_WITH(spawn(2, [&](int) { ran = true; }, o), Catch::Contains("is already in use"));
    CHECK_FALSE(ran);
  }
}

TEST_CASE("spawn names a rank that exits non-zero and stops the others", "[comm][spawn][processes]") {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<pid_t> pids;
  try {
    spawn(3, [](int rank) {
      if (rank == 1) {
        std::printf("about to fail\n");
        return 3;
      }
      std::this_thread::sleep_for(60s);
      return 0;
    }, quick());
    FAIL("spawn did not throw");
  } catch (const process_error& e) {
    CHECK(e.rank() == 1);
    // The rank lives in the sited base: a caller holding any partrain::error reads it.
    const partrain::error& base = e;
    CHECK(base.rank() == 1);
    CHECK(base.operation() == "spawn");
    CHECK_FALSE(e.status().signaled);
    CHECK(e.status().code == 3);
    CHECK_THAT(e.what(), Catch::Contains("rank 1") && Catch::Contains("exited with code 3"));
    CHECK_THAT(e.what(), Catch::Contains("about to fail"));
    pids = e.pids();
  }
  CHECK(std::chrono::steady_clock::now() - t0 < 10s);
  REQUIRE(pids.size() == 3);
  for (pid_t p : pids) CHECK_FALSE(alive(p));
}

TEST_CASE("spawn names a rank killed by a signal", "[comm][spawn][processes]") {
  std::vector<pid_t> pids;
  try {
    spawn(4, [](int rank) {
      if (rank == 2) ::raise(SIGKILL);
      std::this_thread::sleep_for(60s);
    }, quick());
    FAIL("spawn did not throw");
  } catch (const process_error& e) {
    CHECK(e.rank() == 2);
    CHECK(e.status().signaled);
    CHECK(e.status().signal == SIGKILL);
    CHECK_THAT(e.what(), Catch::Contains("rank 2") && Catch::Contains("SIGKILL"));
    pids = e.pids();
  }
  REQUIRE(pids.size() == 4);
  for (pid_t p : pids) CHECK_FALSE(alive(p));
}

TEST_CASE("spawn reports a rank's exception with its message", "[comm][spawn][processes]") {
  CHECK_THROWS_WITH(spawn(2, [](int rank) {
    if (rank == 0) throw config_error("bad thing on rank zero");
  }, quick()),
                    Catch::Contains("rank 0") && Catch::Contains("exited with code 1") &&
                        Catch::Contains("bad thing on rank zero"));
}

TEST_CASE("spawn leaves no process behind: grandchildren and SIGTERM-ignoring ranks", "[comm][spawn][processes]") {
  const auto dir = scratch("orphans");
  std::vector<pid_t> pids;
  try {
    spawn(3, [&](int rank) {
      if (rank == 0) {
        // A grandchild that would outlive its parent if only the parent were killed.
        const pid_t g = ::fork();
        if (g == 0) {
          ::signal(SIGTERM, SIG_IGN);
          std::this_thread::sleep_for(60s);
          ::_exit(0);
        }
        std::ofstream(dir / "grandchild") << g;
      }
      if (rank == 1) ::signal(SIGTERM, SIG_IGN);  // needs the SIGKILL after the grace period
      if (rank == 2) {
        while (!std::filesystem::exists(dir / "grandchild")) std::this_thread::sleep_for(5ms);
        std::this_thread::sleep_for(50ms);
        std::exit(7);
      }
      std::this_thread::sleep_for(60s);
    }, quick());
    FAIL("spawn did not throw");
  } catch (const process_error& e) {
    CHECK(e.rank() == 2);
    CHECK(e.status().code == 7);
    pids = e.pids();
  }
  pid_t grandchild = 0;
  std::ifstream(dir / "grandchild") >> grandchild;
  REQUIRE(grandchild > 0);
  CHECK(eventually_dead(grandchild));
  for (pid_t p : pids) CHECK_FALSE(alive(p));
  std::filesystem::remove_all(dir);
}

TEST_CASE("spawn's teardown does not wait the grace period for a stopped (SIGSTOP) rank", "[comm][spawn][processes]") {
  auto o = quick();
  o.grace = 30s;  // far longer than the test may take: the stopped rank must end at SIGTERM
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(spawn(2, [](int rank) {
    if (rank == 1) {
      ::raise(SIGSTOP);
      std::this_thread::sleep_for(60s);
    }
    std::this_thread::sleep_for(200ms);
    std::exit(5);
  }, o),
                    Catch::Contains("rank 0") && Catch::Contains("exited with code 5"));
  CHECK(std::chrono::steady_clock::now() - t0 < 10s);
}

TEST_CASE("spawn times out with the ranks still running", "[comm][spawn][processes][timeout]") {
  auto o = quick();
  o.timeout = 300ms;
  CHECK_THROWS_WITH(spawn(2, [](int rank) {
    if (rank == 1) std::this_thread::sleep_for(60s);
  }, o),
                    Catch::Contains("rank(s) 1 still running"));
  try {
    spawn(2, [](int rank) {
      if (rank == 1) std::this_thread::sleep_for(60s);
    }, o);
    FAIL("spawn did not time out");
  } catch (const timeout_error& e) {
    CHECK(e.operation() == "spawn");
    CHECK(e.peer() == 1);  // the rank still running
    CHECK(e.timeout() == 300ms);
  }
  CHECK_THROWS_AS(spawn(0, [](int) {}), config_error);
}

TEST_CASE("child_process runs a program with an environment and keeps its last lines", "[comm][spawn][processes]") {
  std::vector<std::string> lines;
  child_options co;
  co.capture_output = true;
  co.keep_lines = 2;
  co.on_line = [&](std::string_view l) { lines.emplace_back(l); };
  std::vector<child_process> kids;
  kids.push_back(child_process::exec("sh", {"-c", "echo one; echo two; echo \"$FOO\"; printf tail; exit 4"},
                                             {"FOO=bar"}, co));
  auto out = supervise(kids, {.timeout = 10s, .grace = 500ms, .poll_interval = 20ms, .stop = nullptr});
  CHECK(out.how == supervise_outcome::result::failed);
  CHECK(out.statuses[0].code == 4);
  CHECK(out.statuses[0].shell_code() == 4);
  CHECK(lines == std::vector<std::string>{"one", "two", "bar", "tail"});
  CHECK(kids[0].last_lines() == std::deque<std::string>{"bar", "tail"});

  CHECK_THROWS_WITH(child_process::exec("/no/such/program", {}, {}),
                    Catch::Contains("cannot execute '/no/such/program'"));

  // stop flag: an interrupted supervisor stops everything.
  std::atomic<bool> stop{false};
  std::vector<child_process> sleepers;
  sleepers.push_back(child_process::exec("sleep", {"60"}, {"PATH=/usr/bin:/bin"}));
  sleepers.push_back(child_process::exec("sleep", {"60"}, {"PATH=/usr/bin:/bin"}));
  std::jthread later([&] {
    std::this_thread::sleep_for(100ms);
    stop = true;
  });
  auto st = supervise(sleepers, {.timeout = 10s, .grace = 500ms, .poll_interval = 20ms, .stop = &stop});
  CHECK(st.how == supervise_outcome::result::interrupted);
  CHECK(st.statuses[0].signaled);
  CHECK(st.statuses[0].signal == SIGTERM);
  CHECK(st.stopped_by_us[1]);
  CHECK_FALSE(alive(sleepers[0].pid()));
}

// The real condition (CUDA initialised in the test process) cannot be made on a host without a
// driver; the check reads a descriptor folder, so a fake one (links to the driver's device files)
// stands in for /proc/self/fd. tests/cuda/test_cuda_raii.cu checks the real one on a GPU.
TEST_CASE("spawn refuses to fork once CUDA is initialised and says to use an exec launch", "[comm][spawn][cuda]") {
  CHECK(detail::launch::is_nvidia_device_file("/dev/nvidiactl"));
  CHECK(detail::launch::is_nvidia_device_file("/dev/nvidia0"));
  CHECK(detail::launch::is_nvidia_device_file("/dev/nvidia-uvm"));
  CHECK_FALSE(detail::launch::is_nvidia_device_file("/usr/lib/x86_64-linux-gnu/libcuda.so.1"));  // loaded, not initialised
  CHECK_FALSE(detail::launch::is_nvidia_device_file("/dev/null"));
  CHECK_FALSE(detail::launch::is_nvidia_device_file(""));

  const auto dir = scratch("fds");
  const auto fds = dir / "fd";
  std::filesystem::create_directories(fds);
  std::filesystem::create_symlink("/dev/null", fds / "0");
  std::filesystem::create_symlink("socket:[12345]", fds / "3");
  CHECK_FALSE(detail::launch::cuda_initialised(fds.c_str()));
  CHECK_NOTHROW(detail::launch::refuse_fork_after_cuda(fds.c_str()));
  std::filesystem::create_symlink("/dev/nvidiactl", fds / "7");
  CHECK(detail::launch::cuda_initialised(fds.c_str()));
  try {
    detail::launch::refuse_fork_after_cuda(fds.c_str());
    FAIL("refuse_fork_after_cuda accepted a process holding /dev/nvidiactl open");
  } catch (const config_error& e) {
    const std::string what = e.what();
    CHECK(what.find("spawn") != std::string::npos);
    CHECK(what.find("CUDA is already initialised") != std::string::npos);
    CHECK(what.find("partrun") != std::string::npos);
  }
  CHECK_FALSE(detail::launch::cuda_initialised((dir / "missing").c_str()));  // unreadable: not refused

  // This host test process never initialises CUDA, so its own check passes and spawn runs.
  CHECK_FALSE(detail::launch::cuda_initialised());
  std::filesystem::remove_all(dir);
}

TEST_CASE("run_ranks refuses more gloo ranks than one host can connect, before starting any", "[comm][spawn][errors]") {
  bool ran = false;
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(run_ranks({.nproc = 1000, .backend = "gloo"}, [&](process_group&) { ran = true; }),
                    Catch::Contains("1000 gloo ranks on one host need 499500 TCP connections") &&
                        Catch::Contains("ephemeral ports") && Catch::Contains("local (threads) or mpi backend"));
  CHECK_FALSE(ran);
  CHECK(std::chrono::steady_clock::now() - t0 < 1s);
}

TEST_CASE("run_ranks refuses to start ranks inside a rank a launcher started", "[comm][spawn][errors]") {
  const auto env_of = [](std::map<std::string, std::string> vars) {
    return [vars = std::move(vars)](const std::string& k) -> std::optional<std::string> {
      if (auto it = vars.find(k); it != vars.end()) return it->second;
      return std::nullopt;
    };
  };
  CHECK(detail::launch::launched_rank(env_of({})).empty());
  CHECK(detail::launch::launched_rank(env_of({{"WORLD_SIZE", "1"}, {"RANK", "0"}})).empty());  // a job of one
  CHECK(detail::launch::launched_rank(env_of({{"SLURM_NTASKS", "1"}, {"SLURM_PROCID", "0"}})).empty());
  CHECK(detail::launch::launched_rank(env_of({{"WORLD_SIZE", "4"}, {"RANK", "2"}, {"PARTRAIN_USE_AGENT_STORE", "1"}})) ==
        "rank 2 of 4 (partrun)");
  CHECK(detail::launch::launched_rank(env_of({{"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "1"}})) ==
        "rank 1 of 2 (mpirun)");
  CHECK(detail::launch::launched_rank(env_of({{"SLURM_NTASKS", "2"}, {"SLURM_PROCID", "1"}, {"WORLD_SIZE", "2"}})) ==
        "rank 1 of 2 (srun)");
  // Threads too: a program asking for 2 threads in each of srun's 2 tasks would be two jobs.
  auto threads = child_process::fork([] {
    ::setenv("SLURM_NTASKS", "2", 1);
    ::setenv("SLURM_PROCID", "0", 1);
    bool ran = false;
    try {
      run_ranks({.nproc = 2, .backend = "local"}, [&](process_group&) { ran = true; });
    } catch (const config_error& e) {
      return !ran && std::string(e.what()).find("asks to start threads here, but this process is already rank 0 of 2 "
                                                "(srun)") != std::string::npos
                 ? 0
                 : 3;
    }
    return 4;
  });
  CHECK(threads.wait_blocking().ok());
  // The whole call, in a child whose environment says it is rank 1 of 2 under partrun.
  auto child = child_process::fork([] {
    ::setenv("WORLD_SIZE", "2", 1);
    ::setenv("RANK", "1", 1);
    ::setenv("PARTRAIN_USE_AGENT_STORE", "1", 1);
    try {
      run_ranks({.nproc = 2}, [](process_group&) {});
    } catch (const config_error& e) {
      return std::string(e.what()).find("already rank 1 of 2 (partrun)") != std::string::npos ? 0 : 3;
    }
    return 4;
  });
  CHECK(child.wait_blocking().ok());
}
