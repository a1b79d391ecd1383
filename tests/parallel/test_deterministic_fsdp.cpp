// Deterministic FSDP (fsdp_options::deterministic_shards) and the binned exact sum under it
// (parallel/detail/binned_sum.hpp): the sum does not depend on the order or grouping of its adds;
// FSDP's trained parameters are the same bits at world sizes 1 to 4 (threads), for the MLP, the
// CNN and the ViT as layers, under SGD with momentum and AdamW, for any gradient-accumulation split,
// with dropout, clipping and several layers a unit, resumed from a sharded checkpoint at another
// world size; they follow deterministic DDP's to float rounding; refusals, and a NaN gradient
// failing every rank under both modes.
#include <catch2/catch.hpp>

#include <partrain/comm/local.hpp>
#include <partrain/data/batch.hpp>
#include <partrain/model/sequential.hpp>
#include <partrain/optim/sgd.hpp>
#include <partrain/parallel/deterministic.hpp>
#include <partrain/parallel/detail/binned_sum.hpp>
#include <partrain/parallel/fsdp.hpp>
#include <partrain/train/sharded_checkpoint.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "cnn_layers.hpp"
#include "mlp_layers.hpp"
#include "pipeline_layers.hpp"
#include "temp_dir.hpp"
#include "vit_layers.hpp"

using namespace partrain;
namespace ml = models::layers;
namespace det = partrain::detail::deterministic;

namespace {

// Sums v in groups (each group's digits at the group's own bin, then merged), in the given order.
struct binned {
  int t = det::no_bin;
  std::int64_t hi = 0, lo = 0;
  void add_group(const std::vector<float>& v, const std::vector<std::size_t>& members) {
    float largest = 0;
    for (const auto i : members) largest = std::max(largest, std::abs(v[i]));
    if (largest == 0) return;
    const int tg = det::bin_of(largest);
    std::int64_t h = 0, l = 0;
    for (const auto i : members) det::add_digits(&v[i], 1, tg, &h, &l);
    det::merge_bins(t, &hi, &lo, &h, &l, 1, tg);
  }
  [[nodiscard]] double value() const { return det::bins_value(t, hi, lo); }
};

}  // namespace

