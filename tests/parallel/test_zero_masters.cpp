// Sharded data parallel with 16-bit parameters: the model holds only bfloat16 values and
// gradients, each rank keeps the fp32 masters of its own elements. Checked against one process
// that keeps every master in fp32 and rounds what the model computes with, at world sizes 1-4,
// both partitions and both stages; the memory and the bytes per step; sharded checkpoints that
// save the masters (not the rounded values) and resume at another world size.
#include <catch2/catch.hpp>

#include <partrain/comm/local.hpp>
#include <partrain/core/half.hpp>
#include <partrain/optim/sgd.hpp>
#include <partrain/parallel/zero.hpp>
#include <partrain/train/sharded_checkpoint.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "temp_dir.hpp"
#include "toy_models.hpp"

using namespace partrain;
using partrain::testing::make_toy_batch;
using partrain::testing::toy_batch;
using partrain::testing::toy_param;
using partrain::testing::toy_rng;

namespace {

constexpr std::size_t in = 6, out = 3, per_rank = 4;
const sgd_options sgd_momentum{.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3};

float round16(float x) { return static_cast<float>(bfloat16(x)); }

// y = W x + b, loss = mean over rows of 0.5 ||y - t||²; parameters stored as S (bfloat16: the
// model holds nothing wider), arithmetic in float. Reports the bias, then the weight, final.
template <class S>
struct toy_linear {
  std::vector<toy_param<S>> ps;
  explicit toy_linear(std::uint64_t seed) {
    ps.emplace_back("fc.weight", shape{out, in});
    ps.emplace_back("fc.bias", shape{out});
    toy_rng r(seed);
    for (auto& p : ps) {
      for (auto& v : p.values()) v = S(round16(static_cast<float>(0.5 * r.uniform())));
    }
  }
  std::vector<toy_param<S>>& parameters() { return ps; }
  double train_step(const toy_batch<float>& b) { return run(b, nullptr); }
  double train_step(const toy_batch<float>& b, const grad_ready_fn& ready) { return run(b, &ready); }

