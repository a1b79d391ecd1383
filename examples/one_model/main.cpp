// examples/one_model: your own layers, written once, trained under every parallel mode. The model
// is a std::vector of layers plus a loss; partrain::sequential makes it a model for DDP, ZeRO,
// data parallel, local SGD and DiLoCo, and FSDP and the pipeline take it whole. fit() runs the
// epochs of each on 2 threads (the `local` backend) over the same data, and each ends near the
// same accuracy. How to run it: `usage` below, which --help prints.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <partrain/partrain.hpp>

#include "model.hpp"  // the layers and the loss, written once

namespace {

using namespace partrain;
using namespace one_model;

// Three classes of points on three rings in the plane.
in_memory_dataset rings(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> noise(0.0f, 0.1f);
  host_buffer<float> x(shape{n, 2});
  std::vector<std::int32_t> y(n);
  for (std::size_t i = 0; i < n; ++i) {
    y[i] = static_cast<std::int32_t>(i % 3);
    const float a = float(i) * 2.39996f, radius = 0.5f + float(y[i]);
    x[2 * i] = radius * std::cos(a) + noise(gen), x[2 * i + 1] = radius * std::sin(a) + noise(gen);
  }
  return {std::move(x), std::move(y), 3};
}

constexpr char usage[] =
    "usage: one_model [MODE...] [--help]\n"
    "Trains one layer description under each MODE (default: every one) on 2 threads of this process\n"
    "and prints its test accuracy. MODE: ddp zero2 fsdp pipeline dp local-sgd diloco.\n"
    "  build/examples/one_model/one_model             every mode\n"
    "  build/examples/one_model/one_model fsdp dp     two of them\n"
    "It starts its own ranks: run it directly (under partrun, torchrun, srun or mpirun it refuses).\n";
const std::vector<std::string> all_modes{"ddp", "zero2", "fsdp", "pipeline", "dp", "local-sgd", "diloco"};

}  // namespace

int main(int argc, char** argv) try {
  std::vector<std::string> modes(argv + 1, argv + argc);
  for (const std::string& a : modes) {  // checked before any mode trains
    if (a == "--help" || a == "-h") {
      std::fputs(usage, stdout);
      return 0;
    }
    if (std::ranges::find(all_modes, a) == all_modes.end()) {
      std::fprintf(stderr, "one_model: unknown argument '%s' (it takes modes: ddp zero2 fsdp pipeline dp "
                           "local-sgd diloco; or --help)\n", a.c_str());
      return 2;
    }
  }
  if (modes.empty()) modes = all_modes;
  const in_memory_dataset train_set = rings(3072, 1), test_set = rings(600, 2);
  double lowest = 1;
  auto report = [&](const std::string& mode, const train_result& r) {
    std::printf("%-9s test_accuracy %.3f\n", mode.c_str(), r.test_accuracy);
    lowest = std::min(lowest, r.test_accuracy);
  };
  for (const std::string& mode : modes) {
    auto layers = [] { return std::vector<dense>{{2, 32, true, 1}, {32, 32, true, 2}, {32, 3, false, 3}}; };
    const sgd_options opt{.lr = 0.1, .momentum = 0.9};
    std::ostringstream quiet;  // fit's epoch lines; we print the result
    const trainer_options o{.epochs = 10, .out = &quiet};
    if (mode == "dp") {  // one process, two host devices, each step's batch split over them
      sequential model(layers(), cross_entropy{});
      data_parallel dp(model, {device::cpu(0), device::cpu(1)}, [&](auto& m) { return sgd<decltype(model)>(m, opt); });
      data_parallel_policy policy(dp);
      loader train(train_set, views::shuffled(train_set.size(), 0), {.batch_size = 64});
      loader test(test_set, views::sequential(test_set.size()), {.batch_size = 200});
      report(mode, fit(policy, train, test, o));
      continue;
    }
    run_ranks({.nproc = 2, .backend = "local"}, [&](process_group& pg) {
      sequential model(layers(), cross_entropy{});
      // Each rank its share of the shuffled training set and its block of the test set; the
      // pipeline's stages all read every batch (stage 0 the features, the last the labels).
      const bool pipe = mode == "pipeline";
      loader train(train_set, views::distributed(train_set.size(), pipe ? 1 : pg.size(), pipe ? 0 : pg.rank()), {.batch_size = 32});
      loader test(test_set, views::shard(test_set.size(), pipe ? 1 : pg.size(), pipe ? 0 : pg.rank()), {.batch_size = 200});
      auto run = [&](auto& policy) {
        const train_result r = fit(policy, train, test, o);
        if (pg.rank() == 0) report(mode, r);
      };
      sgd plain(model, opt);
      if (mode == "ddp") {
        distributed_data_parallel ddp(model, pg);
        ddp_policy policy(ddp, plain);
        run(policy);
      } else if (mode == "zero2") {
        sharded_data_parallel zero(model, pg, opt, {.stage = 2});
        zero_policy policy(zero);
        run(policy);
      } else if (mode == "fsdp") {
        fully_sharded_data_parallel fsdp(model, pg, opt);
        fsdp_policy policy(fsdp);
        run(policy);
      } else if (mode == "pipeline") {
        pipeline_stage stage(model, pg, {.micro_batches = 4});
        auto params = stage.parameters();  // this stage's layers' parameters, for its optimizer
        sgd stage_opt(params, opt);
        pipeline_policy policy(stage, pg, stage_opt, model.loss());
        run(policy);
      } else if (mode == "local-sgd") {
        post_local_sgd lsgd(model, plain, pg, {.period = 4});
        local_sgd_policy policy(lsgd);
        run(policy);
      } else if (mode == "diloco") {
        diloco dl(model, plain, pg, {.inner_steps = 8, .outer_lr = 0.7});
        local_sgd_policy policy(dl);
        run(policy);
      } else {
        throw config_error("unknown mode '" + mode + "' (expected ddp zero2 fsdp pipeline dp local-sgd diloco)");
      }
    });
  }
  std::printf("lowest test_accuracy %.3f over %zu mode(s)\n", lowest, modes.size());
} catch (const std::exception& e) {
  std::fprintf(stderr, "one_model: %s\n", e.what());
  return 1;
}
