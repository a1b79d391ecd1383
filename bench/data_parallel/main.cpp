// bench_data_parallel: samples/s of the example's host MLP (784-256-128-10, one OpenBLAS thread
// per device) trained with data_parallel on 1 and 2 host devices, with the time per phase
// (scatter, compute, gradient reduce, optimizer step / broadcast), both sync modes, and DDP at
// 2 ranks of the local backend when parallel/ddp.hpp is present. Never pass/fail on time.
//   bench_data_parallel [--quick] [--batch N] [--steps N]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <partrain/comm/local.hpp>
#include <partrain/data/batch.hpp>
#include <partrain/optim/sgd.hpp>
#include <partrain/parallel/data_parallel.hpp>

#if __has_include(<partrain/parallel/ddp.hpp>)
#include <partrain/parallel/ddp.hpp>
#define BENCH_HAVE_DDP 1
#else
#define BENCH_HAVE_DDP 0
#endif

#include "mlp_host.hpp"

using namespace partrain;
using model_t = models::mlp_host;
using clock_type = std::chrono::steady_clock;

namespace {

struct synthetic_data {
  std::size_t n, in = 784;
  std::vector<float> x;
  std::vector<std::int32_t> y;
  std::vector<std::size_t> idx;
  explicit synthetic_data(std::size_t n_) : n(n_), x(n_ * 784), y(n_), idx(n_) {
    std::uint64_t s = 42;
    for (std::size_t i = 0; i < n; ++i) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      y[i] = static_cast<std::int32_t>((s >> 33) % 10);
      idx[i] = i;
      for (std::size_t j = 0; j < in; ++j) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i * in + j] = static_cast<float>((s >> 40) % 256) / 255.0f;
      }
    }
  }
  [[nodiscard]] batch rows(std::size_t first, std::size_t m) const {
    return {tensor_view<const float>(x.data() + first * in, shape{m, in}), tensor_view<const std::int32_t>(y.data() + first, m),
            std::span<const std::size_t>(idx.data() + first, m)};
  }
};

struct result {
  std::string name;
  double samples_per_s = 0;
  dp_phase_times per_step{};  // ms per step, when the run has them
  bool has_phases = false;
};

const sgd_options opt_cfg{.lr = 0.05, .momentum = 0.9};

result run_plain(const synthetic_data& d, std::size_t bs, int warm, int steps) {
  model_t m;
  sgd<model_t> opt(m, opt_cfg);
  const std::size_t nb = d.n / bs;
  for (int s = 0; s < warm; ++s) {
    (void)m.train_step(d.rows((static_cast<std::size_t>(s) % nb) * bs, bs));
    opt.step();
  }
  const auto t0 = clock_type::now();
  for (int s = 0; s < steps; ++s) {
    (void)m.train_step(d.rows((static_cast<std::size_t>(s) % nb) * bs, bs));
    opt.step();
  }
  const double sec = std::chrono::duration<double>(clock_type::now() - t0).count();
  return {"plain loop (no partrain)", static_cast<double>(bs) * steps / sec, {}, false};
}

result run_dp(const synthetic_data& d, std::size_t bs, int warm, int steps, int devices, dp_sync sync) {
  model_t m;
  std::vector<device> devs;
  for (int i = 0; i < devices; ++i) devs.push_back(device::cpu(i));
  data_parallel dp(m, devs, [](model_t& r) { return sgd<model_t>(r, opt_cfg); }, {.sync = sync});
  const std::size_t nb = d.n / bs;
  for (int s = 0; s < warm; ++s) (void)dp.train_step(d.rows((static_cast<std::size_t>(s) % nb) * bs, bs));
  const auto before = dp.stats().sum;
  const auto t0 = clock_type::now();
  for (int s = 0; s < steps; ++s) (void)dp.train_step(d.rows((static_cast<std::size_t>(s) % nb) * bs, bs));
  const double sec = std::chrono::duration<double>(clock_type::now() - t0).count();
  auto sum = dp.stats().sum;
  const double k = 1000.0 / steps;
  dp_phase_times per{(sum.scatter_s - before.scatter_s) * k, (sum.compute_s - before.compute_s) * k,
                     (sum.reduce_s - before.reduce_s) * k, (sum.update_s - before.update_s) * k,
                     (sum.total_s - before.total_s) * k};
  std::string name = "data_parallel " + std::to_string(devices) + " dev, " +
                     (sync == dp_sync::all_reduce ? "all_reduce" : "reduce+broadcast");
  return {name, static_cast<double>(bs) * steps / sec, per, true};
}

