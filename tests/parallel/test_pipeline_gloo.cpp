// Pipeline stages as processes: forked ranks (partrain::spawn), each with a gloo_group over a
// file store. Every rank trains its stage and checks its own layers against the unsplit model
// trained in the same process; a mismatch makes the rank fail, and spawn reports which.
#include <catch2/catch.hpp>

#include "temp_dir.hpp"

#include <atomic>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <unistd.h>
#include <vector>

#include <partrain/comm/gloo.hpp>
#include <partrain/launch/spawn.hpp>
#include <partrain/parallel/pipeline/pipeline.hpp>
#include <partrain/rendezvous/file_store.hpp>
#include <partrain/rendezvous/prefix_store.hpp>

#include "pipeline_layers.hpp"

using namespace partrain;
using namespace std::chrono_literals;
using partrain::test::host_model;
namespace fs = std::filesystem;

namespace {

const std::vector<std::size_t> widths{12, 16, 16, 16, 16, 16, 5};
constexpr std::uint32_t model_seed = 42;
constexpr float lr = 0.1f;
constexpr int steps = 10;

struct temp_dir : partrain::testing::temp_dir {
  temp_dir() : partrain::testing::temp_dir("partrain_pipeline_gloo") {}
};

std::vector<test::synthetic_batch> make_batches(std::size_t rows) {
  std::vector<test::synthetic_batch> b;
  for (int s = 0; s < steps; ++s) b.emplace_back(rows, widths.front(), 5, 1000u + static_cast<std::uint32_t>(s));
  return b;
}

host_model train_reference(const std::vector<test::synthetic_batch>& batches) {
  host_model m = test::make_mlp(widths, model_seed);
  test::softmax_cross_entropy loss;
  for (const auto& b : batches) {
    (void)test::reference_step(m, loss, b.input(), b.labels());
    test::sgd_step(m, lr);
  }
  return m;
}

// Throws (failing the rank) unless the given layers match the reference within 1e-5 relative.
void check_layers(host_model& got, host_model& ref, const std::vector<std::size_t>& layers, const std::string& what) {
  for (auto l : layers) {
    auto& pa = got[l]->parameters();
    auto& pb = ref[l]->parameters();
    for (std::size_t k = 0; k < pa.size(); ++k) {
      for (std::size_t i = 0; i < pa[k].v.size(); ++i) {
        const double x = pa[k].v[i], y = pb[k].v[i];
        const double rel = std::abs(x - y) / std::max(std::abs(y), 1e-3);
        if (!(rel < 1e-5)) {
          throw std::runtime_error(what + ": layer " + std::to_string(l) + " parameter " + std::to_string(k) + "[" +
                                   std::to_string(i) + "] = " + std::to_string(x) + ", unsplit model " +
                                   std::to_string(y));
        }
      }
    }
  }
}

spawn_options spawn_opts(bool echo = true) {
  spawn_options o;
  o.timeout = 60s;
  o.echo_output = echo;
  return o;
}

const char* name_of(pipeline_schedule_kind k) {
  switch (k) {
    case pipeline_schedule_kind::gpipe: return "gpipe";
    case pipeline_schedule_kind::one_f_one_b: return "1f1b";
    case pipeline_schedule_kind::interleaved_1f1b: return "interleaved";
  }
  return "?";
}

}  // namespace

TEST_CASE("every schedule gives the unsplit model's parameters (stages as Gloo processes)",
          "[parallel][pipeline][processes]") {
  const auto batches = make_batches(16);
  for (int p : {2, 3, 4}) {
    temp_dir dir;
    const auto store_path = (dir.path / "store").string();
    INFO("p=" << p);
    REQUIRE_NOTHROW(spawn(p, [&](int rank) {
      host_model ref = train_reference(batches);
      gloo_group g(std::make_shared<file_store>(store_path), rank, p, {.timeout = 20s});
      for (int m : {1, 4, 8}) {
        for (auto kind : {pipeline_schedule_kind::gpipe, pipeline_schedule_kind::one_f_one_b,
                          pipeline_schedule_kind::interleaved_1f1b}) {
          if (kind == pipeline_schedule_kind::interleaved_1f1b && m % p != 0) continue;
          pipeline_options o;
          o.kind = kind;
          o.micro_batches = m;
          o.virtual_stages = kind == pipeline_schedule_kind::interleaved_1f1b ? 2 : 1;
          host_model model = test::make_mlp(widths, model_seed);
          pipeline_stage stage(model, g, o);
          test::softmax_cross_entropy loss;
          for (const auto& b : batches) {
            // Only the first stage needs the inputs and only the last the labels.
            const auto x = stage.is_first() ? b.input() : tensor_view<const float>{};
            const auto y = stage.is_last() ? b.labels() : tensor_view<const std::int32_t>{};
            (void)stage.train_step(loss, x, y);
            stage.for_each_parameter([](auto& prm) { test::sgd_update(prm, lr); });
          }
          check_layers(model, ref, stage.owned_layers(),
                       std::string(name_of(kind)) + " p=" + std::to_string(p) + " m=" + std::to_string(m));
        }
      }
    }, spawn_opts()));
  }
}

