// Fully sharded data parallel across processes: forked ranks, each with a gloo_group over a file
// store; FSDP with AdamW and clipping against one process on the global batch, both
// reshard_after_forward settings, and the bytes each rank sends per step.
#include <catch2/catch.hpp>

#include <partrain/comm/gloo.hpp>
#include <partrain/optim/adamw.hpp>
#include <partrain/optim/clip.hpp>
#include <partrain/parallel/fsdp.hpp>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "fork_ranks.hpp"
#include "gloo_ranks.hpp"
#include "pipeline_layers.hpp"

using namespace partrain;
using namespace std::chrono_literals;
using partrain::test::host_model;
using partrain::test::make_mlp;
using partrain::test::reference_step;
using partrain::test::softmax_cross_entropy;
using partrain::test::synthetic_batch;

using partrain::testing::run_gloo;

namespace {

constexpr std::size_t per_rank = 4;
constexpr int steps = 4;
constexpr std::uint32_t seed = 3;
const std::vector<std::size_t> widths{6, 5, 3, 2, 3};  // layers of 35, 18, 8 and 9 elements
const adamw_options adam{.lr = 0.01};
constexpr double max_norm = 0.05;

synthetic_batch step_batch(int s, int world) {
  return synthetic_batch(per_rank * static_cast<std::size_t>(world), widths.front(), 3, 500 + static_cast<std::uint32_t>(s));
}

std::vector<float> reference_run(int world) {
  host_model m = make_mlp(widths, seed);
  struct params_t {
    struct ref {
      models::layers::host_param* p;
      [[nodiscard]] tensor_view<float> value() const { return p->value(); }
      [[nodiscard]] tensor_view<float> grad() const { return p->grad(); }
    };
    std::vector<ref> refs;
    std::vector<ref>& parameters() { return refs; }
  } params;
  for (auto& l : m) {
    for (auto& p : l->parameters()) params.refs.push_back({&p});
  }
  adamw opt(params, adam);
  for (int s = 0; s < steps; ++s) {
    const auto b = step_batch(s, world);
    (void)reference_step(m, softmax_cross_entropy{}, b.input(), b.labels());
    (void)clip_grad_norm(params, max_norm);
    opt.step();
  }
  std::vector<float> out;
  for (auto& r : params.refs) out.insert(out.end(), r.value().begin(), r.value().end());
  return out;
}

}  // namespace

TEST_CASE("fsdp gloo processes: equal to one process on the global batch", "[parallel][fsdp][gloo][processes]") {
  for (int world : {2, 3}) {
    for (bool reshard : {true, false}) {
      CAPTURE(world, reshard);
      const auto got = run_gloo(world, [world, reshard](gloo_group& g, std::vector<float>& out) {
        host_model layers = make_mlp(widths, seed + static_cast<std::uint32_t>(g.rank()));
        fully_sharded_data_parallel f(layers, g, softmax_cross_entropy{}, adam,
                                      {.reshard_after_forward = reshard, .max_grad_norm = max_norm});
        g.reset_traffic();
        for (int s = 0; s < steps; ++s) {
          const auto b = step_batch(s, world);
          const auto r = static_cast<std::size_t>(g.rank());
          (void)f.train_step(b.input().slice(r * per_rank, (r + 1) * per_rank),
                             b.labels().slice(r * per_rank, (r + 1) * per_rank));
        }
        const auto sent = g.traffic().bytes_sent / steps;
        auto full = f.summon_full_params();
        for (auto& p : full.parameters()) out.insert(out.end(), p.value().begin(), p.value().end());
        out.push_back(static_cast<float>(sent));  // the last value: bytes sent per step (exact at this size)
      });
      const auto ref = reference_run(world);
      // Every layer's chunk (n-1 of them) per all_gather and per reduce_scatter, the last layer
      // gathered once, plus the 8-byte norm all_reduce.
      const auto n = static_cast<std::size_t>(world);
      std::size_t pass = 0, last = 0;
      for (std::size_t u : {35u, 18u, 8u, 9u}) {
        last = (n - 1) * ((u + n - 1) / n) * sizeof(float);
        pass += last;
      }
      const auto expected = static_cast<float>((reshard ? 3 * pass - last : 2 * pass) + 2 * (n - 1) * 8 / n);
      for (const auto& r : got) {
        REQUIRE(r.size() == ref.size() + 1);
        CHECK(r == got[0]);
        CHECK(r.back() == expected);
        for (std::size_t i = 0; i < ref.size(); ++i) CHECK(r[i] == Approx(ref[i]).margin(2e-5));
      }
    }
  }
}
