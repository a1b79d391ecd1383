// deterministic_data_parallel (parallel/deterministic.hpp) and its ZeRO-1 form: the same global
// batches give the same parameters, bit for bit, at world sizes 1 to 4 (threads), for the MLP, the
// CNN and the ViT as layers under SGD with momentum (and AdamW), resumed at another world size too,
// and for any gradient-accumulation split of the global batch; the result is the plain mean
// gradient to float rounding; refusals.
#include <catch2/catch.hpp>

#include <partrain/comm/local.hpp>
#include <partrain/data/batch.hpp>
#include <partrain/model/sequential.hpp>
#include <partrain/optim/sgd.hpp>
#include <partrain/optim/adamw.hpp>
#include <partrain/optim/any_optimizer.hpp>
#include <partrain/parallel/deterministic.hpp>
#include <partrain/parallel/deterministic_sharded.hpp>
#include <partrain/train/checkpoint.hpp>

#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cnn_layers.hpp"
#include "mlp_layers.hpp"
#include "pipeline_layers.hpp"
#include "temp_dir.hpp"
#include "vit_layers.hpp"

using namespace partrain;
namespace ml = models::layers;

namespace {

constexpr std::size_t global_rows = 12, shards = 6, steps = 4;

// The example's three models as layers: a small MLP, the CNN and a small ViT.
enum class layers { mlp, cnn, vit };
const char* name_of(layers k) { return k == layers::mlp ? "mlp" : k == layers::cnn ? "cnn" : "vit"; }
std::size_t features_of(layers k) { return k == layers::mlp ? 6 : 784; }
ml::host_model make_layers(layers k) {
  if (k == layers::cnn) return ml::make_cnn(3);
  if (k == layers::vit) return ml::make_vit({.patch = 7, .dim = 16, .depth = 1, .heads = 2, .mlp_ratio = 2}, 3);
  return ml::make_mlp({6, 5, 4, 10}, 3);
}

// The rows [first, first + n) of a batch.
batch rows_of(const test::synthetic_batch& b, std::size_t first, std::size_t n) {
  return batch{b.input().slice(first, first + n), b.labels().slice(first, first + n), {}};
}

// `steps` steps at `world` ranks, each global batch in `micro` micro-batches (gradient
// accumulation: micro - 1 accumulate_steps, then train_step).
template <class Make>
std::vector<float> train(int world, Make make, std::size_t features, std::vector<double>* losses = nullptr,
                         std::size_t micro = 1) {
  std::vector<std::vector<float>> values(static_cast<std::size_t>(world));
  std::vector<std::vector<double>> seen(static_cast<std::size_t>(world));
  run_local(world, [&](local_group& g) {
    sequential model(make(), ml::softmax_cross_entropy{});
    deterministic_data_parallel ddp(model, g, {.shards = shards});
    ddp.set_gradient_accumulation_steps(micro);
    sgd opt(model, {.lr = 0.1, .momentum = 0.9});
    const std::size_t rows = global_rows / micro;
    for (std::uint32_t s = 0; s < steps; ++s) {
      const test::synthetic_batch b(global_rows, features, 10, 40 + s);
      for (std::size_t m = 0; m + 1 < micro; ++m) (void)ddp.accumulate_step(rows_of(b, m * rows, rows));
      seen[static_cast<std::size_t>(g.rank())].push_back(ddp.train_step(rows_of(b, (micro - 1) * rows, rows)));
      opt.step();
    }
    auto& v = values[static_cast<std::size_t>(g.rank())];
    for (auto& p : model.parameters()) v.insert(v.end(), p.value().begin(), p.value().end());
  });
  for (int r = 1; r < world; ++r) {
    REQUIRE(values[static_cast<std::size_t>(r)] == values[0]);  // every rank the same
    REQUIRE(seen[static_cast<std::size_t>(r)] == seen[0]);
  }
  if (losses) *losses = seen[0];
  return values[0];
}

}  // namespace

TEST_CASE("deterministic data parallel: the same bits at world sizes 1 to 4", "[parallel][deterministic]") {
  const auto kind = GENERATE(layers::mlp, layers::cnn, layers::vit);
  CAPTURE(name_of(kind));
  const std::size_t features = features_of(kind);
  auto make = [&] { return make_layers(kind); };
  std::vector<double> losses1, losses;
  const auto one = train(1, make, features, &losses1);
  for (const int world : {2, 3, 4}) {
    CAPTURE(world);
    CHECK(train(world, make, features, &losses) == one);
    CHECK(losses == losses1);
  }
  CHECK(losses1.front() != losses1.back());  // it trained
}

