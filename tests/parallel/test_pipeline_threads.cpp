// Pipeline stages as threads of one process (local backend): equivalence with the unsplit
// model for every schedule, evaluation, pipeline x data parallel, stats and bad input.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <partrain/comm/local.hpp>
#include <partrain/parallel/pipeline/pipeline.hpp>

#include "pipeline_layers.hpp"

using namespace partrain;
using partrain::test::host_model;

namespace {

const std::vector<std::size_t> widths{12, 16, 16, 16, 16, 16, 5};  // 6 linear + 5 relu = 11 layers
constexpr std::uint32_t model_seed = 42;
constexpr float lr = 0.1f;
constexpr int steps = 10;

// Largest |a - b| / max(|b|, 1e-3) over all parameters: "within 1e-5 relative in float", with a
// floor so parameters that pass near zero do not turn rounding noise into a huge ratio.
double max_rel_diff(host_model& a, host_model& b) {
  double worst = 0;
  for (std::size_t l = 0; l < a.size(); ++l) {
    auto& pa = a[l]->parameters();
    auto& pb = b[l]->parameters();
    for (std::size_t k = 0; k < pa.size(); ++k) {
      for (std::size_t i = 0; i < pa[k].v.size(); ++i) {
        const double x = pa[k].v[i], y = pb[k].v[i];
        worst = std::max(worst, std::abs(x - y) / std::max(std::abs(y), 1e-3));
      }
    }
  }
  return worst;
}

std::vector<test::synthetic_batch> make_batches(std::size_t rows) {
  std::vector<test::synthetic_batch> b;
  for (int s = 0; s < steps; ++s) b.emplace_back(rows, widths.front(), 5, 1000u + static_cast<std::uint32_t>(s));
  return b;
}

// Trains a copy of the model on one device; returns the losses per step.
std::vector<double> train_reference(host_model& m, const std::vector<test::synthetic_batch>& batches) {
  test::softmax_cross_entropy loss;
  std::vector<double> losses;
  for (const auto& b : batches) {
    losses.push_back(test::reference_step(m, loss, b.input(), b.labels()));
    test::sgd_step(m, lr);
  }
  return losses;
}

// Trains the model split over p stage threads; every stage applies SGD to its own layers.
std::vector<double> train_pipeline(host_model& m, const std::vector<test::synthetic_batch>& batches, int p,
                                   pipeline_options opts) {
  std::vector<std::vector<double>> losses(static_cast<std::size_t>(p));
  run_local(p, [&](local_group& g) {
    test::softmax_cross_entropy loss;
    pipeline_stage stage(m, g, opts);
    for (const auto& b : batches) {
      losses[static_cast<std::size_t>(g.rank())].push_back(stage.train_step(loss, b.input(), b.labels()));
      stage.for_each_parameter([](auto& prm) { test::sgd_update(prm, lr); });
    }
  });
  for (int r = 1; r < p; ++r) CHECK(losses[static_cast<std::size_t>(r)] == losses[0]);
  return losses[0];
}

struct not_a_layer {
  int x;
};
static_assert(layer_sequence<host_model>);
static_assert(layer_sequence<std::vector<test::linear>>);
static_assert(!layer_sequence<std::vector<not_a_layer>>);
static_assert(!layer<not_a_layer>);
static_assert(layer_loss<test::softmax_cross_entropy, std::int32_t>);
static_assert(!layer_loss<test::softmax_cross_entropy, float>);

}  // namespace

TEST_CASE("every schedule gives the unsplit model's parameters (stages as threads)", "[parallel][pipeline][threads]") {
  const auto batches = make_batches(16);
  host_model ref = test::make_mlp(widths, model_seed);
  const auto ref_losses = train_reference(ref, batches);
  for (int p : {2, 3, 4}) {
    for (int m : {1, 4, 8}) {
      for (auto kind : {pipeline_schedule_kind::gpipe, pipeline_schedule_kind::one_f_one_b,
                        pipeline_schedule_kind::interleaved_1f1b}) {
        pipeline_options o;
        o.kind = kind;
        o.micro_batches = m;
        o.virtual_stages = kind == pipeline_schedule_kind::interleaved_1f1b ? 2 : 1;
        if (kind == pipeline_schedule_kind::interleaved_1f1b && m % p != 0) continue;  // Megatron needs m % p == 0
        INFO("p=" << p << " m=" << m << " schedule " << static_cast<int>(kind));
        host_model model = test::make_mlp(widths, model_seed);
        const auto losses = train_pipeline(model, batches, p, o);
        CHECK(max_rel_diff(model, ref) < 1e-5);
        REQUIRE(losses.size() == ref_losses.size());
        for (std::size_t s = 0; s < losses.size(); ++s) CHECK(losses[s] == Approx(ref_losses[s]).epsilon(1e-5));
      }
    }
  }
}

