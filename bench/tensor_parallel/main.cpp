// bench_tensor_parallel: the example ViT's transformer blocks split over a tensor-parallel group
// of 2 ranks (threads of the local backend, collectives inline on pinned ranks) against the
// whole model on one rank, at a width where the GEMMs dominate the step (dim 256, 8 heads, MLP
// 1024, 4 blocks, 16 tokens, batch 64; --dim to change). Each step is train_step + SGD with
// momentum on the same batch; both ranks of the group take it whole.
//   tp2_speedup            samples/s at tp 2 / samples/s at tp 1 (medians of alternated windows)
//   tp2_param_memory_ratio parameter bytes a tp-2 rank holds / the whole model's
//   tp2_bytes_per_step     bytes one tp-2 rank sent in a step (the local backend's ring count)
//   tp2_bytes_formula      4 all-reduces per block of batch x tokens x dim floats, 2 (p-1)/p each
// and with sequence parallelism (tp 2 + sp, the same model):
//   tp2_sp_speedup           samples/s at tp 2 + sp / samples/s at tp 1
//   tp2_sp_activation_ratio  activation bytes a tp 2 + sp rank holds / a tp 2 rank's
//   tp2_sp_bytes_per_step    bytes one rank sent in a step
//   tp2_sp_bytes_formula     per block 10 exchanges of (p-1)/p of batch x tokens x dim floats (forward
//                            2 all-gathers, 2 reduce-scatters; backward 4 all-gathers, 2
//                            reduce-scatters) and an all-reduce of 4 dim floats; 3 exchanges at the ends
// and with the activations' collectives in bf16 (tp 2, tp_shard::wire):
//   tp2_bf16_speedup         samples/s at tp 2 in bf16 / samples/s at tp 1
//   tp2_bf16_bytes_per_step  bytes one rank sent in a step (the formula's half)
//   bench_tensor_parallel [--quick] [--dim D] [--steps N] [--windows N]
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include <partrain/comm/local.hpp>
#include <partrain/model/sequential.hpp>
#include <partrain/optim/sgd.hpp>

#include "median.hpp"
#include "vit_layers.hpp"

namespace {

using namespace partrain;
namespace ml = models::layers;

struct config {
  std::size_t dim = 256, steps = 6, windows = 5, batch = 64;
};

struct rows_batch {
  tensor_view<const float> features;
  std::vector<std::int32_t> labels;
};

using ::partrain::bench::median;

std::size_t parameter_bytes(ml::host_model& m) {
  std::size_t b = 0;
  for (auto& l : m) {
    for (auto& p : l->parameters()) b += p.value().size_bytes();
  }
  return b;
}

struct result {
  double samples_per_s = 0;
  std::size_t param_bytes = 0;
  std::uint64_t bytes_per_step = 0;
  std::size_t activation_bytes = 0;
};

// One window of `steps` steps after one warm-up step, at tensor-parallel size p (1: the whole
// model), with sequence parallelism or not.
result run(const ml::vit_config& vc, const config& c, int p, const rows_batch& b, bool sp = false,
           dtype wire = dtype::float32) {
  std::vector<result> out(static_cast<std::size_t>(p));
  process_group_options o;
  o.inline_collectives = o.pin_threads = true;
  run_local(p, [&](local_group& g) {
    const auto r = static_cast<std::size_t>(g.rank());
    auto layers = ml::make_vit(vc, 1, {.group = p > 1 ? &g : nullptr, .rank = r, .size = static_cast<std::size_t>(p),
                                       .sequence_parallel = sp, .wire = wire});
    const std::size_t pb = parameter_bytes(layers);
    sequential model(std::move(layers), ml::softmax_cross_entropy{});
    sgd opt(model, {.lr = 0.01, .momentum = 0.9});
    (void)model.train_step(b);
    opt.step();
    g.barrier().wait();
    const auto before = g.traffic().bytes_sent;
    const auto t0 = std::chrono::steady_clock::now();
    for (std::size_t s = 0; s < c.steps; ++s) {
      (void)model.train_step(b);
      opt.step();
    }
    g.barrier().wait();
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    out[r] = {static_cast<double>(c.steps * c.batch) / secs, pb, (g.traffic().bytes_sent - before) / c.steps,
              model.activation_bytes()};
  }, o);
  return out[0];
}

}  // namespace

