#include <catch2/catch.hpp>

#include <partrain/comm/local.hpp>
#include <partrain/optim/sgd.hpp>
#include <partrain/parallel/data_parallel.hpp>
#include <partrain/parallel/ddp.hpp>
#include <partrain/train/lr_schedule.hpp>
#include <partrain/train/trainer.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "dp_models.hpp"
#include "temp_dir.hpp"

using namespace partrain;
using partrain::test::dp_dataset;
using partrain::test::dp_softmax_model;

namespace {

// What fit needs of a batch source: a range of batches with set_epoch and size (a loader's face).
struct batch_list {
  std::vector<batch> batches;
  std::size_t epoch = 0;
  void set_epoch(std::size_t e) { epoch = e; }
  [[nodiscard]] std::size_t size() const noexcept { return batches.size(); }
  [[nodiscard]] auto begin() const { return batches.begin(); }
  [[nodiscard]] auto end() const { return batches.end(); }
};

// Rank r of w takes every w-th batch of 8 rows, as a distributed sampler would.
batch_list shard(const dp_dataset& d, int r, int w) {
  batch_list l;
  for (std::size_t first = static_cast<std::size_t>(r) * 8; first + 8 <= d.size(); first += static_cast<std::size_t>(w) * 8) {
    l.batches.push_back(d.rows(first, 8));
  }
  return l;
}

struct run_out {
  std::uint64_t checksum = 0;
  train_result result;
};

// fit on `ranks` local ranks over DDP; rank 0's result and parameter checksum.
run_out run_ddp(int ranks, trainer_options base, double lr = 0.2) {
  const dp_dataset data(96, 5, 3);
  run_out out;
  std::mutex m;
  run_local(ranks, [&](local_group& g) {
    dp_softmax_model model(5, 3);
    distributed_data_parallel ddp(model, g);
    sgd opt(model, {.lr = lr, .momentum = 0.9});
    ddp_policy policy(ddp, opt);
    auto train = shard(data, g.rank(), g.size());
    auto test = shard(data, g.rank(), g.size());
    trainer_options o = base;
    std::ostringstream sink;
    o.out = &sink;
    const train_result r = fit(policy, train, test, o);
    if (g.rank() == 0) {
      std::lock_guard lock(m);
      out = {parameter_checksum(model), r};
    }
  });
  return out;
}

}  // namespace

static_assert(training_policy<ddp_policy<distributed_data_parallel<dp_softmax_model>, sgd<dp_softmax_model>>, batch>);
static_assert(checkpointable_policy<ddp_policy<distributed_data_parallel<dp_softmax_model>, sgd<dp_softmax_model>>>);
static_assert(training_policy<data_parallel_policy<data_parallel<dp_softmax_model, sgd<dp_softmax_model>>>, batch>);
static_assert(!checkpointable_policy<data_parallel_policy<data_parallel<dp_softmax_model, sgd<dp_softmax_model>>>>);

TEST_CASE("fit: the three loop styles train the same parameters", "[train][trainer][threads]") {
  const auto ranges = run_ddp(2, {.epochs = 2, .lr = cosine_lr{.base = 0.2, .epochs = 2}, .log_every = 3});
  const auto plain = run_ddp(2, {.epochs = 2, .lr = cosine_lr{.base = 0.2, .epochs = 2}, .log_every = 3, .loop = loop_style::plain});
  const auto coro = run_ddp(2, {.epochs = 2, .lr = cosine_lr{.base = 0.2, .epochs = 2}, .log_every = 3, .loop = loop_style::coroutine});
  CHECK(ranges.result.epochs == 2);
  CHECK(ranges.result.steps == 12);  // 96 rows, 8 per batch, 2 ranks: 6 steps an epoch
  CHECK(plain.checksum == ranges.checksum);
  CHECK(coro.checksum == ranges.checksum);
  CHECK(plain.result.train_loss == ranges.result.train_loss);
  CHECK(coro.result.train_loss == Approx(ranges.result.train_loss).epsilon(1e-12));
  CHECK(ranges.result.test_accuracy > 0.0);
}

TEST_CASE("fit: a resumed run continues bit for bit, and a finished one reports its saved result", "[train][trainer][threads]") {
  partrain::testing::temp_dir dir;
  const auto ck = dir.path / "sub" / "run.ckpt";
  const trainer_options two{.epochs = 2, .lr = cosine_lr{.base = 0.2, .epochs = 2}};
  const auto straight = run_ddp(2, two);
  trainer_options first = two;
  first.checkpoint = ck;
  first.epochs = 1;  // the schedule stays the 2-epoch one
  (void)run_ddp(2, first);
  REQUIRE(std::filesystem::exists(ck));
  trainer_options rest = two;
  rest.checkpoint = ck;
  const auto resumed = run_ddp(2, rest);
  CHECK(resumed.result.first_epoch == 1);
  CHECK(resumed.checksum == straight.checksum);
  CHECK(resumed.result.test_accuracy == straight.result.test_accuracy);
  // Again: the checkpoint is at epoch 2 of 2, so nothing trains and the saved numbers come back.
  const auto again = run_ddp(2, rest);
  CHECK(again.result.resumed_finished);
  CHECK(again.checksum == straight.checksum);
  CHECK(again.result.test_accuracy == straight.result.test_accuracy);
  CHECK(again.result.test_accuracy > 0.0);
  CHECK(again.result.train_loss == resumed.result.train_loss);
}

