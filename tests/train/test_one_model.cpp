// One layer description under every mode: the same layers plus loss, as partrain::sequential,
// trained through fit under DDP, ZeRO-2, FSDP, a 2-stage pipeline, data parallel over two host
// devices, post-local SGD and DiLoCo, each ending where one process training on the global batch
// ends (within float rounding: the modes average per-rank means, the reference takes one mean).
#include <catch2/catch.hpp>

#include <partrain/comm/local.hpp>
#include <partrain/model/sequential.hpp>
#include <partrain/optim/sgd.hpp>
#include <partrain/parallel/data_parallel.hpp>
#include <partrain/parallel/ddp.hpp>
#include <partrain/parallel/diloco.hpp>
#include <partrain/parallel/fsdp.hpp>
#include <partrain/parallel/local_sgd.hpp>
#include <partrain/parallel/pipeline/stage.hpp>
#include <partrain/parallel/zero.hpp>
#include <partrain/train/fsdp_policy.hpp>
#include <partrain/train/local_sgd_policy.hpp>
#include <partrain/train/policies.hpp>
#include <partrain/train/trainer.hpp>
#include <partrain/train/zero_policy.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "dp_models.hpp"
#include "pipeline_layers.hpp"

using namespace partrain;
using partrain::test::dp_dataset;
using partrain::test::host_model;
using partrain::test::softmax_cross_entropy;