int main(int argc, char** argv) {
  config c;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto value = [&]() -> std::size_t {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_tensor_parallel: %s needs a value\n", argv[i]);
        std::exit(2);
      }
      return std::strtoull(argv[++i], nullptr, 10);
    };
    if (a == "--quick") {
      c.dim = 64;
      c.steps = 2;
      c.windows = 2;
    } else if (a == "--dim") {
      c.dim = value();
    } else if (a == "--steps") {
      c.steps = value();
    } else if (a == "--windows") {
      c.windows = value();
    } else {
      std::fprintf(stderr, "bench_tensor_parallel: unknown argument %s (expected --quick, --dim, --steps, --windows)\n", argv[i]);
      return 2;
    }
  }
  if (c.dim == 0 || c.dim % 8 != 0 || c.steps == 0 || c.windows == 0) {
    std::fprintf(stderr, "bench_tensor_parallel: --dim must be a positive multiple of 8 (8 heads), --steps and --windows >= 1\n");
    return 2;
  }
  const ml::vit_config vc{.patch = 7, .dim = c.dim, .depth = 4, .heads = 8, .mlp_ratio = 4};
  std::vector<float> x(c.batch * 784);
  std::vector<std::int32_t> y(c.batch);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = static_cast<std::int32_t>(i % 10);
  const rows_batch b{tensor_view<const float>(x.data(), shape{c.batch, 784}), y};

  std::vector<double> sps1, sps2, sps3, sps4;
  result r1, r2, r3, r4;
  for (std::size_t w = 0; w < c.windows; ++w) {  // alternated: tp 1, tp 2, tp 2 + sp, tp 2 bf16, tp 1, ...
    r1 = run(vc, c, 1, b);
    r2 = run(vc, c, 2, b);
    r3 = run(vc, c, 2, b, true);
    r4 = run(vc, c, 2, b, false, dtype::bfloat16);
    sps1.push_back(r1.samples_per_s);
    sps2.push_back(r2.samples_per_s);
    sps3.push_back(r3.samples_per_s);
    sps4.push_back(r4.samples_per_s);
  }
  const std::uint64_t tokens = 16, floats = c.batch * tokens * c.dim;
  const std::uint64_t formula = 4 * vc.depth * (2 * (2 - 1) * floats * sizeof(float) / 2);
  const std::uint64_t exchange = (2 - 1) * floats * sizeof(float) / 2, ln = 2 * (2 - 1) * (4 * c.dim * sizeof(float)) / 2;
  const std::uint64_t sp_formula = vc.depth * (10 * exchange + ln) + 3 * exchange;
  const double speedup = median(sps2) / median(sps1);
  const double mem_ratio = static_cast<double>(r2.param_bytes) / static_cast<double>(r1.param_bytes);
  std::printf("ViT dim %zu, 8 heads, MLP %zu, 4 blocks, 16 tokens, batch %zu; train_step + SGD; medians of %zu "
              "alternated windows of %zu steps\n\n",
              c.dim, 4 * c.dim, c.batch, c.windows, c.steps);
  const double act_ratio = static_cast<double>(r3.activation_bytes) / static_cast<double>(r2.activation_bytes);
  std::printf("%-8s %12s %16s %18s %20s\n", "tp", "samples/s", "param MB/rank", "activation MB/rank", "bytes sent/step");
  auto row = [](const char* name, double sps, const result& r, std::uint64_t f) {
    std::printf("%-8s %12.0f %16.2f %18.2f %20llu", name, sps, static_cast<double>(r.param_bytes) / 1e6,
                static_cast<double>(r.activation_bytes) / 1e6, static_cast<unsigned long long>(r.bytes_per_step));
    if (f > 0) std::printf("   (formula %llu)", static_cast<unsigned long long>(f));
    std::printf("\n");
  };
  row("1", median(sps1), r1, 0);
  row("2", median(sps2), r2, formula);
  row("2 + sp", median(sps3), r3, sp_formula);
  row("2 bf16", median(sps4), r4, formula / 2);
  std::printf("summary: tp2_speedup=%.3f tp2_param_memory_ratio=%.3f tp2_bytes_per_step=%llu tp2_bytes_formula=%llu "
              "tp2_sp_speedup=%.3f tp2_sp_activation_ratio=%.3f tp2_sp_bytes_per_step=%llu tp2_sp_bytes_formula=%llu "
              "tp2_bf16_speedup=%.3f tp2_bf16_bytes_per_step=%llu\n",
              speedup, mem_ratio, static_cast<unsigned long long>(r2.bytes_per_step),
              static_cast<unsigned long long>(formula), median(sps3) / median(sps1), act_ratio,
              static_cast<unsigned long long>(r3.bytes_per_step), static_cast<unsigned long long>(sp_formula),
              median(sps4) / median(sps1), static_cast<unsigned long long>(r4.bytes_per_step));
  return 0;
}