  double run(const toy_batch<float>& b, const grad_ready_fn* ready) {
    const auto& w = ps[0].values();
    const auto& bias = ps[1].values();
    std::vector<float> gw(out * in, 0.0f), gb(out, 0.0f);
    double loss = 0;
    const float inv = 1.0f / static_cast<float>(b.n);
    for (std::size_t s = 0; s < b.n; ++s) {
      for (std::size_t k = 0; k < out; ++k) {
        float y = static_cast<float>(bias[k]);
        for (std::size_t j = 0; j < in; ++j) y += static_cast<float>(w[k * in + j]) * b.x[s * in + j];
        const float d = y - b.y[s * out + k];
        loss += 0.5 * static_cast<double>(d) * static_cast<double>(d);
        gb[k] += d * inv;
        for (std::size_t j = 0; j < in; ++j) gw[k * in + j] += d * inv * b.x[s * in + j];
      }
    }
    for (std::size_t k = 0; k < out; ++k) ps[1].grads()[k] = S(gb[k]);
    if (ready) (*ready)(1);
    for (std::size_t i = 0; i < gw.size(); ++i) ps[0].grads()[i] = S(gw[i]);
    if (ready) (*ready)(0);
    return loss / static_cast<double>(b.n);
  }
  [[nodiscard]] std::vector<float> flat() {
    std::vector<float> v;
    for (auto& p : ps) {
      for (auto x : p.values()) v.push_back(static_cast<float>(x));
    }
    return v;
  }
};

toy_batch<float> rank_batch(int step, int world, int rank) {
  return make_toy_batch<float>(static_cast<std::size_t>(step * world + rank) * per_rank, per_rank, in, out);
}

// One process: fp32 masters; every rank's gradient computed with the masters rounded to bf16,
// rounded to bf16 as the model stores it, divided by the world size and summed in rank order.
// Step s runs at world size worlds[s].
std::vector<float> reference(const std::vector<int>& worlds) {
  toy_linear<float> master(7);
  sgd opt(master, sgd_momentum);
  for (int s = 0; s < static_cast<int>(worlds.size()); ++s) {
    const int world = worlds[static_cast<std::size_t>(s)];
    std::vector<float> sum(in * out + out, 0.0f);
    for (int r = 0; r < world; ++r) {
      toy_linear<float> copy(7);
      for (std::size_t p = 0; p < 2; ++p) {
        for (std::size_t i = 0; i < copy.ps[p].values().size(); ++i) copy.ps[p].values()[i] = round16(master.ps[p].values()[i]);
      }
      copy.train_step(rank_batch(s, world, r));
      std::size_t at = 0;
      for (auto& p : copy.ps) {
        for (float g : p.grads()) {
          sum[at] = r == 0 ? round16(g) / static_cast<float>(world) : sum[at] + round16(g) / static_cast<float>(world);
          ++at;
        }
      }
    }
    std::size_t at = 0;
    for (auto& p : master.ps) {
      for (float& g : p.grads()) g = sum[at++];
    }
    opt.step();
  }
  return master.flat();
}

struct rank_out {
  std::vector<float> model;    // the bf16 values the model holds, widened
  std::vector<float> masters;  // this rank's masters over flat_segments(rank)
  std::vector<detail::zero::flat_range> segments;
  sharded_memory mem{};
  std::uint64_t bytes_per_step = 0;
  std::size_t padding = 0;
};

// Steps [from, to) at `world`, loading `load` first and saving to `save` after when given.
std::vector<rank_out> zero16_run(int world, int from, int to, zero_options o, const std::filesystem::path& load = {},
                                 const std::filesystem::path& save = {}) {
  std::vector<rank_out> outs(static_cast<std::size_t>(world));
  run_local(world, [&](local_group& g) {
    toy_linear<bfloat16> m(load.empty() ? 7 : 99);  // a load replaces the values
    sharded_data_parallel zero(m, g, sgd_momentum, o);
    if (!load.empty()) (void)load_sharded_checkpoint(zero, load);
    g.reset_traffic();
    for (int s = from; s < to; ++s) zero.train_step(rank_batch(s, world, g.rank()));
    auto& r = outs[static_cast<std::size_t>(g.rank())];
    r.bytes_per_step = to > from ? g.traffic().bytes_sent / static_cast<std::uint64_t>(to - from) : 0;
    if (!save.empty()) save_sharded_checkpoint(zero, save, {.step = static_cast<std::uint64_t>(to)});
    r.model = m.flat();
    r.masters = zero.master_values();
    r.segments = zero.flat_segments(static_cast<std::size_t>(g.rank()));
    r.mem = zero.memory();
  });
  return outs;
}

// Every rank's masters equal the reference's over its segments (within rel), and every rank's
// model holds the reference rounded to bf16.
void check_against(const std::vector<rank_out>& got, const std::vector<float>& want, double rel = 1e-6) {
  std::size_t covered = 0;
  for (const auto& r : got) {
    REQUIRE(r.model.size() == want.size());
    for (std::size_t i = 0; i < want.size(); ++i) {
      CAPTURE(i);
      CHECK(r.model[i] == Approx(round16(want[i])).epsilon(1e-2 + rel).margin(1e-6 + rel));
    }
    std::size_t at = 0;
    for (const auto& seg : r.segments) {
      for (std::size_t i = seg.begin; i < seg.end; ++i) {
        CAPTURE(i);
        CHECK(r.masters.at(at++) == Approx(want[i]).epsilon(rel).margin(rel / 10));
      }
      covered += seg.size();
    }
    CHECK(at == r.masters.size());
  }
  CHECK(covered == want.size());  // the ranks' masters together: every element once
}

}  // namespace

