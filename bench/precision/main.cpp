// bench_precision: samples/s and peak model memory of the example's MLP trained in fp32, fp16
// and bf16 (mixed precision: fp32 masters, 16-bit copy, amp_step with a dynamic loss scale for
// fp16), on the host and, in the nvcc build (bench_precision_cuda) on a GPU machine, on CUDA.
// The precisions run interleaved, repeated, and the median is reported, so drifting machine load
// hits them alike. Host 16-bit is storage only (fp32 arithmetic plus conversions): it is the
// correct path, not a fast one. The GPU target (16-bit >= 1.5x fp32) is measured on CUDA rows,
// with wider layers and a batch size where the GEMMs dominate (both printed).
//   bench_precision [--quick] [--batch-size N] [--steps N] [--widths 784,1024,1024,10]
//                   [--cuda-batch-size N] [--cuda-widths ...]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <partrain/data/batch.hpp>
#include <partrain/data/fashion_mnist.hpp>
#include <partrain/optim/sgd.hpp>
#include <partrain/precision/mixed_precision.hpp>

#include "fashion_batches.hpp"
#include "median.hpp"
#include "mlp_host.hpp"
#if defined(__CUDACC__)
#include "mlp_cuda.cuh"
#endif

namespace {

using namespace partrain;
using clock_type = std::chrono::steady_clock;

struct config {
  std::size_t batch = 256;
  std::size_t steps = 60;
  std::size_t warmup = 5;
  int repeats = 3;
  std::vector<std::size_t> widths{784, 256, 128, 10};
  std::size_t cuda_batch = 8192;
  std::size_t cuda_steps = 200;
  std::vector<std::size_t> cuda_widths{784, 4096, 4096, 10};
};

std::vector<std::size_t> parse_widths(std::string_view s) {
  std::vector<std::size_t> w;
  std::stringstream in{std::string(s)};
  for (std::string part; std::getline(in, part, ',');) w.push_back(static_cast<std::size_t>(std::stoul(part)));
  if (w.size() < 2 || w.front() != 784 || w.back() != 10) {
    std::fprintf(stderr, "bench_precision: --widths must start at 784 (the pixels) and end at 10 (the classes)\n");
    std::exit(2);
  }
  return w;
}

using partrain::bench::dataset_batches;

struct measurement {
  double samples_per_s = 0;
  std::size_t model_bytes = 0;
  std::size_t skipped = 0;
  float final_scale = 1;
  double last_loss = 0;
};

// One timed run of `steps` amp_steps on a fresh model. `sync` waits for the device (CUDA).
template <class Model, class Sync>
measurement timed_run(Model& model, precision p, const std::vector<batch>& batches, std::size_t warmup,
                      std::size_t steps, Sync sync) {
  sgd opt(model, {.lr = 0.05, .momentum = 0.9});
  grad_scaler scaler = mixed_precision_policy{.compute = p}.make_scaler();
  measurement m;
  for (std::size_t i = 0; i < warmup; ++i) (void)amp_step(model, opt, scaler, batches[i % batches.size()]);
  sync();
  const auto t0 = clock_type::now();
  for (std::size_t i = 0; i < steps; ++i) {
    const auto r = amp_step(model, opt, scaler, batches[(warmup + i) % batches.size()]);
    m.skipped += r.skipped ? 1 : 0;
    m.last_loss = r.loss;
  }
  sync();
  const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
  m.samples_per_s = static_cast<double>(steps * batches.front().size()) / s;
  m.model_bytes = model.memory_bytes();
  m.final_scale = scaler.scale();
  return m;
}

using ::partrain::bench::median;

std::string widths_text(const std::vector<std::size_t>& w) {
  std::string s;
  for (auto x : w) {
    if (!s.empty()) s += '-';
    s += std::to_string(x);
  }
  return s;
}

constexpr precision all_precisions[] = {precision::fp32, precision::fp16, precision::bf16};

struct table_rows {
  double sps[3] = {0, 0, 0};
};

// Interleaves the precisions over the repeats; prints one row per precision.
template <class MakeModel, class Sync>
table_rows measure(const char* where, const std::vector<batch>& batches, const std::vector<std::size_t>& widths,
                   std::size_t batch_size, std::size_t warmup, std::size_t steps, int repeats, MakeModel make, Sync sync) {
  std::vector<double> sps[3];
  measurement last[3];
  for (int r = 0; r < repeats; ++r) {
    for (int k = 0; k < 3; ++k) {
      auto model = make(all_precisions[k]);
      last[k] = timed_run(*model, all_precisions[k], batches, warmup, steps, sync);
      sps[k].push_back(last[k].samples_per_s);
    }
  }
  table_rows t;
  for (int k = 0; k < 3; ++k) {
    t.sps[k] = median(sps[k]);
    std::printf("%-6s %-6s %-18s %7zu %6zu %12.0f %9.3f %12.2f %8zu %10g %9.4f\n", where,
                std::string(to_string(all_precisions[k])).c_str(), widths_text(widths).c_str(), batch_size, steps,
                t.sps[k], t.sps[k] / t.sps[0], static_cast<double>(last[k].model_bytes) / (1 << 20), last[k].skipped,
                static_cast<double>(last[k].final_scale), last[k].last_loss);
  }
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  config c;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto next = [&]() -> std::string_view {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_precision: %s needs a value\n", argv[i]);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--quick") {
      quick = true;
    } else if (a == "--batch-size") {
      c.batch = static_cast<std::size_t>(std::stoul(std::string(next())));
    } else if (a == "--steps") {
      c.steps = static_cast<std::size_t>(std::stoul(std::string(next())));
    } else if (a == "--widths") {
      c.widths = parse_widths(next());
    } else if (a == "--cuda-batch-size") {
      c.cuda_batch = static_cast<std::size_t>(std::stoul(std::string(next())));
    } else if (a == "--cuda-widths") {
      c.cuda_widths = parse_widths(next());
    } else {
      std::fprintf(stderr,
                   "bench_precision: unknown option '%s' (expected --quick, --batch-size N, --steps N, --widths W, "
                   "--cuda-batch-size N, --cuda-widths W)\n",
                   argv[i]);
      return 2;
    }
  }
  if (quick) {
    c.steps = 8;
    c.warmup = 2;
    c.repeats = 1;
    c.cuda_steps = 20;
  }
  try {
    const in_memory_dataset train = partrain::bench::load_fashion_train();
    std::printf("bench_precision: the example MLP trained with amp_step (sgd, momentum 0.9); samples/s is the median "
                "of %d interleaved runs; memory is the model's buffers (masters, grads, 16-bit copy, activations)\n",
                c.repeats);
    std::printf("%-6s %-6s %-18s %7s %6s %12s %9s %12s %8s %10s %9s\n", "where", "prec", "widths", "batch", "steps",
                "samples/s", "vs_fp32", "model_MiB", "skipped", "scale", "loss");
    const auto host_batches = dataset_batches(train, c.batch, c.warmup + c.steps);
    const table_rows host = measure(
        "host", host_batches, c.widths, c.batch, c.warmup, c.steps, c.repeats,
        [&](precision p) { return std::make_unique<models::mlp_host>(models::mlp_layout{c.widths}, 0, p); }, [] {});
    double fp16_ratio = host.sps[1] / host.sps[0];
    double bf16_ratio = host.sps[2] / host.sps[0];
    std::string device_name = "cpu";
#if defined(__CUDACC__)
    int devices = 0;
    if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0) {
      cudaDeviceProp prop{};
      (void)cudaGetDeviceProperties(&prop, 0);
      device_name = prop.name;
      for (char& ch : device_name) {
        if (ch == ' ') ch = '_';
      }
      const auto cuda_batches = dataset_batches(train, c.cuda_batch, 8);
      const table_rows gpu = measure(
          "cuda", cuda_batches, c.cuda_widths, c.cuda_batch, c.warmup, c.cuda_steps, c.repeats,
          [&](precision p) {
            return std::make_unique<models::mlp_cuda>(models::mlp_layout{c.cuda_widths}, 0, device::cuda(0), p);
          },
          [] { (void)cudaDeviceSynchronize(); });
      fp16_ratio = gpu.sps[1] / gpu.sps[0];
      bf16_ratio = gpu.sps[2] / gpu.sps[0];
    } else {
      std::printf("cuda: no GPU visible; CUDA rows not measured\n");
    }
#else
    std::printf("cuda: host build (bench_precision_cuda, built by nvcc, measures the CUDA rows on a GPU)\n");
#endif
    std::printf("summary: fp16_vs_fp32=%.3f bf16_vs_fp32=%.3f device=%s\n", fp16_ratio, bf16_ratio, device_name.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_precision: %s\n", e.what());
    return 1;
  }
  return 0;
}
