// DDP with parameters in CUDA memory over the local (host) backend: gradients are staged through
// the host buckets. The result must equal the host-parameter run exactly (gpu label; skips
// without a device). Also ZeRO-1/2 (sharded_data_parallel) with CUDA parameters: its shards and
// optimizer state on the device, over NCCL, against the host run; refused over a host backend.
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <partrain/comm/local.hpp>
#include <partrain/cuda/device_buffer.hpp>
#include <partrain/cuda/stream.hpp>
#include <partrain/optim/sgd.hpp>
#include <partrain/parallel/ddp.hpp>
#include <partrain/parallel/zero.hpp>

#include <cstdio>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#if defined(PARTRAIN_WITH_NCCL)
#include <partrain/comm/nccl.hpp>
#include <partrain/rendezvous/file_store.hpp>
#include <unistd.h>
#endif

#include "device_mlp.cuh"
#include "toy_models.hpp"

using namespace partrain;
using partrain::testing::make_toy_batch;
using partrain::testing::toy_batch;
using partrain::testing::device_mlp;
using partrain::testing::toy_mlp;

TEST_CASE("ddp with CUDA parameters equals the host run (staged through host buckets)", "[parallel][ddp][cuda][gpu]") {
  // own_stream: the staging copies must be ordered on the model's stream (model_stream).
  const bool own_stream = GENERATE(false, true);
  INFO("model on its own non-blocking stream: " << own_stream);
  for (int world : {1, 2}) {
    std::vector<std::vector<float>> dev(static_cast<std::size_t>(world)), host(static_cast<std::size_t>(world));
    const sgd_options o{.lr = 0.05, .momentum = 0.9};
    run_local(world, [&](local_group& g) {
      device_mlp m(7 + static_cast<std::uint64_t>(g.rank()), own_stream);
      distributed_data_parallel ddp(m, g, {.bucket_cap_bytes = 64, .first_bucket_bytes = 16});
      sgd opt(m, o);
      {
        auto guard = ddp.no_sync();
        ddp.train_step(make_toy_batch<float>(1000 + static_cast<std::size_t>(g.rank()) * 4, 4));
      }
      for (int s = 0; s < 5; ++s) {
        ddp.train_step(make_toy_batch<float>(static_cast<std::size_t>(s * world + g.rank()) * 4, 4));
        opt.step();
      }
      dev[static_cast<std::size_t>(g.rank())] = m.values();
    });
    run_local(world, [&](local_group& g) {
      toy_mlp<float> m(7 + static_cast<std::uint64_t>(g.rank()));
      distributed_data_parallel ddp(m, g, {.bucket_cap_bytes = 64, .first_bucket_bytes = 16});
      sgd opt(m, o);
      {
        auto guard = ddp.no_sync();
        ddp.train_step(make_toy_batch<float>(1000 + static_cast<std::size_t>(g.rank()) * 4, 4));
      }
      for (int s = 0; s < 5; ++s) {
        ddp.train_step(make_toy_batch<float>(static_cast<std::size_t>(s * world + g.rank()) * 4, 4));
        opt.step();
      }
      host[static_cast<std::size_t>(g.rank())] = m.flat_values();
    });
    for (int r = 0; r < world; ++r) {
      const auto& d = dev[static_cast<std::size_t>(r)];
      const auto& h = host[static_cast<std::size_t>(r)];
      REQUIRE(d.size() == h.size());
      // The SGD kernel may fuse multiply-adds: close, not bitwise.
      for (std::size_t i = 0; i < d.size(); ++i) CHECK(d[i] == Approx(h[i]).epsilon(1e-5).margin(1e-6));
    }
  }
}

#if defined(PARTRAIN_WITH_NCCL)
TEST_CASE("ddp with NCCL at world size 1 trains (device buckets; plain, fp16, bf16 hooks; no_sync; join)",
          "[parallel][ddp][cuda][nccl][gpu]") {
  const auto store_path = std::filesystem::temp_directory_path() / ("partrain_ddp_nccl_" + std::to_string(::getpid()));
  std::filesystem::remove(store_path);
  const sgd_options o{.lr = 0.05, .momentum = 0.9};
  for (auto hook : {comm_hooks::allreduce(), comm_hooks::fp16_compress(), comm_hooks::bf16_compress()}) {
    std::vector<float> dev_values, host_values;
    std::vector<double> losses;
    {
      nccl_group g(std::make_shared<file_store>(store_path.string()), 0, 1, device::cuda(0));
      device_mlp m(7);
      ddp_options opts{.bucket_cap_bytes = 64, .first_bucket_bytes = 16, .join = true};
      opts.hook = hook;
      distributed_data_parallel ddp(m, g, opts);
      sgd opt(m, o);
      {
        auto guard = ddp.no_sync();
        ddp.train_step(make_toy_batch<float>(1000, 4));
      }
      for (int s = 0; s < 20; ++s) {
        losses.push_back(ddp.train_step(make_toy_batch<float>(static_cast<std::size_t>(s % 5) * 4, 4)));
        opt.step();
      }
      CHECK_FALSE(ddp.join());
      CHECK(ddp.stats().synced_steps == 20);
      dev_values = m.values();
    }
    std::filesystem::remove(store_path);
    run_local(1, [&](local_group& g) {
      toy_mlp<float> m(7);
      distributed_data_parallel ddp(m, g, {.bucket_cap_bytes = 64, .first_bucket_bytes = 16});
      sgd opt(m, o);
      {
        auto guard = ddp.no_sync();
        ddp.train_step(make_toy_batch<float>(1000, 4));
      }
      for (int s = 0; s < 20; ++s) {
        ddp.train_step(make_toy_batch<float>(static_cast<std::size_t>(s % 5) * 4, 4));
        opt.step();
      }
      host_values = m.flat_values();
    });
    CHECK(losses.back() < losses.front());  // it trains
    REQUIRE(dev_values.size() == host_values.size());
    // fp16/bf16 round the gradients; the plain hook matches closely.
    for (std::size_t i = 0; i < dev_values.size(); ++i) CHECK(dev_values[i] == Approx(host_values[i]).margin(2e-2));
  }
}

