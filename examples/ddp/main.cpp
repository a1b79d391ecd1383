// examples/ddp: distributed data parallel of your own model, a linear regression y = w.x + b
// whose parameters are plain std::vectors seen through tensor_views. Each rank fits its own part
// of every batch; DDP averages the gradients, so the replicas take the same SGD steps and stay
// bit-identical. The same program runs its ranks as threads or as processes a launcher starts
// (`usage` below, which --help prints).
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <random>
#include <string_view>
#include <vector>

#include <partrain/launch/run_ranks.hpp>
#include <partrain/optim/sgd.hpp>
#include <partrain/parallel/ddp.hpp>

namespace {

constexpr std::size_t features = 4;
constexpr float true_w[features] = {1.0f, -2.0f, 3.0f, 0.5f};
constexpr float true_b = 0.25f;

struct param {  // a parameter: its value and its gradient, same shape
  std::vector<float> v, g;
  explicit param(std::size_t n) : v(n, 0.0f), g(n, 0.0f) {}
  partrain::tensor_view<float> value() { return v; }
  partrain::tensor_view<float> grad() { return g; }
};

struct batch {  // rows of `features` inputs and their targets
  std::vector<float> x, y;
};

// y = w.x + b under mean squared error. train_step writes (not adds) the gradients.
struct linear_regression {
  std::vector<param> params{param(features), param(1)};  // w, b
  std::vector<param>& parameters() { return params; }

  double train_step(const batch& data) {
    param& w = params[0];
    param& b = params[1];
    const std::size_t n = data.y.size();
    std::vector<double> gw(features, 0.0);
    double gb = 0, loss = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const float* x = &data.x[i * features];
      double e = b.v[0] - data.y[i];
      for (std::size_t j = 0; j < features; ++j) e += w.v[j] * x[j];
      loss += e * e / n;
      for (std::size_t j = 0; j < features; ++j) gw[j] += 2 * e * x[j] / n;
      gb += 2 * e / n;
    }
    for (std::size_t j = 0; j < features; ++j) w.g[j] = static_cast<float>(gw[j]);
    b.g[0] = static_cast<float>(gb);
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

// True on every rank when every rank holds rank 0's parameters, bit for bit.
bool parameters_agree(linear_regression& model, partrain::process_group& pg) {
  std::vector<float> mine;
  for (auto& p : model.parameters()) mine.insert(mine.end(), p.v.begin(), p.v.end());
  std::vector<float> rank0 = mine;
  pg.broadcast(partrain::tensor_view<float>(rank0), 0).wait();
  std::vector<int> same{mine == rank0 ? 1 : 0};
  pg.all_reduce(partrain::tensor_view<int>(same), partrain::reduce_op::min).wait();
  return same[0] == 1;
}

constexpr char usage[] =
    "usage: ddp [--help]\n"
    "Fits y = w.x + b with distributed data parallel; the ranks' parameters stay bit-identical.\n"
    "  build/examples/ddp/ddp                         2 ranks as threads of this process (local backend)\n"
    "  partrun --standalone --nproc-per-node 2 build/examples/ddp/ddp    2 processes over Gloo\n"
    "Under a launcher (partrun, torchrun, srun, mpirun) it is one rank of the launcher's job: it reads\n"
    "RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT, or srun's or mpirun's own variables.\n";

}  // namespace

int main(int argc, char** argv) try {
  for (int i = 1; i < argc; ++i) {  // no options but --help; anything else is refused by name
    if (std::string_view(argv[i]) != "--help" && std::string_view(argv[i]) != "-h") {
      std::fprintf(stderr, "ddp: unknown argument '%s' (it takes no arguments but --help)\n", argv[i]);
      return 2;
    }
  }
  if (argc > 1) {
    std::fputs(usage, stdout);
    return 0;
  }
  // Under a launcher (partrun, torchrun, srun, mpirun) the environment names this process's rank
  // and the job joins over Gloo; started by hand, the program runs 2 ranks as threads.
  const bool launched = partrain::detect_launch().launched();
  const partrain::run_ranks_options ranks = launched ? partrain::run_ranks_options{.nproc = 0, .backend = "gloo"}
                                                     : partrain::run_ranks_options{.nproc = 2, .backend = "local"};
  partrain::run_ranks(ranks, [](partrain::process_group& pg) {
    linear_regression model;
    partrain::distributed_data_parallel ddp(model, pg);  // rank 0's weights everywhere, averaged gradients
    partrain::sgd opt(model, {.lr = 0.1});
    double loss = 0;
    for (int step = 0; step < 100; ++step) {
      loss = ddp.train_step(make_batch(pg.rank(), step, 16));
      opt.step();
      if (pg.rank() == 0 && step % 20 == 0) std::printf("step %3d  loss %.6f\n", step, loss);
    }
    const bool agree = parameters_agree(model, pg);
    if (pg.rank() != 0) return;
    const auto& w = model.params[0].v;
    std::printf("w = [%.3f %.3f %.3f %.3f]  b = %.3f  (true: [1 -2 3 0.5], 0.25)\n", w[0], w[1], w[2], w[3],
                model.params[1].v[0]);
    std::printf("final loss %.6f\n", loss);
    std::printf("parameters %s on all %d ranks\n", agree ? "bit-identical" : "DIFFER", pg.size());
  });
} catch (const std::exception& e) {
  partrain::write_error_file(e);  // under torchrun: its failure summary shows this error
  std::fprintf(stderr, "ddp: %s\n", e.what());
  return 1;
}
