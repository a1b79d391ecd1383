// hybrid_group (comm/hybrid_group.hpp): host memory travels on the host group, CUDA memory on the
// device group. Here the host groups are real local groups of two threads and the device group a
// recorder that accepts CUDA memory and never touches it (no GPU here): every call must land on
// the group of its memory, and a replica_group must take the pair as a quorum's group. The same
// over NCCL is in tests/cuda/test_nccl.cu (GPU).
#include <catch2/catch.hpp>

#include <partrain/comm/hybrid_group.hpp>
#include <partrain/comm/local.hpp>
#include <partrain/parallel/lighthouse.hpp>
#include <partrain/parallel/replica_group.hpp>

#include "test_stores.hpp"

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

using namespace partrain;
using namespace std::chrono_literals;

namespace {

// What the device group was asked to do.
struct call {
  std::string what;
  std::size_t count = 0;
  dtype type = dtype::float32;
  bool on_cuda = false;
  int peer = -1;  // root, dst or src
};

class device_recorder final : public process_group {
 public:
  device_recorder(int rank, int size, std::vector<call>& calls, bool takes_cuda = true)
      : process_group(rank, size, {}), calls_(calls), takes_cuda_(takes_cuda) {}
  [[nodiscard]] std::string_view backend() const noexcept override { return "recorder"; }
  [[nodiscard]] bool accepts(device_kind k) const noexcept override { return (k == device_kind::cuda) == takes_cuda_; }
  [[nodiscard]] int cuda_device_index() const noexcept override { return 3; }

 protected:
  work do_all_reduce(raw_tensor t, reduce_op) override { return note("all_reduce", t); }
  work do_broadcast(raw_tensor t, int root) override { return note("broadcast", t, root); }
  work do_reduce(raw_tensor t, int root, reduce_op) override { return note("reduce", t, root); }
  work do_all_gather(raw_tensor in, raw_tensor) override { return note("all_gather", in); }
  work do_reduce_scatter(raw_tensor, raw_tensor out, reduce_op) override { return note("reduce_scatter", out); }
  work do_barrier() override { return note("barrier", {}); }
  work do_send(raw_tensor t, int dst, int) override { return note("send", t, dst); }
  work do_recv(raw_tensor t, int src, int) override { return note("recv", t, src); }

 private:
  work note(std::string what, raw_tensor t, int peer = -1) {
    calls_.push_back({std::move(what), t.count, t.type, t.on_cuda, peer});
    return work::completed();
  }
  std::vector<call>& calls_;
  bool takes_cuda_;
};

}  // namespace

TEST_CASE("hybrid_group: host memory goes to the host group, CUDA memory to the device group",
          "[comm][hybrid][threads]") {
  local_group_registry registry({.timeout = 5s});
  std::vector<call> calls[2];
  std::vector<float> sums[2];
  std::uint64_t host_calls[2] = {};
  {
    std::vector<std::jthread> ranks;
    for (int r = 0; r < 2; ++r) {
      ranks.emplace_back([&, r] {
        hybrid_group g(registry.make(0, r, 2), std::make_unique<device_recorder>(r, 2, calls[r]));
        REQUIRE(g.rank() == r);
        CHECK(g.size() == 2);
        CHECK(g.backend() == "local+recorder");
        CHECK(g.accepts(device_kind::cpu));
        CHECK(g.accepts(device_kind::cuda));
        CHECK(g.cuda_device_index() == 3);
        // Host memory: really reduced over the two threads.
        std::vector<float> h{1.0f + static_cast<float>(r), 10.0f};
        g.all_reduce(tensor_view<float>(h)).wait();
        std::vector<std::int64_t> gathered(4);
        const std::int64_t mine[2] = {r, 7};
        g.all_gather(tensor_view<const std::int64_t>(mine, 2), tensor_view<std::int64_t>(gathered)).wait();
        CHECK(gathered == std::vector<std::int64_t>{0, 7, 1, 7});
        g.barrier().wait();
        sums[r] = h;
        // CUDA memory (never read: the recorder only notes the call).
        std::vector<double> d(6);
        const tensor_view<double, cuda> dv(d.data(), d.size());
        g.all_reduce(dv).wait();
        g.broadcast(dv, 1).wait();
        g.reduce(dv, 0).wait();
        g.all_gather(tensor_view<const double, cuda>(d.data(), 3), dv).wait();
        g.reduce_scatter(tensor_view<const double, cuda>(d.data(), 6), tensor_view<double, cuda>(d.data(), 3)).wait();
        g.send(tensor_view<const double, cuda>(d.data(), 2), 1 - r).wait();
        g.recv(tensor_view<double, cuda>(d.data(), 2), 1 - r).wait();
        host_calls[r] = g.host_group().traffic().calls;
      });
    }
  }
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(sums[r] == std::vector<float>{3.0f, 20.0f});
    CHECK(host_calls[r] == 2);  // the all_reduce and the all_gather; the barrier moves nothing
    REQUIRE(calls[r].size() == 7);
    const char* order[] = {"all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "send", "recv"};
    for (std::size_t k = 0; k < 7; ++k) {
      CHECK(calls[r][k].what == order[k]);
      CHECK(calls[r][k].on_cuda);
      CHECK(calls[r][k].type == dtype::float64);
    }
    CHECK(calls[r][0].count == 6);
    CHECK(calls[r][1].peer == 1);
    CHECK(calls[r][3].count == 3);
    CHECK(calls[r][4].count == 3);
    CHECK(calls[r][5].peer == 1 - r);
  }
}