namespace {

constexpr int world = 2;
constexpr std::size_t per_rank = 8;
constexpr std::size_t global = per_rank * world;
constexpr std::size_t epochs = 2;
const sgd_options opt_options{.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3};

using model_t = sequential<host_model, softmax_cross_entropy>;

// What fit needs of a batch source.
struct batch_list {
  std::vector<batch> batches;
  void set_epoch(std::size_t) {}
  [[nodiscard]] std::size_t size() const noexcept { return batches.size(); }
  [[nodiscard]] auto begin() const { return batches.begin(); }
  [[nodiscard]] auto end() const { return batches.end(); }
};

// Step s of the global run reads rows [s * global, (s + 1) * global); rank r of a data-parallel
// mode reads its per_rank rows of them.
batch_list global_batches(const dp_dataset& d) {
  batch_list l;
  for (std::size_t first = 0; first + global <= d.size(); first += global) l.batches.push_back(d.rows(first, global));
  return l;
}
batch_list rank_batches(const dp_dataset& d, int r) {
  batch_list l;
  for (std::size_t first = 0; first + global <= d.size(); first += global) {
    l.batches.push_back(d.rows(first + static_cast<std::size_t>(r) * per_rank, per_rank));
  }
  return l;
}

template <class M>
std::vector<float> flat_values(M& m) {
  std::vector<float> out;
  for (auto&& p : m.parameters()) out.insert(out.end(), p.value().begin(), p.value().end());
  return out;
}

struct setup {
  std::function<host_model()> layers;
  std::size_t features;
};

trainer_options quiet(std::ostringstream& sink) {
  trainer_options o{.epochs = epochs};
  o.out = &sink;
  return o;
}

std::vector<float> reference(const setup& s, const dp_dataset& data) {
  model_t model(s.layers(), softmax_cross_entropy{});
  sgd opt(model, opt_options);
  for (std::size_t e = 0; e < epochs; ++e) {
    for (const batch& b : global_batches(data).batches) {
      (void)model.train_step(b);
      opt.step();
    }
  }
  return flat_values(model);
}

// Runs body(group, model, sink) on every rank and returns rank 0's result.
template <class Body>
std::vector<float> on_ranks(const setup& s, Body body) {
  std::vector<float> out;
  std::mutex m;
  run_local(world, [&](local_group& g) {
    model_t model(s.layers(), softmax_cross_entropy{});
    std::ostringstream sink;
    std::vector<float> v = body(g, model, sink);
    if (g.rank() == 0) {
      std::lock_guard lock(m);
      out = std::move(v);
    }
  });
  return out;
}

std::map<std::string, std::vector<float>> every_mode(const setup& s, const dp_dataset& data) {
  std::map<std::string, std::vector<float>> r;
  r["ddp"] = on_ranks(s, [&](local_group& g, model_t& model, std::ostringstream& sink) {
    distributed_data_parallel ddp(model, g);
    sgd opt(model, opt_options);
    ddp_policy policy(ddp, opt);
    auto train = rank_batches(data, g.rank());
    (void)fit(policy, train, train, quiet(sink));
    return flat_values(model);
  });
  r["zero2"] = on_ranks(s, [&](local_group& g, model_t& model, std::ostringstream& sink) {
    sharded_data_parallel zero(model, g, opt_options, zero_options{.stage = 2});
    zero_policy policy(zero);
    auto train = rank_batches(data, g.rank());
    (void)fit(policy, train, train, quiet(sink));
    return flat_values(model);
  });
  r["fsdp"] = on_ranks(s, [&](local_group& g, model_t& model, std::ostringstream& sink) {
    fully_sharded_data_parallel fsdp(model, g, opt_options);
    fsdp_policy policy(fsdp);
    auto train = rank_batches(data, g.rank());
    (void)fit(policy, train, train, quiet(sink));
    auto full = fsdp.summon_full_params();
    return flat_values(full);
  });
  r["local_sgd"] = on_ranks(s, [&](local_group& g, model_t& model, std::ostringstream& sink) {
    sgd opt(model, opt_options);
    post_local_sgd lsgd(model, opt, g, {.period = 1});  // parameters averaged after every step
    local_sgd_policy policy(lsgd);
    auto train = rank_batches(data, g.rank());
    (void)fit(policy, train, train, quiet(sink));
    return flat_values(model);
  });
  r["diloco"] = on_ranks(s, [&](local_group& g, model_t& model, std::ostringstream& sink) {
    sgd opt(model, opt_options);
    // One inner step, an outer step of lr 1 without momentum: the outer step is the average.
    diloco dl(model, opt, g, {.inner_steps = 1, .outer_lr = 1.0, .outer_momentum = 0.0, .nesterov = false});
    local_sgd_policy policy(dl);
    auto train = rank_batches(data, g.rank());
    (void)fit(policy, train, train, quiet(sink));
    return flat_values(model);
  });
  {
    // The pipeline: every rank reads the whole batch; each holds its stage's layers.
    std::map<std::size_t, std::vector<float>> by_layer;
    std::mutex m;
    run_local(world, [&](local_group& g) {
      model_t model(s.layers(), softmax_cross_entropy{});
      pipeline_stage stage(model, g, {.micro_batches = 2});
      auto params = stage.parameters();
      sgd opt(params, opt_options);
      pipeline_policy policy(stage, g, opt, model.loss());
      auto train = global_batches(data);
      std::ostringstream sink;
      (void)fit(policy, train, train, quiet(sink));
      std::lock_guard lock(m);
      for (const std::size_t i : stage.owned_layers()) {
        auto& l = *model.layers()[i];
        for (auto& p : l.parameters()) by_layer[i].insert(by_layer[i].end(), p.value().begin(), p.value().end());
      }
    });
    for (auto& [i, v] : by_layer) r["pipeline"].insert(r["pipeline"].end(), v.begin(), v.end());
  }
  {
    // Data parallel: one process, two host devices, the global batch scattered over them.
    model_t model(s.layers(), softmax_cross_entropy{});
    data_parallel dp(model, {device::cpu(0), device::cpu(1)}, [](model_t& replica) { return sgd<model_t>(replica, opt_options); });
    data_parallel_policy policy(dp);
    auto train = global_batches(data);
    std::ostringstream sink;
    (void)fit(policy, train, train, quiet(sink));
    r["dp"] = flat_values(model);
  }
  return r;
}

void check_every_mode(const setup& s) {
  const dp_dataset data(64, s.features, 3);
  const auto want = reference(s, data);
  const auto initial = flat_values(*std::make_unique<model_t>(s.layers(), softmax_cross_entropy{}));
  for (const auto& [mode, got] : every_mode(s, data)) {
    INFO("mode " << mode);
    REQUIRE(got.size() == want.size());
    double moved = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
      CHECK(got[i] == Approx(want[i]).margin(2e-5));
      moved = std::max(moved, static_cast<double>(std::abs(got[i] - initial[i])));
    }
    CHECK(moved > 1e-2);  // it trained
  }
}

}  // namespace

TEST_CASE("one layer description: the MLP trains alike under every mode", "[train][sequential][threads]") {
  check_every_mode({[] { return partrain::test::make_mlp({5, 6, 4, 3}, 3); }, 5});
}
