// DDP with parameters in CUDA memory over the local (host) backend: gradients are staged through
// the host buckets. The result must equal the host-parameter run exactly (gpu label; skips
// without a device).
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <partrain/comm/local.hpp>
#include <partrain/cuda/device_buffer.hpp>
#include <partrain/cuda/stream.hpp>
#include <partrain/optim/sgd.hpp>
#include <partrain/parallel/ddp.hpp>

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
#endif
