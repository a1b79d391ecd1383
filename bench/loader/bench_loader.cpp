// bench_loader: how fast the loader assembles shuffled 256-example batches of Fashion-MNIST
// (a gather of 784-float rows into one buffer), against a plain memcpy of the same bytes, with
// and without prefetch; then a training loop that sleeps for a step time and counts how often
// it had to wait for the loader.
//
//   bench_loader [--epochs N] [--batch B] [--step-us U] [--dir PATH]
//
// Never fails on time; the last line is `summary: loader_vs_memcpy=<ratio> ...`.
#include <partrain/data/fashion_mnist.hpp>
#include <partrain/data/loader.hpp>
#include <partrain/data/shuffled.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

using namespace partrain;
using clock_type = std::chrono::steady_clock;

namespace {

struct result {
  std::string name;
  std::size_t batches = 0;
  double seconds = 0;
  double bytes = 0;
  [[nodiscard]] double batches_per_s() const { return static_cast<double>(batches) / seconds; }
  [[nodiscard]] double gb_per_s() const { return bytes / seconds / 1e9; }
};

// Keeps the optimiser from dropping work whose result is never used.
volatile float sink = 0;

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t epochs = 3, batch_size = 256;
  double step_us = -1;  // default: twice the measured synchronous assembly time per batch
  std::filesystem::path dir = fashion_mnist_dir();
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    const auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_loader: %s needs a value\n", argv[i]);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--epochs") epochs = std::stoul(next());
    else if (a == "--batch") batch_size = std::stoul(next());
    else if (a == "--step-us") step_us = std::stod(next());
    else if (a == "--dir") dir = next();
    else {
      std::fprintf(stderr, "usage: bench_loader [--epochs N] [--batch B] [--step-us U] [--dir PATH]\n");
      return 2;
    }
  }

  const auto t_load = clock_type::now();
  const in_memory_dataset ds = load_fashion_mnist(fashion_mnist_split::train, {}, dir);
  std::printf("loaded %zu examples of %zu floats from %s in %.2f s\n", ds.size(), ds.example_shape().numel(),
              dir.c_str(), seconds_since(t_load));

  const std::size_t row = ds.example_shape().numel();
  const std::size_t per_epoch = ds.size() / batch_size;  // drop_last: every batch is full
  const double batch_bytes = static_cast<double>(batch_size * (row * sizeof(float) + sizeof(std::int32_t)));
  std::vector<result> results;

  // 1. memcpy of the same bytes: contiguous runs of rows (and labels) into a batch buffer.
  {
    host_buffer<float> fbuf(batch_size * row);
    std::vector<std::int32_t> lbuf(batch_size);
    const float* src = ds.features().data();
    const std::int32_t* lsrc = ds.labels().data();
    result r{"memcpy, same bytes (contiguous)"};
    const auto t0 = clock_type::now();
    for (std::size_t e = 0; e < epochs; ++e) {
      for (std::size_t k = 0; k < per_epoch; ++k) {
        std::memcpy(fbuf.data(), src + k * batch_size * row, batch_size * row * sizeof(float));
        std::memcpy(lbuf.data(), lsrc + k * batch_size, batch_size * sizeof(std::int32_t));
        sink = sink + fbuf[k % fbuf.size()];
        ++r.batches;
      }
    }
    r.seconds = seconds_since(t0);
    r.bytes = batch_bytes * static_cast<double>(r.batches);
    results.push_back(r);
  }

  // 2. The loader: shuffled gather into its batch buffer, on this thread or ahead on another.
  for (std::size_t prefetch : {std::size_t{0}, std::size_t{2}}) {
    loader l(ds, views::shuffled(ds.size(), 0), {.batch_size = batch_size, .drop_last = true, .prefetch = prefetch});
    result r{prefetch == 0 ? "loader, shuffled, prefetch=0" : "loader, shuffled, prefetch=2"};
    const auto t0 = clock_type::now();
    for (std::size_t e = 0; e < epochs; ++e) {
      l.set_epoch(e);
      for (const batch& b : l) {
        sink = sink + b.features[0];
        ++r.batches;
      }
    }
    r.seconds = seconds_since(t0);
    r.bytes = batch_bytes * static_cast<double>(r.batches);
    results.push_back(r);
  }

  const double memcpy_gbs = results[0].gb_per_s();
  std::printf("\n%-34s %10s %12s %9s %10s\n", "batch assembly (256 x 784 floats)", "batches", "batches/s", "GB/s",
              "vs memcpy");
  for (const auto& r : results) {
    std::printf("%-34s %10zu %12.0f %9.2f %9.0f%%\n", r.name.c_str(), r.batches, r.batches_per_s(), r.gb_per_s(),
                100.0 * r.gb_per_s() / memcpy_gbs);
  }

  // 3. A training loop that sleeps for the step time: does it ever wait for the loader?
  const double assembly_us = 1e6 / results[1].batches_per_s();
  if (step_us < 0) step_us = 2.0 * assembly_us;
  std::printf("\ntraining loop sleeping %.0f us per step (synchronous assembly: %.0f us per batch)\n", step_us,
              assembly_us);
  std::printf("%-10s %8s %14s %14s\n", "prefetch", "steps", "waited", "wait ms");
  std::vector<std::size_t> loop_waits;
  for (std::size_t prefetch : {std::size_t{2}, std::size_t{4}}) {
    loader l(ds, views::shuffled(ds.size(), 0), {.batch_size = batch_size, .drop_last = true, .prefetch = prefetch});
    std::size_t steps = 0, late = 0;
    std::chrono::nanoseconds late_time{0};
    for (std::size_t e = 0; e < epochs; ++e) {
      l.set_epoch(e);
      auto it = l.begin();  // the first batch of an epoch cannot be ahead: not counted
      l.reset_stats();
      for (; it != l.end(); ++it) {
        sink = sink + it->features[0];
        std::this_thread::sleep_for(std::chrono::duration<double, std::micro>(step_us));
        ++steps;
      }
      late += l.stats().waits;
      late_time += l.stats().wait_time;
    }
    std::printf("%-10zu %8zu %14zu %14.2f\n", prefetch, steps, late,
                std::chrono::duration<double, std::milli>(late_time).count());
    loop_waits.push_back(late);
  }

  std::printf("summary: loader_vs_memcpy=%.2f loader_gbs=%.2f memcpy_gbs=%.2f prefetch_batches_per_s=%.0f "
              "step_us=%.0f loop_waits_prefetch2=%zu loop_waits_prefetch4=%zu\n",
              results[1].gb_per_s() / memcpy_gbs, results[1].gb_per_s(), memcpy_gbs, results[2].batches_per_s(),
              step_us, loop_waits[0], loop_waits[1]);
  return 0;
}