TEST_CASE("pipeline x data parallel over Gloo processes (2 stages x 2 replicas)", "[parallel][pipeline][processes]") {
  constexpr int stages = 2, replicas = 2;
  const auto batches = make_batches(32);
  temp_dir dir;
  const auto store_path = (dir.path / "store").string();
  REQUIRE_NOTHROW(spawn(stages * replicas, [&](int rank) {
    const int s = rank % stages, j = rank / stages;
    host_model ref = train_reference(batches);
    auto base = std::make_shared<file_store>(store_path);
    // Each group rendezvouses under its own prefix: the pipeline of replica j, the replicas of stage s.
    gloo_group pp(std::make_shared<prefix_store>("pp" + std::to_string(j), base), s, stages, {.timeout = 20s});
    gloo_group dp(std::make_shared<prefix_store>("dp" + std::to_string(s), base), j, replicas, {.timeout = 20s});
    pipeline_options o;
    o.kind = pipeline_schedule_kind::one_f_one_b;
    o.micro_batches = 4;
    o.data_parallel = &dp;
    host_model model = test::make_mlp(widths, model_seed);
    pipeline_stage stage(model, pp, o);
    test::softmax_cross_entropy loss;
    const auto lo = static_cast<std::size_t>(16 * j);
    for (const auto& b : batches) {
      (void)stage.train_step(loss, b.input().slice(lo, lo + 16), b.labels().slice(lo, lo + 16));
      stage.for_each_parameter([](auto& prm) { test::sgd_update(prm, lr); });
    }
    check_layers(model, ref, stage.owned_layers(), "stage " + std::to_string(s) + " replica " + std::to_string(j));
    // Evaluation over the processes: forward only, the same numbers as one device.
    test::synthetic_batch e(20, widths.front(), 5, 9);
    const auto got = stage.eval_step(loss, e.input(), e.labels());
    const auto want = test::reference_eval(ref, loss, e.input(), e.labels());
    if (got.count != 20 || got.correct != want.correct || std::abs(got.loss_sum - want.loss_sum) > 1e-4 * want.loss_sum) {
      throw std::runtime_error("eval_step: got " + std::to_string(got.loss_sum) + "/" + std::to_string(got.correct) +
                               ", expected " + std::to_string(want.loss_sum) + "/" + std::to_string(want.correct));
    }
  }, spawn_opts()));
}

TEST_CASE("a pipeline rank that fails makes the job fail, naming it", "[parallel][pipeline][processes]") {
  temp_dir dir;
  const auto store_path = (dir.path / "store").string();
  const auto batches = make_batches(8);
  CHECK_THROWS_WITH(spawn(2, [&](int rank) {
    gloo_group g(std::make_shared<file_store>(store_path), rank, 2, {.timeout = 3s});
    host_model model = test::make_mlp(widths, model_seed);
    pipeline_options o;
    o.micro_batches = 2;
    pipeline_stage stage(model, g, o);
    // Both ranks set up first: otherwise rank 1 could exit while rank 0 still connects, and rank
    // 0's first error would be its rendezvous's (seen once in CI), not the failed stage's.
    g.barrier().wait();
    if (rank == 1) throw std::runtime_error("stage 1 ran out of memory");
    test::softmax_cross_entropy loss;
    (void)stage.train_step(loss, batches[0].input(), batches[0].labels());
  }, spawn_opts(false)),
                    // Either rank 1's own error comes first, or rank 0's, naming the receive from rank 1.
                    Catch::Contains("stage 1 ran out of memory") || Catch::Contains("recv: gradient of micro-batch 0 for global stage 0 from rank 1"));
}
