// examples/pipeline: a small network as a sequence of layers, cut into 2 pipeline stages that run
// on 2 threads (the `local` backend). Each batch is split into 4 micro-batches that flow through
// the stages in the 1F1B order: stage 0 works on micro-batch 1 while stage 1 works on micro-batch 0.
// Stage 0 reads the inputs, stage 1 the targets and computes the loss; each steps its own layers.
// How to run it: `usage` below, which --help prints.
#include <cmath>
#include <cstdio>
#include <exception>
#include <iostream>
#include <random>
#include <string_view>
#include <vector>

#include <partrain/launch/run_ranks.hpp>
#include <partrain/optim/sgd.hpp>
#include <partrain/parallel/pipeline/pipeline.hpp>

namespace {

using partrain::shape;
using partrain::tensor_view;

struct param {
  std::vector<float> v, g;
  explicit param(std::size_t n) : v(n, 0.0f), g(n, 0.0f) {}
  tensor_view<float> value() { return v; }
  tensor_view<float> grad() { return g; }
};

// y = x W^T + b, then a ReLU when `relu`. One layer type, so the model is a std::vector<dense>.
// The pipeline keeps each micro-batch's input and output for backward: the layer holds no state.
struct dense {
  std::size_t in, out;
  bool relu;
  std::vector<param> params;  // W [out, in], b [out]

  dense(std::size_t in_, std::size_t out_, bool relu_, unsigned seed) : in(in_), out(out_), relu(relu_) {
    params = {param(out * in), param(out)};
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> u(-1.0f / std::sqrt(float(in)), 1.0f / std::sqrt(float(in)));
    for (float& w : params[0].v) w = u(gen);
  }
  std::vector<param>& parameters() { return params; }
  shape output_shape(const shape& s) const { return {s[0], out}; }

  void forward(tensor_view<const float> x, tensor_view<float> y) {
    for (std::size_t r = 0; r < x.extent(0); ++r) {
      for (std::size_t o = 0; o < out; ++o) {
        float z = params[1].v[o];
        for (std::size_t i = 0; i < in; ++i) z += params[0].v[o * in + i] * x[r * in + i];
        y[r * out + o] = relu && z < 0 ? 0.0f : z;
      }
    }
  }
  // Adds to the parameters' gradients (the pipeline sums micro-batches) and writes gx.
  void backward(tensor_view<const float> x, tensor_view<const float> y, tensor_view<const float> gy,
                tensor_view<float> gx) {
    std::ranges::fill(gx, 0.0f);
    for (std::size_t r = 0; r < x.extent(0); ++r) {
      for (std::size_t o = 0; o < out; ++o) {
        const float g = relu && y[r * out + o] <= 0 ? 0.0f : gy[r * out + o];  // ReLU passes where it was > 0
        params[1].g[o] += g;
        for (std::size_t i = 0; i < in; ++i) {
          params[0].g[o * in + i] += g * x[r * in + i];
          gx[r * in + i] += g * params[0].v[o * in + i];
        }
      }
    }
  }
};

// Squared error on the last stage: returns the micro-batch's SUM of losses and writes
// grad_out = scale * d(sum)/d(out); the pipeline's scale (1 / batch rows) makes it the batch mean.
struct squared_error {
  double forward_backward(tensor_view<const float> out, tensor_view<const float> target, tensor_view<float> grad_out,
                          float scale) const {
    double sum = 0;
    for (std::size_t i = 0; i < out.size(); ++i) {
      sum += (out[i] - target[i]) * (out[i] - target[i]);
      grad_out[i] = scale * 2 * (out[i] - target[i]);
    }
    return sum;
  }
  partrain::eval_result evaluate(tensor_view<const float> out, tensor_view<const float> target) const {
    std::vector<float> unused(out.size());
    return {forward_backward(out, target, unused, 0.0f), 0, out.extent(0)};
  }
};

constexpr char usage[] =
    "usage: pipeline [--help]\n"
    "Trains a 4-layer network cut into 2 pipeline stages on 2 threads of this process (the local\n"
    "backend), 1F1B over 4 micro-batches, and prints stage 0's schedule and the loss.\n"
    "  build/examples/pipeline/pipeline\n"
    "It starts its own ranks: run it directly (under partrun, torchrun, srun or mpirun it refuses).\n";

}  // namespace

int main(int argc, char** argv) try {
  for (int i = 1; i < argc; ++i) {  // no options but --help; anything else is refused by name
    if (std::string_view(argv[i]) != "--help" && std::string_view(argv[i]) != "-h") {
      std::fprintf(stderr, "pipeline: unknown argument '%s' (it takes no arguments but --help)\n", argv[i]);
      return 2;
    }
  }
  if (argc > 1) {
    std::fputs(usage, stdout);
    return 0;
  }
  // 2 -> 16 -> 16 -> 16 -> 1, four layers: two per stage. Every stage sees the whole sequence and
  // touches only its own layers, so both threads share this one object.
  std::vector<dense> model{{2, 16, true, 1}, {16, 16, true, 2}, {16, 16, true, 3}, {16, 1, false, 4}};
  partrain::run_ranks({.nproc = 2, .backend = "local"}, [&](partrain::process_group& pg) {
    const partrain::pipeline_options o{.kind = partrain::pipeline_schedule_kind::one_f_one_b, .micro_batches = 4};
    partrain::pipeline_stage stage(model, pg, o);  // this thread's rank is its stage
    auto params = stage.parameters();  // this stage's layers, as a model for the optimizer
    partrain::sgd opt(params, {.lr = 0.05, .momentum = 0.9});
    if (pg.rank() == 0) std::cout << stage.schedule();  // "stage 0: F0 F1 B0 F2 B1 F3 B2 B3" ...

    squared_error mse;
    double first = 0, loss = 0;
    for (int step = 0; step < 300; ++step) {
      // 64 rows of y = x0 * x1 + sin(x0), the same batch on both stages (each reads its part).
      std::mt19937 gen(static_cast<unsigned>(step));
      std::uniform_real_distribution<float> u(-2.0f, 2.0f);
      std::vector<float> x(64 * 2), y(64);
      for (std::size_t r = 0; r < y.size(); ++r) {
        x[2 * r] = u(gen);
        x[2 * r + 1] = u(gen);
        y[r] = x[2 * r] * x[2 * r + 1] + std::sin(x[2 * r]);
      }
      loss = stage.train_step(mse, tensor_view<const float>(x.data(), shape{64, 2}),
                              tensor_view<const float>(y.data(), shape{64, 1}));
      opt.step();
      if (step == 0) first = loss;
      if (pg.rank() == 0 && step % 50 == 0) std::printf("step %3d  loss %.5f\n", step, loss);
    }
    if (pg.rank() == 0) {
      std::printf("final loss %.5f (from %.5f); stage 0 held at most %d micro-batches\n", loss, first,
                  stage.last_stats().peak_in_flight);
    }
  });
} catch (const std::exception& e) {
  std::fprintf(stderr, "pipeline: %s\n", e.what());
  return 1;
}
