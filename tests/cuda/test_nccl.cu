// The NCCL backend at world size 1 (one GPU is enough): every collective and dtype against the
// sequential reference (which, for one rank, is the input itself, and avg is exact), works that
// complete only when the GPU is done, checking mode, bad input, and bounded initialisation.
//
// World size >= 2 cannot run here: NCCL refuses two ranks of one communicator on the same GPU
// ("Duplicate GPU detected"), and CI has at most one. At world size 1 every collective is the
// identity, so a wrong ncclAvg, dtype mapping or peer order passes: those need a multi-GPU
// machine. What one GPU proves is covered below, including send_recv to self (one NCCL group)
// and a collective queued behind long compute that must not time out.
#include <catch2/catch.hpp>

#include <partrain/comm/hybrid_group.hpp>
#include <partrain/comm/local.hpp>
#include <partrain/comm/nccl.hpp>
#include <partrain/cuda/device_buffer.hpp>
#include <partrain/cuda/stream.hpp>

#include "test_stores.hpp"

#include <chrono>
#include <memory>
#include <string>
#include <vector>

using namespace partrain;
using namespace std::chrono_literals;

namespace {

constexpr int gpu = 0;  // the one device these tests use (every buffer names its device)

__global__ void spin(unsigned long long cycles) {
  const unsigned long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

std::unique_ptr<nccl_group> make_world_of_one(process_group_options opts = {.timeout = 60s}) {
  return std::make_unique<nccl_group>(std::make_shared<testing::memory_store>(), 0, 1, device::cuda(0), opts);
}

template <class T>
std::vector<T> iota_values(std::size_t n) {
  std::vector<T> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<T>(static_cast<float>((i * 7) % 23) - 11.0f);
  return v;
}

template <class T>
std::vector<T> to_host(const device_buffer<T>& d) {
  std::vector<T> h(d.size());
  d.copy_to(tensor_view<T>(h));
  return h;
}

template <class T>
bool same(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (static_cast<double>(static_cast<float>(a[i])) != static_cast<double>(static_cast<float>(b[i]))) return false;
  }
  return true;
}

template <class T>
void every_collective(nccl_group& g, std::size_t n) {
  const auto input = iota_values<T>(n);
  device_buffer<T> d(n, gpu);
  for (auto op : {reduce_op::sum, reduce_op::avg, reduce_op::min, reduce_op::max, reduce_op::prod}) {
    d.copy_from(tensor_view<const T>(input));
    g.all_reduce(d.view(), op).wait();
    INFO("all_reduce " << to_string(op) << " n=" << n);
    CHECK(same(to_host(d), input));
  }
  d.copy_from(tensor_view<const T>(input));
  g.broadcast(d.view(), 0).wait();
  CHECK(same(to_host(d), input));
  g.reduce(d.view(), 0, reduce_op::sum).wait();
  CHECK(same(to_host(d), input));

  device_buffer<T> out(n, gpu);
  g.all_gather(d.view(), out.view()).wait();
  CHECK(same(to_host(out), input));
  device_buffer<T> scattered(n, gpu);
  g.reduce_scatter(out.view(), scattered.view(), reduce_op::sum).wait();
  CHECK(same(to_host(scattered), input));
  g.barrier().wait();
}

}  // namespace

TEST_CASE("nccl world of one: every collective, every dtype, odd sizes", "[comm][nccl]") {
  auto g = make_world_of_one();
  CHECK(g->backend() == "nccl");
  CHECK(g->rank() == 0);
  CHECK(g->size() == 1);
  for (std::size_t n : {std::size_t{1}, std::size_t{7}, std::size_t{1000}, std::size_t{1} << 20}) {
    every_collective<float>(*g, n);
    every_collective<double>(*g, n);
    every_collective<partrain::half>(*g, n);
    every_collective<partrain::bfloat16>(*g, n);
    every_collective<std::int32_t>(*g, n);
    every_collective<std::int64_t>(*g, n);
  }
}

