// Activation recomputation (recompute_options on a sequential model): a layer that keeps
// activations, with dropout drawn from its call's seed, gives bit-identical gradients with and
// without recomputation under the single-process model, DDP, fully sharded data parallel and the
// pipeline; recomputation runs the selected layers' forwards a second time, repeats no collective
// or send, and lowers the activation bytes each runner counts.
#include <catch2/catch.hpp>

#include <partrain/comm/local.hpp>
#include <partrain/model/sequential.hpp>
#include <partrain/optim/sgd.hpp>
#include <partrain/parallel/ddp.hpp>
#include <partrain/parallel/fsdp.hpp>
#include <partrain/parallel/pipeline/stage.hpp>

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "dp_models.hpp"
#include "mlp_layers.hpp"

using namespace partrain;
using models::layers::host_layer;
using models::layers::host_model;
using models::layers::host_param;
using models::layers::host_saving_layer;
using models::layers::linear;
using models::layers::softmax_cross_entropy;
using partrain::test::dp_dataset;

namespace {

// y = dropout(tanh(x * w + b)) feature by feature, p = 0.3. Keeps tanh's output and the mask for
// its backward; counts its forwards (shared by its clones, which threads run at once).
class gated_dropout final : public host_saving_layer {
 public:
  gated_dropout(std::size_t width, std::shared_ptr<std::atomic<int>> forwards) : d_(width), forwards_(std::move(forwards)) {
    params_.emplace_back(shape{d_});
    params_.emplace_back(shape{d_});
    for (std::size_t c = 0; c < d_; ++c) {
      params_[0].v[c] = 0.5f + 0.1f * static_cast<float>(c);
      params_[1].v[c] = 0.05f * static_cast<float>(c);
    }
  }
  [[nodiscard]] shape output_shape(const shape& s) const override { return s; }
  [[nodiscard]] std::size_t saved_size(const shape& s) const override { return 2 * s.numel(); }
  void forward(tensor_view<const float> x, tensor_view<float> y, const layer_call<>& call) override {
    forwards_->fetch_add(1);
    const std::size_t n = x.size();
    float* h = call.saved.data();
    float* mask = h + n;
    const float* w = params_[0].value().data();
    const float* b = params_[1].value().data();
    for (std::size_t i = 0; i < n; ++i) {
      h[i] = std::tanh(x[i] * w[i % d_] + b[i % d_]);
      mask[i] = keep(call.seed, i) ? 1.0f / (1.0f - p) : 0.0f;
      y[i] = h[i] * mask[i];
    }
  }
  void backward(tensor_view<const float> x, tensor_view<const float>, const layer_call<>& call,
                tensor_view<const float> gy, tensor_view<float> gx) override {
    const std::size_t n = x.size();
    const float* h = call.saved.data();
    const float* mask = h + n;
    float* gw = params_[0].grad().data();
    float* gb = params_[1].grad().data();
    const float* w = params_[0].value().data();
    for (std::size_t i = 0; i < n; ++i) {
      const float dz = gy[i] * mask[i] * (1.0f - h[i] * h[i]);
      gw[i % d_] += dz * x[i];
      gb[i % d_] += dz;
      gx[i] = dz * w[i % d_];
    }
  }
  [[nodiscard]] std::vector<host_param>& parameters() override { return params_; }
  [[nodiscard]] std::unique_ptr<host_layer> clone() const override { return std::make_unique<gated_dropout>(*this); }

