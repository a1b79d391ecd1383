// replica_trainer (train/replica_trainer.hpp), the training loop of a fault-tolerant job, on threads
// with a lighthouse: a fixed world whose spare takes a lost replica's slot ends on the parameters
// of a run without failures, bit for bit; a dynamic world that loses a member still trains every
// row of every epoch exactly once; in rounds of local steps (local SGD, DiLoCo) a spare resumes
// the lost slot's own inner optimizer state, so that run too ends bit-identical; bad options are
// refused by name.
#include <catch2/catch.hpp>

#include <partrain/comm/local.hpp>
#include <partrain/data/in_memory_dataset.hpp>
#include <partrain/optim/sgd.hpp>
#include <partrain/parallel/lighthouse.hpp>
#include <partrain/train/replica_trainer.hpp>

#include "dp_models.hpp"
#include "test_stores.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using namespace partrain;
using namespace std::chrono_literals;

namespace {

struct killed {};  // thrown by a replica the test ends

constexpr std::size_t examples = 91, features = 6, classes = 3;  // the last global batch splits 2 + 1

in_memory_dataset make_data() {
  const test::dp_dataset d(examples, features, classes);
  host_buffer<float> x(shape{examples, features});
  std::copy(d.features.begin(), d.features.end(), x.data());
  return in_memory_dataset(std::move(x), d.labels, static_cast<std::int32_t>(classes));
}

struct replica_result {
  std::vector<float> w;  // parameters at the end (replicas that trained the job)
  bool finished = false;
  bool ended = false;
  int heals = 0;
  std::string error;
};

struct job_result {
  std::vector<replica_result> replicas;
  std::vector<replica_epoch> epochs;  // slot 0's reports
};

// Rounds of local steps: global batches per round, and DiLoCo's outer SGD (empty: local SGD).
struct rounds {
  std::size_t sync_every = 1;
  std::optional<sgd_options> outer{};
};
// DiLoCo's outer momentum is 0.9 for rounds of hundreds of steps; rounds of 3 batches on this small
// problem diverge with it.
const sgd_options diloco_outer{.lr = 0.7, .momentum = 0.5, .nesterov = true};

// `replicas` processes as threads under `policy`, 3 epochs of batch 4 per slot over `slots`;
// dies(replica, step) ends that replica's thread before it computes that step.
job_result run_job(int replicas, quorum_policy policy, std::size_t slots, bool (*dies)(int, std::int64_t),
                   const rounds& local = {}) {
  const in_memory_dataset data = make_data();
  auto s = std::make_shared<testing::memory_store>();
  lighthouse lh(s, {.replicas = replicas, .policy = policy, .heartbeat_timeout = 400ms, .join_timeout = 300ms, .tick = 5ms});
  local_group_registry registry({.timeout = 3000ms});
  job_result out;
  out.replicas.resize(static_cast<std::size_t>(replicas));
  std::mutex mu;
  {
    std::vector<std::jthread> threads;
    for (int r = 0; r < replicas; ++r) {
      threads.emplace_back([&, r] {
        auto& o = out.replicas[static_cast<std::size_t>(r)];
        test::dp_softmax_model model(features, classes, 3);
        sgd opt(model, {.lr = 0.5, .momentum = 0.9});
        try {
          replica_trainer trainer(model, opt, data,
                                  {.batch_size = 4,
                                   .slots = slots,
                                   .epochs = 3,
                                   .seed = 11,
                                   .lr = [](std::size_t, std::size_t epoch) { return 0.5 / static_cast<double>(epoch + 1); },
                                   .before_step = [r, dies](std::int64_t step) {
                                     if (dies(r, step)) throw killed{};
                                   },
                                   .sync_every = local.sync_every,
                                   .outer = local.outer});
          replica_group rg(s, [&](std::int64_t id, int rank, int size) { return registry.make(id, rank, size); },
                           trainer.state(), {.replica = r, .heartbeat_interval = 20ms, .quorum_timeout = 10s});
          try {
            o.finished = trainer.run(rg, [&](const replica_epoch& e) {
              if (e.slot != 0) return;
              std::lock_guard lock(mu);
              out.epochs.push_back(e);
            });
            rg.finish();
          } catch (const killed&) {
            o.ended = true;
          }
          o.heals = rg.heals();
          for (auto& p : model.parameters()) o.w.insert(o.w.end(), p.value().begin(), p.value().end());
        } catch (const std::exception& e) {
          o.error = e.what();
        }
      });
    }
  }
  return out;
}

bool never(int, std::int64_t) { return false; }

// One process on the same global batches (the shuffled order of each epoch, batch_size x slots
// rows a step): what the replicas' weighted sum of their rows' mean gradients must equal.
std::vector<float> one_process(std::size_t slots) {
  const in_memory_dataset data = make_data();
  test::dp_softmax_model model(features, classes, 3);
  sgd opt(model, {.lr = 0.5, .momentum = 0.9});
  const std::size_t global = 4 * slots, per_epoch = (examples + global - 1) / global;
  shuffled_view order(examples, 11);
  std::vector<std::size_t> rows;
  std::vector<float> x;
  std::vector<std::int32_t> y;
  for (std::size_t step = 0; step < 3 * per_epoch; ++step) {
    const std::size_t epoch = step / per_epoch, first = step % per_epoch * global, n = std::min(global, examples - first);
    order.set_epoch(epoch);
    opt.set_lr(0.5 / static_cast<double>(epoch + 1));
    rows.resize(n);
    for (std::size_t i = 0; i < n; ++i) rows[i] = order.element(first + i);
    x.resize(n * features);
    y.resize(n);
    data.fetch(rows, tensor_view<float>(x.data(), shape{n, features}), tensor_view<std::int32_t>(y.data(), n));
    (void)model.train_step(batch{tensor_view<const float>(x.data(), shape{n, features}), tensor_view<const std::int32_t>(y.data(), n), rows});
    opt.step();
  }
  std::vector<float> w;
  for (auto& p : model.parameters()) w.insert(w.end(), p.value().begin(), p.value().end());
  return w;
}

// The rounds' algorithm written plainly: each slot's model starts a round from the committed
// parameters with its own optimizer (its momentum carried from round to round), steps on its rows
// of each of the round's global batches, and the parameters are averaged weighted by those rows
// (DiLoCo: the outer SGD steps on committed - average).
std::vector<float> rounds_reference(std::size_t slots, const rounds& local) {
  const in_memory_dataset data = make_data();
  test::dp_softmax_model center(features, classes, 3);
  std::optional<sgd<test::dp_softmax_model>> outer;
  if (local.outer) outer.emplace(center, *local.outer);
  std::vector<test::dp_softmax_model> models;
  std::vector<std::unique_ptr<sgd<test::dp_softmax_model>>> opts;
  models.reserve(slots);
  for (std::size_t k = 0; k < slots; ++k) models.emplace_back(features, classes, 3);
  for (auto& m : models) opts.push_back(std::make_unique<sgd<test::dp_softmax_model>>(m, sgd_options{.lr = 0.5, .momentum = 0.9}));
  const std::size_t global = 4 * slots, batches = (examples + global - 1) / global;
  shuffled_view order(examples, 11);
  std::vector<std::size_t> rows;
  std::vector<float> x, mean;
  std::vector<std::int32_t> y;
  auto flat = [](test::dp_softmax_model& m) {
    std::vector<float> w;
    for (auto& p : m.parameters()) w.insert(w.end(), p.value().begin(), p.value().end());
    return w;
  };
  auto set = [](test::dp_softmax_model& m, const std::vector<float>& w, bool grads) {
    std::size_t at = 0;
    for (auto& p : m.parameters()) {
      auto t = grads ? p.grad() : p.value();
      std::copy_n(w.begin() + static_cast<std::ptrdiff_t>(at), t.size(), t.begin());
      at += t.size();
    }
  };
  for (std::size_t epoch = 0; epoch < 3; ++epoch) {
    order.set_epoch(epoch);
    for (std::size_t first = 0; first < batches; first += local.sync_every) {
      const std::vector<float> start = flat(center);
      std::vector<std::size_t> trained(slots, 0);
      std::size_t round_rows = 0;
      for (std::size_t k = 0; k < slots; ++k) {
        set(models[k], start, false);
        for (std::size_t b = first; b < std::min(first + local.sync_every, batches); ++b) {
          const std::size_t n = std::min(global, examples - b * global);
          if (k == 0) round_rows += n;
          const replica_rows_range mine = replica_rows(n, static_cast<int>(k), static_cast<int>(slots));
          if (mine.count == 0) continue;
          rows.resize(mine.count);
          for (std::size_t i = 0; i < mine.count; ++i) rows[i] = order.element(b * global + mine.first + i);
          x.resize(mine.count * features);
          y.resize(mine.count);
          data.fetch(rows, tensor_view<float>(x.data(), shape{mine.count, features}), tensor_view<std::int32_t>(y.data(), mine.count));
          opts[k]->set_lr(0.5 / static_cast<double>(epoch + 1));
          (void)models[k].train_step(batch{tensor_view<const float>(x.data(), shape{mine.count, features}),
                                           tensor_view<const std::int32_t>(y.data(), mine.count), rows});
          opts[k]->step();
          trained[k] += mine.count;
        }
      }
      mean.assign(start.size(), 0.0f);
      for (std::size_t k = 0; k < slots; ++k) {
        const std::vector<float> w = flat(models[k]);
        const float share = static_cast<float>(trained[k]) / static_cast<float>(round_rows);
        for (std::size_t i = 0; i < w.size(); ++i) mean[i] += w[i] * share;
      }
      if (!outer) {
        set(center, mean, false);
        continue;
      }
      std::vector<float> delta(start.size());
      for (std::size_t i = 0; i < delta.size(); ++i) delta[i] = start[i] - mean[i];
      set(center, delta, true);
      outer->step();
    }
  }
  return flat(center);
}

double max_difference(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(static_cast<double>(a[i]) - b[i]));
  return d;
}

