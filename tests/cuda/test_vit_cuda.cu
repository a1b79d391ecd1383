// The CUDA ViT (models/vit_layers_device.hpp on mlp_cuda.cuh's backend: cuBLAS, strided batched
// GEMMs for the heads, vit_elements.hpp's functors as kernels) against the host ViT
// (models/vit_layers.hpp): one step, same weights, batch and call seeds, with and without dropout,
// at the tiny size and at the example's (16 tokens of width 64, 4 heads, batch 64). The CPU tier
// runs the same step on the layers' host twin (tests/cpu_tier/test_vit_cpu_tier.cpp). Skips
// without a CUDA device (gpu label).
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include <partrain/comm/local.hpp>

#include "mlp_cuda.cuh"
#include "mlp_host_twin.hpp"
#include "mlp_layers_device.hpp"
#include "pipeline_layers.hpp"
#include "vit_device_step.hpp"
#include "vit_layers_device.hpp"

using namespace partrain;
using models::cuda_backend;
namespace ml = models::layers;

static_assert(keeps_activations<ml::device_layer<cuda_backend>, partrain::cuda>);

TEST_CASE("the CUDA ViT computes the host ViT's step", "[examples][vit][gpu]") {
  const float dropout = GENERATE(0.0f, 0.2f);
  const bool example_size = GENERATE(false, true);
  // bfloat16 matrix products (tensor cores) against the host's rounded operands.
  const dtype compute = GENERATE(dtype::float32, dtype::bfloat16);
  CAPTURE(dropout, example_size, to_string(compute));
  ml::vit_config c = example_size ? ml::vit_config{.dropout = dropout} : test::tiny_vit(dropout);
  c.compute = compute;
  const std::size_t n = example_size ? 64 : 5;
  auto host = ml::make_vit(c, 7);
  auto gpu = ml::make_device_vit<cuda_backend>(c, 7, device::cuda(0));
  ml::softmax_cross_entropy host_loss;
  ml::device_softmax_cross_entropy<cuda_backend> gpu_loss(gpu);
  const test::synthetic_batch b(n, c.image * c.image, static_cast<std::int32_t>(c.classes), 3);
  const auto h = test::run_vit_step(models::host_twin_backend(device::cpu()), host, host_loss, b, 11);
  const auto g = test::run_vit_step(*gpu.front()->backend(), gpu, gpu_loss, b, 11);
  // cuBLAS sums in other orders and the GPU fuses multiply-adds: float rounding, a little more
  // than the twin's at the larger size. In bfloat16 those differences move a few operands across
  // a rounding boundary (one bf16 step, 2^-8): still well inside the 1e-2 between bf16 and fp32.
  const double fp32_tolerance = example_size ? 1e-4 : 2e-5;
  test::check_same_step(g, h, compute == dtype::bfloat16 ? 2e-3 : fp32_tolerance);
}

TEST_CASE("the CUDA ViT split over 2 tensor-parallel ranks as threads on one GPU computes the whole host ViT's step",
          "[examples][vit][tensor_parallel][gpu]") {
  // The local backend takes host memory: each block's 4 sums per step pass through it (download,
  // all-reduce, upload); NCCL would sum in place.
  const float dropout = GENERATE(0.0f, 0.2f);
  CAPTURE(dropout);
  const ml::vit_config c{.patch = 7, .dim = 16, .depth = 2, .heads = 4, .mlp_ratio = 2, .dropout = dropout};
  const test::synthetic_batch b(3, c.image * c.image, 10, 5);
  auto whole = ml::make_vit(c, 9);
  ml::softmax_cross_entropy loss;
  const auto ref = test::run_vit_step(models::host_twin_backend(device::cpu()), whole, loss, b, 21);
  std::vector<test::vit_step> got(2);
  run_local(2, [&](local_group& g) {
    const auto r = static_cast<std::size_t>(g.rank());
    auto shard = ml::make_device_vit<cuda_backend>(c, 9, device::cuda(0), {.group = &g, .rank = r, .size = 2});
    ml::device_softmax_cross_entropy<cuda_backend> l(shard);
    got[r] = test::run_vit_step(*shard.front()->backend(), shard, l, b, 21);
  });
  for (std::size_t r = 0; r < 2; ++r) {
    CAPTURE(r);
    test::check_tp_step(got[r], ref, r, 2, c, 1e-4, 2e-4);  // cuBLAS's sums in other orders
  }
}