TEST_CASE("interleaved schedule with the model balanced by parameter count", "[parallel][pipeline][threads]") {
  const auto batches = make_batches(12);
  host_model ref = test::make_mlp(widths, model_seed);
  (void)train_reference(ref, batches);
  host_model model = test::make_mlp(widths, model_seed);
  pipeline_options o;
  o.kind = pipeline_schedule_kind::interleaved_1f1b;
  o.micro_batches = 6;
  o.virtual_stages = 3;
  const auto c = parameter_costs(model);
  // Relu layers weigh 0: give each a small cost so no part is empty of work.
  std::vector<double> w(c.begin(), c.end());
  for (auto& x : w) x += 1;
  o.layout = partition_balanced(w, 2 * 3);
  (void)train_pipeline(model, batches, 2, o);
  CHECK(max_rel_diff(model, ref) < 1e-5);
}

TEST_CASE("a user-supplied schedule trains like the generated ones", "[parallel][pipeline][threads]") {
  const auto batches = make_batches(8);
  host_model ref = test::make_mlp(widths, model_seed);
  (void)train_reference(ref, batches);
  host_model model = test::make_mlp(widths, model_seed);
  pipeline_options o;
  // Backwards in reverse micro-batch order: unusual but valid.
  o.schedule = parse_schedule("reversed", 2, 4, 1, "F0 F1 F2 F3 B3 B2 B1 B0\nF0 F1 F2 F3 B3 B2 B1 B0");
  (void)train_pipeline(model, batches, 2, o);
  CHECK(max_rel_diff(model, ref) < 1e-5);
}

TEST_CASE("evaluation runs forward only through the pipeline", "[parallel][pipeline][threads]") {
  test::synthetic_batch b(20, widths.front(), 5, 77);
  host_model ref = test::make_mlp(widths, model_seed);
  const auto want = test::reference_eval(ref, test::softmax_cross_entropy{}, b.input(), b.labels());
  for (int p : {1, 2, 4}) {
    host_model model = test::make_mlp(widths, model_seed);
    std::vector<eval_result> got(static_cast<std::size_t>(p));
    run_local(p, [&](local_group& g) {
      pipeline_options o;
      o.micro_batches = 3;  // 20 rows -> 7, 7, 6
      pipeline_stage stage(model, g, o);
      test::softmax_cross_entropy loss;
      got[static_cast<std::size_t>(g.rank())] = stage.eval_step(loss, b.input(), b.labels());
    });
    for (const auto& r : got) {
      CHECK(r.count == 20);
      CHECK(r.correct == want.correct);
      CHECK(r.loss_sum == Approx(want.loss_sum).epsilon(1e-6));
    }
  }
}

TEST_CASE("pipeline x data parallel (2 stages x 2 replicas) matches one device", "[parallel][pipeline][threads]") {
  for (auto kind : {pipeline_schedule_kind::gpipe, pipeline_schedule_kind::one_f_one_b}) {
    constexpr int replicas = 2;
    const auto batches = make_batches(32);  // replica j trains on rows [16j, 16j + 16)
    host_model ref = test::make_mlp(widths, model_seed);
    (void)train_reference(ref, batches);
    std::vector<host_model> models;
    for (int j = 0; j < replicas; ++j) models.push_back(test::make_mlp(widths, model_seed));
    run_local_grid(2, replicas, [&](grid_rank& gr) {
      pipeline_options o;
      o.kind = kind;
      o.micro_batches = 4;
      o.data_parallel = &gr.data;
      auto& model = models[static_cast<std::size_t>(gr.replica())];
      pipeline_stage stage(model, gr.pipeline, o);
      test::softmax_cross_entropy loss;
      const auto j = static_cast<std::size_t>(gr.replica());
      for (const auto& b : batches) {
        (void)stage.train_step(loss, b.input().slice(16 * j, 16 * j + 16), b.labels().slice(16 * j, 16 * j + 16));
        stage.for_each_parameter([](auto& prm) { test::sgd_update(prm, lr); });
      }
    });
    for (auto& m : models) CHECK(max_rel_diff(m, ref) < 1e-5);
  }
}