// A job that lost replica `lost_replica` and whose spare `spare` took its slot ended as the clean
// job did: every other replica finished on the clean parameters, bit for bit, the spare healed
// once, and every epoch trained every example once with the clean run's loss (which fell).
void check_spare_run(const job_result& clean, const job_result& lost, int lost_replica, int spare) {
  for (int r = 0; r < static_cast<int>(lost.replicas.size()); ++r) {
    if (r == lost_replica) continue;
    const auto& o = lost.replicas[static_cast<std::size_t>(r)];
    INFO("replica " << r << ": " << o.error);
    CHECK(o.finished);
    CHECK(o.w == clean.replicas[0].w);
  }
  CHECK(lost.replicas[static_cast<std::size_t>(lost_replica)].ended);
  CHECK(lost.replicas[static_cast<std::size_t>(spare)].heals == 1);
  for (const auto* job : {&clean, &lost}) {
    REQUIRE(job->epochs.size() == 3);
    for (std::size_t e = 0; e < 3; ++e) {
      CHECK(job->epochs[e].epoch == e + 1);
      CHECK(job->epochs[e].trained == examples);
      CHECK(job->epochs[e].train_loss == clean.epochs[e].train_loss);
    }
  }
  CHECK(clean.epochs[2].train_loss < clean.epochs[0].train_loss);  // it learns
}

}  // namespace

