// Post-local SGD, DiLoCo and streaming DiLoCo with parameters in CUDA memory: their host state
// works on a host mirror of the parameters, copied at every average or outer step, so the result
// must match the host-parameter run, over the local (host) backend and, at world size 1, over NCCL
// (whose collectives take device memory only: the host exchanges go through a device copy).
// Not bit for bit: the device MLP's kernels and the optimizer fuse multiplies and adds (nvcc's
// default), the host does not, and 11 steps carry that rounding (about 1e-5 on an H200). A
// mirror copied at the wrong time or not at all moves parameters by the ranks' spread (1e-2 and
// more). gpu label; skips without a device.
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <partrain/comm/local.hpp>
#include <partrain/optim/sgd.hpp>
#include <partrain/parallel/diloco.hpp>
#include <partrain/parallel/local_sgd.hpp>
#include <partrain/parallel/streaming_diloco.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
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
using partrain::testing::device_mlp;
using partrain::testing::make_toy_batch;
using partrain::testing::toy_mlp;

namespace {

const sgd_options inner{.lr = 0.05, .momentum = 0.9};

// Every rank's parameters after `steps` steps of the mode `make` builds (on model m, optimizer
// opt, group g), with the model of type Model.
template <class Model, class Make>
std::vector<std::vector<float>> run_mode(int world, int steps, Make make) {
  std::vector<std::vector<float>> out(static_cast<std::size_t>(world));
  run_local(world, [&](local_group& g) {
    Model m(7 + static_cast<std::uint64_t>(g.rank()));
    sgd opt(m, inner);
    auto policy = make(m, opt, g);
    for (int s = 0; s < steps; ++s) {
      policy->train_step(make_toy_batch<float>(static_cast<std::size_t>(s * world + g.rank()) * 4, 4));
    }
    if constexpr (requires { m.values(); }) {
      out[static_cast<std::size_t>(g.rank())] = m.values();
    } else {
      out[static_cast<std::size_t>(g.rank())] = m.flat_values();
    }
  });
  return out;
}

// Every rank's parameters within `margin` of the host run's; the largest difference is reported.
void check_close_runs(const std::vector<std::vector<float>>& dev, const std::vector<std::vector<float>>& host, float margin) {
  REQUIRE(dev.size() == host.size());
  for (std::size_t r = 0; r < dev.size(); ++r) {
    REQUIRE(dev[r].size() == host[r].size());
    float worst = 0;
    std::size_t at = 0;
    for (std::size_t i = 0; i < dev[r].size(); ++i) {
      const float d = std::fabs(dev[r][i] - host[r][i]);
      if (!(d <= worst)) worst = d, at = i;  // a NaN on either side is the worst
    }
    CAPTURE(r, at, dev[r][at], host[r][at], margin);
    CHECK(worst <= margin);
  }
}

// Rounding differences before a compressed exchange may round a value to the neighbouring level
// of the 16-bit or 8-bit grid: one level of an outer delta of about 0.1.
float margin_for(outer_compression c) { return c == outer_compression::none ? 1e-4f : 2e-3f; }

}  // namespace

TEST_CASE("post-local SGD, DiLoCo and streaming DiLoCo with CUDA parameters equal the host run", "[parallel][diloco][local_sgd][cuda][gpu]") {
  constexpr int world = 2, steps = 11;
  auto lsgd = [](auto& m, auto& opt, local_group& g) {
    return std::make_unique<post_local_sgd<std::remove_cvref_t<decltype(m)>, std::remove_cvref_t<decltype(opt)>, local_group>>(
        m, opt, g, local_sgd_options{.period = 3, .warmup_steps = 2});
  };
  check_close_runs(run_mode<device_mlp>(world, steps, lsgd), run_mode<toy_mlp<float>>(world, steps, lsgd), 1e-4f);
  for (auto c : {outer_compression::none, outer_compression::bf16, outer_compression::int8}) {
    CAPTURE(to_string(c));
    auto dl = [c](auto& m, auto& opt, local_group& g) {
      return std::make_unique<diloco<std::remove_cvref_t<decltype(m)>, std::remove_cvref_t<decltype(opt)>, local_group>>(
          m, opt, g, diloco_options{.inner_steps = 3, .compression = c});
    };
    check_close_runs(run_mode<device_mlp>(world, steps, dl), run_mode<toy_mlp<float>>(world, steps, dl), margin_for(c));
    auto sd = [c](auto& m, auto& opt, local_group& g) {
      return std::make_unique<streaming_diloco<std::remove_cvref_t<decltype(m)>, std::remove_cvref_t<decltype(opt)>, local_group>>(
          m, opt, g, streaming_diloco_options{.inner_steps = 4, .fragments = 2, .fragment_sync_delay = 1, .compression = c});
    };
    check_close_runs(run_mode<device_mlp>(world, steps, sd), run_mode<toy_mlp<float>>(world, steps, sd), margin_for(c));
  }
}

#if defined(PARTRAIN_WITH_NCCL)
TEST_CASE("DiLoCo and post-local SGD over NCCL at world size 1 (host exchanges through a device copy)", "[parallel][diloco][cuda][nccl][gpu]") {
  const auto store_path = std::filesystem::temp_directory_path() / ("partrain_diloco_nccl_" + std::to_string(::getpid()));
  std::vector<float> dev, host;
  for (int mode = 0; mode < 2; ++mode) {
    CAPTURE(mode);
    std::filesystem::remove(store_path);
    {
      nccl_group g(std::make_shared<file_store>(store_path.string()), 0, 1, device::cuda(0));
      device_mlp m(7);
      sgd opt(m, inner);
      if (mode == 0) {
        diloco dl(m, opt, g, {.inner_steps = 3, .compression = outer_compression::int8, .join = true});
        for (int s = 0; s < 8; ++s) dl.train_step(make_toy_batch<float>(static_cast<std::size_t>(s) * 4, 4));
        CHECK_FALSE(dl.join());
        CHECK(dl.outer_steps() == 2);
      } else {
        post_local_sgd ls(m, opt, g, {.period = 3, .join = true});
        for (int s = 0; s < 8; ++s) ls.train_step(make_toy_batch<float>(static_cast<std::size_t>(s) * 4, 4));
        CHECK_FALSE(ls.join());
      }
      dev = m.values();
    }
    std::filesystem::remove(store_path);
    run_local(1, [&](local_group& g) {
      toy_mlp<float> m(7);
      sgd opt(m, inner);
      if (mode == 0) {
        diloco dl(m, opt, g, {.inner_steps = 3, .compression = outer_compression::int8});
        for (int s = 0; s < 8; ++s) dl.train_step(make_toy_batch<float>(static_cast<std::size_t>(s) * 4, 4));
      } else {
        post_local_sgd ls(m, opt, g, {.period = 3});
        for (int s = 0; s < 8; ++s) ls.train_step(make_toy_batch<float>(static_cast<std::size_t>(s) * 4, 4));
      }
      host = m.flat_values();
    });
    check_close_runs({dev}, {host}, mode == 0 ? margin_for(outer_compression::int8) : 1e-4f);
  }
}
#endif
