// examples/data_parallel: one process driving 2 host devices (worker threads), as
// torch.nn.DataParallel does with GPUs. The model says how to copy itself to a device
// (replicate_to); data_parallel scatters each batch over the replicas, runs their steps at once,
// averages the gradients weighted by each replica's rows and steps every replica's optimizer.
// The result is one device's training on the whole batch, within float rounding.
// How to run it: `usage` below, which --help prints.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <random>
#include <string_view>
#include <vector>

#include <partrain/optim/sgd.hpp>
#include <partrain/parallel/data_parallel.hpp>

namespace {

using partrain::tensor_view;
constexpr std::size_t features = 3;

struct param {
  std::vector<float> v, g;
  explicit param(std::size_t n) : v(n, 0.0f), g(n, 0.0f) {}
  tensor_view<float> value() { return v; }
  tensor_view<float> grad() { return g; }
};

// Rows of a batch held elsewhere: x is [rows, features], y is [rows]. slice() is how
// data_parallel cuts it into one part per device, without copying.
struct rows {
  tensor_view<const float> x, y;
  std::size_t size() const { return y.size(); }
  rows slice(std::size_t first, std::size_t last) const { return {x.slice(first, last), y.slice(first, last)}; }
};

// y = w.x + b under mean squared error.
struct linear_regression {
  std::vector<param> params{param(features), param(1)};  // w, b
  std::vector<param>& parameters() { return params; }
  // Host memory is one space for every cpu device: a replica is a plain copy.
  linear_regression replicate_to(partrain::device) const { return *this; }

  double train_step(const rows& data) {
    param& w = params[0];
    param& b = params[1];
    const std::size_t n = data.size();
    std::vector<double> gw(features, 0.0);
    double gb = 0, loss = 0;
    for (std::size_t i = 0; i < n; ++i) {
      double e = b.v[0] - data.y[i];
      for (std::size_t j = 0; j < features; ++j) e += w.v[j] * data.x[i * features + j];
      loss += e * e / n;
      for (std::size_t j = 0; j < features; ++j) gw[j] += 2 * e * data.x[i * features + j] / n;
      gb += 2 * e / n;
    }
    for (std::size_t j = 0; j < features; ++j) w.g[j] = static_cast<float>(gw[j]);
    b.g[0] = static_cast<float>(gb);
    return loss;
  }
};

// 32 rows of y = 2 x0 - x1 + 0.5 x2 - 1, different at every step.
struct batch_data {
  std::vector<float> x, y;
  explicit batch_data(int step) {
    std::mt19937 gen(static_cast<unsigned>(step));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (int i = 0; i < 32; ++i) {
      for (std::size_t j = 0; j < features; ++j) x.push_back(u(gen));
      y.push_back(2 * x[x.size() - 3] - x[x.size() - 2] + 0.5f * x.back() - 1);
    }
  }
  rows view() const { return {tensor_view<const float>(x.data(), partrain::shape{y.size(), features}), y}; }
};

constexpr char usage[] =
    "usage: data_parallel [--help]\n"
    "Fits y = w.x + b in one process on 2 host devices (data parallel, as torch.nn.DataParallel) and\n"
    "compares the result with one device's training; exits 1 if they differ by more than 1e-5.\n"
    "  build/examples/data_parallel/data_parallel\n"
    "One process, no launcher; it reads no environment variables.\n";

}  // namespace

int main(int argc, char** argv) try {
  for (int i = 1; i < argc; ++i) {  // no options but --help; anything else is refused by name
    if (std::string_view(argv[i]) != "--help" && std::string_view(argv[i]) != "-h") {
      std::fprintf(stderr, "data_parallel: unknown argument '%s' (it takes no arguments but --help)\n", argv[i]);
      return 2;
    }
  }
  if (argc > 1) {
    std::fputs(usage, stdout);
    return 0;
  }
  linear_regression model;      // replica 0: after training it holds the trained parameters
  linear_regression reference;  // the same model trained on one device, for comparison
  partrain::data_parallel dp(model, {partrain::device::cpu(0), partrain::device::cpu(1)},
                             [](linear_regression& replica) { return partrain::sgd(replica, {.lr = 0.1}); });
  partrain::sgd reference_opt(reference, {.lr = 0.1});
  double loss = 0;
  for (int step = 0; step < 100; ++step) {
    const batch_data data(step);
    loss = dp.train_step(data.view());  // scatter, forward + backward, average, step everywhere
    reference.train_step(data.view());
    reference_opt.step();
    if (step % 20 == 0) std::printf("step %3d  loss %.6f\n", step, loss);
  }
  double diff = 0;
  for (std::size_t i = 0; i < model.params.size(); ++i) {
    for (std::size_t j = 0; j < model.params[i].v.size(); ++j) {
      diff = std::max(diff, static_cast<double>(std::fabs(model.params[i].v[j] - reference.params[i].v[j])));
    }
  }
  const auto& w = model.params[0].v;
  std::printf("w = [%.3f %.3f %.3f]  b = %.3f  (true: [2 -1 0.5], -1)\n", w[0], w[1], w[2], model.params[1].v[0]);
  std::printf("final loss %.6f on 2 devices; largest difference from one device %.2g\n", loss, diff);
  return diff < 1e-5 ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "data_parallel: %s\n", e.what());
  return 1;
}