 private:
  static constexpr float p = 0.3f;
  static bool keep(std::uint64_t seed, std::size_t i) {
    std::uint64_t z = seed + 0x9E3779B97F4A7C15ull * (i + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return static_cast<double>((z ^ (z >> 31)) >> 11) * 0x1.0p-53 >= p;
  }
  std::size_t d_;
  std::shared_ptr<std::atomic<int>> forwards_;
  std::vector<host_param> params_;
};

constexpr std::size_t in = 6, width = 8, classes = 3;

// linear, gated, linear, gated, linear: layers 1 and 3 keep activations.
host_model make_layers(const std::shared_ptr<std::atomic<int>>& forwards) {
  host_model m;
  m.push_back(std::make_unique<linear>(in, width, 11));
  m.push_back(std::make_unique<gated_dropout>(width, forwards));
  m.push_back(std::make_unique<linear>(width, width, 12));
  m.push_back(std::make_unique<gated_dropout>(width, forwards));
  m.push_back(std::make_unique<linear>(width, classes, 13));
  return m;
}
using model_t = sequential<host_model, softmax_cross_entropy>;

std::vector<float> flat(std::vector<parameter_ref<host_param>>& ps, bool grads) {
  std::vector<float> out;
  for (auto& p : ps) {
    const auto v = grads ? p.grad() : p.value();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

const recompute_options every_layer{.every = 1, .layers = {}};

}  // namespace

TEST_CASE("recompute: sequential's gradients are bit-identical, dropout included, for a second forward") {
  const dp_dataset data(24, in, classes);
  auto count_plain = std::make_shared<std::atomic<int>>(0);
  auto count_again = std::make_shared<std::atomic<int>>(0);
  model_t plain(make_layers(count_plain));
  model_t again(make_layers(count_again));
  again.set_recompute(every_layer);
  for (std::size_t step = 0; step < 3; ++step) {
    const batch b = data.rows(step * 8, 8);
    CHECK(plain.train_step(b) == again.train_step(b));
    CHECK(flat(plain.parameters(), true) == flat(again.parameters(), true));
  }
  CHECK(count_plain->load() == 2 * 3);      // two gated layers, three steps
  CHECK(count_again->load() == 2 * 2 * 3);  // each forward again before its backward
  CHECK(again.activation_bytes() < plain.activation_bytes());

  // Each step draws new masks: the same batch twice gives two losses.
  const batch b = data.rows(0, 8);
  CHECK(plain.train_step(b) != plain.train_step(b));

  // Per layer, by index; a list of the wrong length is refused by name.
  auto count_one = std::make_shared<std::atomic<int>>(0);
  model_t one(make_layers(count_one));
  one.set_recompute({.every = 0, .layers = {false, false, false, true, false}});
  (void)one.train_step(b);
  CHECK(count_one->load() == 3);
  CHECK_THROWS_WITH(one.set_recompute({.every = 0, .layers = {true, false}}),
                    Catch::Contains("2 per-layer flags for 5 layers"));

  // Evaluation keeps nothing for a backward and takes the layers as they are.
  CHECK(again.eval_step(b).count == 8);
}

TEST_CASE("recompute: DDP, FSDP and the pipeline give the same parameters and traffic with and without it") {
  const dp_dataset data(32, in, classes);
  struct outcome {
    std::vector<float> values;  // rank 0's then rank 1's (each rank's own layers under the pipeline)
    std::uint64_t calls = 0, bytes_sent = 0;
    std::size_t activation_bytes = 0;  // the larger rank's
    int forwards = 0;
  };
  enum class mode { ddp, fsdp, pipeline };
  const auto run = [&](mode md, bool recompute) {
    std::vector<std::vector<float>> values(2);
    outcome out;
    std::mutex m;
    auto forwards = std::make_shared<std::atomic<int>>(0);
    run_local(2, [&](local_group& g) {
      model_t model(make_layers(forwards));
      if (recompute) model.set_recompute(every_layer);
      const auto r = static_cast<std::size_t>(g.rank());
      std::vector<float> mine;
      std::size_t bytes = 0;
      if (md == mode::ddp) {
        distributed_data_parallel ddp(model, g);
        sgd opt(model, {.lr = 0.1});
        for (std::size_t step = 0; step < 2; ++step) {
          (void)ddp.train_step(data.rows(step * 16 + r * 8, 8));
          opt.step();
        }
        bytes = model.activation_bytes();
        mine = flat(model.parameters(), false);
      } else if (md == mode::fsdp) {
        fully_sharded_data_parallel fsdp(model, g, sgd_options{.lr = 0.1});
        for (std::size_t step = 0; step < 2; ++step) {
          const batch b = data.rows(step * 16 + r * 8, 8);
          (void)fsdp.train_step(b.features, b.labels);
        }
        bytes = fsdp.memory().peak_activation_bytes;
        auto guard = fsdp.summon_full_params();
        mine = flat(model.parameters(), false);
      } else {
        pipeline_stage stage(model, g, {.micro_batches = 4});
        auto params = stage.parameters();
        sgd opt(params, {.lr = 0.1});
        for (std::size_t step = 0; step < 2; ++step) {
          const batch b = data.rows(step * 16, 16);  // both stages see the whole batch
          (void)stage.train_step(model.loss(), b.features, b.labels);
          opt.step();
          bytes = std::max(bytes, stage.last_stats().peak_activation_bytes);
        }
        mine = flat(params.parameters(), false);
      }
      std::lock_guard lock(m);
      values[r] = std::move(mine);
      out.calls += g.traffic().calls;
      out.bytes_sent += g.traffic().bytes_sent;
      out.activation_bytes = std::max(out.activation_bytes, bytes);
    });
    out.values = values[0];
    out.values.insert(out.values.end(), values[1].begin(), values[1].end());
    out.forwards = forwards->load();
    return out;
  };
  for (const mode md : {mode::ddp, mode::fsdp, mode::pipeline}) {
    INFO("mode " << static_cast<int>(md));
    const outcome plain = run(md, false);
    const outcome again = run(md, true);
    CHECK(!plain.values.empty());
    CHECK(plain.values == again.values);
    CHECK(plain.calls == again.calls);
    CHECK(plain.bytes_sent == again.bytes_sent);
    CHECK(plain.calls > 0);
    CHECK(again.forwards > plain.forwards);
    CHECK(again.activation_bytes < plain.activation_bytes);
  }
}