TEST_CASE("fit: metrics records carry the bytes rank 0 sent, growing with the steps", "[train][trainer][metrics][threads]") {
  partrain::testing::temp_dir dir;
  const auto file = dir.path / "m.jsonl";
  (void)run_ddp(2, {.epochs = 2, .metrics = file, .log_every = 3});
  std::ifstream in(file);
  std::vector<long long> sent;
  for (std::string line; std::getline(in, line);) {
    const auto k = line.find("\"bytes_sent\":");
    REQUIRE(k != std::string::npos);
    sent.push_back(std::stoll(line.substr(k + 13)));
  }
  REQUIRE(sent.size() == 4 + 2);  // step records at steps 3, 6, 9, 12 and two epoch records
  // dp_softmax_model (5 x 3 weights + 3 biases = 18 floats) at 2 ranks: a gradient all_reduce
  // sends 72 bytes, so 3 steps send at least 216.
  CHECK(sent.front() >= 216);
  CHECK(std::is_sorted(sent.begin(), sent.end()));
  CHECK(sent.back() >= 12 * 72);
}

TEST_CASE("fit: a resumed run continues the metrics file: no step twice, bytes_sent counted on", "[train][trainer][metrics][threads]") {
  partrain::testing::temp_dir dir;
  const auto file = dir.path / "m.jsonl";
  const auto ck = dir.path / "run.ckpt";
  const trainer_options two{.epochs = 2, .checkpoint = ck, .metrics = file, .log_every = 3};
  trainer_options first = two;
  first.epochs = 1;
  (void)run_ddp(2, first);  // epoch 1: steps 1-6, records at steps 3 and 6, checkpoint at step 6
  {
    // A killed second attempt got as far as step 9 before dying: its record stays in the file.
    std::ofstream killed(file, std::ios::app);
    killed << "{\"kind\":\"step\",\"step\":9,\"time\":1,\"epoch\":2,\"loss\":1.5,\"bytes_sent\":1}\n";
  }
  (void)run_ddp(2, two);
  std::ifstream in(file);
  std::vector<long long> steps, sent;
  int epochs = 0;
  for (std::string line; std::getline(in, line);) {
    const auto k = line.find("\"bytes_sent\":");
    REQUIRE(k != std::string::npos);
    sent.push_back(std::stoll(line.substr(k + 13)));
    if (line.starts_with("{\"kind\":\"step\",\"step\":")) steps.push_back(std::stoll(line.substr(22)));
    epochs += line.starts_with("{\"kind\":\"epoch\"") ? 1 : 0;
  }
  CHECK(steps == std::vector<long long>{3, 6, 9, 12});  // the killed attempt's step 9 replaced, not repeated
  CHECK(epochs == 2);
  CHECK(std::is_sorted(sent.begin(), sent.end()));  // the resumed run counts on from its checkpoint
  CHECK(sent.back() >= 12 * 72);
}

TEST_CASE("fit: bad settings fail before training, with the reason", "[train][trainer][threads]") {
  partrain::testing::temp_dir dir;
  std::ofstream(dir.path / "a_file") << "x";
  trainer_options o{.epochs = 1};
  o.checkpoint = dir.path / "a_file" / "run.ckpt";  // its folder cannot exist: a file is in the way
  CHECK_THROWS_WITH(run_ddp(1, o), Catch::Contains("cannot write checkpoints in") && Catch::Contains("a_file"));
  CHECK_THROWS_WITH(run_ddp(1, {.epochs = 0}), Catch::Contains("epochs must be at least 1"));
  // Outputs of their own: a metrics path that is a folder is refused (it used to be removed and
  // replaced by the file), and two outputs on one path are refused (one overwrote the other).
  std::filesystem::create_directory(dir.path / "a_folder");
  CHECK_THROWS_WITH(run_ddp(1, {.epochs = 1, .metrics = dir.path / "a_folder"}),
                    Catch::Contains("metrics path") && Catch::Contains("is a folder"));
  CHECK(std::filesystem::is_directory(dir.path / "a_folder"));
  CHECK_THROWS_WITH(run_ddp(1, {.epochs = 1, .checkpoint = dir.path / "run.x", .metrics = dir.path / "." / "run.x"}),
                    Catch::Contains("the metrics and the checkpoint are the same file"));
  trace_recorder trace(dir.path / "t.json");
  CHECK_THROWS_WITH(run_ddp(1, {.epochs = 1, .metrics = dir.path / "t.json", .trace = &trace}),
                    Catch::Contains("the metrics and the trace are the same file"));
  // A diverging run stops at the step whose loss is not finite instead of reporting NaN.
  CHECK_THROWS_WITH(run_ddp(1, {.epochs = 1}, std::numeric_limits<double>::infinity()),
                    Catch::Contains("training loss at step 2 (epoch 1) is") && Catch::Contains("diverged"));
}

