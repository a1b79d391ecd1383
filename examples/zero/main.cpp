// examples/zero: sharded data parallel (ZeRO-2) of your own model on 2 threads. Each rank trains
// the whole model on its own rows, as under DDP, but keeps the momentum of half the parameters
// and steps only that half. The model keeps all its values in one buffer and all its gradients
// in another, so on threads the whole step is one pass over shared memory: each rank averages
// its half of both ranks' gradients, steps it and writes it into both ranks' parameters.
// How to run it: `usage` below, which --help prints.
#include <cstdio>
#include <exception>
#include <random>
#include <string_view>
#include <vector>

#include <partrain/launch/run_ranks.hpp>
#include <partrain/parallel/zero.hpp>

namespace {

constexpr std::size_t features = 4;
constexpr float true_w[features] = {1.0f, -2.0f, 3.0f, 0.5f};
constexpr float true_b = 0.25f;

struct batch {  // rows of `features` inputs and their targets
  std::vector<float> x, y;
};

// y = w.x + b under mean squared error; w and b are views into one buffer, their gradients into
// another. train_step writes (not adds) the gradients.
struct linear_regression {
  struct param {
    partrain::tensor_view<float> v, g;
    partrain::tensor_view<float> value() const { return v; }
    partrain::tensor_view<float> grad() const { return g; }
  };
  std::vector<float> values = std::vector<float>(features + 1, 0.0f), grads = values;
  std::vector<param> params{{{values.data(), features}, {grads.data(), features}},
                            {{values.data() + features, 1}, {grads.data() + features, 1}}};
  std::vector<param>& parameters() { return params; }

  double train_step(const batch& data) {
    const std::size_t n = data.y.size();
    std::vector<double> g(features + 1, 0.0);
    double loss = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const float* x = &data.x[i * features];
      double e = values[features] - data.y[i];
      for (std::size_t j = 0; j < features; ++j) e += values[j] * x[j];
      loss += e * e / n;
      for (std::size_t j = 0; j < features; ++j) g[j] += 2 * e * x[j] / n;
      g[features] += 2 * e / n;
    }
    for (std::size_t j = 0; j <= features; ++j) grads[j] = static_cast<float>(g[j]);
    return loss;
  }
};

// This rank's share of step `step`: different rows on every rank, the same rows on every run.
batch make_batch(int rank, int step, std::size_t rows) {
  std::mt19937 gen(static_cast<unsigned>(step * 100 + rank));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  batch data;
  for (std::size_t i = 0; i < rows; ++i) {
    float y = true_b;
    for (std::size_t j = 0; j < features; ++j) {
      data.x.push_back(u(gen));
      y += true_w[j] * data.x.back();
    }
    data.y.push_back(y);
  }
  return data;
}

constexpr char usage[] =
    "usage: zero [--help]\n"
    "Fits y = w.x + b with sharded data parallel (ZeRO-2) on 2 threads of this process (the local\n"
    "backend), each rank keeping and stepping half of the optimizer state.\n"
    "  build/examples/zero/zero\n"
    "It starts its own ranks: run it directly (under partrun, torchrun, srun or mpirun it refuses).\n";

}  // namespace

int main(int argc, char** argv) try {
  for (int i = 1; i < argc; ++i) {  // no options but --help; anything else is refused by name
    if (std::string_view(argv[i]) != "--help" && std::string_view(argv[i]) != "-h") {
      std::fprintf(stderr, "zero: unknown argument '%s' (it takes no arguments but --help)\n", argv[i]);
      return 2;
    }
  }
  if (argc > 1) {
    std::fputs(usage, stdout);
    return 0;
  }
  partrain::run_ranks({.nproc = 2, .backend = "local"}, [](partrain::process_group& pg) {
    linear_regression model;
    // Rank 0's weights everywhere; averaged gradients; each rank steps its shard with SGD.
    partrain::sharded_data_parallel zero(model, pg, partrain::sgd_options{.lr = 0.1, .momentum = 0.5});
    double loss = 0;
    for (int step = 0; step < 100; ++step) {
      loss = zero.train_step(make_batch(pg.rank(), step, 16));
      if (pg.rank() == 0 && step % 20 == 0) std::printf("step %3d  loss %.6f\n", step, loss);
    }
    // Every rank holds the whole model, bit for bit: compare with rank 0's.
    std::vector<float> rank0 = model.values;
    pg.broadcast(partrain::tensor_view<float>(rank0), 0).wait();
    std::vector<int> same{rank0 == model.values ? 1 : 0};
    pg.all_reduce(partrain::tensor_view<int>(same), partrain::reduce_op::min).wait();
    if (pg.rank() != 0) return;
    const auto& v = model.values;
    std::printf("w = [%.3f %.3f %.3f %.3f]  b = %.3f  (true: [1 -2 3 0.5], 0.25)\n", v[0], v[1], v[2], v[3], v[4]);
    std::printf("rank 0 keeps momentum for %zu of the %zu parameter values; step %s\n", zero.memory().shard_elements,
                v.size(), zero.shared_memory_step() ? "over shared memory" : "by reduce_scatter");
    std::printf("final loss %.6f, parameters %s on all %d ranks\n", loss, same[0] == 1 ? "bit-identical" : "DIFFER",
                pg.size());
  });
} catch (const std::exception& e) {
  std::fprintf(stderr, "zero: %s\n", e.what());
  return 1;
}
