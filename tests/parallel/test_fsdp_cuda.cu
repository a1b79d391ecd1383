// Fully sharded data parallel with CUDA layers (models/mlp_layers_device.hpp on mlp_cuda.cuh's
// backend): the chunks, gathered layers, whole gradients and activations on the device, over NCCL
// at world size 1, against the host layers over the local backend, in every option that changes
// the device path; a grad scaler's overflow skips; refused over a host backend (gpu label; skips
// without a device). The CPU tier runs the same layers' code on their host twin
// (tests/cpu_tier/test_fsdp_cpu_tier.cpp).
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <partrain/comm/local.hpp>
#include <partrain/cuda/check.hpp>
#include <partrain/parallel/fsdp.hpp>
#include <partrain/precision/grad_scaler.hpp>
#include <partrain/precision/sharded_amp.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#if defined(PARTRAIN_WITH_NCCL)
#include <partrain/comm/nccl.hpp>
#include <partrain/rendezvous/file_store.hpp>
#include <unistd.h>
#endif

#include "fsdp_device_layers.hpp"
#include "mlp_cuda.cuh"
#include "mlp_layers_device.hpp"

using namespace partrain;
using models::cuda_backend;
namespace ml = models::layers;

static_assert(fsdp_layer_sequence<ml::device_model<cuda_backend>>);

namespace {

std::vector<float> device_copy(tensor_view<float, partrain::cuda> v) {
  std::vector<float> h(v.size());
  if (!h.empty()) PARTRAIN_CUDA_CHECK(cudaMemcpy(h.data(), v.data(), v.size_bytes(), cudaMemcpyDeviceToHost));
  return h;
}
auto host_copy = [](tensor_view<float> v) { return std::vector<float>(v.begin(), v.end()); };

}  // namespace

#if defined(PARTRAIN_WITH_NCCL)
namespace {

struct nccl_world_1 {
  std::filesystem::path path = std::filesystem::temp_directory_path() / ("partrain_fsdp_nccl_" + std::to_string(::getpid()));
  std::optional<nccl_group> g;
  nccl_world_1() {
    std::filesystem::remove(path);
    g.emplace(std::make_shared<file_store>(path.string()), 0, 1, device::cuda(0));
  }
  ~nccl_world_1() {
    g.reset();
    std::filesystem::remove(path);
  }
};

}  // namespace

TEST_CASE("fsdp with CUDA layers over NCCL at world size 1 equals the host layers", "[parallel][fsdp][cuda][nccl][gpu]") {
  const auto v = GENERATE(from_range(test::fsdp_variants()));
  CAPTURE(v.name);
  test::fsdp_run dev, host;
  {
    nccl_world_1 w;
    auto layers = ml::make_device_mlp<cuda_backend>(test::fsdp_widths, 11, device::cuda(0));
    ml::device_softmax_cross_entropy<cuda_backend> loss(layers);
    dev = test::run_fsdp(layers, std::move(loss), *w.g, v.optimizer(), v.o, device_copy);
  }
  run_local(1, [&](local_group& g) {
    auto layers = ml::make_mlp(test::fsdp_widths, 11);
    host = test::run_fsdp(layers, ml::softmax_cross_entropy{}, g, v.optimizer(), v.o, host_copy);
  });
  test::check_same_run(dev, host, v);
}

TEST_CASE("fsdp with CUDA layers and a grad scaler: an overflow skips the step and backs the scale off", "[parallel][fsdp][cuda][nccl][amp][gpu]") {
  const auto initial = [] {
    auto layers = ml::make_mlp(test::fsdp_widths, 11);
    std::vector<float> out;
    for (auto& l : layers) {
      for (auto& p : l->parameters()) out.insert(out.end(), p.v.begin(), p.v.end());
    }
    return out;
  }();
  for (const bool overflow : {true, false}) {
    // Gradients of order 1e-2 times 2^40 are far past float16's range: every step overflows.
    const float init_scale = overflow ? std::ldexp(1.0f, 40) : 1024.0f;
    CAPTURE(init_scale);
    nccl_world_1 w;
    auto layers = ml::make_device_mlp<cuda_backend>(test::fsdp_widths, 11, device::cuda(0));
    fully_sharded_data_parallel f(layers, *w.g, ml::device_softmax_cross_entropy<cuda_backend>(layers),
                                  adamw_options{.lr = 0.01}, {.reduce_dtype = dtype::float16});
    grad_scaler scaler(grad_scaler_options{.init_scale = init_scale});
    std::vector<int> skipped;
    for (int s = 0; s < 3; ++s) {
      const test::synthetic_batch b(test::fsdp_rows, test::fsdp_widths.front(), 3, 100 + static_cast<std::uint32_t>(s));
      const batch mine{b.input(), b.labels(), {}};
      skipped.push_back(amp_step(f, scaler, mine).skipped ? 1 : 0);
    }
    std::vector<float> values;
    {
      auto full = f.summon_full_params();
      for (auto& p : full.parameters()) {
        const auto v = device_copy(p.value());
        values.insert(values.end(), v.begin(), v.end());
      }
    }
    if (overflow) {
      CHECK(skipped == std::vector<int>{1, 1, 1});
      CHECK(scaler.scale() == std::ldexp(1.0f, 37));
      CHECK(values == initial);
    } else {
      CHECK(skipped == std::vector<int>{0, 0, 0});
      CHECK(values != initial);
    }
  }
}
#endif

TEST_CASE("fsdp with CUDA layers over a host backend is refused, naming nccl", "[parallel][fsdp][cuda][gpu]") {
  run_local(1, [&](local_group& g) {
    auto layers = ml::make_device_mlp<cuda_backend>(test::fsdp_widths, 11, device::cuda(0));
    CHECK_THROWS_WITH((fully_sharded_data_parallel(layers, g, ml::device_softmax_cross_entropy<cuda_backend>(layers),
                                                   sgd_options{.lr = 0.1})),
                      Catch::Contains("rank 0") && Catch::Contains("nccl") && Catch::Contains("CUDA memory"));
  });
}