TEST_CASE("deterministic data parallel: any gradient-accumulation split of the global batch gives the same bits",
          "[parallel][deterministic][accumulation]") {
  // 6 shards of 12 rows: 2, 3 or 6 micro-batches of 3, 2 or 1 shards, at 1 to 4 ranks (more ranks
  // than a micro-batch's shards: some wait), each the 1-rank, 1-micro-batch bits.
  const auto kind = GENERATE(layers::mlp, layers::vit);
  CAPTURE(name_of(kind));
  const std::size_t features = features_of(kind);
  auto make = [&] { return make_layers(kind); };
  const auto one = train(1, make, features);
  for (const std::size_t micro : {2, 3, 6}) {
    for (const int world : {1, 2, 3, 4}) {
      CAPTURE(micro, world);
      CHECK(train(world, make, features, nullptr, micro) == one);
    }
  }
}

TEST_CASE("deterministic ZeRO-1 accumulates as deterministic data parallel does", "[parallel][deterministic][accumulation]") {
  const auto want = train(1, [] { return make_layers(layers::mlp); }, 6);
  std::vector<std::vector<float>> out(3);
  run_local(3, [&](local_group& g) {
    sequential model(make_layers(layers::mlp), ml::softmax_cross_entropy{});
    deterministic_sharded_data_parallel zero(model, g, sgd_options{.lr = 0.1, .momentum = 0.9}, {.shards = shards});
    zero.set_gradient_accumulation_steps(2);
    for (std::uint32_t s = 0; s < steps; ++s) {
      const test::synthetic_batch b(global_rows, 6, 10, 40 + s);
      (void)zero.accumulate_step(rows_of(b, 0, global_rows / 2));
      (void)zero.train_step(rows_of(b, global_rows / 2, global_rows / 2));
    }
    auto& v = out[static_cast<std::size_t>(g.rank())];
    for (auto& p : model.parameters()) v.insert(v.end(), p.value().begin(), p.value().end());
  });
  for (const auto& v : out) CHECK(v == want);
}

TEST_CASE("deterministic data parallel: a run checkpointed at 2 ranks and resumed at 3 ends with the 1-rank bits",
          "[parallel][deterministic][checkpoint]") {
  testing::temp_dir dir("partrain_det_resume");
  const auto file = dir.path / "run.ckpt";
  // Steps [from, to) at `world` ranks; optionally loaded from / saved to the checkpoint first / last.
  auto run = [&](int world, std::uint32_t from, std::uint32_t to, bool load, bool save) {
    std::vector<std::vector<float>> values(static_cast<std::size_t>(world));
    run_local(world, [&](local_group& g) {
      sequential model(ml::make_mlp({6, 5, 4, 10}, 3), ml::softmax_cross_entropy{});
      deterministic_data_parallel ddp(model, g, {.shards = shards});
      sgd opt(model, {.lr = 0.1, .momentum = 0.9});  // momentum: the optimizer's state must resume too
      if (load) (void)load_checkpoint(file, model, opt);
      for (std::uint32_t s = from; s < to; ++s) {
        const test::synthetic_batch b(global_rows, 6, 10, 40 + s);
        (void)ddp.train_step(batch{b.input(), b.labels(), {}});
        opt.step();
      }
      if (save) save_checkpoint(g, file, model, opt);
      auto& v = values[static_cast<std::size_t>(g.rank())];
      for (auto& p : model.parameters()) v.insert(v.end(), p.value().begin(), p.value().end());
    });
    for (const auto& v : values) REQUIRE(v == values[0]);
    return values[0];
  };
  const auto one = run(1, 0, steps, false, false);
  const auto half = run(2, 0, steps / 2, false, true);
  CHECK(half != one);
  CHECK(run(3, steps / 2, steps, true, false) == one);
  CHECK(run(4, steps / 2, steps, true, false) == one);
}