TEST_CASE("binned sum: the same bits for any order and grouping, within 2^-29 of the largest value", "[deterministic][binned]") {
  std::mt19937 gen(7);
  for (int trial = 0; trial < 200; ++trial) {
    // Values over 2^-40 .. 2^20, both signs: groups land in different bins, so merges move up and down.
    std::vector<float> v(1 + gen() % 40);
    for (auto& x : v) {
      x = std::ldexp(std::uniform_real_distribution<float>(0.5f, 1.0f)(gen), static_cast<int>(gen() % 61) - 40) *
          (gen() % 2 ? 1.0f : -1.0f);
    }
    if (trial % 10 == 0) v[0] = std::ldexp(1.0f, 100);  // a lone huge value: everything else below its low bin
    std::vector<std::size_t> order(v.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    binned one;
    one.add_group(v, order);
    long double exact = 0;
    float largest = 0;
    for (const float x : v) {
      exact += x;
      largest = std::max(largest, std::abs(x));
    }
    CAPTURE(trial, v.size());
    CHECK(std::abs(static_cast<long double>(one.value()) - exact) <= std::ldexp(static_cast<long double>(largest), -29) * v.size());
    for (int shuffle = 0; shuffle < 5; ++shuffle) {
      std::shuffle(order.begin(), order.end(), gen);
      binned many;
      for (std::size_t at = 0; at < order.size();) {  // groups of 1 to 7 in a shuffled order
        const std::size_t n = std::min<std::size_t>(order.size() - at, 1 + gen() % 7);
        many.add_group(v, std::vector<std::size_t>(order.begin() + static_cast<std::ptrdiff_t>(at),
                                                   order.begin() + static_cast<std::ptrdiff_t>(at + n)));
        at += n;
      }
      CHECK(many.value() == one.value());
    }
  }
}

namespace {

constexpr std::size_t global_rows = 12, shards = 6, steps = 3;

enum class layers { mlp, cnn, vit };
const char* name_of(layers k) { return k == layers::mlp ? "mlp" : k == layers::cnn ? "cnn" : "vit"; }
std::size_t features_of(layers k) { return k == layers::mlp ? 6 : 784; }
ml::host_model make_layers(layers k, float dropout = 0.0f) {
  if (k == layers::cnn) return ml::make_cnn(3);
  if (k == layers::vit) return ml::make_vit({.patch = 7, .dim = 16, .depth = 1, .heads = 2, .mlp_ratio = 2, .dropout = dropout}, 3);
  return ml::make_mlp({6, 5, 4, 10}, 3);
}
batch rows_of(const test::synthetic_batch& b, std::size_t first, std::size_t n) {
  return batch{b.input().slice(first, first + n), b.labels().slice(first, first + n), {}};
}

struct run_options {
  layers kind = layers::mlp;
  bool adamw = false;
  std::size_t micro = 1;               // micro-batches a step
  std::size_t min_unit_elements = 0;   // FSDP's units
  float dropout = 0.0f;
  double max_grad_norm = 0;
  bool recompute = false;              // every layer's activations recomputed in backward
  dtype param_dtype = dtype::float32;  // FSDP's gathers
  std::uint32_t from = 0, to = steps;  // the steps run
  const std::filesystem::path* load = nullptr;
  const std::filesystem::path* save = nullptr;
};

// Deterministic FSDP at `world` ranks: every rank's whole parameters at the end (checked equal),
// and the losses rank 0 saw.
std::vector<float> train_fsdp(int world, const run_options& o, std::vector<double>* losses = nullptr) {
  std::vector<std::vector<float>> values(static_cast<std::size_t>(world));
  std::vector<std::vector<double>> seen(static_cast<std::size_t>(world));
  const std::size_t features = features_of(o.kind);
  run_local(world, [&](local_group& g) {
    sequential model(make_layers(o.kind, o.dropout), ml::softmax_cross_entropy{});
    model.set_seed(11);
    if (o.recompute) model.set_recompute({.every = 1, .layers = {}});
    shard_optimizer_options opt = sgd_options{.lr = 0.1, .momentum = 0.9};
    if (o.adamw) opt = adamw_options{.lr = 0.01};
    fully_sharded_data_parallel fsdp(model, g, opt,
                                     {.max_grad_norm = o.max_grad_norm, .param_dtype = o.param_dtype,
                                      .min_unit_elements = o.min_unit_elements, .deterministic_shards = shards});
    if (o.load) (void)load_sharded_checkpoint(fsdp, *o.load);
    fsdp.set_gradient_accumulation_steps(o.micro);
    const std::size_t rows = global_rows / o.micro;
    auto& mine = seen[static_cast<std::size_t>(g.rank())];
    for (std::uint32_t s = o.from; s < o.to; ++s) {
      const test::synthetic_batch b(global_rows, features, 10, 40 + s);
      for (std::size_t m = 0; m + 1 < o.micro; ++m) mine.push_back(fsdp.accumulate_step(rows_of(b, m * rows, rows)));
      mine.push_back(fsdp.train_step(rows_of(b, (o.micro - 1) * rows, rows)));
      if (o.max_grad_norm > 0) mine.push_back(fsdp.last_grad_norm());
    }
    if (o.save) save_sharded_checkpoint(fsdp, *o.save);
    auto full = fsdp.summon_full_params();
    auto& v = values[static_cast<std::size_t>(g.rank())];
    for (auto& p : full.parameters()) v.insert(v.end(), p.value().begin(), p.value().end());
  });
  for (int r = 1; r < world; ++r) {
    REQUIRE(values[static_cast<std::size_t>(r)] == values[0]);  // every rank the same model
    REQUIRE(seen[static_cast<std::size_t>(r)] == seen[0]);
  }
  if (losses) *losses = seen[0];
  return values[0];
}

}  // namespace

TEST_CASE("deterministic FSDP: the same bits at world sizes 1 to 4", "[parallel][deterministic][fsdp]") {
  const auto kind = GENERATE(layers::mlp, layers::cnn, layers::vit);
  const bool adamw = GENERATE(false, true);
  CAPTURE(name_of(kind), adamw);
  const run_options o{.kind = kind, .adamw = adamw};
  std::vector<double> losses1, losses;
  const auto one = train_fsdp(1, o, &losses1);
  for (const int world : {2, 3, 4}) {
    CAPTURE(world);
    CHECK(train_fsdp(world, o, &losses) == one);
    CHECK(losses == losses1);
  }
  CHECK(losses1.front() != losses1.back());  // it trained
}

TEST_CASE("deterministic FSDP: any gradient-accumulation split, any units, dropout and clipping give the same bits",
          "[parallel][deterministic][fsdp][accumulation]") {
  SECTION("accumulation: 2, 3 or 6 micro-batches of 3, 2 or 1 shards (more ranks than a micro-batch's shards: some idle)") {
    const auto kind = GENERATE(layers::mlp, layers::vit);
    CAPTURE(name_of(kind));
    const auto one = train_fsdp(1, {.kind = kind});
    for (const std::size_t micro : {2, 3, 6}) {
      for (const int world : {2, 4}) {
        CAPTURE(micro, world);
        CHECK(train_fsdp(world, {.kind = kind, .micro = micro}) == one);
      }
    }
  }
  SECTION("several layers a unit") {
    const auto one = train_fsdp(1, {.kind = layers::vit, .min_unit_elements = 3000});
    CHECK(train_fsdp(3, {.kind = layers::vit, .min_unit_elements = 3000}) == one);
    CHECK(train_fsdp(3, {.kind = layers::vit}) == one);  // the units do not change the sum either
  }
  SECTION("recomputation and bf16 gathers: the same bits too") {
    const run_options recomputed{.kind = layers::vit, .dropout = 0.2f, .recompute = true};
    const auto one = train_fsdp(1, recomputed);
    CHECK(one == train_fsdp(1, {.kind = layers::vit, .dropout = 0.2f}));  // recomputing changes no bit
    CHECK(train_fsdp(3, recomputed) == one);
    const run_options bf16{.kind = layers::vit, .param_dtype = dtype::bfloat16};
    const auto rounded = train_fsdp(1, bf16);
    CHECK(rounded != train_fsdp(1, {.kind = layers::vit}));  // the gathers round
    CHECK(train_fsdp(2, bf16) == rounded);
    CHECK(train_fsdp(4, bf16) == rounded);
  }
  SECTION("dropout: drawn per step and shard, whichever rank computes the shard") {
    const run_options o{.kind = layers::vit, .dropout = 0.2f};
    const auto one = train_fsdp(1, o);
    CHECK(one != train_fsdp(1, {.kind = layers::vit}));  // the dropout is on
    CHECK(train_fsdp(2, o) == one);
    CHECK(train_fsdp(3, {.kind = layers::vit, .micro = 2, .dropout = 0.2f}) == one);
  }
  SECTION("clipping: the global norm the same bits too, and clipping on") {
    const run_options o{.kind = layers::vit, .max_grad_norm = 0.05};
    std::vector<double> seen1, seen;
    const auto one = train_fsdp(1, o, &seen1);
    CHECK(one != train_fsdp(1, {.kind = layers::vit}));
    CHECK(seen1[1] > 0.05);  // the first step's norm (losses and norms alternate): clipped
    for (const int world : {2, 4}) {
      CHECK(train_fsdp(world, o, &seen) == one);
      CHECK(seen == seen1);
    }
  }
}

TEST_CASE("deterministic FSDP: checkpointed at 2 ranks and resumed at 3 or 4, the 1-rank bits", "[parallel][deterministic][fsdp][checkpoint]") {
  testing::temp_dir dir("partrain_det_fsdp_resume");
  const auto file = dir.path / "run" / "index.json";
  const auto one = train_fsdp(1, {.adamw = true});
  const auto half = train_fsdp(2, {.adamw = true, .to = 1, .save = &file});
  CHECK(half != one);
  CHECK(train_fsdp(3, {.adamw = true, .from = 1, .load = &file}) == one);
  CHECK(train_fsdp(4, {.adamw = true, .from = 1, .load = &file}) == one);
}

TEST_CASE("deterministic FSDP follows deterministic DDP to float rounding", "[parallel][deterministic][fsdp]") {
  // Another exact sum (bins, not one fixed-point scale), so not the same bits: the same training.
  std::vector<float> want;
  run_local(1, [&](local_group& g) {
    sequential model(make_layers(layers::mlp), ml::softmax_cross_entropy{});
    deterministic_data_parallel ddp(model, g, {.shards = shards});
    sgd opt(model, {.lr = 0.1, .momentum = 0.9});
    for (std::uint32_t s = 0; s < steps; ++s) {
      const test::synthetic_batch b(global_rows, 6, 10, 40 + s);
      (void)ddp.train_step(batch{b.input(), b.labels(), {}});
      opt.step();
    }
    for (auto& p : model.parameters()) want.insert(want.end(), p.value().begin(), p.value().end());
  });
  const auto got = train_fsdp(2, {});
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) CHECK(got[i] == Approx(want[i]).epsilon(1e-5).margin(1e-6));
}

