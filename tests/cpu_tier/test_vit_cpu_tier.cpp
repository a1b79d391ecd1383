// The CUDA ViT's layers (models/vit_layers_device.hpp) on their host twin, so the CPU tier runs
// the code they run on a GPU (the GEMMs in cuBLAS's column-major conventions and strided batches,
// the element and row functors of vit_elements.hpp): one step against the host ViT
// (models/vit_layers.hpp), whose gradients are checked against finite differences in
// tests/examples/test_vit_layers.cpp, with and without dropout; the plain forms recompute; and
// fully sharded data parallel over the twin equals it over the host layers.
// tests/cuda/test_vit_cuda.cu runs the same step on a GPU.
#include <catch2/catch.hpp>

#include <partrain/comm/local.hpp>
#include <partrain/parallel/fsdp.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "mlp_host_twin.hpp"
#include "mlp_layers_device.hpp"
#include "pipeline_layers.hpp"
#include "vit_device_step.hpp"
#include "vit_layers_device.hpp"

using namespace partrain;
using models::host_twin_backend;
namespace ml = models::layers;

static_assert(fsdp_layer_sequence<ml::device_model<host_twin_backend>>);
static_assert(keeps_activations<ml::device_layer<host_twin_backend>, host>);

namespace {

// The twin sums in the same order as the host layers but calls the BLAS with other shapes.
constexpr double step_tolerance = 2e-5;

}  // namespace

TEST_CASE("the device ViT on its host twin computes the host ViT's step", "[examples][vit][cpu_tier]") {
  const float dropout = GENERATE(0.0f, 0.2f);
  // bfloat16: both round every GEMM operand (vit_config::compute); the sums still differ only in order.
  const dtype compute = GENERATE(dtype::float32, dtype::bfloat16);
  CAPTURE(dropout, to_string(compute));
  auto c = test::tiny_vit(dropout);
  c.compute = compute;
  auto host = ml::make_vit(c, 7);
  auto twin = ml::make_device_vit<host_twin_backend>(c, 7, device::cpu());
  REQUIRE(twin.size() == host.size());
  ml::softmax_cross_entropy host_loss;
  ml::device_softmax_cross_entropy<host_twin_backend> twin_loss(twin);
  const host_twin_backend memory(device::cpu());
  const test::synthetic_batch b(5, c.image * c.image, static_cast<std::int32_t>(c.classes), 3);
  const auto h = test::run_vit_step(memory, host, host_loss, b, 11);
  const auto t = test::run_vit_step(memory, twin, twin_loss, b, 11);
  REQUIRE(h.grads.size() == 3 + 12 * c.depth + 4);
  test::check_same_step(t, h, step_tolerance);
  // Not vacuous: every parameter has a gradient somewhere, and dropout changed the step.
  for (const auto& g : h.grads) CHECK(test::relative_difference(g, std::vector<float>(g.size(), 0.0f)) > 0);
  if (dropout > 0) {
    auto plain_c = test::tiny_vit(0.0f);
    plain_c.compute = compute;
    auto plain = ml::make_vit(plain_c, 7);
    const auto p = test::run_vit_step(memory, plain, host_loss, b, 11);
    CHECK(test::relative_difference(p.logits, h.logits) > 1e-3);
  }
  if (compute == dtype::bfloat16) {
    // Rounded: about bfloat16's 2^-8 away from the float32 step (1e-2 of the largest value here),
    // far beyond the tolerance above, so a side that skipped the rounding would fail it.
    auto fp32_c = c;
    fp32_c.compute = dtype::float32;
    auto fp32 = ml::make_vit(fp32_c, 7);
    const auto f = test::run_vit_step(memory, fp32, host_loss, b, 11);
    double worst = test::relative_difference(f.logits, h.logits);
    for (std::size_t i = 0; i < h.grads.size(); ++i) worst = std::max(worst, test::relative_difference(f.grads[i], h.grads[i]));
    CHECK(worst > 100 * step_tolerance);
    CHECK(worst < 0x1p-4);
  }
}

