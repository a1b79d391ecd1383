// sequential: a layer sequence plus a loss as a model. Its step equals the hand-written loop of
// tests/support/pipeline_layers.hpp bit for bit (loss, every gradient), writes rather than
// accumulates, reports each parameter ready once, last layer first, when its gradient is final;
// evaluation runs the layers in eval mode; copies and moves keep parameters() pointing at their
// own layers; bad input is refused with a sentence.
#include <catch2/catch.hpp>

#include <partrain/core/buffer.hpp>
#include <partrain/core/device.hpp>
#include <partrain/data/batch.hpp>
#include <partrain/model/sequential.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "pipeline_layers.hpp"

using namespace partrain;
using partrain::test::host_model;
using partrain::test::make_mlp;
using partrain::test::reference_eval;
using partrain::test::reference_step;
using partrain::test::softmax_cross_entropy;
using partrain::test::synthetic_batch;

namespace {

const std::vector<std::size_t> widths{6, 5, 4, 3};
constexpr std::uint32_t seed = 5;

batch as_batch(const synthetic_batch& b) {
  return {b.input(), b.labels(), {}};
}

template <class M>
std::vector<std::vector<float>> grads_of(M& m) {
  std::vector<std::vector<float>> out;
  for (auto&& p : m.parameters()) out.emplace_back(p.grad().begin(), p.grad().end());
  return out;
}
template <class M>
std::vector<std::vector<float>> values_of(M& m) {
  std::vector<std::vector<float>> out;
  for (auto&& p : m.parameters()) out.emplace_back(p.value().begin(), p.value().end());
  return out;
}

std::vector<std::vector<float>> grads_of(host_model& m) {
  std::vector<std::vector<float>> out;
  for (auto& l : m) {
    for (auto& p : l->parameters()) out.emplace_back(p.grad().begin(), p.grad().end());
  }
  return out;
}

// A layer that records the mode it last computed in, and whether it was switched at all.
struct mode_probe {
  bool training = true;
  bool forward_saw_training = true;
  std::vector<models::layers::host_param> none;
  [[nodiscard]] shape output_shape(const shape& s) const { return s; }
  void forward(tensor_view<const float> in, tensor_view<float> out) {
    forward_saw_training = training;
    std::ranges::copy(in, out.begin());
  }
  void backward(tensor_view<const float>, tensor_view<const float>, tensor_view<const float> gout, tensor_view<float> gin) {
    std::ranges::copy(gout, gin.begin());
  }
  std::vector<models::layers::host_param>& parameters() { return none; }
  void train(bool on) { training = on; }
};

}  // namespace

static_assert(trainable_on<sequential<host_model, softmax_cross_entropy>, batch>);
static_assert(notifies_grad_ready<sequential<host_model, softmax_cross_entropy>, batch>);
static_assert(evaluable_on<sequential<host_model, softmax_cross_entropy>, batch>);
static_assert(replicable<sequential<host_model, softmax_cross_entropy>>);
static_assert(has_training_mode<mode_probe>);

TEST_CASE("sequential: a step equals the hand-written loop bit for bit, and writes its gradients", "[model][sequential]") {
  host_model reference = make_mlp(widths, seed);
  sequential model(make_mlp(widths, seed), softmax_cross_entropy{});
  REQUIRE(model.parameters().size() == 6);  // three linear layers, weight and bias each
  const synthetic_batch b(7, widths.front(), widths.back(), 3);
  const double want = reference_step(reference, softmax_cross_entropy{}, b.input(), b.labels());
  const double got = model.train_step(as_batch(b));
  CHECK(got == want);
  CHECK(grads_of(model) == grads_of(reference));
  // Again on the same batch: the same gradients, not twice them.
  CHECK(model.train_step(as_batch(b)) == want);
  CHECK(grads_of(model) == grads_of(reference));
  // A batch of another size reuses (or grows) the activation memory and is still exact.
  const synthetic_batch big(19, widths.front(), widths.back(), 4);
  CHECK(model.train_step(as_batch(big)) == reference_step(reference, softmax_cross_entropy{}, big.input(), big.labels()));
  CHECK(grads_of(model) == grads_of(reference));
  CHECK(model.activation_bytes() > 0);
}

TEST_CASE("sequential: each parameter is reported ready once, last layer first, with its final gradient", "[model][sequential]") {
  sequential model(make_mlp(widths, seed), softmax_cross_entropy{});
  const synthetic_batch b(5, widths.front(), widths.back(), 9);
  (void)model.train_step(as_batch(b));
  const auto final_grads = grads_of(model);
  std::vector<std::size_t> order;
  std::vector<bool> final_when_ready;
  (void)model.train_step(as_batch(b), [&](std::size_t i) {
    order.push_back(i);
    const auto g = model.parameters()[i].grad();
    final_when_ready.push_back(std::vector<float>(g.begin(), g.end()) == final_grads[i]);
  });
  CHECK(order == std::vector<std::size_t>{5, 4, 3, 2, 1, 0});
  CHECK(final_when_ready == std::vector<bool>(6, true));
  CHECK(grads_of(model) == final_grads);
}