TEST_CASE("the executor's measured in-flight peak matches the schedule", "[parallel][pipeline][threads]") {
  test::synthetic_batch b(16, widths.front(), 5, 3);
  for (auto kind : {pipeline_schedule_kind::gpipe, pipeline_schedule_kind::one_f_one_b}) {
    host_model model = test::make_mlp(widths, model_seed);
    std::vector<pipeline_step_stats> stats(4);
    run_local(4, [&](local_group& g) {
      pipeline_options o;
      o.kind = kind;
      o.micro_batches = 8;
      pipeline_stage stage(model, g, o);
      test::softmax_cross_entropy loss;
      (void)stage.train_step(loss, b.input(), b.labels());
      stats[static_cast<std::size_t>(g.rank())] = stage.last_stats();
    });
    for (int s = 0; s < 4; ++s) {
      const int want = kind == pipeline_schedule_kind::gpipe ? 8 : 4 - s;
      CHECK(stats[static_cast<std::size_t>(s)].peak_in_flight == want);
      CHECK(stats[static_cast<std::size_t>(s)].peak_activation_bytes > 0);
    }
    if (kind == pipeline_schedule_kind::one_f_one_b) CHECK(stats[0].bytes_sent > 0);
  }
}

TEST_CASE("bad pipeline input gives clear errors", "[parallel][pipeline][threads]") {
  using Catch::Contains;
  host_model model = test::make_mlp(widths, model_seed);
  test::synthetic_batch b(3, widths.front(), 5, 1);
  test::softmax_cross_entropy loss;
  CHECK_THROWS_WITH(run_local(2, [&](local_group& g) {
                      pipeline_options o;
                      o.micro_batches = 4;
                      pipeline_stage stage(model, g, o);
                      (void)stage.train_step(loss, b.input(), b.labels());
                    }, {.timeout = std::chrono::milliseconds(5000)}),
                    Contains("cannot be split into 4 micro-batches"));
  CHECK_THROWS_WITH(run_local(2, [&](local_group& g) {
                      pipeline_options o;
                      o.layout = partition_uniform(model.size(), 3);
                      pipeline_stage stage(model, g, o);
                    }),
                    Contains("the layout has 3 parts"));
  CHECK_THROWS_WITH(run_local(2, [&](local_group& g) {
                      pipeline_options o;
                      o.virtual_stages = 2;
                      pipeline_stage stage(model, g, o);
                    }),
                    Contains("needs the interleaved_1f1b schedule"));
  CHECK_THROWS_WITH(run_local(3, [&](local_group& g) {
                      pipeline_options o;
                      o.schedule = make_1f1b_schedule(2, 2);
                      pipeline_stage stage(model, g, o);
                    }),
                    Contains("is for 2 stages"));
}

TEST_CASE("a stage that dies makes its peers fail, naming the operation", "[parallel][pipeline][threads]") {
  host_model model = test::make_mlp(widths, model_seed);
  test::synthetic_batch b(8, widths.front(), 5, 1);
  test::softmax_cross_entropy loss;
  std::vector<std::string> errors(2);
  try {
    run_local(2, [&](local_group& g) {
      pipeline_options o;
      o.micro_batches = 2;
      pipeline_stage stage(model, g, o);
      if (g.rank() == 1) throw std::runtime_error("stage 1 lost its device");
      try {
        (void)stage.train_step(loss, b.input(), b.labels());
      } catch (const std::exception& e) {
        errors[0] = e.what();
        throw;
      }
    }, {.timeout = std::chrono::milliseconds(3000)});
  } catch (const std::exception& e) {
    CHECK(std::string(e.what()).find("stage 1 lost its device") != std::string::npos);
  }
  CHECK_THAT(errors[0], Catch::Contains("pipeline stage 0 of 2 recv") && Catch::Contains("from rank 1"));
}