TEST_CASE("deterministic ZeRO-1 and ZeRO-2: the optimizer state sharded, deterministic DDP's bits at world sizes 1 to 4",
          "[parallel][deterministic][zero]") {
  const auto kind = GENERATE(layers::mlp, layers::cnn, layers::vit);
  const bool use_adamw = GENERATE(false, true);
  // 0: ZeRO-1's one reduce_scatter of the whole gradient; 64: ZeRO-2's buckets of 64 int64
  // elements (chunks of 64 / world of every block, the last one ragged).
  const std::size_t bucket = GENERATE(std::size_t{0}, std::size_t{64});
  CAPTURE(name_of(kind), use_adamw, bucket);
  const std::size_t features = features_of(kind);
  auto make = [&] { return make_layers(kind); };
  const sgd_options sgd_o{.lr = 0.1, .momentum = 0.9};
  const adamw_options adamw_o{.lr = 0.01};
  // The reference: deterministic DDP at one rank with the replicated optimizer.
  std::vector<float> want;
  run_local(1, [&](local_group& g) {
    sequential model(make(), ml::softmax_cross_entropy{});
    deterministic_data_parallel ddp(model, g, {.shards = shards});
    any_optimizer opt = use_adamw ? any_optimizer(adamw(model, adamw_o)) : any_optimizer(sgd(model, sgd_o));
    for (std::uint32_t s = 0; s < steps; ++s) {
      const test::synthetic_batch b(global_rows, features, 10, 40 + s);
      (void)ddp.train_step(batch{b.input(), b.labels(), {}});
      opt.step();
    }
    for (auto& p : model.parameters()) want.insert(want.end(), p.value().begin(), p.value().end());
  });
  // Steps [from, to) at `world` ranks, the optimizer state first loaded from `state` when given,
  // and gathered into it at the end.
  auto run = [&](int world, std::uint32_t from, std::uint32_t to, std::vector<float>* values,
                 shard_optimizer_state<float>* state) {
    std::vector<std::vector<float>> out(static_cast<std::size_t>(world));
    std::vector<std::size_t> state_bytes(static_cast<std::size_t>(world)), scratch_bytes(state_bytes);
    run_local(world, [&](local_group& g) {
      sequential model(make(), ml::softmax_cross_entropy{});
      shard_optimizer_options o = sgd_o;
      if (use_adamw) o = adamw_o;
      deterministic_sharded_data_parallel zero(model, g, o, {.shards = shards, .bucket_elements = bucket});
      auto& v = out[static_cast<std::size_t>(g.rank())];
      if (values && !values->empty()) {  // resume: the parameters as they were
        std::size_t at = 0;
        for (auto& p : model.parameters()) {
          std::copy_n(values->begin() + static_cast<std::ptrdiff_t>(at), p.value().size(), p.value().begin());
          at += p.value().size();
        }
        zero.load_state(*state, "the test's state");
      }
      for (std::uint32_t s = from; s < to; ++s) {
        const test::synthetic_batch b(global_rows, features, 10, 40 + s);
        (void)zero.train_step(batch{b.input(), b.labels(), {}});
      }
      state_bytes[static_cast<std::size_t>(g.rank())] = zero.optimizer_state_bytes();
      scratch_bytes[static_cast<std::size_t>(g.rank())] = zero.reduction_scratch_bytes();
      auto whole = zero.gather_state();
      if (state && g.rank() == 0) *state = std::move(whole);
      for (auto& p : model.parameters()) v.insert(v.end(), p.value().begin(), p.value().end());
    });
    for (const auto& v : out) REQUIRE(v == out[0]);
    if (world > 1) CHECK(state_bytes[0] < state_bytes.back() * 2 + 64);  // about 1/world each
    // The exact sum's scratch: the whole gradient (ZeRO-1), or a bucket and this rank's block.
    const auto w = static_cast<std::size_t>(world), block = (out[0].size() + w - 1) / w;
    for (const std::size_t bytes : scratch_bytes) {
      if (bucket == 0) CHECK(bytes >= out[0].size() * sizeof(std::int64_t));
      if (bucket > 0) CHECK(bytes <= (bucket + block) * sizeof(std::int64_t));
    }
    if (values) *values = out[0];
    return std::pair{out[0], state_bytes[0]};
  };
  std::size_t one_rank_bytes = 0;
  for (const int world : {1, 2, 3, 4}) {
    CAPTURE(world);
    const auto [got, bytes] = run(world, 0, steps, nullptr, nullptr);
    CHECK(got == want);
    if (world == 1) one_rank_bytes = bytes;
    CHECK(bytes * static_cast<std::size_t>(world) <= one_rank_bytes + static_cast<std::size_t>(world) * 8 * sizeof(float));
  }
  // Two steps at 2 ranks, the rest at 3: the state gathered and resliced.
  std::vector<float> values;
  shard_optimizer_state<float> state;
  (void)run(2, 0, steps / 2, &values, &state);
  CHECK(run(3, steps / 2, steps, &values, &state).first == want);
}