#if BENCH_HAVE_DDP
// DDP at 2 ranks of the local backend (threads), each rank on half the global batch.
result run_ddp2(const synthetic_data& d, std::size_t bs, int warm, int steps) {
  std::vector<double> secs(2);
  run_local(2, [&](local_group& g) {
    model_t m;
    distributed_data_parallel<model_t> ddp(m, g);
    sgd<model_t> opt(m, opt_cfg);
    const std::size_t half = bs / 2, nb = d.n / bs;
    auto shard = [&](int s) {
      return d.rows((static_cast<std::size_t>(s) % nb) * bs + static_cast<std::size_t>(g.rank()) * half, half);
    };
    for (int s = 0; s < warm; ++s) {
      (void)ddp.train_step(shard(s));
      opt.step();
    }
    g.barrier().wait();
    const auto t0 = clock_type::now();
    for (int s = 0; s < steps; ++s) {
      (void)ddp.train_step(shard(s));
      opt.step();
    }
    g.barrier().wait();
    secs[static_cast<std::size_t>(g.rank())] = std::chrono::duration<double>(clock_type::now() - t0).count();
  });
  return {"DDP 2 ranks (local backend)", static_cast<double>(bs / 2 * 2) * steps / std::max(secs[0], secs[1]), {}, false};
}
#endif

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  std::size_t bs = 256;
  int steps = 60;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      quick = true;
    } else if (a == "--batch" && i + 1 < argc) {
      bs = static_cast<std::size_t>(std::stoul(argv[++i]));
    } else if (a == "--steps" && i + 1 < argc) {
      steps = std::stoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: bench_data_parallel [--quick] [--batch N] [--steps N]\n");
      return 2;
    }
  }
  if (quick) steps = std::min(steps, 10);
  const int warm = quick ? 2 : 5;
  const synthetic_data data(bs * 8);

  std::vector<result> rs;
  rs.push_back(run_plain(data, bs, warm, steps));
  rs.push_back(run_dp(data, bs, warm, steps, 1, dp_sync::all_reduce));
  rs.push_back(run_dp(data, bs, warm, steps, 2, dp_sync::all_reduce));
  rs.push_back(run_dp(data, bs, warm, steps, 2, dp_sync::reduce_broadcast));
#if BENCH_HAVE_DDP
  rs.push_back(run_ddp2(data, bs, warm, steps));
#endif

  std::printf("bench_data_parallel: host MLP 784-256-128-10, global batch %zu, %d timed steps (%d warm-up)\n", bs,
              steps, warm);
  std::printf("%-40s %12s %9s %9s %9s %9s %9s\n", "configuration", "samples/s", "scatter", "compute", "reduce",
              "update", "step ms");
  for (const auto& r : rs) {
    if (r.has_phases) {
      std::printf("%-40s %12.0f %9.3f %9.3f %9.3f %9.3f %9.3f\n", r.name.c_str(), r.samples_per_s, r.per_step.scatter_s,
                  r.per_step.compute_s, r.per_step.reduce_s, r.per_step.update_s, r.per_step.total_s);
    } else {
      std::printf("%-40s %12.0f %9s %9s %9s %9s %9s\n", r.name.c_str(), r.samples_per_s, "-", "-", "-", "-", "-");
    }
  }
  std::printf("(phase columns: ms per step; compute = slowest device's train_step, reduce = gradient collective,\n"
              " update = optimizer step, plus the parameter broadcast in reduce+broadcast mode)\n");
#if !BENCH_HAVE_DDP
  std::printf("DDP: skipped (partrain/parallel/ddp.hpp not present in this build)\n");
#endif
  std::printf("CUDA model: skipped (no GPU on this machine)\n");
  const double dp1 = rs[1].samples_per_s, dp2 = rs[2].samples_per_s, dp2rb = rs[3].samples_per_s;
  std::printf("summary: dp2_vs_dp1=%.3f dp1_vs_plain=%.3f allreduce_vs_reduce_broadcast=%.3f", dp2 / dp1,
              dp1 / rs[0].samples_per_s, dp2 / dp2rb);
#if BENCH_HAVE_DDP
  std::printf(" ddp2_vs_dp2=%.3f", rs[4].samples_per_s / dp2);
#endif
  std::printf("\n");
  return 0;
}
