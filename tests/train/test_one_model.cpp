// One layer description under every mode: the same layers plus loss, as partrain::sequential,
// trained through fit under DDP, ZeRO-2, FSDP, a 2-stage pipeline, data parallel over two host
// devices, post-local SGD and DiLoCo, each ending where one process training on the global batch
// ends (within float rounding: the modes average per-rank means, the reference takes one mean).
// The loop's options on the modes that take them: gradient accumulation equal to a batch N times
// larger, clipping of the global norm across shards, a per-step schedule; the others refuse.
#include <catch2/catch.hpp>

#include <partrain/comm/local.hpp>
#include <partrain/model/sequential.hpp>
#include <partrain/optim/clip.hpp>
#include <partrain/optim/sgd.hpp>
#include <partrain/parallel/data_parallel.hpp>
#include <partrain/parallel/ddp.hpp>
#include <partrain/parallel/diloco.hpp>
#include <partrain/parallel/fsdp.hpp>
#include <partrain/parallel/local_sgd.hpp>
#include <partrain/parallel/pipeline/stage.hpp>
#include <partrain/parallel/zero.hpp>
#include <partrain/precision/grad_scaler.hpp>
#include <partrain/train/fsdp_policy.hpp>
#include <partrain/train/local_sgd_policy.hpp>
#include <partrain/train/lr_schedule.hpp>
#include <partrain/train/checkpoint.hpp>
#include <partrain/train/sharded_checkpoint.hpp>
#include <partrain/train/policies.hpp>
#include <partrain/train/trainer.hpp>
#include <partrain/train/zero_policy.hpp>

#include <cstddef>
#include <filesystem>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <variant>
#include <vector>