TEST_CASE("zero with bf16 parameters: fp32 masters sharded, equal to one process keeping them whole",
          "[parallel][zero][masters]") {
  for (int world = 1; world <= 4; ++world) {
    const auto want = reference(std::vector<int>(6, world));
    for (const auto partition : {zero_partition::per_bucket, zero_partition::contiguous}) {
      for (int stage : {1, 2}) {
        CAPTURE(world, static_cast<int>(partition), stage);
        // 32-byte buckets: several of them, launched in backward per bucket. Gradients reduced
        // in fp32: the reference's numbers.
        const zero_options o{.stage = stage, .partition = partition, .bucket_cap_bytes = 32, .first_bucket_bytes = 32,
                             .fp32_reduce = true};
        const auto got = zero16_run(world, 0, 6, o);
        check_against(got, want);
        for (const auto& r : got) CHECK(r.model == got[0].model);
        // Memory: 2 bytes per parameter in the model, 4 per owned element of masters.
        const auto& m = got[0].mem;
        CHECK(m.parameter_bytes == 21 * sizeof(bfloat16));
        CHECK(m.master_bytes == m.shard_elements * sizeof(float));
        CHECK(m.optimizer_state_bytes == m.shard_elements * sizeof(float));  // momentum, fp32
        // Bytes: the reduce_scatter in fp32, the all_gather in bf16, of the padded space.
        const auto n = static_cast<std::uint64_t>(world);
        const std::uint64_t padded = 21 + m.padding_elements;
        CHECK(got[0].bytes_per_step == (n - 1) * padded / n * (sizeof(float) + sizeof(bfloat16)));

        // The default: reduced in bf16, half the reduce_scatter's bytes (DDP's on a bf16 model),
        // the sums rounded to bf16.
        auto o16 = o;
        o16.fp32_reduce = false;
        const auto got16 = zero16_run(world, 0, 6, o16);
        check_against(got16, want, 1e-2);
        for (const auto& r : got16) CHECK(r.model == got16[0].model);
        const std::uint64_t padded16 = 21 + got16[0].mem.padding_elements;
        CHECK(got16[0].bytes_per_step == (n - 1) * padded16 / n * (2 * sizeof(bfloat16)));
      }
    }
  }
}

TEST_CASE("zero with bf16 parameters: checkpoints save the fp32 masters and reshard", "[parallel][zero][masters][checkpoint]") {
  partrain::testing::temp_dir dir;
  const auto ck = dir.path / "bf16.ckpt";
  const zero_options o{.bucket_cap_bytes = 32, .first_bucket_bytes = 32, .fp32_reduce = true};
  const auto straight = zero16_run(3, 0, 6, o);
  (void)zero16_run(3, 0, 3, o, {}, ck);
  // The same world: the same bytes, masters included (rounded values would lose them).
  const auto same = zero16_run(3, 3, 6, o, ck);
  for (std::size_t r = 0; r < 3; ++r) {
    CHECK(same[r].masters == straight[r].masters);
    CHECK(same[r].model == straight[r].model);
  }
  // Other world sizes and the other partition: the masters resume exactly, the sums regroup.
  for (int world : {1, 2, 4}) {
    for (const auto partition : {zero_partition::per_bucket, zero_partition::contiguous}) {
      CAPTURE(world, static_cast<int>(partition));
      zero_options p = o;
      p.partition = partition;
      const auto got = zero16_run(world, 3, 6, p, ck);
      // Three steps at world 3, then three at this world (each rank its own batch).
      check_against(got, reference({3, 3, 3, world, world, world}));
    }
  }
  SECTION("the checkpoint holds fp32 values: consolidated, they are the masters") {
    const auto whole = dir.path / "whole.ckpt";
    consolidate_sharded_checkpoint(ck, whole);
    CHECK(std::filesystem::exists(whole));
    // Resumed from it at world 1, the masters are what the three ranks held.
    const auto one = zero16_run(1, 3, 3, o, ck);
    std::vector<float> all(21);
    const auto at3 = zero16_run(3, 3, 3, o, ck);
    for (const auto& r : at3) {
      std::size_t at = 0;
      for (const auto& seg : r.segments) {
        for (std::size_t i = seg.begin; i < seg.end; ++i) all[i] = r.masters[at++];
      }
    }
    CHECK(one[0].masters == all);
    bool any_finer = false;  // some master is not a bf16 value: the file kept more than the model
    for (float x : all) any_finer = any_finer || x != round16(x);
    CHECK(any_finer);
  }
}