TEST_CASE("the device ViT's plain forward and backward recompute what the saved forms keep", "[examples][vit][cpu_tier]") {
  // The seed-0 call is what the plain forms use (device_saving_layer), so the steps agree exactly.
  const auto c = test::tiny_vit(0.1f);
  auto twin = ml::make_device_vit<host_twin_backend>(c, 5, device::cpu());
  auto& block = *twin[1];
  const test::synthetic_batch b(3 * 16, c.dim, 10, 9);  // 3 images of 16 tokens
  const shape s{3, 16, c.dim};
  std::vector<float> y(s.numel()), saved(block.saved_size(s)), gin_saved(s.numel()), gin_plain(s.numel()), y2(s.numel());
  const tensor_view<const float> x(b.x.data(), s);
  block.forward(x, tensor_view<float>(y.data(), s), layer_call<>{tensor_view<float>(saved.data(), shape{saved.size()}), 0});
  block.forward(x, tensor_view<float>(y2.data(), s));
  CHECK(y == y2);
  std::vector<float> gy(s.numel(), 0.01f);
  for (std::size_t i = 0; i < gy.size(); ++i) gy[i] *= static_cast<float>(i % 7) - 3.0f;
  const tensor_view<const float> gyv(gy.data(), s), yv(y.data(), s);
  block.backward(x, yv, layer_call<>{tensor_view<float>(saved.data(), shape{saved.size()}), 0}, gyv,
                 tensor_view<float>(gin_saved.data(), s));
  block.backward(x, yv, gyv, tensor_view<float>(gin_plain.data(), s));
  CHECK(gin_saved == gin_plain);
  CHECK(test::relative_difference(gin_plain, std::vector<float>(gin_plain.size(), 0.0f)) > 0);
}

TEST_CASE("the device ViT's layers refuse shapes they cannot take", "[examples][vit][cpu_tier]") {
  const auto c = test::tiny_vit(0.0f);
  auto twin = ml::make_device_vit<host_twin_backend>(c, 5, device::cpu());
  CHECK_THROWS_WITH(twin[0]->output_shape(shape{4, 100}), Catch::Contains("patch_embed"));
  CHECK_THROWS_WITH(twin[1]->output_shape(shape{4, 16, 8}), Catch::Contains("expected [batch, tokens, 16]"));
  CHECK_THROWS_WITH(twin[1]->saved_size(shape{4, 0, 16}), Catch::Contains("tokens >= 1"));
  std::vector<float> x(2 * 16 * 16), y(x.size()), saved(10);
  const shape s{2, 16, 16};
  CHECK_THROWS_WITH(twin[1]->forward(tensor_view<const float>(x.data(), s), tensor_view<float>(y.data(), s),
                                     layer_call<>{tensor_view<float>(saved.data(), shape{saved.size()}), 0}),
                    Catch::Contains("saved buffer has 10 elements"));
  CHECK_THROWS_WITH(ml::make_device_vit<host_twin_backend>(c, 5, device::cuda(0)), Catch::Contains("not the CPU"));
}

TEST_CASE("the device ViT split over a tensor-parallel group computes the whole host ViT's step",
          "[examples][vit][tensor_parallel][cpu_tier]") {
  const int p = GENERATE(2, 4);
  const float dropout = GENERATE(0.0f, 0.2f);
  // bfloat16: the activations' sums move rounded to bf16 (the host blocks' wire).
  const dtype wire = GENERATE(dtype::float32, dtype::bfloat16);
  CAPTURE(p, dropout, to_string(wire));
  const ml::vit_config c{.patch = 7, .dim = 16, .depth = 2, .heads = 4, .mlp_ratio = 2, .dropout = dropout};
  const auto ranks = static_cast<std::size_t>(p);
  const test::synthetic_batch b(3, c.image * c.image, 10, 5);
  const host_twin_backend memory(device::cpu());
  ml::softmax_cross_entropy loss;
  auto whole = ml::make_vit(c, 9);
  const auto ref = test::run_vit_step(memory, whole, loss, b, 21);
  std::vector<test::vit_step> got(ranks);
  std::vector<std::uint64_t> calls(ranks);
  std::vector<std::size_t> sharded(ranks);
  run_local(p, [&](local_group& g) {
    const auto r = static_cast<std::size_t>(g.rank());
    auto shard = ml::make_device_vit<host_twin_backend>(c, 9, device::cpu(), {.group = &g, .rank = r, .size = ranks, .wire = wire});
    ml::device_softmax_cross_entropy<host_twin_backend> l(shard);
    const auto before = g.traffic().calls;
    got[r] = test::run_vit_step(memory, shard, l, b, 21);
    calls[r] = g.traffic().calls - before;
    for (auto& layer : shard) {
      for (auto& param : layer->parameters()) sharded[r] += param.shard_group() == &g ? 1 : 0;
    }
  });
  const double tol = wire == dtype::bfloat16 ? 1e-2 : 1e-5;  // the host blocks' tolerances (test_vit_tensor_parallel)
  for (std::size_t r = 0; r < ranks; ++r) {
    CAPTURE(r);
    test::check_tp_step(got[r], ref, r, ranks, c, tol, 2 * tol);
    CHECK(calls[r] == 4 * c.depth);        // 2 all-reduces forward, 2 backward, per block
    CHECK(sharded[r] == 6 * c.depth);      // qkv W and b, proj W, fc1 W and b, fc2 W: each rank a slice
  }
}

