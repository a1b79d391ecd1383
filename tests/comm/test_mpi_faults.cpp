// A stalled or failing rank of an MPI job must not hang the others: each case starts a 2-rank
// job under mpirun (PARTRAIN_MPIEXEC, PARTRAIN_MPI_FAULT_RANK from tests/comm/mpi.cmake) and
// checks that it ends within seconds, non-zero, with an error naming the rank and operation;
// and that a rank merely busy in its own code is not taken for a stalled one.
#include <catch2/catch.hpp>

#include <array>
#include <chrono>
#include <cstdio>
#include <string>
#include <sys/wait.h>

namespace {

struct job_result {
  int code = -1;
  std::string output;
  double seconds = 0;
};

job_result run_job(const std::string& scenario, const std::string& env = "", int np = 2) {
  // `timeout` bounds the job should the behaviour under test regress into a hang.
  const std::string cmd = env + " timeout 90 " PARTRAIN_MPIEXEC " " PARTRAIN_MPIEXEC_FLAGS " -np " + std::to_string(np) +
                          " " PARTRAIN_MPI_FAULT_RANK " " + scenario + " 2>&1";
  const auto t0 = std::chrono::steady_clock::now();
  job_result r;
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::array<char, 4096> buf{};
  while (std::fgets(buf.data(), static_cast<int>(buf.size()), p)) r.output += buf.data();
  const int status = pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace

TEST_CASE("mpi processes: a stalled rank ends the job at the timeout, naming the rank and operation",
          "[comm][mpi][processes]") {
  const auto r = run_job("stall");
  INFO(r.output);
  CHECK(r.code != 0);
  CHECK(r.code != 124);  // not ended by the test's own timeout
  CHECK(r.output.find("rank 0 all_reduce (mpi, world size 2): timed out after 2000 ms") != std::string::npos);
  // MPI cannot say whom a collective waits for; the peers' own progress threads can.
  CHECK(r.output.find("this rank's operation #2; 1 rank(s) never issued operation #2: rank 1 (issued 1, finished 1)") !=
        std::string::npos);
  CHECK(r.output.find("MPI_Abort") != std::string::npos);
  CHECK(r.output.find("unreachable") == std::string::npos);
  CHECK(r.seconds < 30);
}

TEST_CASE("mpi processes: a rank stopped as a whole is named as the one that did not answer",
          "[comm][mpi][processes]") {
  const auto r = run_job("stop");
  INFO(r.output);
  CHECK(r.code != 0);
  CHECK(r.code != 124);
  CHECK(r.output.find("rank 0 all_reduce (mpi, world size 2): timed out after 2000 ms") != std::string::npos);
  CHECK(r.output.find("rank(s) 1 did not answer within 1000 ms (stopped, hung or dead)") != std::string::npos);
  CHECK(r.seconds < 30);
}

// The silence watch: with a 30 s collective timeout and a 1 s silence window, a stopped rank is
// named in seconds (1 s of waiting, then two unanswered rounds of a second), a busy one never.
TEST_CASE("mpi processes: a stopped rank is named within seconds of the silence window, not at the timeout",
          "[comm][mpi][processes]") {
  const auto r = run_job("silent", "PARTRAIN_SILENCE_MS=1000");
  INFO(r.output);
  CHECK(r.code != 0);
  CHECK(r.code != 124);
  CHECK(r.output.find("rank 0 all_reduce (mpi, world size 2): rank 1 is silent: this operation waited ") !=
        std::string::npos);
  CHECK(r.output.find("peers are asked after 1000 ms, PARTRAIN_SILENCE_MS") != std::string::npos);
  CHECK(r.output.find("MPI_Abort") != std::string::npos);
  CHECK(r.output.find("unreachable") == std::string::npos);
  CHECK(r.seconds < 15);  // the timeout is 30 s
}

TEST_CASE("mpi processes: without abort_on_timeout, a silent rank fails the operation as a timeout_error naming it",
          "[comm][mpi][processes]") {
  const auto r = run_job("silent-throw", "PARTRAIN_SILENCE_MS=1000");
  INFO(r.output);
  CHECK(r.code == 4);  // rank 0 caught it and exited 4
  CHECK(r.output.find("caught timeout_error after ") != std::string::npos);
  CHECK(r.output.find(" naming peer 1: partrain: rank 0 all_reduce (mpi, world size 2): rank 1 is silent") !=
        std::string::npos);
  CHECK(r.output.find("unreachable") == std::string::npos);
  CHECK(r.seconds < 15);
}

TEST_CASE("mpi processes: a rank busy in its own code for longer than the silence window is not failed",
          "[comm][mpi][processes]") {
  const auto r = run_job("busy", "PARTRAIN_SILENCE_MS=1000");
  INFO(r.output);
  CHECK(r.code == 0);
  CHECK(r.output.find("rank 1: busy for 4 s in a callback on another thread") != std::string::npos);
  CHECK(r.output.find("rank 0: the all_reduce completed after ") != std::string::npos);
  CHECK(r.output.find("rank 1: the all_reduce completed after ") != std::string::npos);
  CHECK(r.output.find("silent") == std::string::npos);
}

TEST_CASE("mpi processes: a send or recv asks only its peer, not a rank already done with the group",
          "[comm][mpi][processes]") {
  const auto r = run_job("done-early", "PARTRAIN_SILENCE_MS=1000", 3);
  INFO(r.output);
  CHECK(r.code == 0);
  CHECK(r.output.find("rank 0: the recv from rank 1 completed after ") != std::string::npos);
  CHECK(r.output.find("rank 2: done with the group") != std::string::npos);
  CHECK(r.output.find("silent") == std::string::npos);
}

TEST_CASE("mpi processes: a rank that throws ends the job at once, not at its peers' timeout",
          "[comm][mpi][processes]") {
  const auto r = run_job("throw");
  INFO(r.output);
  CHECK(r.code != 0);
  CHECK(r.code != 124);
  CHECK(r.output.find("rank 1 failed: model exploded on purpose") != std::string::npos);
  CHECK(r.output.find("unreachable") == std::string::npos);
  CHECK(r.seconds < 30);  // the barrier's timeout is 120 s
}
