// bench_deterministic: a step of deterministic_data_parallel (parallel/deterministic.hpp) against
// a step of distributed_data_parallel on the same work: 2 ranks as threads (collectives inline on
// pinned ranks), 64 rows per rank (the deterministic run: a global batch of 128 in 2 shards, one
// per rank), train_step + SGD with momentum, in alternated windows (medians).
//   deterministic_step_ratio      the example MLP (784-256-128-10, its hand-fused host step)
//   deterministic_step_ratio_vit  the example ViT as layers (dim 64, 4 blocks)
//   bench_deterministic [--quick] [--steps N] [--windows N]
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <vector>

#include <partrain/comm/local.hpp>
#include <partrain/data/batch.hpp>
#include <partrain/model/sequential.hpp>
#include <partrain/optim/sgd.hpp>
#include <partrain/parallel/ddp.hpp>
#include <partrain/parallel/deterministic.hpp>

#include "mlp_host.hpp"
#include "median.hpp"
#include "vit_layers.hpp"

namespace {

using namespace partrain;
namespace ml = models::layers;

constexpr std::size_t per_rank = 64, world = 2, global = per_rank * world;

using ::partrain::bench::median;

// Seconds per step (rank 0's window), after one warm-up step.
template <class Make>
double window(Make make, bool deterministic, std::size_t steps, const std::vector<float>& x, const std::vector<std::int32_t>& y) {
  std::vector<double> secs(world);
  process_group_options o;
  o.inline_collectives = o.pin_threads = true;
  run_local(static_cast<int>(world), [&](local_group& g) {
    auto model = make();
    sgd opt(model, {.lr = 0.01, .momentum = 0.9});
    const auto r = static_cast<std::size_t>(g.rank());
    const batch whole{tensor_view<const float>(x.data(), shape{global, 784}), tensor_view<const std::int32_t>(y.data(), global), {}};
    const batch mine{whole.features.slice(r * per_rank, (r + 1) * per_rank), whole.labels.slice(r * per_rank, (r + 1) * per_rank), {}};
    auto run = [&](auto& par, const batch& b) {
      (void)par.train_step(b);
      opt.step();
      g.barrier().wait();
      const auto t0 = std::chrono::steady_clock::now();
      for (std::size_t s = 0; s < steps; ++s) {
        (void)par.train_step(b);
        opt.step();
      }
      g.barrier().wait();
      secs[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / static_cast<double>(steps);
    };
    if (deterministic) {
      deterministic_data_parallel det(model, g, {.shards = world});
      run(det, whole);
    } else {
      distributed_data_parallel ddp(model, g);
      run(ddp, mine);
    }
  }, o);
  return secs[0];
}

template <class Make>
std::pair<double, double> compare(Make make, std::size_t steps, std::size_t windows, const std::vector<float>& x,
                                  const std::vector<std::int32_t>& y) {
  std::vector<double> plain, det;
  for (std::size_t w = 0; w < windows; ++w) {  // alternated
    plain.push_back(window(make, false, steps, x, y));
    det.push_back(window(make, true, steps, x, y));
  }
  return {median(plain), median(det)};
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t steps = 40, windows = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--quick") {
      steps = 3;
      windows = 1;
    } else if ((a == "--steps" || a == "--windows") && i + 1 < argc) {
      (a == "--steps" ? steps : windows) = std::max<std::size_t>(1, std::strtoull(argv[++i], nullptr, 10));
    } else {
      std::fprintf(stderr, "bench_deterministic: unknown argument %s (expected --quick, --steps N, --windows N)\n", argv[i]);
      return 2;
    }
  }
  std::vector<float> x(global * 784);
  std::vector<std::int32_t> y(global);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = static_cast<std::int32_t>(i % 10);

  const auto mlp = compare([] { return models::mlp_host({}, 1); }, steps, windows, x, y);
  const auto vit = compare([] { return sequential(ml::make_vit({}, 1), ml::softmax_cross_entropy{}); }, std::max<std::size_t>(1, steps / 8),
                           windows, x, y);
  std::printf("2 ranks (threads), %zu rows per rank, train_step + SGD; medians of %zu alternated windows\n\n", per_rank, windows);
  std::printf("%-6s %14s %22s %8s\n", "model", "ddp ms/step", "deterministic ms/step", "ratio");
  std::printf("%-6s %14.3f %22.3f %8.3f\n", "mlp", mlp.first * 1e3, mlp.second * 1e3, mlp.second / mlp.first);
  std::printf("%-6s %14.3f %22.3f %8.3f\n", "vit", vit.first * 1e3, vit.second * 1e3, vit.second / vit.first);
  std::printf("summary: deterministic_step_ratio=%.3f deterministic_step_ratio_vit=%.3f\n", mlp.second / mlp.first,
              vit.second / vit.first);
  return 0;
}
