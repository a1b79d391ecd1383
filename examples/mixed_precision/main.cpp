// examples/mixed_precision: fp16 training with fp32 master weights, as PyTorch's autocast +
// GradScaler. The model computes with a 16-bit copy of its weights and keeps its backward's
// gradients in fp16; the loss is scaled so that small gradients survive in 16 bits. When a scaled
// gradient overflows fp16 (inf), amp_step skips that step and halves the scale; after
// growth_interval good steps it doubles the scale again.
// How to run it: `usage` below, which --help prints.
#include <cstdio>
#include <exception>
#include <random>
#include <string_view>
#include <vector>

#include <partrain/core/half.hpp>
#include <partrain/optim/sgd.hpp>
#include <partrain/precision/low_precision_copy.hpp>
#include <partrain/precision/mixed_precision.hpp>

namespace {

using partrain::half;
constexpr std::size_t features = 4;

struct param {
  std::vector<float> v, g;
  explicit param(std::size_t n) : v(n, 0.0f), g(n, 0.0f) {}
  partrain::tensor_view<float> value() { return v; }
  partrain::tensor_view<float> grad() { return g; }
};

struct batch {
  std::vector<float> x, y;
};

// y = w.x + b under mean squared error, computed in fp16 from fp32 masters.
struct linear_fp16 {
  std::vector<param> params{param(features), param(1)};  // the fp32 masters: w, b
  // Their fp16 copy, made from (and pointing at) the masters above: the model is not copyable.
  partrain::low_precision_copy<> copy = partrain::make_low_precision_copy(partrain::precision::fp16, *this);
  float loss_scale = 1;

  linear_fp16() = default;
  linear_fp16(const linear_fp16&) = delete;
  std::vector<param>& parameters() { return params; }
  void set_loss_scale(float s) { loss_scale = s; }  // what amp_step calls before each step
  void refresh_low_precision() { copy.refresh(); }  // ... and after the optimizer stepped

  double train_step(const batch& data) {
    const auto w = copy.get<half>(0);
    const auto b = copy.get<half>(1);
    const std::size_t n = data.y.size();
    std::vector<float> gw(features, 0.0f);
    float gb = 0;
    double loss = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const float* x = &data.x[i * features];
      float e = float(b[0]) - data.y[i];
      for (std::size_t j = 0; j < features; ++j) e += float(w[j]) * float(half(x[j]));  // fp16 inputs
      loss += double(e) * e / double(n);
      for (std::size_t j = 0; j < features; ++j) gw[j] += 2 * e * x[j] / float(n);
      gb += 2 * e / float(n);
    }
    // The gradients leave backward as fp16, scaled: past 65504 they become inf.
    for (std::size_t j = 0; j < features; ++j) params[0].g[j] = float(half(loss_scale * gw[j]));
    params[1].g[0] = float(half(loss_scale * gb));
    return loss;  // unscaled
  }
};

batch make_batch(int step) {
  std::mt19937 gen(static_cast<unsigned>(step));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  batch data;
  for (int i = 0; i < 32; ++i) {
    for (std::size_t j = 0; j < features; ++j) data.x.push_back(u(gen));
    const float* x = &data.x[data.x.size() - features];
    data.y.push_back(1.0f * x[0] - 2.0f * x[1] + 3.0f * x[2] + 0.5f * x[3] + 0.25f);
  }
  return data;
}

constexpr char usage[] =
    "usage: mixed_precision [--help]\n"
    "Fits y = w.x + b in fp16 with fp32 master weights and a gradient scaler (PyTorch's autocast +\n"
    "GradScaler), printing the steps it skips when a gradient overflows fp16.\n"
    "  build/examples/mixed_precision/mixed_precision\n"
    "One process, no launcher; it reads no environment variables.\n";

}  // namespace

int main(int argc, char** argv) try {
  for (int i = 1; i < argc; ++i) {  // no options but --help; anything else is refused by name
    if (std::string_view(argv[i]) != "--help" && std::string_view(argv[i]) != "-h") {
      std::fprintf(stderr, "mixed_precision: unknown argument '%s' (it takes no arguments but --help)\n", argv[i]);
      return 2;
    }
  }
  if (argc > 1) {
    std::fputs(usage, stdout);
    return 0;
  }
  const partrain::mixed_precision_policy mp{.compute = partrain::precision::fp16, .scaler = {.growth_interval = 50}};
  linear_fp16 model;
  partrain::sgd opt(model, {.lr = 0.1});
  partrain::grad_scaler scaler = mp.make_scaler();  // starts at 2^16, as PyTorch's
  int skipped = 0;
  double loss = 0;
  for (int step = 0; step < 200; ++step) {
    // set_loss_scale, train_step, unscale + inf check, step unless overflowed, refresh, update.
    const partrain::amp_step_result r = partrain::amp_step(model, opt, scaler, make_batch(step));
    loss = r.loss;
    if (r.skipped) {
      ++skipped;
      std::printf("step %3d  skipped: a gradient overflowed fp16 at scale %g, scale now %g\n", step, double(r.scale),
                  double(scaler.scale()));
    } else if (step % 40 == 0) {
      std::printf("step %3d  loss %.6f  scale %g\n", step, loss, double(r.scale));
    }
  }
  const auto& w = model.params[0].v;
  std::printf("w = [%.3f %.3f %.3f %.3f]  b = %.3f  (true: [1 -2 3 0.5], 0.25)\n", w[0], w[1], w[2], w[3],
              model.params[1].v[0]);
  std::printf("final loss %.6f, loss scale %g, %d step(s) skipped\n", loss, double(scaler.scale()), skipped);
} catch (const std::exception& e) {
  std::fprintf(stderr, "mixed_precision: %s\n", e.what());
  return 1;
}
