// examples/custom_cuda_model: the skeleton of your own model on a GPU. Its parameters live in
// device memory (device_buffer, on a device you name), forward and backward are its own kernels,
// and value()/grad() hand partrain tensor_view<float, cuda>: DDP averages the gradients (over NCCL,
// or staged through host memory for local and Gloo) and sgd steps them on the device.
// How to run it: `usage` below, which --help prints.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <partrain/cuda/device_buffer.hpp>
#include <partrain/cuda/device_guard.hpp>
#include <partrain/launch/run_ranks.hpp>
#include <partrain/optim/sgd.hpp>
#include <partrain/parallel/ddp.hpp>

namespace {

using partrain::device_buffer;
constexpr std::size_t features = 4;

// e[i] = w.x_i + b - y[i]: one thread per row.
__global__ void residual_kernel(const float* x, const float* y, const float* w, const float* b, std::size_t rows,
                                float* e) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= rows) return;
  float s = b[0] - y[i];
  for (std::size_t j = 0; j < features; ++j) s += w[j] * x[i * features + j];
  e[i] = s;
}

// Gradients of the mean squared error, written (DDP expects that): thread j < features sums
// 2 e_i x_ij / n into gw[j], thread `features` sums 2 e_i / n into gb. Tiny model, one block.
__global__ void gradient_kernel(const float* x, const float* e, std::size_t rows, float* gw, float* gb) {
  const std::size_t j = threadIdx.x;
  if (j > features) return;
  float s = 0;
  for (std::size_t i = 0; i < rows; ++i) s += 2 * e[i] * (j < features ? x[i * features + j] : 1.0f) / rows;
  if (j < features) {
    gw[j] = s;
  } else {
    *gb = s;
  }
}

struct param {  // value and gradient in the device memory of one GPU
  device_buffer<float> v, g;
  param(std::size_t n, partrain::device d) : v(n, d), g(n, d) {}
  partrain::tensor_view<float, partrain::cuda> value() { return v.view(); }
  partrain::tensor_view<float, partrain::cuda> grad() { return g.view(); }
};

struct batch {  // in host memory; train_step copies it to the GPU
  std::vector<float> x, y;
};

// y = w.x + b under mean squared error, on device `dev`.
struct linear_regression {
  partrain::device dev;
  std::vector<param> params;  // w, b (zero-filled by device_buffer)
  device_buffer<float> x, y, e;  // this step's batch and residuals

  explicit linear_regression(partrain::device d) : dev(d) {
    params.emplace_back(features, dev);
    params.emplace_back(1, dev);
  }
  std::vector<param>& parameters() { return params; }

  double train_step(const batch& data) {
    const std::size_t rows = data.y.size();
    if (e.size() != rows) {
      x = device_buffer<float>(rows * features, dev);
      y = device_buffer<float>(rows, dev);
      e = device_buffer<float>(rows, dev);
    }
    x.copy_from(data.x);  // finished on return
    y.copy_from(data.y);
    partrain::cuda_device_guard on(dev);  // kernels go to the current device
    residual_kernel<<<static_cast<unsigned>((rows + 255) / 256), 256>>>(x.data(), y.data(), params[0].v.data(),
                                                                         params[1].v.data(), rows, e.data());
    gradient_kernel<<<1, features + 1>>>(x.data(), e.data(), rows, params[0].g.data(), params[1].g.data());
    PARTRAIN_CUDA_CHECK(cudaGetLastError());
    std::vector<float> residuals(rows);
    e.copy_to(residuals);  // waits for the kernels: the gradients are final when we return
    double loss = 0;
    for (float r : residuals) loss += double(r) * r / double(rows);
    return loss;
  }
};

batch make_batch(int rank, int step) {
  std::mt19937 gen(static_cast<unsigned>(step * 100 + rank));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  batch data;
  for (int i = 0; i < 64; ++i) {
    for (std::size_t j = 0; j < features; ++j) data.x.push_back(u(gen));
    const float* x = &data.x[data.x.size() - features];
    data.y.push_back(1.0f * x[0] - 2.0f * x[1] + 3.0f * x[2] + 0.5f * x[3] + 0.25f);
  }
  return data;
}

constexpr char usage[] =
    "usage: custom_cuda_model [--help]\n"
    "Fits y = w.x + b with your own CUDA kernels under DDP; exits 77 (skipped) where no GPU answers.\n"
    "  build/examples/custom_cuda_model/custom_cuda_model      2 ranks as threads sharing the GPUs\n"
    "  partrun --standalone --nproc-per-node gpu build/examples/custom_cuda_model/custom_cuda_model\n"
    "                                                          one process per GPU (NCCL, else Gloo)\n"
    "Under a launcher (WORLD_SIZE set) it is one rank of the launcher's job on GPU LOCAL_RANK: it reads\n"
    "RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT.\n";

}  // namespace

int main(int argc, char** argv) try {
  for (int i = 1; i < argc; ++i) {  // no options but --help; anything else is refused by name
    if (std::string_view(argv[i]) != "--help" && std::string_view(argv[i]) != "-h") {
      std::fprintf(stderr, "custom_cuda_model: unknown argument '%s' (it takes no arguments but --help)\n", argv[i]);
      return 2;
    }
  }
  if (argc > 1) {
    std::fputs(usage, stdout);
    return 0;
  }
  int gpus = 0;
  if (const cudaError_t rc = cudaGetDeviceCount(&gpus); rc != cudaSuccess || gpus == 0) {
    std::printf("custom_cuda_model: skipped, no CUDA-capable device answers (%s)\n",
                rc == cudaSuccess ? "0 devices" : cudaGetErrorString(rc));
    return 77;  // what ctest's SKIP_RETURN_CODE reports as Skipped
  }
  // Under a launcher each process is one rank on GPU LOCAL_RANK; run directly, 2 threads.
  const bool launched = std::getenv("WORLD_SIZE") != nullptr;
#if PARTRAIN_WITH_NCCL  // set by partrain::nccl
  const char* launched_backend = "nccl";
#else
  const char* launched_backend = "gloo";
#endif
  partrain::run_ranks({.nproc = launched ? 0 : 2, .backend = launched ? launched_backend : "local"},
                      [&](partrain::process_group& pg) {
    const char* local_rank = std::getenv("LOCAL_RANK");
    const auto dev = partrain::device::cuda(launched && local_rank ? std::atoi(local_rank) : pg.rank() % gpus);
    linear_regression model(dev);
    partrain::distributed_data_parallel ddp(model, pg);
    partrain::sgd opt(model, {.lr = 0.1});
    double loss = 0;
    for (int step = 0; step < 100; ++step) {
      loss = ddp.train_step(make_batch(pg.rank(), step));
      opt.step();
      if (pg.rank() == 0 && step % 20 == 0) std::printf("step %3d  loss %.6f\n", step, loss);
    }
    std::vector<float> w(features);
    model.params[0].v.copy_to(w);
    if (pg.rank() == 0) {
      std::printf("w = [%.3f %.3f %.3f %.3f] on %s, %d rank(s) over %s\n", w[0], w[1], w[2], w[3],
                  dev.to_string().c_str(), pg.size(), std::string(pg.backend()).c_str());
      std::printf("final loss %.6f\n", loss);
    }
  });
} catch (const std::exception& e) {
  std::fprintf(stderr, "custom_cuda_model: %s\n", e.what());
  return 1;
}