TEST_CASE("the device ViT refuses sequence parallelism and splits it cannot make", "[examples][vit][tensor_parallel][cpu_tier]") {
  std::vector<std::string> errors(2);
  run_local(2, [&](local_group& g) {
    const auto r = static_cast<std::size_t>(g.rank());
    try {
      (void)ml::make_device_vit<host_twin_backend>(test::tiny_vit(0.0f), 1, device::cpu(),
                                                   {.group = &g, .rank = r, .size = 2, .sequence_parallel = true});
    } catch (const std::exception& e) {
      errors[r] = e.what();
    }
  });
  for (const auto& e : errors) CHECK_THAT(e, Catch::Contains("sequence parallelism over 2 ranks runs in the host layers only"));
  // tiny_vit has 2 heads: 4 ranks cannot each hold whole heads (the host shard's check).
  CHECK_THROWS_WITH(ml::make_device_vit<host_twin_backend>(test::tiny_vit(0.0f), 1, device::cpu(),
                                                           {.group = nullptr, .rank = 0, .size = 4}),
                    Catch::Contains("expected both divisible by the tensor-parallel size"));
}

namespace {

struct fsdp_vit_run {
  std::vector<double> losses;
  std::vector<float> values;
};

template <class Layers, class Loss>
fsdp_vit_run run_fsdp_vit(Layers& layers, Loss loss, local_group& g) {
  // SGD: its update is proportional to the gradient, so float rounding stays float rounding
  // (AdamW divides by the root of the second moment and magnifies it where gradients are ~0).
  fully_sharded_data_parallel fsdp(layers, g, std::move(loss), shard_optimizer_options{sgd_options{.lr = 0.1, .momentum = 0.9}});
  fsdp_vit_run out;
  const auto rank = static_cast<std::uint32_t>(g.rank());
  for (std::uint32_t s = 0; s < 3; ++s) {
    const test::synthetic_batch b(3, 784, 10, 40 * s + rank);
    out.losses.push_back(fsdp.train_step(b.input(), b.labels()));
  }
  auto full = fsdp.summon_full_params();
  for (auto& p : full.parameters()) out.values.insert(out.values.end(), p.value().begin(), p.value().end());
  return out;
}

}  // namespace

TEST_CASE("fsdp over the device ViT's host twin equals fsdp over the host ViT", "[parallel][fsdp][vit][cpu_tier]") {
  const int world = 2;
  const float dropout = GENERATE(0.0f, 0.1f);
  CAPTURE(dropout);
  std::vector<fsdp_vit_run> twin(world), host(world);
  run_local(world, [&](local_group& g) {
    auto layers = ml::make_device_vit<host_twin_backend>(test::tiny_vit(dropout), 3, device::cpu());
    ml::device_softmax_cross_entropy<host_twin_backend> loss(layers);
    twin[static_cast<std::size_t>(g.rank())] = run_fsdp_vit(layers, std::move(loss), g);
  });
  run_local(world, [&](local_group& g) {
    auto layers = ml::make_vit(test::tiny_vit(dropout), 3);
    host[static_cast<std::size_t>(g.rank())] = run_fsdp_vit(layers, ml::softmax_cross_entropy{}, g);
  });
  for (std::size_t r = 0; r < static_cast<std::size_t>(world); ++r) {
    REQUIRE(twin[r].losses.size() == host[r].losses.size());
    for (std::size_t i = 0; i < host[r].losses.size(); ++i) CHECK(twin[r].losses[i] == Approx(host[r].losses[i]).epsilon(1e-5));
    CHECK(test::relative_difference(twin[r].values, host[r].values) <= 1e-5);
  }
  CHECK(host[0].losses != host[1].losses);  // each rank its own batches
}