TEST_CASE("nccl work completes when the GPU work completes", "[comm][nccl]") {
  auto g = make_world_of_one();
  cuda_stream producer(0);
  g->set_input_stream(producer.get());
  device_buffer<float> d(std::size_t{1024}, gpu);
  spin<<<1, 1, 0, producer.get()>>>(2'000'000'000ULL);  // about a second on any GPU
  work w = g->all_reduce(d.view());
  CHECK_FALSE(w.is_completed());  // queued behind the spinning kernel
  w.wait();
  CHECK(w.is_completed());
  CHECK(producer.query());
}

TEST_CASE("nccl in checking mode compares through device memory", "[comm][nccl]") {
  auto g = make_world_of_one({.timeout = 60s, .check_collectives = true});
  REQUIRE(g->options().check_collectives);
  // Each call below first all_gathers its fingerprint through device memory; a fingerprint read
  // before its zero fill or copy finished would throw "collective mismatch" here.
  const auto input = iota_values<float>(10);
  device_buffer<float> d(std::size_t{10}, gpu);
  d.copy_from(tensor_view<const float>(input));
  CHECK_NOTHROW(g->all_reduce(d.view()).wait());
  CHECK(same(to_host(d), input));
  CHECK_NOTHROW(g->barrier().wait());
  const std::vector<double> values{1.5, -2.25, 1e300};
  device_buffer<double> e(std::size_t{3}, gpu);
  e.copy_from(tensor_view<const double>(values));
  CHECK_NOTHROW(g->broadcast(e.view(), 0).wait());
  CHECK(to_host(e) == values);
  // The checks still reject what the typed front can see on one rank.
  CHECK_THROWS_WITH(g->broadcast(e.view(), 1), Catch::Contains("root 1 is out of range"));
}

TEST_CASE("nccl send_recv to itself moves the data in one group", "[comm][nccl]") {
  auto g = make_world_of_one();
  const auto input = iota_values<float>(257);
  device_buffer<float> out(input.size(), gpu), in(input.size(), gpu);
  out.copy_from(tensor_view<const float>(input));
  g->send_recv(tensor_view<const float, cuda>(out.view()), 0, in.view(), 0).wait();
  CHECK(same(to_host(in), input));
  CHECK_THROWS_WITH(g->send_recv(tensor_view<const float, cuda>(out.view()), 1, in.view(), 0),
                    Catch::Contains("dst 1 is out of range"));
}

TEST_CASE("an nccl collective queued behind long compute is not timed out", "[comm][nccl][timeout]") {
  // The deadline counts from when the GPU starts the collective: here it waits behind about two
  // seconds of compute on the input stream, twice the timeout, and must still complete.
  auto g = make_world_of_one({.timeout = 1s});
  cuda_stream producer(gpu);
  g->set_input_stream(producer.get());
  device_buffer<float> d(std::size_t{64}, gpu);
  spin<<<1, 1, 0, producer.get()>>>(4'000'000'000ULL);
  REQUIRE(cudaGetLastError() == cudaSuccess);
  work w = g->all_reduce(d.view());
  CHECK_NOTHROW(w.wait());
  CHECK(producer.query());
}

TEST_CASE("nccl rejects bad input with clear errors", "[comm][nccl]") {
  auto g = make_world_of_one();
  std::vector<float> host(4);
  CHECK_THROWS_WITH(g->all_reduce(tensor_view<float>(host)), Catch::Contains("does not take host tensors"));
  device_buffer<float> d(std::size_t{4}, gpu);
  CHECK_THROWS_WITH(g->broadcast(d.view(), 1), Catch::Contains("root 1 is out of range"));
  CHECK_THROWS_WITH(g->send(d.view(), 3), Catch::Contains("dst 3 is out of range"));
  device_buffer<float> small(std::size_t{3}, gpu);
  CHECK_THROWS_AS(g->all_gather(d.view(), small.view()), invalid_argument_error);

  auto store = std::make_shared<testing::memory_store>();
  CHECK_THROWS_WITH(nccl_group(store, 0, 1, device::cpu(0)), Catch::Contains("not a CUDA device"));
  CHECK_THROWS_WITH(nccl_group(store, 0, 1, device::cuda(4096)), Catch::Contains("does not exist"));
  CHECK_THROWS_WITH(nccl_group(nullptr, 0, 1, device::cuda(0)), Catch::Contains("store is null"));
  CHECK_THROWS_AS(nccl_group(store, 2, 1, device::cuda(0)), config_error);
}

TEST_CASE("nccl init is bounded by the timeout when a peer never comes", "[comm][nccl][timeout]") {
  // Rank 1 of 2 alone: rank 0 never publishes the unique id.
  auto store = std::make_shared<testing::memory_store>();
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(nccl_group(store, 1, 2, device::cuda(0), {.timeout = 1s}),
                    Catch::Contains("rank 1 nccl init") && Catch::Contains("unique id"));
  // Rank 0 of 2 alone: the id is published, the communicator never completes.
  CHECK_THROWS_WITH(nccl_group(store, 0, 2, device::cuda(0), {.timeout = 2s}), Catch::Contains("rank 0"));
  CHECK(std::chrono::steady_clock::now() - t0 < 60s);  // hang guard only
}

TEST_CASE("an aborted nccl group fails pending and later work naming the rank and operation",
          "[comm][nccl][timeout]") {
  auto g = make_world_of_one();
  device_buffer<float> d(std::size_t{16}, gpu);
  g->all_reduce(d.view()).wait();
  g->abort("test asked for it");
  CHECK_THROWS_WITH(g->all_reduce(d.view()), Catch::Contains("rank 0 all_reduce") && Catch::Contains("aborted"));
}

TEST_CASE("several nccl groups on one store each meet under their own unique id", "[comm][nccl]") {
  auto store = std::make_shared<testing::memory_store>();
  nccl_group a(store, 0, 1, device::cuda(0), {.timeout = 60s});
  nccl_group b(store, 0, 1, device::cuda(0), {.timeout = 60s});
  CHECK(store->check({"partrain/nccl/1/unique_id", "partrain/nccl/2/unique_id"}));
  device_buffer<float> d(std::size_t{8}, gpu);
  a.all_reduce(d.view()).wait();
  b.all_reduce(d.view()).wait();
}

TEST_CASE("nccl_groups_by_id: each quorum's communicator meets under its own prefix, beside a host group",
          "[comm][nccl][hybrid]") {
  auto store = std::make_shared<testing::memory_store>();
  local_group_registry registry({.timeout = 60s});
  auto groups = hybrid_groups_by_id([&](std::int64_t id, int rank, int size) { return registry.make(id, rank, size); },
                                    nccl_groups_by_id(store, device::cuda(0), {.timeout = 60s}));
  for (const std::int64_t id : {0, 1}) {
    auto g = groups(id, 0, 1);
    CHECK(g->backend() == "local+nccl");
    CHECK(g->cuda_device_index() == 0);
    CHECK(store->check({"ft/nccl" + std::to_string(id) + "/1/unique_id"}));
    // Device memory through NCCL, host memory through the local group.
    auto& pair = static_cast<hybrid_group&>(*g);
    const std::vector<float> values = iota_values<float>(8);
    device_buffer<float> d(std::size_t{8}, gpu);
    d.copy_from(tensor_view<const float>(values));
    g->all_reduce(d.view()).wait();
    CHECK(same(to_host(d), values));
    std::vector<float> h(values);
    g->all_reduce(tensor_view<float>(h)).wait();
    CHECK(h == values);
    CHECK(pair.device_group().traffic().calls == 1);
    CHECK(pair.host_group().traffic().calls == 1);
  }
}