#include "dp_models.hpp"
#include "temp_dir.hpp"
#include "pipeline_layers.hpp"
#if PARTRAIN_TEST_HAVE_OPENBLAS
#include "cnn_layers.hpp"
#include "vit_layers.hpp"
#endif

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
// With micro > 1, each rank's rows of a step come as `micro` consecutive micro-batches.
batch_list rank_batches(const dp_dataset& d, int r, std::size_t micro = 1) {
  batch_list l;
  const std::size_t rows = per_rank / micro;
  for (std::size_t first = 0; first + global <= d.size(); first += global) {
    for (std::size_t m = 0; m < micro; ++m) {
      l.batches.push_back(d.rows(first + static_cast<std::size_t>(r) * per_rank + m * rows, rows));
    }
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
  recompute_options recompute{};  // the model's activation recomputation (the reference's too)
};

model_t make_model(const setup& s) {
  model_t m(s.layers(), softmax_cross_entropy{});
  m.set_recompute(s.recompute);
  return m;
}

trainer_options quiet(std::ostringstream& sink) {
  trainer_options o{.epochs = epochs};
  o.out = &sink;
  return o;
}

// What the loop adds to each step of the reference (one process, the global batch).
struct loop_options {
  double max_grad_norm = 0;
  std::function<double(std::size_t)> step_lr{};
};

std::vector<float> reference(const setup& s, const dp_dataset& data, const loop_options& lo = {}) {
  model_t model = make_model(s);
  sgd opt(model, opt_options);
  std::size_t step = 0;
  for (std::size_t e = 0; e < epochs; ++e) {
    for (const batch& b : global_batches(data).batches) {
      if (lo.step_lr) opt.set_lr(lo.step_lr(step));
      (void)model.train_step(b);
      if (lo.max_grad_norm > 0) (void)clip_grad_norm(model, lo.max_grad_norm);
      opt.step();
      ++step;
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
    model_t model = make_model(s);
    std::ostringstream sink;
    std::vector<float> v = body(g, model, sink);
    if (g.rank() == 0) {
      std::lock_guard lock(m);
      out = std::move(v);
    }
  });
  return out;
}

// The pipeline: every rank reads the whole batch and holds its stage's layers; returns each layer's
// values (from the rank that owns it), by layer.
std::map<std::size_t, std::vector<float>> pipeline_run(const setup& s, const dp_dataset& data, trainer_options o,
                                                       std::size_t micro = 1) {
  std::map<std::size_t, std::vector<float>> by_layer;
  std::mutex m;
  run_local(world, [&](local_group& g) {
    model_t model = make_model(s);
    pipeline_stage stage(model, g, {.micro_batches = 2});
    auto params = stage.parameters();
    sgd opt(params, opt_options);
    pipeline_policy policy(stage, g, opt, model.loss());
    batch_list train;  // each global batch in `micro` consecutive pieces
    for (const batch& b : global_batches(data).batches) {
      for (std::size_t m = 0; m < micro; ++m) train.batches.push_back(data.rows(b.indices[0] + m * global / micro, global / micro));
    }
    std::ostringstream sink;
    trainer_options t = o;
    t.gradient_accumulation_steps = micro;
    t.out = &sink;
    (void)fit(policy, train, train, t);
    std::lock_guard lock(m);
    for (const std::size_t i : stage.owned_layers()) {
      for (auto& p : model.layers()[i]->parameters()) by_layer[i].insert(by_layer[i].end(), p.value().begin(), p.value().end());
    }
  });
  return by_layer;
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
  for (auto& [i, v] : pipeline_run(s, data, {.epochs = epochs})) r["pipeline"].insert(r["pipeline"].end(), v.begin(), v.end());
  {
    // Data parallel: one process, two host devices, the global batch scattered over them.
    model_t model = make_model(s);
    data_parallel dp(model, {device::cpu(0), device::cpu(1)}, [](model_t& replica) { return sgd<model_t>(replica, opt_options); });
    data_parallel_policy policy(dp);
    auto train = global_batches(data);
    std::ostringstream sink;
    (void)fit(policy, train, train, quiet(sink));
    r["dp"] = flat_values(model);
  }
  return r;
}

void check_close(const std::map<std::string, std::vector<float>>& runs, const std::vector<float>& want, double margin) {
  for (const auto& [mode, got] : runs) {
    INFO("mode " << mode);
    REQUIRE(got.size() == want.size());
    double worst = 0;
    for (std::size_t i = 0; i < want.size(); ++i) worst = std::max(worst, static_cast<double>(std::abs(got[i] - want[i])));
    CHECK(worst <= margin);
  }
}

// DDP, ZeRO-2 and FSDP through fit with the loop options o, each rank's rows of a step in `micro`
// micro-batches.
std::map<std::string, std::vector<float>> sharded_modes(const setup& s, const dp_dataset& data, trainer_options o,
                                                        std::size_t micro) {
  std::map<std::string, std::vector<float>> r;
  o.epochs = epochs;
  o.gradient_accumulation_steps = micro;
  auto run = [&](auto body) {
    return on_ranks(s, [&](local_group& g, model_t& model, std::ostringstream& sink) {
      trainer_options t = o;
      t.out = &sink;
      auto train = rank_batches(data, g.rank(), micro);
      return body(g, model, train, t);
    });
  };
  r["ddp"] = run([&](local_group& g, model_t& model, batch_list& train, const trainer_options& t) {
    distributed_data_parallel ddp(model, g);
    sgd opt(model, opt_options);
    ddp_policy policy(ddp, opt);
    (void)fit(policy, train, train, t);
    return flat_values(model);
  });
  r["zero2"] = run([&](local_group& g, model_t& model, batch_list& train, const trainer_options& t) {
    sharded_data_parallel zero(model, g, opt_options, zero_options{.stage = 2});
    zero_policy policy(zero);
    (void)fit(policy, train, train, t);
    return flat_values(model);
  });
  r["fsdp"] = run([&](local_group& g, model_t& model, batch_list& train, const trainer_options& t) {
    fully_sharded_data_parallel fsdp(model, g, opt_options);
    fsdp_policy policy(fsdp);
    (void)fit(policy, train, train, t);
    auto full = fsdp.summon_full_params();
    return flat_values(full);
  });
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

#if PARTRAIN_TEST_HAVE_OPENBLAS
TEST_CASE("one layer description: a CNN trains alike under every mode", "[train][sequential][threads]") {
  namespace ml = models::layers;
  // 1x6x6 images: conv 3x3 1->2, relu, maxpool (2x3x3), flatten, linear 18->3.
  check_every_mode({[] {
                      host_model m;
                      m.push_back(std::make_unique<ml::conv2d>(1, 2, 6, 6, 4));
                      m.push_back(std::make_unique<ml::relu>());
                      m.push_back(std::make_unique<ml::maxpool2d>(2, 6, 6));
                      m.push_back(std::make_unique<ml::flatten>());
                      m.push_back(std::make_unique<ml::linear>(18, 3, 5));
                      return m;
                    },
                    36});
}

// A ViT on 8x8 images: 4x4 patches (4 tokens of dim 8), 2 blocks of 2 heads, 3 classes.
static host_model tiny_vit() {
  return models::layers::make_vit({.patch = 4, .dim = 8, .depth = 2, .heads = 2, .mlp_ratio = 2, .dropout = 0.0f,
                                   .image = 8, .classes = 3},
                                  7);
}

TEST_CASE("one layer description: a ViT trains alike under every mode", "[train][sequential][threads]") {
  check_every_mode({tiny_vit, 64});
}

TEST_CASE("one layer description: a ViT recomputing its blocks trains alike under every mode", "[train][sequential][threads]") {
  check_every_mode({tiny_vit, 64, {.every = 1, .layers = {}}});
}
#endif

// The loop's options on two models: 0 the MLP, 1 the tiny ViT.
static setup mlp_or_vit(int which) {
#if PARTRAIN_TEST_HAVE_OPENBLAS
  if (which == 1) return {tiny_vit, 64};
#endif
  (void)which;
  return {[] { return partrain::test::make_mlp({5, 6, 4, 3}, 3); }, 5};
}

TEST_CASE("fit: gradient accumulation equals a batch N times larger", "[train][sequential][threads]") {
  const setup s = mlp_or_vit(GENERATE(0, PARTRAIN_TEST_HAVE_OPENBLAS));  // the MLP, then the ViT where it builds
  INFO((s.features == 5 ? "the MLP" : "the ViT"));
  const dp_dataset data(64, s.features, 3);
  const auto want = reference(s, data);
  for (const std::size_t micro : {2, 4}) {
    INFO(micro << " micro-batches per step");
    check_close(sharded_modes(s, data, {}, micro), want, 1e-6);
    std::vector<float> piped;
    for (auto& [i, v] : pipeline_run(s, data, {.epochs = epochs}, micro)) piped.insert(piped.end(), v.begin(), v.end());
    check_close({{"pipeline", piped}}, want, 1e-6);
  }
  // Without accumulation the same micro-batches are steps of their own: far from the reference.
  std::vector<float> steps_alone;
  run_local(world, [&](local_group& g) {
    model_t model = make_model(s);
    distributed_data_parallel ddp(model, g);
    sgd opt(model, opt_options);
    ddp_policy policy(ddp, opt);
    auto train = rank_batches(data, g.rank(), 2);
    std::ostringstream quiet_sink;
    trainer_options o{.epochs = epochs};
    o.out = &quiet_sink;
    const train_result r = fit(policy, train, train, o);
    if (g.rank() == 0) {
      steps_alone = flat_values(model);
      CHECK(r.steps == 16);  // every micro-batch a step
    }
  });
  double far = 0;
  for (std::size_t i = 0; i < want.size(); ++i) far = std::max(far, static_cast<double>(std::abs(steps_alone[i] - want[i])));
  CHECK(far > 1e-3);
}

TEST_CASE("fit: max_grad_norm clips the global norm across ranks and shards, as one process does", "[train][sequential][threads]") {
  const setup s = mlp_or_vit(GENERATE(0, PARTRAIN_TEST_HAVE_OPENBLAS));  // the MLP, then the ViT where it builds
  INFO((s.features == 5 ? "the MLP" : "the ViT"));
  const dp_dataset data(64, s.features, 3);
  const loop_options clipped{.max_grad_norm = 0.05};
  const auto want = reference(s, data, clipped);
  const auto unclipped = reference(s, data);
  double apart = 0;
  for (std::size_t i = 0; i < want.size(); ++i) apart = std::max(apart, static_cast<double>(std::abs(want[i] - unclipped[i])));
  REQUIRE(apart > 1e-2);  // the bound bites
  trainer_options o;
  o.max_grad_norm = clipped.max_grad_norm;
  check_close(sharded_modes(s, data, o, 1), want, 2e-5);
  check_close(sharded_modes(s, data, o, 2), want, 2e-5);  // and with accumulation
  o.epochs = epochs;
  for (const std::size_t micro : {1, 2}) {  // the pipeline: the norm over every stage's gradients
    std::vector<float> piped;
    for (auto& [i, v] : pipeline_run(s, data, o, micro)) piped.insert(piped.end(), v.begin(), v.end());
    check_close({{"pipeline", piped}}, want, 2e-5);
  }
}

TEST_CASE("fit: step_lr sets the learning rate before every step", "[train][sequential][threads]") {
  const setup s{[] { return partrain::test::make_mlp({5, 6, 4, 3}, 3); }, 5};
  const dp_dataset data(64, s.features, 3);
  const warmup_cosine_lr schedule{.base = 0.2, .warmup_steps = 3, .total_steps = 8};
  const auto want = reference(s, data, {.step_lr = schedule});
  trainer_options o;
  o.step_lr = schedule;
  check_close(sharded_modes(s, data, o, 1), want, 2e-5);
  // Steps, not micro-batches: with 2 micro-batches per step the schedule still moves once a step.
  check_close(sharded_modes(s, data, o, 2), want, 2e-5);
}

TEST_CASE("fit: the loop options a mode cannot honour are refused by name", "[train][sequential][threads]") {
  const setup s{[] { return partrain::test::make_mlp({5, 6, 4, 3}, 3); }, 5};
  const dp_dataset data(64, s.features, 3);
  run_local(world, [&](local_group& g) {
    model_t model = make_model(s);
    sgd opt(model, opt_options);
    post_local_sgd lsgd(model, opt, g, {.period = 1});
    local_sgd_policy policy(lsgd);
    auto train = rank_batches(data, g.rank());
    std::ostringstream sink;
    trainer_options clip{.epochs = 1};
    clip.out = &sink;
    clip.max_grad_norm = 1.0;
    CHECK_THROWS_WITH(fit(policy, train, train, clip), Catch::Contains("max_grad_norm needs a policy that clips") &&
                                                          Catch::Contains("ddp_policy, zero_policy, fsdp_policy, pipeline_policy"));
    trainer_options acc{.epochs = 1};
    acc.out = &sink;
    acc.gradient_accumulation_steps = 2;
    CHECK_THROWS_WITH(fit(policy, train, train, acc), Catch::Contains("gradient_accumulation_steps = 2 needs a policy with accumulate_step") &&
                                                         Catch::Contains("pipeline_policy"));
    trainer_options both{.epochs = 1, .lr = constant_lr{.base = 0.1}};
    both.out = &sink;
    both.step_lr = constant_lr{.base = 0.1};
    CHECK_THROWS_WITH(fit(policy, train, train, both), Catch::Contains("set one schedule"));
    trainer_options zero_micro{.epochs = 1};
    zero_micro.gradient_accumulation_steps = 0;
    CHECK_THROWS_WITH(fit(policy, train, train, zero_micro), Catch::Contains("gradient_accumulation_steps must be at least 1"));
  });
}

TEST_CASE("warmup_cosine_lr: linear warm-up, cosine down to min, bad bounds refused", "[train][lr]") {
  const warmup_cosine_lr s{.base = 1.0, .warmup_steps = 4, .total_steps = 14, .min = 0.1};
  CHECK(s(0) == Approx(0.2));
  CHECK(s(3) == Approx(0.8));
  CHECK(s(4) == Approx(1.0));
  CHECK(s(9) == Approx(0.1 + 0.9 * 0.5));
  CHECK(s(14) == Approx(0.1));
  CHECK(s(100) == Approx(0.1));
  CHECK_THROWS_WITH((warmup_cosine_lr{.base = 1.0, .warmup_steps = 4, .total_steps = 4}(0)), Catch::Contains("greater than warmup_steps"));
  CHECK_THROWS_WITH((warmup_cosine_lr{.base = 1.0, .warmup_steps = 0, .total_steps = 4, .min = 2}(0)), Catch::Contains("min must be in [0, base]"));
}

TEST_CASE("fit: a pipeline checkpoints stage by stage and resumes bit for bit", "[train][sequential][threads]") {
  const setup s = mlp_or_vit(GENERATE(0, PARTRAIN_TEST_HAVE_OPENBLAS));
  INFO((s.features == 5 ? "the MLP" : "the ViT"));
  const dp_dataset data(64, s.features, 3);
  partrain::testing::temp_dir dir;
  auto run = [&](std::size_t epochs_to_run, const std::filesystem::path& ck) {
    return pipeline_run(s, data, {.epochs = epochs_to_run, .checkpoint = ck});
  };
  const auto straight = run(2, dir.path / "straight.ckpt");
  (void)run(1, dir.path / "resumed.ckpt");  // epoch 1, then a new run resumes for epoch 2
  const auto resumed = run(2, dir.path / "resumed.ckpt");
  REQUIRE(straight.size() == (s.features == 5 ? 3u : 4u));  // the layers with parameters, on their stages
  CHECK(resumed == straight);
}

#if PARTRAIN_TEST_HAVE_OPENBLAS
TEST_CASE("fsdp: the ViT gathered and reduced in bf16, or fp16 with a loss scale, ends near fp32", "[train][sequential][threads]") {
  const setup s = mlp_or_vit(1);
  const dp_dataset data(64, s.features, 3);
  const auto want = reference(s, data);
  const auto initial = flat_values(*std::make_unique<model_t>(s.layers(), softmax_cross_entropy{}));
  double moved = 0;
  for (std::size_t i = 0; i < want.size(); ++i) moved = std::max(moved, static_cast<double>(std::abs(want[i] - initial[i])));
  for (const dtype wire : {dtype::bfloat16, dtype::float16}) {
    INFO(to_string(wire));
    const auto got = on_ranks(s, [&](local_group& g, model_t& model, std::ostringstream& sink) {
      fully_sharded_data_parallel fsdp(model, g, opt_options, fsdp_options{.param_dtype = wire, .reduce_dtype = wire});
      grad_scaler scaler = grad_scaler::for_precision(wire == dtype::float16 ? precision::fp16 : precision::bf16);
      fsdp_policy policy(fsdp, {.scaler = scaler.enabled() ? &scaler : nullptr});
      auto train = rank_batches(data, g.rank());
      (void)fit(policy, train, train, quiet(sink));
      CHECK(scaler.enabled() == (wire == dtype::float16));
      auto full = fsdp.summon_full_params();
      return flat_values(full);
    });
    REQUIRE(got.size() == want.size());
    double worst = 0;
    for (std::size_t i = 0; i < want.size(); ++i) worst = std::max(worst, static_cast<double>(std::abs(got[i] - want[i])));
    // 16-bit parameters in forward and backward: within a few of their rounding steps of fp32,
    // far closer than the training moved them.
    CHECK(worst < 0.1 * moved);
    CHECK(worst > 0);  // the wire really was 16 bits
  }
}

TEST_CASE("fit: DDP and FSDP checkpoint the ViT and resume bit for bit", "[train][sequential][threads]") {
  const setup s = mlp_or_vit(1);
  const dp_dataset data(64, s.features, 3);
  partrain::testing::temp_dir dir;
  for (const bool sharded : {false, true}) {
    INFO((sharded ? "fsdp" : "ddp"));
    auto run = [&](std::size_t epochs_to_run, const std::filesystem::path& ck) {
      return on_ranks(s, [&](local_group& g, model_t& model, std::ostringstream& sink) {
        trainer_options o = quiet(sink);
        o.epochs = epochs_to_run;
        o.checkpoint = ck;
        auto train = rank_batches(data, g.rank());
        if (sharded) {
          fully_sharded_data_parallel fsdp(model, g, opt_options);
          fsdp_policy policy(fsdp);
          (void)fit(policy, train, train, o);
          auto full = fsdp.summon_full_params();
          return flat_values(full);
        }
        distributed_data_parallel ddp(model, g);
        sgd opt(model, opt_options);
        ddp_policy policy(ddp, opt);
        (void)fit(policy, train, train, o);
        return flat_values(model);
      });
    };
    const std::string tag = sharded ? "fsdp" : "ddp";
    const auto straight = run(2, dir.path / (tag + "_straight.ckpt"));
    (void)run(1, dir.path / (tag + "_resumed.ckpt"));  // epoch 1, then a new run resumes for epoch 2
    const auto resumed = run(2, dir.path / (tag + "_resumed.ckpt"));
    REQUIRE(!straight.empty());
    CHECK(resumed == straight);
  }
}
#endif

namespace {

// A layer with a buffer: a running mean of its input's features (momentum 0.1, as batch norm's),
// updated by each training forward and subtracted in eval mode. Training output = input.
struct running_mean {
  std::vector<models::layers::host_param> none;
  std::vector<float> mean;
  bool training = true;
  explicit running_mean(std::size_t features, float start) : mean(features, start) {}
  [[nodiscard]] shape output_shape(const shape& s) const { return s; }
  void forward(tensor_view<const float> in, tensor_view<float> out) {
    const std::size_t rows = in.extent(0), f = mean.size();
    for (std::size_t i = 0; i < in.size(); ++i) out[i] = training ? in[i] : in[i] - mean[i % f];
    if (!training) return;
    for (std::size_t j = 0; j < f; ++j) {
      double sum = 0;
      for (std::size_t r = 0; r < rows; ++r) sum += in[r * f + j];
      mean[j] = 0.9f * mean[j] + 0.1f * static_cast<float>(sum / static_cast<double>(rows));
    }
  }
  void backward(tensor_view<const float>, tensor_view<const float>, tensor_view<const float> gout, tensor_view<float> gin) {
    std::ranges::copy(gout, gin.begin());
  }
  std::vector<models::layers::host_param>& parameters() { return none; }
  std::vector<tensor_view<float>> buffers() { return {tensor_view<float>(mean)}; }
  void train(bool on) { training = on; }
};

// The running mean first, then a linear layer (the one with parameters), as a variant sequence.
struct with_buffer_layer {
  std::variant<running_mean, models::layers::linear> l;
  [[nodiscard]] shape output_shape(const shape& s) const { return std::visit([&](auto& x) { return x.output_shape(s); }, l); }
  void forward(tensor_view<const float> in, tensor_view<float> out) { std::visit([&](auto& x) { x.forward(in, out); }, l); }
  void backward(tensor_view<const float> in, tensor_view<const float> out, tensor_view<const float> g, tensor_view<float> gi) {
    std::visit([&](auto& x) { x.backward(in, out, g, gi); }, l);
  }
  std::vector<models::layers::host_param>& parameters() { return std::visit([](auto& x) -> auto& { return x.parameters(); }, l); }
  std::vector<tensor_view<float>> buffers() {
    if (auto* r = std::get_if<running_mean>(&l)) return r->buffers();
    return {};
  }
  void train(bool on) {
    if (auto* r = std::get_if<running_mean>(&l)) r->train(on);
  }
};

using buffered_t = sequential<std::vector<with_buffer_layer>, softmax_cross_entropy>;

buffered_t buffered_model(float start) {
  std::vector<with_buffer_layer> layers;
  layers.push_back({running_mean(5, start)});
  layers.push_back({models::layers::linear(5, 3, 7)});
  return buffered_t(std::move(layers), softmax_cross_entropy{});
}

double feature_mean(const batch& b, std::size_t j) {
  double sum = 0;
  for (std::size_t r = 0; r < b.size(); ++r) sum += b.features[r * 5 + j];
  return sum / static_cast<double>(b.size());
}

}  // namespace

static_assert(has_buffers<buffered_t>);
static_assert(!has_buffers<model_t>);

TEST_CASE("buffers: DDP and ZeRO copy rank 0's at construction and before every step, checkpoints keep them", "[train][sequential][threads]") {
  const dp_dataset data(64, 5, 3);
  for (const bool every_step : {true, false}) {
    INFO("broadcast_buffers " << every_step);
    std::vector<float> at_start(2), after(2);
    run_local(world, [&](local_group& g) {
      auto model = buffered_model(g.rank() == 0 ? 0.0f : 5.0f);
      ddp_options o;
      o.broadcast_buffers = every_step;
      distributed_data_parallel ddp(model, g, o);
      const auto r = static_cast<std::size_t>(g.rank());
      at_start[r] = model.buffers()[0][0];
      (void)ddp.train_step(rank_batches(data, g.rank()).batches[0]);
      (void)ddp.train_step(rank_batches(data, g.rank()).batches[1]);
      after[r] = model.buffers()[0][0];
    });
    CHECK(at_start == std::vector<float>{0.0f, 0.0f});  // rank 1's 5 replaced by rank 0's 0
    const double own1 = 0.1 * feature_mean(rank_batches(data, 1).batches[0], 0);
    const double from0 = 0.1 * feature_mean(rank_batches(data, 0).batches[0], 0);
    const double step2 = 0.1 * feature_mean(rank_batches(data, 1).batches[1], 0);
    // Step 2 starts from rank 0's running mean when broadcasting every step, else from rank 1's own.
    CHECK(after[1] == Approx(0.9 * (every_step ? from0 : own1) + step2).margin(1e-6));
  }

  // ZeRO keeps them whole on every rank, copied from rank 0 as DDP does.
  std::vector<float> zero_start(2), zero_after(2);
  run_local(world, [&](local_group& g) {
    auto model = buffered_model(g.rank() == 0 ? 0.0f : 5.0f);
    sharded_data_parallel zero(model, g, opt_options, zero_options{.stage = 2});
    const auto r = static_cast<std::size_t>(g.rank());
    zero_start[r] = model.buffers()[0][0];
    (void)zero.train_step(rank_batches(data, g.rank()).batches[0]);
    (void)zero.train_step(rank_batches(data, g.rank()).batches[1]);
    zero_after[r] = model.buffers()[0][0];
  });
  CHECK(zero_start == std::vector<float>{0.0f, 0.0f});
  // FSDP shards the parameters; the layers' buffers stay whole, rank 0's at construction.
  std::vector<float> fsdp_start(2);
  run_local(world, [&](local_group& g) {
    auto model = buffered_model(g.rank() == 0 ? 0.0f : 5.0f);
    fully_sharded_data_parallel fsdp(model, g, opt_options);
    fsdp_start[static_cast<std::size_t>(g.rank())] = model.buffers()[0][0];
  });
  CHECK(fsdp_start == std::vector<float>{0.0f, 0.0f});
  // FSDP's checkpoints (sharded files, or a section per rank over a mesh) do not hold buffers yet:
  // both forms refuse them on every rank before writing anything.
  partrain::testing::temp_dir fsdp_dir;
  std::vector<std::string> refusals(2 * world);
  run_local(world, [&](local_group& g) {
    auto model = buffered_model(0.0f);
    fully_sharded_data_parallel fsdp(model, g, opt_options);
    fsdp_policy sharded(fsdp), sections(fsdp, {.rank_sections = &g});
    for (std::size_t k = 0; k < 2; ++k) {
      try {
        (k == 0 ? sharded : sections).save_checkpoint(fsdp_dir.path / "f.ckpt", {});
      } catch (const checkpoint_error& e) {
        refusals[2 * static_cast<std::size_t>(g.rank()) + k] = e.what();
      }
    }
  });
  for (const auto& r : refusals) CHECK_THAT(r, Catch::Contains("the layers have buffers (non-trainable state)"));
  CHECK(std::filesystem::is_empty(fsdp_dir.path));
  CHECK(zero_after[1] == Approx(0.9 * 0.1 * feature_mean(rank_batches(data, 0).batches[0], 0) +
                                0.1 * feature_mean(rank_batches(data, 1).batches[1], 0)).margin(1e-6));

  partrain::testing::temp_dir dir;
  auto saved = buffered_model(0.0f);
  (void)saved.train_step(rank_batches(data, 0).batches[0]);
  sgd opt(saved, opt_options);
  save_checkpoint(dir.path / "b.ckpt", saved, opt);
  auto loaded = buffered_model(0.0f);
  sgd lopt(loaded, opt_options);
  (void)load_checkpoint(dir.path / "b.ckpt", loaded, lopt);
  CHECK(loaded.buffers()[0][0] == saved.buffers()[0][0]);
  CHECK(loaded.buffers()[0][0] != 0.0f);
  // Evaluation runs in eval mode: the running mean is subtracted, and not updated.
  const float before = loaded.buffers()[0][0];
  (void)loaded.eval_step(rank_batches(data, 0).batches[1]);
  CHECK(loaded.buffers()[0][0] == before);
  // A checkpoint with buffers does not load into a model without them, and the other way round.
  model_t plain(partrain::test::make_mlp({5, 3}, 7), softmax_cross_entropy{});
  sgd popt(plain, opt_options);
  CHECK_THROWS_WITH(load_checkpoint(dir.path / "b.ckpt", plain, popt), Catch::Contains("holds buffers"));
  save_checkpoint(dir.path / "p.ckpt", plain, popt);
  CHECK_THROWS_WITH(load_checkpoint(dir.path / "p.ckpt", loaded, lopt), Catch::Contains("holds no buffers, the model has 1"));
}

TEST_CASE("buffers: ZeRO's sharded checkpoints keep them, into ZeRO, a replicated model or a consolidated file", "[train][sequential][threads]") {
  const dp_dataset data(64, 5, 3);
  partrain::testing::temp_dir dir;
  const auto index = dir.path / "zero.idx";
  std::vector<float> saved(2);
  run_local(world, [&](local_group& g) {
    auto model = buffered_model(0.0f);
    sharded_data_parallel zero(model, g, opt_options, zero_options{.stage = 2});
    (void)zero.train_step(rank_batches(data, g.rank()).batches[0]);
    save_sharded_checkpoint(zero, index, {.step = 1});
    saved[static_cast<std::size_t>(g.rank())] = model.buffers()[0][0];
  });
  REQUIRE(saved[0] != 0.0f);
  std::vector<float> loaded(2);
  run_local(world, [&](local_group& g) {
    auto model = buffered_model(3.0f);
    sharded_data_parallel zero(model, g, opt_options, zero_options{.stage = 2, .broadcast_buffers = false});
    (void)load_sharded_checkpoint(zero, index);
    loaded[static_cast<std::size_t>(g.rank())] = model.buffers()[0][0];
  });
  CHECK(loaded == std::vector<float>{saved[0], saved[0]});  // rank 0's, on every rank
  auto replicated = buffered_model(3.0f);
  sgd opt(replicated, opt_options);
  (void)load_sharded_checkpoint(index, replicated, opt);
  CHECK(replicated.buffers()[0][0] == saved[0]);
  consolidate_sharded_checkpoint(index, dir.path / "one.ckpt");
  auto plain = buffered_model(3.0f);
  sgd popt(plain, opt_options);
  (void)load_checkpoint(dir.path / "one.ckpt", plain, popt);
  CHECK(plain.buffers()[0][0] == saved[0]);
  // A model without buffers refuses the checkpoint that has them.
  model_t none(partrain::test::make_mlp({5, 3}, 7), softmax_cross_entropy{});
  sgd nopt(none, opt_options);
  CHECK_THROWS_WITH(load_sharded_checkpoint(index, none, nopt), Catch::Contains("holds buffers"));
}
