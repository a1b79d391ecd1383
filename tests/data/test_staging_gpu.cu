// device_stager on a GPU: every staged batch, copied back from the device, equals the host batch,
// across more batches than slots (so slot reuse and the release events are exercised). Skips
// itself, saying so, when no GPU is present.
#include <catch2/catch.hpp>

#include <partrain/cuda/device_buffer.hpp>
#include <partrain/data/device_stager.hpp>
#include <partrain/data/in_memory_dataset.hpp>
#include <partrain/data/loader.hpp>
#include <partrain/data/shuffled.hpp>

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

using namespace partrain;

namespace {
// Adds 1 to every feature, so the test sees compute ordered after the copy on the compute stream.
__global__ void add_one(const float* in, float* out, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = in[i] + 1.0f;
}
}  // namespace

TEST_CASE("device_stager copies every batch to the device in order", "[data][cuda][gpu]") {
  const std::size_t n = 300, row = 784;
  host_buffer<float> x(shape{n, row});
  std::vector<std::int32_t> y(n);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < row; ++j) x[i * row + j] = static_cast<float>(i) + static_cast<float>(j) * 1e-3f;
    y[i] = static_cast<std::int32_t>(i % 10);
  }
  const in_memory_dataset ds(std::move(x), std::move(y), 10);
  loader l(ds, views::shuffled(n, 5), {.batch_size = 32, .prefetch = 2});
  device_stager stage(0, {.max_rows = 32, .example_shape = ds.example_shape(), .depth = 2});

  cudaStream_t compute = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking) == cudaSuccess);
  device_buffer<float> out_buffer(32 * row, 0);
  float* out = out_buffer.data();
  std::vector<float> back(32 * row);
  std::vector<std::int32_t> labels(32);
  std::size_t batches = 0;
  for (const batch& b : l) {
    const device_batch& d = stage(b, compute);
    REQUIRE(d.size() == b.size());
    const std::size_t count = d.features.size();
    add_one<<<static_cast<unsigned>((count + 255) / 256), 256, 0, compute>>>(d.features.data(), out, count);
    REQUIRE(cudaMemcpyAsync(back.data(), out, count * sizeof(float), cudaMemcpyDeviceToHost, compute) == cudaSuccess);
    REQUIRE(cudaMemcpyAsync(labels.data(), d.labels.data(), d.size() * sizeof(std::int32_t), cudaMemcpyDeviceToHost,
                            compute) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(compute) == cudaSuccess);
    for (std::size_t k = 0; k < count; ++k) REQUIRE(back[k] == b.features[k] + 1.0f);
    for (std::size_t k = 0; k < b.size(); ++k) REQUIRE(labels[k] == b.labels[k]);
    ++batches;
  }
  CHECK(batches == (n + 31) / 32);
  CHECK(cudaStreamDestroy(compute) == cudaSuccess);
}
