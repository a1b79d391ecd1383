// bench_sharding: what ZeRO-1, ZeRO-2 (sharded_data_parallel) and ZeRO-3 (fully_sharded_data_parallel)
// hold and send against DDP, on the example's host MLP (784-256-128-10), a wider one
// (784-1024-1024-10) and a deep one (784, ten 512-512 layers, 10; DDP and FSDP only), AdamW, at
// world sizes 1, 2 and 4 on the local (threads) backend, one OpenBLAS thread per rank:
//   params, model grads  what the model itself holds (whole on every rank under DDP and ZeRO-1/2);
//                        fsdp: params is the peak a rank held (its chunks + the layers gathered at
//                        once), model grads 0 (the layers hold none of their own)
//   grad bufs            gradient memory the policy holds (DDP: its buckets; ZeRO: see zero.hpp;
//                        fsdp: the peak of its chunks + whole layer gradients in flight)
//   opt state            the optimizer's state on this rank (AdamW: two moments)
//   sent/step            bytes rank 0 sends per step, counted by the communicator (ring bytes)
//   samples/s            over the whole job (the ranks share this machine's cores); fsdp runs the
//                        same MLP as layers (models/mlp_layers.hpp, plain loops, no BLAS), so its
//                        samples/s is not comparable with the other rows'
// The last line is the summary: zero2_state_ratio (optimizer state per rank at world 4 / DDP's, wide
// MLP), zero2_traffic_ratio (bytes per step at world 4 / DDP's, wide MLP), zero2_speed_ratio
// (samples/s at world 2 / DDP's, wide MLP), fsdp_param_ratio (peak parameter bytes per rank at
// world 4 / DDP's, deep MLP; FSDP holds its chunks plus two layers, so a model dominated by one
// layer, as the other two, cannot go below that layer's share), fsdp_traffic_ratio and
// fsdp_bf16_traffic_ratio (bytes per step at world 4 / DDP's, wide MLP; fsdp16 gathers and
// reduces in bfloat16, fsdp_options' param_dtype and reduce_dtype), zero2_per_bucket_speedup
// (ZeRO-2's samples/s with its default per-bucket partition, reduce_scatters in backward, over the
// contiguous partition's, wide MLP at world 2: the median of alternated rounds) and
// zero2_exposed_ms_per_bucket / _contiguous (ms per step rank 0 waited for reduce_scatters after
// its backward, the same rounds' medians).
//   bench_sharding [--quick] [--steps N] [--batch-size N]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <partrain/comm/local.hpp>
#include <partrain/data/batch.hpp>
#include <partrain/optim/adamw.hpp>
#include <partrain/parallel/ddp.hpp>
#include <partrain/parallel/fsdp.hpp>
#include <partrain/parallel/zero.hpp>

#include "mlp_host.hpp"
#include "mlp_layers.hpp"