TEST_CASE("hybrid_group refuses groups that do not fit, by name", "[comm][hybrid]") {
  std::vector<call> calls;
  local_group_registry registry({.timeout = 5s});
  CHECK_THROWS_WITH(hybrid_group(nullptr, std::make_unique<device_recorder>(0, 1, calls)), Catch::Contains("a group is null"));
  CHECK_THROWS_WITH(hybrid_group(std::make_unique<device_recorder>(0, 1, calls), std::make_unique<device_recorder>(0, 1, calls)),
                    Catch::Contains("the host group (recorder) does not take host memory"));
  CHECK_THROWS_WITH(hybrid_group(registry.make(1, 0, 1), std::make_unique<device_recorder>(0, 1, calls, false)),
                    Catch::Contains("the device group (recorder) does not take CUDA memory"));
  CHECK_THROWS_WITH(hybrid_group(registry.make(2, 0, 1), std::make_unique<device_recorder>(1, 2, calls)),
                    Catch::Contains("the host group is rank 0 of 1 and the device group rank 1 of 2"));
}

TEST_CASE("replica_group takes hybrid groups, one new pair per quorum", "[comm][hybrid][parallel][ft]") {
  auto s = std::make_shared<testing::memory_store>();
  lighthouse lh(s, {.replicas = 1, .policy = {.slots = 1}, .tick = 5ms});
  local_group_registry registry({.timeout = 5s});
  std::vector<call> calls;
  std::vector<std::int64_t> made;
  auto groups = hybrid_groups_by_id(
      [&](std::int64_t id, int rank, int size) {
        made.push_back(id);
        return registry.make(id, rank, size);
      },
      [&](std::int64_t, int rank, int size) { return std::make_unique<device_recorder>(rank, size, calls); });
  float value = 1.0f;
  replica_group rg(s, groups,
                   {.save = [&] { return std::vector<std::byte>(4); }, .load = [](std::span<const std::byte>) {}},
                   {.replica = 0, .heartbeat_interval = 20ms, .quorum_timeout = 5s});
  std::string backend;
  for (int k = 0; k < 3; ++k) {
    REQUIRE(rg.step(
        [&](process_group& g, int, std::int64_t) {
          backend = std::string(g.backend());
          float grad = 2.0f;
          g.all_reduce(tensor_view<float>(&grad, 1)).wait();  // host bytes: the local group
          std::vector<float> dev(5);
          g.all_reduce(tensor_view<float, cuda>(dev.data(), dev.size())).wait();  // "gradients": the device group
          value += grad;
        },
        [] {}));
  }
  rg.finish();
  CHECK(backend == "local+recorder");
  CHECK(value == 7.0f);
  CHECK(made.size() == 1);  // one quorum, one pair
  CHECK(calls.size() == 3);
  for (const auto& c : calls) CHECK((c.what == "all_reduce" && c.on_cuda && c.count == 5));
}

TEST_CASE("replica_group refuses a hybrid group over mpi by name", "[comm][hybrid][parallel][ft][errors]") {
  class mpi_named final : public process_group {
   public:
    mpi_named() : process_group(0, 1, {}) {}
    [[nodiscard]] std::string_view backend() const noexcept override { return "mpi"; }

   protected:
    work do_all_reduce(raw_tensor, reduce_op) override { return work::completed(); }
    work do_broadcast(raw_tensor, int) override { return work::completed(); }
    work do_reduce(raw_tensor, int, reduce_op) override { return work::completed(); }
    work do_all_gather(raw_tensor, raw_tensor) override { return work::completed(); }
    work do_reduce_scatter(raw_tensor, raw_tensor, reduce_op) override { return work::completed(); }
    work do_barrier() override { return work::completed(); }
    work do_send(raw_tensor, int, int) override { return work::completed(); }
    work do_recv(raw_tensor, int, int) override { return work::completed(); }
  };
  auto s = std::make_shared<testing::memory_store>();
  lighthouse lh(s, {.replicas = 1, .policy = {.slots = 1}, .tick = 5ms});
  std::vector<call> calls;
  replica_group rg(
      s,
      hybrid_groups_by_id([](std::int64_t, int, int) { return std::make_unique<mpi_named>(); },
                          [&](std::int64_t, int rank, int size) { return std::make_unique<device_recorder>(rank, size, calls); }),
      {.save = [] { return std::vector<std::byte>(); }, .load = [](std::span<const std::byte>) {}},
      {.replica = 0, .heartbeat_interval = 20ms, .quorum_timeout = 5s});
  CHECK_THROWS_WITH((void)rg.step([](process_group&, int, std::int64_t) {}, [] {}),
                    Catch::Contains("an mpi group cannot be a quorum's group"));
}
