// Fully sharded data parallel over the device layers (models/mlp_layers_device.hpp) on their host
// twin: the code the CUDA layers run (the GEMMs in cuBLAS's conventions, the element functors)
// trains under FSDP as the host layers do, over the local backend at world sizes 1-3, in every
// option that changes the path (16-bit gathers and reductions, units, clipping, no prefetch,
// SHARD_GRAD_OP, AdamW). tests/parallel/test_fsdp_cuda.cu runs the same on a GPU.
#include <catch2/catch.hpp>

#include <partrain/comm/local.hpp>
#include <partrain/parallel/fsdp.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "fsdp_device_layers.hpp"
#include "mlp_host_twin.hpp"
#include "mlp_layers_device.hpp"
#include "pipeline_layers.hpp"

using namespace partrain;
using models::host_twin_backend;
namespace ml = models::layers;

static_assert(fsdp_layer_sequence<ml::device_model<host_twin_backend>>);
static_assert(layer_loss<ml::device_softmax_cross_entropy<host_twin_backend>, std::int32_t>);

namespace {

auto host_copy = [](tensor_view<float> v) { return std::vector<float>(v.begin(), v.end()); };

}  // namespace

TEST_CASE("fsdp over the device layers' host twin equals fsdp over the host layers", "[parallel][fsdp][cpu_tier]") {
  const int world = GENERATE(1, 2, 3);
  const auto v = GENERATE(from_range(test::fsdp_variants()));
  CAPTURE(world, v.name);
  std::vector<test::fsdp_run> twin(static_cast<std::size_t>(world)), host(static_cast<std::size_t>(world));
  run_local(world, [&](local_group& g) {
    auto layers = ml::make_device_mlp<host_twin_backend>(test::fsdp_widths, 11, device::cpu());
    ml::device_softmax_cross_entropy<host_twin_backend> loss(layers);
    twin[static_cast<std::size_t>(g.rank())] = test::run_fsdp(layers, std::move(loss), g, v.optimizer(), v.o, host_copy);
  });
  run_local(world, [&](local_group& g) {
    auto layers = ml::make_mlp(test::fsdp_widths, 11);
    host[static_cast<std::size_t>(g.rank())] =
        test::run_fsdp(layers, ml::softmax_cross_entropy{}, g, v.optimizer(), v.o, host_copy);
  });
  for (int r = 0; r < world; ++r) test::check_same_run(twin[static_cast<std::size_t>(r)], host[static_cast<std::size_t>(r)], v);
}

TEST_CASE("device layers start from make_mlp's weights and their loss refuses a label out of range", "[examples][cpu_tier]") {
  auto twin = ml::make_device_mlp<host_twin_backend>(test::fsdp_widths, 11, device::cpu());
  auto host = ml::make_mlp(test::fsdp_widths, 11);
  REQUIRE(twin.size() == host.size());
  for (std::size_t i = 0; i < twin.size(); ++i) {
    auto& a = twin[i]->parameters();
    auto& b = host[i]->parameters();
    REQUIRE(a.size() == b.size());
    for (std::size_t k = 0; k < a.size(); ++k) {
      const auto va = a[k].value();
      const auto vb = b[k].value();
      REQUIRE(va.shape() == vb.shape());
      for (std::size_t j = 0; j < va.size(); ++j) CHECK(va[j] == vb[j]);
    }
  }
  ml::device_softmax_cross_entropy<host_twin_backend> loss(twin);
  std::vector<float> logits(2 * 3, 0.0f), grad(2 * 3);
  std::vector<std::int32_t> labels{1, 3};
  CHECK_THROWS_WITH(loss.forward_backward(tensor_view<const float>(logits.data(), shape{2, 3}),
                                          tensor_view<const std::int32_t>(labels.data(), labels.size()),
                                          tensor_view<float>(grad.data(), shape{2, 3}), 1.0f),
                    Catch::Contains("label 3 in row 1") && Catch::Contains("expected 0 <= label < 3"));
  labels[1] = 2;
  const double sum = loss.forward_backward(tensor_view<const float>(logits.data(), shape{2, 3}),
                                           tensor_view<const std::int32_t>(labels.data(), labels.size()),
                                           tensor_view<float>(grad.data(), shape{2, 3}), 0.5f);
  CHECK(sum == Approx(2 * std::log(3.0)));  // uniform logits: log 3 per row
  CHECK(grad[1] == Approx(0.5 * (1.0 / 3 - 1)));
}
