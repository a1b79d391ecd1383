// bench_deterministic: a step of deterministic_data_parallel (parallel/deterministic.hpp) against
// a step of distributed_data_parallel on the same work, and deterministic FSDP
// (fsdp_options::deterministic_shards) against plain FSDP: 2 ranks as threads (collectives inline
// on pinned ranks), 64 rows per rank (the deterministic runs: a global batch of 128 in 2 shards,
// one per rank), train_step + SGD with momentum, in alternated windows (medians).
//   deterministic_step_ratio           the example MLP (784-256-128-10, its hand-fused host step)
//   deterministic_step_ratio_vit       the example ViT as layers (dim 64, 4 blocks)
//   deterministic_fsdp_step_ratio      FSDP over the MLP as layers
//   deterministic_fsdp_step_ratio_vit  FSDP over the ViT's layers
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
#include <partrain/parallel/fsdp.hpp>

#include "mlp_host.hpp"
#include "median.hpp"
#include "mlp_layers.hpp"
#include "vit_layers.hpp"

namespace {

using namespace partrain;
namespace ml = models::layers;

constexpr std::size_t per_rank = 64, world = 2, global = per_rank * world;

using ::partrain::bench::median;

// Seconds per step (rank 0's window), after one warm-up step: a DDP-like mode (fsdp false) with
// SGD, or FSDP, whose step holds SGD's.
template <class Make>
double window(Make make, bool deterministic, bool fsdp, std::size_t steps, const std::vector<float>& x,
              const std::vector<std::int32_t>& y) {
  std::vector<double> secs(world);
  process_group_options o;
  o.inline_collectives = o.pin_threads = true;
  run_local(static_cast<int>(world), [&](local_group& g) {
    auto model = make();
    const auto r = static_cast<std::size_t>(g.rank());
    const batch whole{tensor_view<const float>(x.data(), shape{global, 784}), tensor_view<const std::int32_t>(y.data(), global), {}};
    const batch mine{whole.features.slice(r * per_rank, (r + 1) * per_rank), whole.labels.slice(r * per_rank, (r + 1) * per_rank), {}};
    const batch& b = deterministic ? whole : mine;
    auto run = [&](auto step) {
      step();
      g.barrier().wait();
      const auto t0 = std::chrono::steady_clock::now();
      for (std::size_t s = 0; s < steps; ++s) step();
      g.barrier().wait();
      secs[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / static_cast<double>(steps);
    };
    if constexpr (requires { model.layers(); }) {
      if (fsdp) {
        fully_sharded_data_parallel f(model, g, sgd_options{.lr = 0.01, .momentum = 0.9},
                                      {.deterministic_shards = deterministic ? world : 0});
        run([&] { (void)f.train_step(b); });
        return;
      }
    }
    sgd opt(model, {.lr = 0.01, .momentum = 0.9});
    auto with = [&](auto& par) {
      run([&] {
        (void)par.train_step(b);
        opt.step();
      });
    };
    if (deterministic) {
      deterministic_data_parallel det(model, g, {.shards = world});
      with(det);
    } else {
      distributed_data_parallel ddp(model, g);
      with(ddp);
    }
  }, o);
  return secs[0];
}

template <class Make>
std::pair<double, double> compare(Make make, bool fsdp, std::size_t steps, std::size_t windows, const std::vector<float>& x,
                                  const std::vector<std::int32_t>& y) {
  std::vector<double> plain, det;
  for (std::size_t w = 0; w < windows; ++w) {  // alternated
    plain.push_back(window(make, false, fsdp, steps, x, y));
    det.push_back(window(make, true, fsdp, steps, x, y));
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

  const auto make_vit = [] { return sequential(ml::make_vit({}, 1), ml::softmax_cross_entropy{}); };
  const auto make_mlp_layers = [] { return sequential(ml::make_mlp({784, 256, 128, 10}, 1), ml::softmax_cross_entropy{}); };
  const std::size_t vit_steps = std::max<std::size_t>(1, steps / 8);
  const auto mlp = compare([] { return models::mlp_host({}, 1); }, false, steps, windows, x, y);
  const auto vit = compare(make_vit, false, vit_steps, windows, x, y);
  const auto fsdp_mlp = compare(make_mlp_layers, true, steps, windows, x, y);
  const auto fsdp_vit = compare(make_vit, true, vit_steps, windows, x, y);
  std::printf("2 ranks (threads), %zu rows per rank, train_step + SGD; medians of %zu alternated windows\n\n", per_rank, windows);
  std::printf("%-12s %14s %22s %8s\n", "model", "plain ms/step", "deterministic ms/step", "ratio");
  const auto row = [](const char* name, std::pair<double, double> t) {
    std::printf("%-12s %14.3f %22.3f %8.3f\n", name, t.first * 1e3, t.second * 1e3, t.second / t.first);
  };
  row("ddp mlp", mlp);
  row("ddp vit", vit);
  row("fsdp mlp", fsdp_mlp);
  row("fsdp vit", fsdp_vit);
  std::printf("summary: deterministic_step_ratio=%.3f deterministic_step_ratio_vit=%.3f deterministic_fsdp_step_ratio=%.3f "
              "deterministic_fsdp_step_ratio_vit=%.3f\n", mlp.second / mlp.first, vit.second / vit.first,
              fsdp_mlp.second / fsdp_mlp.first, fsdp_vit.second / fsdp_vit.first);
  return 0;
}
