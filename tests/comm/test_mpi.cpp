// The mpi backend, run by ctest under `mpirun -np N` (tests/comm/mpi.cmake): every rank runs
// every test case in the same order, as an MPI program does, and mpirun fails if any rank fails.
#include <catch2/catch.hpp>

#include <partrain/comm/mpi.hpp>
#include <partrain/comm/subgroups.hpp>
#include <partrain/rendezvous/init.hpp>

#include "collective_reference.hpp"

#include <chrono>
#include <memory>
#include <mutex>
#include <numeric>
#include <vector>

using namespace partrain;
using namespace std::chrono_literals;
using partrain::testing::make_input;
using partrain::testing::reference_reduce;

namespace {

mpi_group& world() {
  static mpi_group g(process_group_options{.timeout = 60s});
  return g;
}

}  // namespace

TEMPLATE_TEST_CASE("mpi: every collective matches the sequential reference", "[comm][mpi]", float, double, half,
                   bfloat16, std::int32_t, std::int64_t, std::uint8_t) {
  for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1000}}) {
    INFO("rank " << world().rank() << " of " << world().size() << ", " << n << " elements");
    CHECK(partrain::testing::collective_failures<TestType>(world(), n) == 0);
  }
}

TEST_CASE("mpi: a large all_reduce is bit-identical on every rank", "[comm][mpi]") {
  auto& g = world();
  std::vector<float> v(std::size_t{1} << 20);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.001f * static_cast<float>((i * 13 + static_cast<std::size_t>(g.rank())) % 97);
  g.all_reduce(tensor_view<float>(v), reduce_op::avg).wait();
  std::vector<float> root = v;
  g.broadcast(tensor_view<float>(root), 0).wait();
  CHECK(root == v);
}

TEST_CASE("mpi: operations are asynchronous, overlap and complete in issue order", "[comm][mpi]") {
  auto& g = world();
  std::vector<std::vector<float>> bufs(8, std::vector<float>(4096, 1.0f));
  std::vector<work> ws;
  for (auto& b : bufs) ws.push_back(g.all_reduce(tensor_view<float>(b)));
  // A callback runs on the progress thread, or here when its work has already finished.
  std::mutex order_mutex;
  std::vector<int> order;
  for (std::size_t i = 0; i < ws.size(); ++i)
    ws[i].then([&order, &order_mutex, i] {
      std::lock_guard lock(order_mutex);
      order.push_back(static_cast<int>(i));
    });
  wait_all(ws);
  for (auto& b : bufs) CHECK(b[4095] == static_cast<float>(g.size()));
  std::lock_guard lock(order_mutex);
  std::vector<int> issued(bufs.size());
  std::iota(issued.begin(), issued.end(), 0);
  CHECK(order == issued);
}

TEST_CASE("mpi: both ranks may send before either receives", "[comm][mpi]") {
  auto& g = world();
  if (g.size() < 2) {
    SUCCEED("one rank: no peer to exchange with");
    return;
  }
  const int peer = g.rank() ^ 1;
  if (peer >= g.size()) {  // the odd rank out of an odd world
    CHECK(g.barrier().wait_for(60s));
    return;
  }
  std::vector<double> mine(1 << 16, g.rank() + 1.0), theirs(1 << 16);
  auto s = g.send(tensor_view<double>(mine), peer, 3);
  auto r = g.recv(tensor_view<double>(theirs), peer, 3);
  s.wait();
  r.wait();
  CHECK(theirs.front() == peer + 1.0);
  CHECK(g.barrier().wait_for(60s));
}

TEST_CASE("mpi: traffic is counted as on every backend", "[comm][mpi]") {
  auto& g = world();
  g.reset_traffic();
  std::vector<float> v(1000);
  g.all_reduce(tensor_view<float>(v)).wait();
  const auto n = static_cast<std::uint64_t>(g.size());
  CHECK(g.traffic().bytes_sent == (n == 1 ? 0 : 2 * (n - 1) * 4000 / n));
}

TEST_CASE("mpi: bad arguments are refused before any communication", "[comm][mpi][errors]") {
  auto& g = world();
  std::vector<float> v(4), out(7);
  CHECK_THROWS_WITH(g.broadcast(tensor_view<float>(v), g.size()), Catch::Contains("out of range"));
  CHECK_THROWS_WITH(g.all_gather(tensor_view<float>(v), tensor_view<float>(out)), Catch::Contains("x 4"));
  CHECK_THROWS_WITH(g.send(tensor_view<float>(v), 0, -1), Catch::Contains("tag must be in [0,"));
  CHECK_THROWS_AS(g.recv(tensor_view<float>(v), -1), invalid_argument_error);
}

TEST_CASE("mpi: checking mode reports a different collective on another rank", "[comm][mpi][errors]") {
  mpi_group g(process_group_options{.timeout = 30s, .check_collectives = true});
  if (g.size() < 2) {
    SUCCEED("one rank: nothing to disagree with");
    return;
  }
  std::vector<float> v(g.rank() == 0 ? 10 : 11);
  CHECK_THROWS_WITH(g.all_reduce(tensor_view<float>(v)).wait(),
                    Catch::Contains("collective mismatch") && Catch::Contains("float32 x 10") &&
                        Catch::Contains("float32 x 11"));
}

TEST_CASE("mpi: split_group and new_subgroups split the communicator", "[comm][mpi][subgroups]") {
  auto& g = world();
  auto parity = split_group(g, g.rank() % 2);
  CHECK(parity->rank() == g.rank() / 2);
  CHECK(parity->size() == (g.size() + 1 - g.rank() % 2) / 2);
  std::vector<std::int64_t> v{g.rank()};
  parity->all_reduce(tensor_view<std::int64_t>(v)).wait();
  std::int64_t want = 0;
  for (int q = g.rank() % 2; q < g.size(); q += 2) want += q;
  CHECK(v[0] == want);
  auto alone = new_subgroups(g, 1);
  CHECK(alone->size() == 1);
  CHECK_THROWS_WITH(split_group(g, -2), Catch::Contains("color must be >= 0"));
}

TEST_CASE("mpi: init_process_group builds the group from mpirun's environment", "[comm][mpi]") {
  auto pg = init_process_group("mpi://");
  CHECK(pg->backend() == "mpi");
  CHECK(pg->rank() == world().rank());
  CHECK(pg->size() == world().size());
  auto same = init_process_group("env://", {.backend = "mpi"});
  CHECK(same->size() == world().size());
  std::vector<std::int64_t> one{1};
  same->all_reduce(tensor_view<std::int64_t>(one)).wait();
  CHECK(one[0] == world().size());
  CHECK_THROWS_WITH(init_process_group("mpi://", {.backend = "gloo"}), Catch::Contains("needs backend 'mpi'"));
  CHECK_THROWS_WITH(init_process_group("tcp://x:1", {.backend = "mpi"}), Catch::Contains("'mpi://' or 'env://'"));
  CHECK_THROWS_WITH(init_process_group("mpi://", {.backend = "mpi", .world_size = world().size() + 1}),
                    Catch::Contains("disagrees with MPI's"));
}
