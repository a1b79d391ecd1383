// A stalled or failing rank of an MPI job must not hang the others: each case starts a 2-rank
// job under mpirun (PARTRAIN_MPIEXEC, PARTRAIN_MPI_FAULT_RANK from tests/comm/mpi.cmake) and
// checks that it ends within seconds, non-zero, with an error naming the rank and operation.
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

job_result run_job(const std::string& scenario) {
  // `timeout` bounds the job should the behaviour under test regress into a hang.
  const std::string cmd = "timeout 90 " PARTRAIN_MPIEXEC " " PARTRAIN_MPIEXEC_FLAGS " -np 2 " PARTRAIN_MPI_FAULT_RANK
                          " " + scenario + " 2>&1";
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
  CHECK(r.output.find("MPI_Abort") != std::string::npos);
  CHECK(r.output.find("unreachable") == std::string::npos);
  CHECK(r.seconds < 30);
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
