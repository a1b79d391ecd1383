// Sharded data parallel across processes: forked ranks, each with a gloo_group over a file store;
// ZeRO-1 and ZeRO-2 against one process on the global batch, with uneven shards, many buckets,
// AdamW and clipping, and the bytes each rank sends per step.
#include <catch2/catch.hpp>

#include <partrain/comm/gloo.hpp>
#include <partrain/optim/adamw.hpp>
#include <partrain/optim/clip.hpp>
#include <partrain/optim/sgd.hpp>
#include <partrain/parallel/zero.hpp>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "fork_ranks.hpp"
#include "gloo_ranks.hpp"
#include "toy_models.hpp"

using namespace partrain;
using namespace std::chrono_literals;
using partrain::testing::make_toy_batch;
using partrain::testing::toy_mlp;

using partrain::testing::run_gloo;

namespace {

constexpr std::size_t per_rank = 4;
constexpr int steps = 10;

// One process on the global batch (N ranks' batches of one step together), clipped, AdamW.
std::vector<float> reference_run(int world) {
  toy_mlp<float, false> m(7);
  adamw opt(m, {.lr = 0.01});
  for (int s = 0; s < steps; ++s) {
    m.train_step(make_toy_batch<float>(static_cast<std::size_t>(s * world) * per_rank, per_rank * static_cast<std::size_t>(world)));
    (void)clip_grad_norm(m, 0.05);
    opt.step();
  }
  return m.flat_values();
}

}  // namespace

TEST_CASE("zero gloo processes: ZeRO-1 and ZeRO-2 equal one process on the global batch", "[parallel][zero][gloo][processes]") {
  for (int world : {2, 3}) {
    for (int stage : {1, 2}) {
      CAPTURE(world, stage);
      const auto got = run_gloo(world, [world, stage](gloo_group& g, std::vector<float>& out) {
        toy_mlp<float> m(7 + static_cast<std::uint64_t>(g.rank()));
        sharded_data_parallel zero(m, g, adamw_options{.lr = 0.01},
                                   {.stage = stage, .bucket_cap_bytes = 20, .max_grad_norm = 0.05});
        g.reset_traffic();
        for (int s = 0; s < steps; ++s) {
          zero.train_step(make_toy_batch<float>(static_cast<std::size_t>(s * world + g.rank()) * per_rank, per_rank));
        }
        out = m.flat_values();
        // The last value: bytes sent per step (exact in float at this size).
        out.push_back(static_cast<float>(g.traffic().bytes_sent / steps));
      });
      const auto ref = reference_run(world);
      // 53 elements padded to world * ceil(53 / world); a reduce_scatter and an all_gather of that,
      // (n-1)/n each, plus the 8-byte norm all_reduce.
      const auto n = static_cast<std::size_t>(world);
      const std::size_t padded = (53 + n - 1) / n * n;
      const auto expected = static_cast<float>(2 * (n - 1) * padded / n * sizeof(float) + 2 * (n - 1) * 8 / n);
      for (const auto& r : got) {
        REQUIRE(r.size() == ref.size() + 1);
        CHECK(r == got[0]);
        CHECK(r.back() == expected);
        for (std::size_t i = 0; i < ref.size(); ++i) CHECK(r[i] == Approx(ref[i]).epsilon(1e-5).margin(1e-6));
      }
    }
  }
}