TEST_CASE("deterministic FSDP refuses what it cannot sum exactly", "[parallel][deterministic][fsdp][errors]") {
  std::vector<std::string> errors(6);
  std::vector<std::size_t> kept(3);
  std::vector<std::string> disagreed(2);
  run_local(2, [&](local_group& g) {
    const bool leader = g.rank() == 0;
    auto refused = [&](std::size_t i, fsdp_options fo) {
      sequential model(ml::make_mlp({6, 5, 10}, 1), ml::softmax_cross_entropy{});
      try {
        fully_sharded_data_parallel f(model, g, sgd_options{.lr = 0.1}, fo);
      } catch (const config_error& e) {
        if (leader) errors[i] = e.what();
      }
      if (leader) kept[i] = model.parameters().front().value().size();  // refused before taking the storage
    };
    refused(0, {.deterministic_shards = 1});
    refused(1, {.reduce_dtype = dtype::bfloat16, .deterministic_shards = 2});
    refused(2, {.join = true, .deterministic_shards = 2});
    try {  // the ranks disagree: both fail in the model check
      sequential model(ml::make_mlp({6, 5, 10}, 1), ml::softmax_cross_entropy{});
      fully_sharded_data_parallel f(model, g, sgd_options{.lr = 0.1}, {.deterministic_shards = leader ? 2u : 4u});
    } catch (const config_error& e) {
      disagreed[static_cast<std::size_t>(g.rank())] = e.what();
    }
    sequential model(ml::make_mlp({6, 5, 10}, 1), ml::softmax_cross_entropy{});
    fully_sharded_data_parallel f(model, g, sgd_options{.lr = 0.1}, {.deterministic_shards = 4});
    const test::synthetic_batch b(12, 6, 10, 1);
    try {
      (void)f.train_step(rows_of(b, 0, 10));  // both ranks refuse before any collective
    } catch (const invalid_argument_error& e) {
      if (leader) errors[3] = e.what();
    }
    try {
      f.set_gradient_accumulation_steps(3);
    } catch (const invalid_argument_error& e) {
      if (leader) errors[4] = e.what();
    }
    try {
      auto guard = f.no_sync();
      (void)f.train_step(rows_of(b, 0, 12));
    } catch (const invalid_argument_error& e) {
      if (leader) errors[5] = e.what();
    }
    (void)f.train_step(rows_of(b, 0, 12));  // the refused calls left nothing behind
  });
  CHECK(kept == std::vector<std::size_t>(3, 6 * 5));
  for (const auto& e : disagreed) CHECK_THAT(e, Catch::Contains("rank 1 has fsdp_options::deterministic_shards = 4, rank 0 2"));
  CHECK_THAT(errors[0], Catch::Contains("deterministic_shards = 1: fewer shards than the 2 ranks"));
  CHECK_THAT(errors[1], Catch::Contains("expected reduce_dtype float32"));
  CHECK_THAT(errors[2], Catch::Contains("expected join = false"));
  CHECK_THAT(errors[3], Catch::Contains("a global batch of 10 rows in 4 deterministic shards"));
  CHECK_THAT(errors[4], Catch::Contains("3 micro-batches a step for 4 deterministic shards"));
  CHECK_THAT(errors[5], Catch::Contains("no_sync() in the deterministic mode"));
}