TEST_CASE("a stage whose peer died gets an aborted_error echo naming the recv and the peer",
          "[parallel][pipeline][threads][errors]") {
  // Stage 1 of replica 0 fails; stage 0 of replica 0, waiting on its gradient, is an echo:
  // the grid reports the root cause, and the echo carries rank, operation, peer and origin.
  test::synthetic_batch b(8, widths.front(), 5, 1);
  test::softmax_cross_entropy loss;
  std::vector<host_model> models;
  for (int j = 0; j < 2; ++j) models.push_back(test::make_mlp(widths, model_seed));
  std::exception_ptr echo;
  CHECK_THROWS_WITH(run_local_grid(2, 2, [&](grid_rank& gr) {
    pipeline_options o;
    o.micro_batches = 2;
    o.data_parallel = &gr.data;
    pipeline_stage stage(models[static_cast<std::size_t>(gr.replica())], gr.pipeline, o);
    if (gr.stage() == 1 && gr.replica() == 0) throw std::runtime_error("stage 1 lost its device");
    try {
      (void)stage.train_step(loss, b.input(), b.labels());
    } catch (...) {
      if (gr.stage() == 0 && gr.replica() == 0) echo = std::current_exception();
      throw;
    }
  }, {.timeout = std::chrono::milliseconds(3000)}),
                    Catch::Contains("stage 1 lost its device"));
  REQUIRE(echo);
  try {
    std::rethrow_exception(echo);
  } catch (const aborted_error& e) {
    CHECK(e.rank() == 0);
    CHECK(e.operation() == "recv");
    CHECK(e.peer() == 1);
    CHECK(e.origin() == 1);
    CHECK_THAT(e.what(), Catch::Contains("pipeline stage 0 of 2 recv"));
  } catch (const std::exception& e) {
    FAIL("stage 0 got a root cause, not an echo: " << e.what());
  }
}

TEST_CASE("partition by measured time leaves the gradients alone and covers the model", "[parallel][pipeline][partition]") {
  host_model model = test::make_mlp({64, 256, 8, 8, 8}, 5);
  for (auto& l : model) for (auto& p : l->parameters()) std::ranges::fill(p.g, 0.25f);
  test::synthetic_batch b(32, 64, 8, 4);
  const auto costs = measure_layer_costs(model, b.input(), 2);
  REQUIRE(costs.size() == model.size());
  for (double c : costs) CHECK(c >= 0);
  for (auto& l : model) for (auto& p : l->parameters()) for (float g : p.g) REQUIRE(g == 0.25f);
  const auto part = partition_by_time(model, b.input(), 3, 1);
  CHECK(part.stages() == 3);
  CHECK(part.bounds.front() == 0);
  CHECK(part.bounds.back() == model.size());
  CHECK_THROWS_WITH(partition_by_time(model, b.input(), 8), Catch::Contains("cannot split 7 layers into 8 stages"));
}

TEST_CASE("without a layout the stages balance by cost: parameters, or rank 0's timing of a probe", "[parallel][pipeline][threads]") {
  // linear 4->64 (320), relu, linear 64->64 (4160), relu, linear 64->2 (130): by parameters the
  // big middle layer gets a stage to itself, unlike partition_uniform's 3 + 2 layers.
  const std::vector<std::size_t> widths{4, 64, 64, 2};
  host_model reference = test::make_mlp(widths, 1);
  const partition by_params = partition_balanced(parameter_costs(reference), 2);
  REQUIRE(by_params.bounds != partition_uniform(reference.size(), 2).bounds);
  const test::synthetic_batch probe(16, widths.front(), 2, 3);
  std::vector<std::vector<std::size_t>> plain(2), probed(2);
  run_local(2, [&](local_group& g) {
    host_model model = test::make_mlp(widths, 1);
    pipeline_stage by_default(model, g);
    plain[static_cast<std::size_t>(g.rank())] = by_default.layout().bounds;
    pipeline_stage timed(model, g, {.probe = probe.input()});
    probed[static_cast<std::size_t>(g.rank())] = timed.layout().bounds;
  });
  CHECK(plain[0] == by_params.bounds);
  CHECK(plain[1] == by_params.bounds);
  CHECK(probed[0] == probed[1]);  // rank 0's measurement, every rank's partition
  CHECK(probed[0].size() == 3);
}