TEST_CASE("replica_trainer: a spare takes a lost replica's slot and the run ends bit-identical to one without failures",
          "[parallel][ft][threads]") {
  const quorum_policy fixed{.mode = world_size_mode::fixed_with_spares, .slots = 2};
  const job_result clean = run_job(2, fixed, 2, never);
  // Replica 1 ends before step 7 (of 36: 12 a epoch, 8 rows a step): spare 2 takes its slot.
  const job_result lost = run_job(3, fixed, 2, [](int r, std::int64_t s) { return r == 1 && s == 7; });
  for (const auto& r : clean.replicas) {
    INFO(r.error);
    CHECK(r.finished);
  }
  REQUIRE(clean.replicas[0].w.size() == features * classes + classes);
  CHECK(clean.replicas[1].w == clean.replicas[0].w);
  // The replicas' step is one process's step on the global batch, up to float rounding.
  CHECK(max_difference(clean.replicas[0].w, one_process(2)) < 1e-5);
  check_spare_run(clean, lost, 1, 2);
}

TEST_CASE("replica_trainer: a dynamic world that loses a member trains every row of every epoch once",
          "[parallel][ft][threads]") {
  const job_result out = run_job(3, {.mode = world_size_mode::dynamic, .min_replicas = 2}, 3,
                                 [](int r, std::int64_t s) { return r == 2 && s == 4; });
  for (const int r : {0, 1}) {
    const auto& o = out.replicas[static_cast<std::size_t>(r)];
    INFO("replica " << r << ": " << o.error);
    CHECK(o.finished);
  }
  CHECK(out.replicas[0].w == out.replicas[1].w);
  // The members present share each global batch: still one process's steps, whatever the membership.
  CHECK(max_difference(out.replicas[0].w, one_process(3)) < 1e-5);
  CHECK(out.replicas[2].ended);
  REQUIRE(out.epochs.size() == 3);
  for (const auto& e : out.epochs) CHECK(e.trained == examples);
}