namespace {

using namespace partrain;
using clock_type = std::chrono::steady_clock;

// Buckets of 1 MiB for every policy: the wide MLP spans several, so ZeRO-2's gradient slots are
// smaller than the model (PyTorch's 25 MiB default would hold either MLP in one bucket).
constexpr std::size_t bucket_cap = std::size_t{1} << 20;

struct config {
  std::size_t batch = 32;  // per rank
  std::size_t steps = 20;
  std::size_t warmup = 3;
};

// Synthetic rows: features uniform in [-1, 1), labels in [0, 10).
struct synthetic_data {
  std::vector<float> x;
  std::vector<std::int32_t> y;
  std::size_t rows = 0;
  explicit synthetic_data(std::size_t n) : x(n * 784), y(n), rows(n) {
    models::splitmix64 r(42);
    for (auto& v : x) v = r.uniform(-1.0f, 1.0f);
    for (auto& v : y) v = static_cast<std::int32_t>(r.next() % 10);
  }
  // Rank `rank`'s batch at step `s` of a world of `world`.
  [[nodiscard]] batch at(std::size_t s, int world, int rank, std::size_t bs) const {
    const std::size_t per_step = bs * static_cast<std::size_t>(world);
    const std::size_t first = (s * per_step + static_cast<std::size_t>(rank) * bs) % (rows - bs + 1);
    return {tensor_view<const float>(x.data() + first * 784, shape{bs, 784}),
            tensor_view<const std::int32_t>(y.data() + first, bs), {}};
  }
};

// zero2c: ZeRO-2 with zero_partition::contiguous (one range per rank, every reduce_scatter after
// backward); zero1 and zero2 use the default, per bucket (each reduce_scatter in backward).
enum class mode { ddp, zero1, zero2, zero2c, fsdp, fsdp16 };
constexpr std::string_view name(mode m) {
  switch (m) {
    case mode::ddp: return "ddp";
    case mode::zero1: return "zero1";
    case mode::zero2: return "zero2";
    case mode::zero2c: return "zero2c";
    case mode::fsdp: return "fsdp";
    case mode::fsdp16: return "fsdp16";
  }
  return "?";
}

struct row {
  std::size_t params = 0, model_grads = 0, grad_bufs = 0, state = 0;
  std::uint64_t sent_per_step = 0;
  double samples_per_s = 0;
  std::size_t buckets = 0, launched_in_backward = 0;  // ZeRO: reduce_scatters, and those launched in backward
  double exposed_ms = 0;  // ZeRO: ms per step waiting for reduce_scatters after backward (rank 0)
};

row measure(const models::mlp_layout& layout, mode md, int world, const config& c, const synthetic_data& data) {
  row out;
  std::mutex mu;
  const adamw_options opt_options{.lr = 1e-3};
  run_local(world, [&](local_group& g) {
    models::mlp_host model(layout, 0);
    const std::size_t n = model.flat_values().size();
    row mine;
    auto timed = [&](auto&& step) {
      for (std::size_t s = 0; s < c.warmup; ++s) step(s);
      g.barrier().wait();
      g.reset_traffic();
      const auto t0 = clock_type::now();
      for (std::size_t s = 0; s < c.steps; ++s) step(c.warmup + s);
      g.barrier().wait();
      const double secs = std::chrono::duration<double>(clock_type::now() - t0).count();
      mine.sent_per_step = g.traffic().bytes_sent / c.steps;
      mine.samples_per_s = static_cast<double>(c.steps * c.batch * static_cast<std::size_t>(world)) / secs;
    };
    if (md == mode::fsdp || md == mode::fsdp16) {
      auto layers = models::layers::make_mlp(layout.widths, 0);
      const dtype wire = md == mode::fsdp16 ? dtype::bfloat16 : dtype::float32;
      fully_sharded_data_parallel fsdp(layers, g, models::layers::softmax_cross_entropy{}, opt_options,
                                       {.param_dtype = wire, .reduce_dtype = wire});
      timed([&](std::size_t s) { (void)fsdp.train_step(data.at(s, world, g.rank(), c.batch)); });
      const fsdp_memory m = fsdp.memory();
      mine.params = m.peak_parameter_bytes;
      mine.grad_bufs = m.peak_gradient_bytes;
      mine.state = m.optimizer_state_bytes;
    } else if (md == mode::ddp) {
      distributed_data_parallel ddp(model, g, {.bucket_cap_bytes = bucket_cap});
      adamw opt(model, opt_options);
      timed([&](std::size_t s) {
        (void)ddp.train_step(data.at(s, world, g.rank(), c.batch));
        opt.step();
      });
      mine.params = n * sizeof(float);
      mine.model_grads = n * sizeof(float);
      // World size 1 skips the buckets' use but holds them all the same.
      for (const auto& b : ddp.stats().buckets) mine.grad_bufs += b.bytes;
      mine.state = 2 * n * sizeof(float);  // AdamW's exp_avg and exp_avg_sq, whole
    } else {
      const auto partition = md == mode::zero2c ? zero_partition::contiguous : zero_partition::per_bucket;
      // The reduce_scatter path, as every multi-process backend runs it (on threads the default is
      // the shared-memory step, which bench_ddp measures): its buckets, overlap and buffers.
      sharded_data_parallel zero(model, g, opt_options,
                                 {.stage = md == mode::zero1 ? 1 : 2, .partition = partition, .bucket_cap_bytes = bucket_cap,
                                  .shared_memory_step = false});
      timed([&](std::size_t s) { (void)zero.train_step(data.at(s, world, g.rank(), c.batch)); });
      mine.buckets = zero.buckets();
      mine.launched_in_backward = zero.buckets_launched_in_backward();
      mine.exposed_ms = 1e3 * zero.exposed_reduce_seconds() / static_cast<double>(c.warmup + c.steps);
      const sharded_memory m = zero.memory();
      mine.params = m.parameter_bytes;
      mine.model_grads = m.model_gradient_bytes;
      mine.grad_bufs = m.gradient_bytes;
      mine.state = m.optimizer_state_bytes;
    }
    if (g.rank() == 0) {
      std::lock_guard lock(mu);
      out = mine;
    }
  });
  return out;
}

std::string mib(std::size_t b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.2f", static_cast<double>(b) / (1024.0 * 1024.0));
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  config c;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--quick") {
      c.steps = 3;
      c.warmup = 1;
    } else if (a == "--steps" && i + 1 < argc) {
      c.steps = std::strtoul(argv[++i], nullptr, 10);
    } else if (a == "--batch-size" && i + 1 < argc) {
      c.batch = std::strtoul(argv[++i], nullptr, 10);
    } else {
      std::fprintf(stderr, "usage: bench_sharding [--quick] [--steps N] [--batch-size N]\n");
      return 2;
    }
  }
  if (c.steps == 0 || c.batch == 0) {
    std::fprintf(stderr, "bench_sharding: --steps and --batch-size must be at least 1\n");
    return 2;
  }
  const synthetic_data data(4096);
  struct model_case {
    const char* label;
    models::mlp_layout layout;
    std::vector<mode> modes;
  };
  const std::vector<mode> all_modes{mode::ddp, mode::zero1, mode::zero2, mode::zero2c, mode::fsdp, mode::fsdp16};
  std::vector<std::size_t> deep(12, 512);  // 784, 512 x 11 (ten 512-512 layers), 10
  deep.front() = 784;
  deep.push_back(10);
  const std::vector<model_case> cases{{"mlp", {{784, 256, 128, 10}}, all_modes},
                                      {"wide", {{784, 1024, 1024, 10}}, all_modes},
                                      {"deep", {deep}, {mode::ddp, mode::fsdp, mode::fsdp16}}};
  double state_ratio = 0, traffic_ratio = 0, speed_ratio = 0, fsdp_param_ratio = 0, fsdp_traffic = 0, fsdp16_traffic = 0;
  std::printf("bench_sharding: AdamW, %zu steps of %zu samples per rank, local backend (threads)\n", c.steps, c.batch);
  std::printf("%-5s %5s %-6s %10s %11s %10s %10s %12s %10s\n", "model", "world", "mode", "params", "model grads",
              "grad bufs", "opt state", "sent/step", "samples/s");
  std::printf("%-5s %5s %-6s %10s %11s %10s %10s %12s %10s\n", "", "", "", "MiB", "MiB", "MiB", "MiB", "MiB", "");
  for (const auto& mc : cases) {
    for (int world : {1, 2, 4}) {
      row ddp{};
      for (mode md : mc.modes) {
        const row r = measure(mc.layout, md, world, c, data);
        if (md == mode::ddp) ddp = r;
        std::printf("%-5s %5d %-6s %10s %11s %10s %10s %12s %10.0f\n", mc.label, world, std::string(name(md)).c_str(),
                    mib(r.params).c_str(), mib(r.model_grads).c_str(), mib(r.grad_bufs).c_str(), mib(r.state).c_str(),
                    mib(r.sent_per_step).c_str(), r.samples_per_s);
        if (std::string_view(mc.label) == "wide" && md == mode::zero2) {
          if (world == 4) {
            state_ratio = static_cast<double>(r.state) / static_cast<double>(ddp.state);
            traffic_ratio = static_cast<double>(r.sent_per_step) / static_cast<double>(ddp.sent_per_step);
          }
          if (world == 2) speed_ratio = r.samples_per_s / ddp.samples_per_s;
        }
        if (std::string_view(mc.label) == "deep" && md == mode::fsdp && world == 4) {
          fsdp_param_ratio = static_cast<double>(r.params) / static_cast<double>(ddp.params);
        }
        if (std::string_view(mc.label) == "wide" && world == 4 && (md == mode::fsdp || md == mode::fsdp16)) {
          (md == mode::fsdp ? fsdp_traffic : fsdp16_traffic) =
              static_cast<double>(r.sent_per_step) / static_cast<double>(ddp.sent_per_step);
        }
      }
    }
  }
  // Per bucket against contiguous, alternated so that both see the same machine: ZeRO-2 on the wide
  // MLP at world 2; the ratio of each round's samples/s, and their median.
  const std::size_t rounds = c.steps >= 10 ? 5 : 1;
  const auto& wide = cases[1].layout;
  std::vector<double> ratios;
  std::printf("\nzero2, wide MLP, world 2: per bucket against contiguous, alternated\n");
  std::printf("%5s %14s %14s %8s %14s %14s %12s\n", "round", "per bucket", "contiguous", "ratio", "exposed ms", "exposed ms",
              "in backward");
  std::printf("%5s %14s %14s %8s %14s %14s %12s\n", "", "samples/s", "samples/s", "", "per bucket", "contiguous",
              "/ buckets");
  std::vector<double> exposed_pb, exposed_c;
  for (std::size_t k = 0; k < rounds; ++k) {
    const row a = measure(wide, mode::zero2, 2, c, data);
    const row b = measure(wide, mode::zero2c, 2, c, data);
    ratios.push_back(a.samples_per_s / b.samples_per_s);
    exposed_pb.push_back(a.exposed_ms);
    exposed_c.push_back(b.exposed_ms);
    std::printf("%5zu %14.0f %14.0f %8.3f %14.3f %14.3f %7zu / %zu\n", k + 1, a.samples_per_s, b.samples_per_s,
                ratios.back(), a.exposed_ms, b.exposed_ms, a.launched_in_backward, a.buckets);
  }
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double per_bucket_speedup = median(ratios);
  std::printf("summary: zero2_state_ratio=%.4f zero2_traffic_ratio=%.4f zero2_speed_ratio=%.3f fsdp_param_ratio=%.4f "
              "fsdp_traffic_ratio=%.4f fsdp_bf16_traffic_ratio=%.4f zero2_per_bucket_speedup=%.3f "
              "zero2_exposed_ms_per_bucket=%.3f zero2_exposed_ms_contiguous=%.3f\n",
              state_ratio, traffic_ratio, speed_ratio, fsdp_param_ratio, fsdp_traffic, fsdp16_traffic, per_bucket_speedup,
              median(exposed_pb), median(exposed_c));
  return 0;
}