TEST_CASE("sequential: eval_step equals the reference, in eval mode, and restores the mode", "[model][sequential]") {
  host_model reference = make_mlp(widths, seed);
  sequential model(make_mlp(widths, seed), softmax_cross_entropy{});
  const synthetic_batch b(9, widths.front(), widths.back(), 12);
  const eval_result want = reference_eval(reference, softmax_cross_entropy{}, b.input(), b.labels());
  const eval_result got = model.eval_step(as_batch(b));
  CHECK(got.loss_sum == want.loss_sum);
  CHECK(got.correct == want.correct);
  CHECK(got.count == 9);

  std::vector<mode_probe> probes(2);
  sequential probed(std::move(probes), softmax_cross_entropy{});
  const synthetic_batch p(4, 3, 3, 1);
  (void)probed.eval_step(as_batch(p));
  CHECK_FALSE(probed.layers()[0].forward_saw_training);
  CHECK(probed.layers()[1].training);  // back in training mode after evaluation
  CHECK(probed.training());
  (void)probed.train_step(as_batch(p));
  CHECK(probed.layers()[0].forward_saw_training);
  probed.eval();
  CHECK_FALSE(probed.layers()[1].training);
  (void)probed.eval_step(as_batch(p));
  CHECK_FALSE(probed.layers()[1].training);  // eval() stays eval()
}

TEST_CASE("sequential: replicate_to clones the layers, moves keep parameters() on their own layers", "[model][sequential]") {
  sequential model(make_mlp(widths, seed), softmax_cross_entropy{});
  auto copy = model.replicate_to(device::cpu(1));
  CHECK(values_of(copy) == values_of(model));
  CHECK(copy.parameters()[0].value().data() != model.parameters()[0].value().data());
  const synthetic_batch b(6, widths.front(), widths.back(), 2);
  CHECK(copy.train_step(as_batch(b)) == model.train_step(as_batch(b)));
  CHECK(grads_of(copy) == grads_of(model));
  CHECK_THROWS_WITH(model.replicate_to(device::cuda(0)), Catch::Contains("expected a cpu device"));

  sequential moved(std::move(copy));
  const float* w0 = moved.parameters()[0].value().data();
  CHECK(w0 == moved.layers()[0]->parameters()[0].value().data());
  CHECK(moved.train_step(as_batch(b)) == model.train_step(as_batch(b)));
  CHECK(grads_of(moved) == grads_of(model));

  // Layers held by value are copied as values.
  std::vector<models::layers::linear> plain{models::layers::linear(6, 3, 1)};
  sequential by_value(std::move(plain), softmax_cross_entropy{});
  auto twin = by_value.replicate_to(device::cpu());
  CHECK(values_of(twin) == values_of(by_value));
  CHECK(twin.parameters()[0].value().data() != by_value.parameters()[0].value().data());
}

TEST_CASE("sequential: the loss scale multiplies every gradient", "[model][sequential]") {
  sequential model(make_mlp(widths, seed), softmax_cross_entropy{});
  const synthetic_batch b(8, widths.front(), widths.back(), 6);
  const double plain = model.train_step(as_batch(b));
  const auto g1 = grads_of(model);
  model.set_loss_scale(1024.0f);
  CHECK(model.train_step(as_batch(b)) == plain);  // the loss itself is not scaled
  const auto g2 = grads_of(model);
  for (std::size_t i = 0; i < g1.size(); ++i) {
    for (std::size_t k = 0; k < g1[i].size(); ++k) CHECK(g2[i][k] == Approx(1024.0 * g1[i][k]).epsilon(1e-5).margin(1e-6));
  }
  CHECK_THROWS_WITH(model.set_loss_scale(0.0f), Catch::Contains("finite number > 0"));
}

TEST_CASE("sequential: bad input is refused with a sentence", "[model][sequential]") {
  CHECK_THROWS_WITH(sequential(host_model{}, softmax_cross_entropy{}), Catch::Contains("the layer sequence is empty"));
  sequential model(make_mlp(widths, seed), softmax_cross_entropy{});
  const synthetic_batch b(4, widths.front(), widths.back(), 6);
  batch empty = as_batch(b);
  empty.features = tensor_view<const float>(b.x.data(), shape{0, widths.front()});
  empty.labels = tensor_view<const std::int32_t>(b.y.data(), 0);
  CHECK_THROWS_WITH(model.train_step(empty), Catch::Contains("the batch is empty"));
  CHECK_THROWS_WITH(model.eval_step(empty), Catch::Contains("the batch is empty"));
  batch short_labels = as_batch(b);
  short_labels.labels = tensor_view<const std::int32_t>(b.y.data(), 3);
  CHECK_THROWS_WITH(model.train_step(short_labels), Catch::Contains("4 rows of features but 3 labels"));
  batch wide = as_batch(b);
  wide.features = tensor_view<const float>(b.x.data(), shape{2, 2 * widths.front()});
  wide.labels = tensor_view<const std::int32_t>(b.y.data(), 2);
  CHECK_THROWS_WITH(model.train_step(wide), Catch::Contains("linear: input shape [2, 12], expected [batch, 6]"));
}