TEST_CASE("fit: an empty training or test source is refused, saying which", "[train][trainer][threads][hostile]") {
  const dp_dataset data(32, 5, 3);
  std::atomic<int> steps{0};
  // fit over DDP on `ranks` local ranks, each rank's train and test batches made by the functions.
  const auto go = [&](int ranks, auto make_train, auto make_test) {
    steps = 0;
    run_local(ranks, [&](local_group& g) {
      dp_softmax_model model(5, 3);
      distributed_data_parallel ddp(model, g);
      sgd opt(model, {.lr = 0.1});
      ddp_policy policy(ddp, opt);
      auto train = make_train(g.rank(), g.size());
      auto test = make_test(g.rank(), g.size());
      std::ostringstream sink;
      (void)fit(policy, train, test, {.epochs = 1, .out = &sink, .before_step = [&](std::size_t) { ++steps; }});
    });
  };
  const auto none = [](int, int) { return batch_list{}; };
  const auto sharded = [&](int r, int w) { return shard(data, r, w); };
  // No training batch (a training set of 0 images): refused before a step, not "trained" to an
  // untrained model's accuracy.
  CHECK_THROWS_AS(go(1, none, sharded), data_error);
  CHECK_THROWS_WITH(go(1, none, sharded), Catch::Contains("the training data gives rank 0 no batches"));
  CHECK(steps == 0);
  // One process and no test sample: refused before a step, not reported as accuracy 0.
  CHECK_THROWS_WITH(go(1, sharded, none), Catch::Contains("the test data holds no samples"));
  CHECK(steps == 0);
  // Two ranks with no test sample between them: every rank refuses at the first evaluation.
  CHECK_THROWS_WITH(go(2, sharded, none), Catch::Contains("the test data holds no samples"));
  // A test shard empty on one rank only (fewer test samples than ranks) is not an empty test set.
  CHECK_NOTHROW(go(2, sharded, [&](int r, int) { return r == 0 ? shard(data, 0, 1) : batch_list{}; }));
  CHECK(steps > 0);
}

TEST_CASE("fit: a policy that cannot checkpoint refuses a checkpoint path", "[train][trainer][threads]") {
  const dp_dataset data(32, 5, 3);
  dp_softmax_model model(5, 3);
  data_parallel dp(model, {device::cpu(0), device::cpu(1)},
                   [](dp_softmax_model& m) { return sgd<dp_softmax_model>(m, {.lr = 0.1}); });
  data_parallel_policy policy(dp);
  auto train = shard(data, 0, 1);
  std::ostringstream sink;
  const auto r = fit(policy, train, train, {.epochs = 1, .out = &sink});
  CHECK(r.steps == 4);
  CHECK(sink.str().find("final test_accuracy") != std::string::npos);
  CHECK_THROWS_WITH(fit(policy, train, train, {.epochs = 1, .checkpoint = "x.ckpt", .out = &sink}),
                    Catch::Contains("need a policy with save_checkpoint and load_checkpoint") && Catch::Contains("fsdp_policy"));
}

TEST_CASE("learning-rate schedules", "[train][trainer]") {
  const cosine_lr c{.base = 0.1, .epochs = 4};
  CHECK(c(0) == Approx(0.1));
  CHECK(c(2) == Approx(0.05));
  CHECK(c(4) == Approx(0.0).margin(1e-12));
  CHECK(constant_lr{.base = 0.3}(7) == 0.3);
  CHECK_THROWS_WITH((cosine_lr{.base = std::nan(""), .epochs = 4})(0), Catch::Contains("finite number > 0"));
  CHECK_THROWS_WITH((cosine_lr{.base = 0.1, .epochs = 0})(0), Catch::Contains("epochs must be at least 1"));
}

TEST_CASE("fit: a policy refuses an enabled grad scaler on a model without set_loss_scale when built", "[train][trainer][threads]") {
  run_local(1, [&](local_group& g) {
    dp_softmax_model model(5, 3);
    distributed_data_parallel ddp(model, g);
    sgd opt(model, {.lr = 0.1});
    grad_scaler fp16;
    CHECK_THROWS_WITH(ddp_policy(ddp, opt, {.scaler = &fp16}), Catch::Contains("ddp_policy: the gradient scaler is enabled") &&
                                                               Catch::Contains("`void set_loss_scale(float)`"));
    grad_scaler bf16 = grad_scaler::for_precision(precision::bf16);  // no loss scaling: nothing to apply
    CHECK_NOTHROW(ddp_policy(ddp, opt, {.scaler = &bf16}));
  });
}
