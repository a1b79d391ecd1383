// bench_ddp: what distributed_data_parallel costs and gains on the example's host MLP
// (784-256-128-10, OpenBLAS with one thread per rank), in samples/s over the same batches:
//   1. a plain loop without partrain's policy: model.train_step + sgd.step
//   2. DDP at world size 1 (local backend): the policy's own overhead
//   3. DDP at 2 ranks over Gloo (two processes on this machine), overlap on and off
//   4. the same 2-rank run with the timeline on (trace spans for every step and bucket all_reduce)
// then the scaling at 2 ranks, how much gradient communication overlap hid, and what tracing costs.
//   bench_ddp [--quick] [--batch-size N] [--steps N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <unistd.h>
#include <vector>

#if defined(PARTRAIN_WITH_CUDA)
#include <cuda_runtime.h>
#endif

#include <partrain/comm/local.hpp>
#include <partrain/data/batch.hpp>
#include <partrain/data/fashion_mnist.hpp>
#include <partrain/launch/spawn.hpp>
#include <partrain/optim/sgd.hpp>
#include <partrain/parallel/ddp.hpp>
#include <partrain/rendezvous/init.hpp>
#include <partrain/train/trace.hpp>

#include "fashion_batches.hpp"
#include "mlp_host.hpp"

namespace {

using namespace partrain;
using clock_type = std::chrono::steady_clock;

struct config {
  std::size_t batch = 64;
  std::size_t steps = 300;
  std::size_t warmup = 20;
  int repeats = 3;
};

using partrain::bench::dataset_batches;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

double plain_loop(const std::vector<batch>& batches, const config& c) {
  models::mlp_host model({}, 0);
  sgd opt(model, {.lr = 0.05, .momentum = 0.9});
  for (std::size_t i = 0; i < c.warmup; ++i) {
    (void)model.train_step(batches[i]);
    opt.step();
  }
  const auto t0 = clock_type::now();
  for (std::size_t i = 0; i < c.steps; ++i) {
    (void)model.train_step(batches[c.warmup + i]);
    opt.step();
  }
  return static_cast<double>(c.steps * c.batch) / seconds_since(t0);
}

struct ddp_result {
  double samples_per_s = 0;
  double comm_ms = 0;  // per step: first bucket launch to last completion
  double wait_ms = 0;  // per step: what train_step waited for after the model's step
  double hidden = 0;   // fraction of communication time hidden by overlap
};

template <class Group>
ddp_result ddp_loop(Group& pg, const std::vector<batch>& batches, const config& c, bool overlap,
                    trace_recorder* trace = nullptr) {
  models::mlp_host model({}, 0);
  ddp_options o{.overlap = overlap};
  if (trace) o.on_bucket_launch = trace->bucket_spans();  // what the example does with --trace
  distributed_data_parallel ddp(model, pg, o);
  sgd opt(model, {.lr = 0.05, .momentum = 0.9});
  trace_recorder off;
  trace_recorder& rec = trace ? *trace : off;
  auto one_step = [&](const batch& b, std::size_t i) {
    auto step = rec.span("step", trace_track::step, "step", static_cast<std::int64_t>(i));
    auto fb = rec.span("forward_backward");
    (void)ddp.train_step(b);
    fb.end();
    auto os = rec.span("optimizer");
    opt.step();
  };
  for (std::size_t i = 0; i < c.warmup; ++i) one_step(batches[i], i);
  pg.barrier().wait();
  ddp.stats().reset_timing();
  const auto t0 = clock_type::now();
  for (std::size_t i = 0; i < c.steps; ++i) one_step(batches[c.warmup + i], c.warmup + i);
  pg.barrier().wait();  // the slowest rank decides the rate
  const double s = seconds_since(t0);
  const auto& st = ddp.stats();
  const double steps = static_cast<double>(std::max<std::size_t>(st.synced_steps, 1));
  return {static_cast<double>(c.steps * c.batch * static_cast<std::size_t>(pg.size())) / s,
          1e3 * st.comm_s / steps, 1e3 * st.wait_s / steps, st.hidden_fraction()};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void row(const char* mode, int ranks, const config& c, double sps, const ddp_result* d) {
  if (d) {
    std::printf("%-30s %5d %10zu %7zu %11.0f %13.3f %13.3f %8.2f\n", mode, ranks, c.batch, c.steps, sps, d->comm_ms,
                d->wait_ms, d->hidden);
  } else {
    std::printf("%-30s %5d %10zu %7zu %11.0f %13s %13s %8s\n", mode, ranks, c.batch, c.steps, sps, "-", "-", "-");
  }
}

bool gpu_present() {
#if defined(PARTRAIN_WITH_CUDA)
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
#else
  return false;
#endif
}

}  // namespace

int main(int argc, char** argv) {
  config c;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto next = [&]() -> std::size_t {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_ddp: %s needs a value\n", argv[i]);
        std::exit(2);
      }
      const long v = std::atol(argv[++i]);
      if (v <= 0) {
        std::fprintf(stderr, "bench_ddp: %s must be a positive integer, got '%s'\n", argv[i - 1], argv[i]);
        std::exit(2);
      }
      return static_cast<std::size_t>(v);
    };
    if (a == "--quick") {
      c.steps = 60;
      c.warmup = 5;
      c.repeats = 1;
    } else if (a == "--batch-size") {
      c.batch = next();
    } else if (a == "--steps") {
      c.steps = next();
    } else {
      std::fprintf(stderr, "bench_ddp: unknown option '%s' (expected --quick, --batch-size N, --steps N)\n", argv[i]);
      return 2;
    }
  }
  try {
    const in_memory_dataset train = partrain::bench::load_fashion_train();
    const std::size_t need = c.warmup + c.steps;

    std::printf("bench_ddp: MLP 784-256-128-10 on Fashion-MNIST, OpenBLAS 1 thread per rank, %u cores\n",
                std::max(1u, static_cast<unsigned>(sysconf(_SC_NPROCESSORS_ONLN))));
    std::printf("%-30s %5s %10s %7s %11s %13s %13s %8s\n", "mode", "ranks", "batch/rank", "steps", "samples/s",
                "comm ms/step", "wait ms/step", "hidden");

    // 1 and 2, interleaved so that drift in the machine's load hits both alike.
    const auto batches0 = dataset_batches(train, c.batch, need, 0);
    std::vector<double> plain, ddp1;
    ddp_result d1;
    auto world1 = make_local_world(1);
    for (int r = 0; r < c.repeats; ++r) {
      plain.push_back(plain_loop(batches0, c));
      d1 = ddp_loop(*world1[0], batches0, c, true);
      ddp1.push_back(d1.samples_per_s);
    }
    const double plain_sps = median(plain), ddp1_sps = median(ddp1);
    row("plain loop (no policy)", 1, c, plain_sps, nullptr);
    d1.samples_per_s = ddp1_sps;
    row("DDP world 1 (local)", 1, c, ddp1_sps, &d1);
    std::fflush(stdout);

    // 3: two processes; rank 0 writes its figures for this process to print.
    const std::filesystem::path result_file =
        std::filesystem::temp_directory_path() / ("bench_ddp_" + std::to_string(::getpid()) + ".txt");
    const std::filesystem::path trace_file =
        std::filesystem::temp_directory_path() / ("bench_ddp_" + std::to_string(::getpid()) + "_trace.json");
    spawn(2, [&](int rank) {
      auto pg = init_process_group("env://", {.backend = "gloo"});
      // Rank r starts r * need batches in, so the ranks train on different rows.
      const auto mine = dataset_batches(train, c.batch, need, static_cast<std::size_t>(rank) * need);
      // Overlap on, untraced and traced, interleaved (medians of the repeats); then overlap off.
      std::vector<ddp_result> ons, traceds;
      for (int r = 0; r < c.repeats; ++r) {
        ons.push_back(ddp_loop(*pg, mine, c, true));
        trace_recorder rec(trace_file);
        rec.start(*pg);
        traceds.push_back(ddp_loop(*pg, mine, c, true, &rec));
        (void)rec.finish(*pg);  // the merge is not timed
      }
      auto by_rate = [](const ddp_result& a, const ddp_result& b) { return a.samples_per_s < b.samples_per_s; };
      std::sort(ons.begin(), ons.end(), by_rate);
      std::sort(traceds.begin(), traceds.end(), by_rate);
      const ddp_result on = ons[ons.size() / 2];
      const ddp_result traced = traceds[traceds.size() / 2];
      const ddp_result off = ddp_loop(*pg, mine, c, false);
      if (rank == 0) {
        const auto tmp = result_file.string() + ".tmp";
        {
          std::ofstream out(tmp);
          out << on.samples_per_s << ' ' << on.comm_ms << ' ' << on.wait_ms << ' ' << on.hidden << '\n'
              << off.samples_per_s << ' ' << off.comm_ms << ' ' << off.wait_ms << ' ' << off.hidden << '\n'
              << traced.samples_per_s << ' ' << traced.comm_ms << ' ' << traced.wait_ms << ' ' << traced.hidden << '\n';
        }
        std::filesystem::rename(tmp, result_file);
      }
    });
    ddp_result on, off, traced;
    {
      std::ifstream in(result_file);
      in >> on.samples_per_s >> on.comm_ms >> on.wait_ms >> on.hidden >> off.samples_per_s >> off.comm_ms >>
          off.wait_ms >> off.hidden >> traced.samples_per_s >> traced.comm_ms >> traced.wait_ms >> traced.hidden;
      if (!in) throw error(error_kind::internal, "bench_ddp: rank 0 left no readable results in " + result_file.string());
    }
    std::filesystem::remove(result_file);
    std::filesystem::remove(trace_file);
    row("DDP 2 ranks gloo, overlap on", 2, c, on.samples_per_s, &on);
    row("DDP 2 ranks gloo, overlap off", 2, c, off.samples_per_s, &off);
    row("DDP 2 ranks gloo, on, traced", 2, c, traced.samples_per_s, &traced);
    // A second view of overlap that does not rely on DDP's own timers: the step time it saved,
    // against the communication time per step measured with overlap off.
    const double step_ms_on = 1e3 * 2.0 * static_cast<double>(c.batch) / on.samples_per_s;
    const double step_ms_off = 1e3 * 2.0 * static_cast<double>(c.batch) / off.samples_per_s;
    std::printf("overlap: step %.3f ms (on) vs %.3f ms (off); saved %.3f ms of %.3f ms communication per step\n",
                step_ms_on, step_ms_off, step_ms_off - step_ms_on, off.comm_ms);
    if (gpu_present()) {
      std::printf("cuda: a GPU is present, but this bench has no CUDA rows yet (mlp_cuda is tested by test_mlp_cuda)\n");
    } else {
      std::printf("cuda and PyTorch rows: skipped: no GPU\n");
    }
    // Tracing's cost as a fraction of the untraced step time (step time = 1 / rate); noise on a
    // busy machine can make it slightly negative.
    const double trace_overhead = on.samples_per_s / traced.samples_per_s - 1.0;
    std::printf("tracing: step %.3f ms (off) vs %.3f ms (on): overhead %.4f of the step\n", step_ms_on,
                1e3 * 2.0 * static_cast<double>(c.batch) / traced.samples_per_s, trace_overhead);
    std::printf("summary: ddp1_vs_plain=%.3f scaling_2=%.3f overlap_hidden=%.3f trace_overhead=%.4f\n",
                ddp1_sps / plain_sps, on.samples_per_s / (2.0 * ddp1_sps), on.hidden, trace_overhead);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_ddp: %s\n", e.what());
    return 1;
  }
  return 0;
}