// Every option that changes the device path: stage 1 and 2, both partitions (per bucket launches
// in backward from the model's reports), SGD with momentum and AdamW, clipping, no_sync, the
// model on its own stream; several buckets (64-byte cap) and padding (the MLP's 43 elements).
TEST_CASE("zero with CUDA parameters over NCCL at world size 1 equals the host run", "[parallel][zero][cuda][nccl][gpu]") {
  const auto store_path = std::filesystem::temp_directory_path() / ("partrain_zero_nccl_" + std::to_string(::getpid()));
  const int stage = GENERATE(1, 2);
  const auto partition = GENERATE(zero_partition::per_bucket, zero_partition::contiguous);
  const bool adam = GENERATE(false, true);
  const bool own_stream = GENERATE(false, true);
  CAPTURE(stage, static_cast<int>(partition), adam, own_stream);
  const shard_optimizer_options o =
      adam ? shard_optimizer_options{adamw_options{.lr = 0.01}} : shard_optimizer_options{sgd_options{.lr = 0.05, .momentum = 0.9}};
  const zero_options zo{.stage = stage, .partition = partition, .bucket_cap_bytes = 64, .first_bucket_bytes = 16,
                        .max_grad_norm = 0.5};
  auto train = [&](auto& zero) {
    std::vector<double> losses;
    {
      auto guard = zero.no_sync();
      zero.train_step(make_toy_batch<float>(1000, 4));
    }
    for (int s = 0; s < 12; ++s) losses.push_back(zero.train_step(make_toy_batch<float>(static_cast<std::size_t>(s % 5) * 4, 4)));
    return losses;
  };
  std::vector<float> dev_values, host_values;
  std::vector<double> dev_losses, host_losses;
  std::size_t in_backward = 0, host_in_backward = 0;
  std::vector<float> dev_masters;
  {
    std::filesystem::remove(store_path);
    nccl_group g(std::make_shared<file_store>(store_path.string()), 0, 1, device::cuda(0));
    device_mlp m(7, own_stream);
    sharded_data_parallel zero(m, g, o, zo);
    dev_losses = train(zero);
    in_backward = zero.buckets_launched_in_backward();
    dev_masters = zero.master_values();
    CHECK(zero.buckets() > 1);
    CHECK(std::isfinite(zero.last_grad_norm()));
    dev_values = m.values();
  }
  std::filesystem::remove(store_path);
  run_local(1, [&](local_group& g) {
    toy_mlp<float> m(7);
    sharded_data_parallel zero(m, g, o, zo);
    host_losses = train(zero);
    host_in_backward = zero.buckets_launched_in_backward();
    host_values = m.flat_values();
  });
  CHECK(in_backward == host_in_backward);
  CHECK((in_backward > 0) == (partition == zero_partition::per_bucket));
  REQUIRE(dev_values.size() == host_values.size());
  REQUIRE(dev_masters.size() == host_values.size());  // world 1: the shard is the whole model
  REQUIRE(dev_losses.size() == host_losses.size());
  for (std::size_t i = 0; i < dev_losses.size(); ++i) CHECK(dev_losses[i] == Approx(host_losses[i]).epsilon(1e-4));
  // The device fuses multiply-adds: close, not bitwise; a missing step or all_gather is off by far more.
  for (std::size_t i = 0; i < dev_values.size(); ++i) {
    CHECK(dev_values[i] == Approx(host_values[i]).epsilon(1e-4).margin(1e-5));
    CHECK(dev_masters[i] == dev_values[i]);
  }
}
#endif

TEST_CASE("zero with CUDA parameters over a host backend is refused, naming nccl", "[parallel][zero][cuda][gpu]") {
  run_local(1, [&](local_group& g) {
    device_mlp m(7);
    REQUIRE_THROWS_AS((sharded_data_parallel(m, g, sgd_options{.lr = 0.1})), config_error);
    try {
      sharded_data_parallel zero(m, g, sgd_options{.lr = 0.1});
    } catch (const config_error& e) {
      CHECK_THAT(e.what(), Catch::Contains("rank 0") && Catch::Contains("nccl") && Catch::Contains("CUDA memory"));
    }
  });
}