TEST_CASE("deterministic data parallel's gradient is the global batch's mean gradient", "[parallel][deterministic]") {
  const test::synthetic_batch b(global_rows, 6, 10, 5);
  sequential plain(ml::make_mlp({6, 5, 4, 10}, 3), ml::softmax_cross_entropy{});
  const double want_loss = plain.train_step(batch{b.input(), b.labels(), {}});
  std::vector<float> want;
  for (auto& p : plain.parameters()) want.insert(want.end(), p.grad().begin(), p.grad().end());
  // Catch's assertions are not thread-safe: the ranks record, the test thread checks.
  struct seen {
    double loss = 0;
    std::vector<float> grads;
    std::vector<std::size_t> mine;
  };
  std::vector<seen> got(2);
  run_local(2, [&](local_group& g) {
    sequential model(ml::make_mlp({6, 5, 4, 10}, 3), ml::softmax_cross_entropy{});
    deterministic_data_parallel ddp(model, g, {.shards = 4});
    auto& out = got[static_cast<std::size_t>(g.rank())];
    out.loss = ddp.train_step(batch{b.input(), b.labels(), {}});
    for (auto& p : model.parameters()) out.grads.insert(out.grads.end(), p.grad().begin(), p.grad().end());
    out.mine = ddp.shards_of(g.rank());
  });
  for (const auto& out : got) {
    CHECK(out.loss == Approx(want_loss).epsilon(1e-6));
    REQUIRE(out.grads.size() == want.size());
    for (std::size_t i = 0; i < want.size(); ++i) CHECK(out.grads[i] == Approx(want[i]).epsilon(1e-5).margin(1e-7));
  }
  CHECK(got[0].mine == std::vector<std::size_t>{0, 1});
  CHECK(got[1].mine == std::vector<std::size_t>{2, 3});
}

TEST_CASE("deterministic data parallel refuses shard counts it cannot use, and options the ranks disagree on",
          "[parallel][deterministic][errors]") {
  std::vector<std::string> errors(4);
  std::vector<std::vector<int>> thrown(2, std::vector<int>(3, 0));  // each rank writes its own
  run_local(3, [&](local_group& g) {
    const bool leader = g.rank() == 0;
    sequential model(ml::make_mlp({6, 5, 10}, 1), ml::softmax_cross_entropy{});
    try {
      deterministic_data_parallel refused(model, g, {.shards = 2});  // every rank, before any collective
    } catch (const invalid_argument_error& e) {
      if (leader) errors[0] = e.what();
    }
    deterministic_data_parallel ddp(model, g, {.shards = 3});
    const test::synthetic_batch b(10, 6, 10, 1);
    try {
      (void)ddp.train_step(batch{b.input(), b.labels(), {}});
    } catch (const invalid_argument_error& e) {
      if (leader) errors[1] = e.what();
    }
    // Rank 2 alone with other shards, then another bucket: every rank fails, none hangs.
    for (const std::size_t i : {2, 3}) {
      const deterministic_options o{.shards = i == 2 && g.rank() == 2 ? 6u : 3u, .bucket_elements = i == 3 && g.rank() == 2 ? 64u : 0u};
      try {
        deterministic_data_parallel disagreed(model, g, o);
      } catch (const config_error& e) {
        thrown[i - 2][static_cast<std::size_t>(g.rank())] = 1;
        if (leader) errors[i] = e.what();
      }
    }
  });
  CHECK_THAT(errors[0], Catch::Contains("2 shard(s) for 3 ranks"));
  CHECK_THAT(errors[1], Catch::Contains("a global batch of 10 rows in 3 shards"));
  CHECK_THAT(errors[2], Catch::Contains("rank 2 has deterministic_options{.shards = 6, .bucket_elements = 0}, rank 0 {3, 0}"));
  CHECK_THAT(errors[3], Catch::Contains("rank 2 has deterministic_options{.shards = 3, .bucket_elements = 64}, rank 0 {3, 0}"));
  CHECK(thrown == std::vector<std::vector<int>>(2, std::vector<int>(3, 1)));
}

TEST_CASE("deterministic accumulation refuses splits that cut a shard", "[parallel][deterministic][accumulation][errors]") {
  std::vector<std::string> errors(3);
  run_local(1, [&](local_group& g) {
    sequential model(ml::make_mlp({6, 5, 10}, 1), ml::softmax_cross_entropy{});
    deterministic_data_parallel ddp(model, g, {.shards = 6});
    try {
      ddp.set_gradient_accumulation_steps(4);
    } catch (const invalid_argument_error& e) {
      errors[0] = e.what();
    }
    ddp.set_gradient_accumulation_steps(2);
    const test::synthetic_batch b(12, 6, 10, 1);
    (void)ddp.accumulate_step(rows_of(b, 0, 6));
    try {
      ddp.set_gradient_accumulation_steps(3);
    } catch (const invalid_argument_error& e) {
      errors[1] = e.what();
    }
    try {
      (void)ddp.train_step(rows_of(b, 6, 3));
    } catch (const invalid_argument_error& e) {
      errors[2] = e.what();
    }
    (void)ddp.train_step(rows_of(b, 0, 6));  // the refused step was dropped: this one starts afresh
  });
  CHECK_THAT(errors[0], Catch::Contains("4 micro-batches a step for 6 shards"));
  CHECK_THAT(errors[1], Catch::Contains("inside a step (after 1 micro-batch(es))"));
  CHECK_THAT(errors[2], Catch::Contains("a micro-batch of 3 rows after ones of 6"));
}