TEST_CASE("deterministic DDP and FSDP: a NaN gradient on one rank fails every rank", "[parallel][deterministic][fsdp][errors]") {
  const bool fsdp = GENERATE(false, true);
  CAPTURE(fsdp);
  const test::synthetic_batch b(12, 6, 10, 1);
  std::vector<float> x(b.input().begin(), b.input().end());
  x[7 * 6] = std::numeric_limits<float>::quiet_NaN();  // row 7: shard 1 of 2, rank 1's
  const batch bad{tensor_view<const float>(x.data(), shape{12, 6}), b.labels(), {}};
  std::vector<std::string> errors(2);
  run_local(2, [&](local_group& g) {
    sequential model(ml::make_mlp({6, 5, 10}, 1), ml::softmax_cross_entropy{});
    try {
      if (fsdp) {
        fully_sharded_data_parallel f(model, g, sgd_options{.lr = 0.1}, {.deterministic_shards = 2});
        (void)f.train_step(bad);
      } else {
        deterministic_data_parallel ddp(model, g, {.shards = 2});
        (void)ddp.train_step(bad);
      }
    } catch (const invalid_argument_error& e) {
      errors[static_cast<std::size_t>(g.rank())] = e.what();
    }
  });
  for (const auto& e : errors) CHECK_THAT(e, Catch::Contains("is not finite (inf or NaN)"));
}