TEST_CASE("replica_trainer refuses options it cannot train with, by name", "[parallel][ft]") {
  const in_memory_dataset data = make_data();
  test::dp_softmax_model model(features, classes);
  sgd opt(model, {.lr = 0.1});
  using trainer = replica_trainer<test::dp_softmax_model, sgd<test::dp_softmax_model>, in_memory_dataset>;
  CHECK_THROWS_WITH(trainer(model, opt, data, {.batch_size = 0, .slots = 2}), Catch::Contains("batch_size is 0"));
  CHECK_THROWS_WITH(trainer(model, opt, data, {.batch_size = 4, .slots = 0}), Catch::Contains("slots is 0"));
  CHECK_THROWS_WITH(trainer(model, opt, data, {.batch_size = 4, .slots = 2, .epochs = 0}), Catch::Contains("epochs is 0"));
  const in_memory_dataset empty(host_buffer<float>(shape{0, features}), {}, 3);
  CHECK_THROWS_WITH(trainer(model, opt, empty, {.batch_size = 4, .slots = 2}), Catch::Contains("the training set is empty"));
  CHECK_THROWS_WITH(trainer(model, opt, data, {.batch_size = 4, .slots = 2, .examples = 92}),
                    Catch::Contains("examples is 92 but the training set holds 91"));
  CHECK(trainer(model, opt, data, {.batch_size = 4, .slots = 2, .examples = 40}).steps_per_epoch() == 5);
  // A schedule needs an optimizer that takes a learning rate.
  struct fixed_rate {
    void step() {}
    void zero_grad() {}
    void save_state(state_writer&) const {}
    void load_state(state_reader&) {}
  } plain;
  CHECK_THROWS_WITH((replica_trainer<test::dp_softmax_model, fixed_rate, in_memory_dataset>(
                        model, plain, data, {.batch_size = 4, .slots = 2, .lr = [](std::size_t, std::size_t) { return 0.1; }})),
                    Catch::Contains("the optimizer has no set_lr(double)"));
  const trainer t(model, opt, data, {.batch_size = 4, .slots = 2, .epochs = 3});
  CHECK(t.steps_per_epoch() == 12);  // ceil(91 / 8): the last global batch holds 3 rows
  CHECK(t.total_steps() == 36);
  CHECK_THROWS_WITH(trainer(model, opt, data, {.batch_size = 4, .slots = 2, .sync_every = 0}),
                    Catch::Contains("sync_every is 0"));
  CHECK_THROWS_WITH(trainer(model, opt, data, {.batch_size = 4, .slots = 2, .outer = diloco_outer}),
                    Catch::Contains("an outer optimizer (DiLoCo) was given with sync_every 1"));
  // Rounds of 5 global batches: 12 batches an epoch make rounds of 5, 5 and 2.
  const trainer r(model, opt, data, {.batch_size = 4, .slots = 2, .epochs = 3, .sync_every = 5});
  CHECK(r.steps_per_epoch() == 3);
  CHECK(r.batches_per_epoch() == 12);
  CHECK(r.total_steps() == 9);
}

TEST_CASE("replica_trainer in rounds of local steps: local SGD and DiLoCo are the plain algorithm, and a spare that "
          "takes a lost slot resumes that slot's inner optimizer state, bit-identical",
          "[parallel][ft][threads]") {
  // 3 slots of 4 rows: 8 global batches an epoch (the last of 7 rows), rounds of 3, 3 and 2.
  const quorum_policy fixed{.mode = world_size_mode::fixed_with_spares, .slots = 3};
  SECTION("local SGD") {
    const rounds local{.sync_every = 3};
    const job_result clean = run_job(3, fixed, 3, never, local);
    for (const auto& r : clean.replicas) {
      INFO(r.error);
      CHECK(r.finished);
      CHECK(r.w == clean.replicas[0].w);
    }
    CHECK(max_difference(clean.replicas[0].w, rounds_reference(3, local)) < 1e-5);
    // Rounds are not the every-batch algorithm: the test tells them apart.
    CHECK(max_difference(clean.replicas[0].w, one_process(3)) > 1e-3);
  }
  SECTION("DiLoCo, and a lost replica") {
    const rounds local{.sync_every = 3, .outer = diloco_outer};
    const job_result clean = run_job(3, fixed, 3, never, local);
    // Replica 1 ends before round 4 (of 9): replicas 0 and 2 train the round's local steps, their
    // all-reduce fails, they roll back; spare 3 heals into slot 1 with slot 1's momentum.
    const job_result lost = run_job(4, fixed, 3, [](int r, std::int64_t s) { return r == 1 && s == 4; }, local);
    REQUIRE(clean.replicas[0].w.size() == features * classes + classes);
    CHECK(max_difference(clean.replicas[0].w, rounds_reference(3, local)) < 1e-5);
    check_spare_run(clean, lost, 1, 3);
  }
}

TEST_CASE("replica_trainer in rounds: a dynamic world that loses a member trains every row of every epoch once",
          "[parallel][ft][threads]") {
  const job_result out = run_job(3, {.mode = world_size_mode::dynamic, .min_replicas = 2}, 3,
                                 [](int r, std::int64_t s) { return r == 2 && s == 2; }, {.sync_every = 2});
  for (const int r : {0, 1}) {
    const auto& o = out.replicas[static_cast<std::size_t>(r)];
    INFO("replica " << r << ": " << o.error);
    CHECK(o.finished);
  }
  CHECK(out.replicas[0].w == out.replicas[1].w);
  CHECK(out.replicas[2].ended);
  REQUIRE(out.epochs.size() == 3);
  for (const auto& e : out.epochs) CHECK(e.trained == examples);
}
