// partrain/data/device_stager.hpp: moves the loader's host batches to a GPU without stalling compute.
// Each batch is copied into pinned (page-locked) host memory, then to the device with
// cudaMemcpyAsync on the stager's own stream; the compute stream waits on an event, not the host,
// so the copy of batch k+1 runs while kernels work on batch k.
//
//   device_stager stage(device_id, {.max_rows = 256, .example_shape = ds.example_shape()});
//   for (const batch& b : loader) {
//     const device_batch& d = stage(b, compute_stream);  // enqueued; compute_stream waits for it
//     launch_train_step(d.features, d.labels, compute_stream);
//   }
//
// A device_batch stays valid until `depth` further calls (slots are reused in a ring; reuse waits
// on the GPU for the compute work issued between the stage() calls). Needs the CUDA runtime
// (link partrain::cuda); the loader could fill pinned memory directly, which would save the
// host-side copy: not done yet.
// partrain-facade: if PARTRAIN_HAS_CUDA
#pragma once

#include <partrain/config.hpp>

#if !PARTRAIN_HAS_CUDA
#error "partrain/data/device_stager.hpp needs the CUDA runtime: link partrain::cuda or compile with nvcc"
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <partrain/core/error.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/cuda/check.hpp>
#include <partrain/cuda/device_buffer.hpp>
#include <partrain/cuda/device_guard.hpp>
#include <partrain/cuda/event.hpp>
#include <partrain/cuda/pinned_buffer.hpp>
#include <partrain/cuda/stream.hpp>
#include <partrain/data/batch.hpp>

namespace partrain::inline v0 {

// A batch on the device. Labels and features are device pointers; indices stay on the host.
struct device_batch {
  tensor_view<const float, cuda> features;        // [n, example dims...]
  tensor_view<const std::int32_t, cuda> labels;   // [n]
  std::span<const std::size_t> indices;           // the host batch's indices (valid as it is)
  cudaEvent_t ready = nullptr;                    // recorded on the copy stream after the copy
  [[nodiscard]] std::size_t size() const noexcept { return labels.size(); }
};

struct staging_options {
  std::size_t max_rows = 256;  // the largest batch to stage
  shape example_shape{};       // one example's features, e.g. {784}
  std::size_t depth = 2;       // batches in flight: 2 lets the copy of k+1 overlap compute on k
};

class device_stager {
 public:
  device_stager(int device, staging_options options) : device_(device), options_(options) {
    if (options_.depth < 1) throw invalid_argument_error("device_stager: depth is 0, expected at least 1");
    if (options_.example_shape.rank() + 1 > max_rank) {
      throw invalid_argument_error("device_stager: example_shape " + options_.example_shape.to_string() +
                                   " has too many dimensions");
    }
    row_ = options_.example_shape.numel();
    cuda_device_guard guard(device_);
    stream_ = std::make_unique<cuda_stream>(device_);
    for (std::size_t i = 0; i < options_.depth; ++i) slots_.emplace_back(options_.max_rows, row_, device_);
  }
  device_stager(const device_stager&) = delete;
  device_stager& operator=(const device_stager&) = delete;
  ~device_stager() {
    if (stream_) (void)cudaStreamSynchronize(stream_->get());  // no copy may outlive its buffers
  }

  // Enqueues the copy of `b` and makes `compute` wait for it (on the GPU; the host goes on).
  const device_batch& operator()(const batch& b, cudaStream_t compute) {
    if (b.size() > options_.max_rows) {
      throw invalid_argument_error("device_stager: batch of " + std::to_string(b.size()) + " rows, expected at most " +
                                   std::to_string(options_.max_rows) + " (staging_options::max_rows)");
    }
    if (b.features.size() != b.size() * row_) {
      throw invalid_argument_error("device_stager: batch features have shape " + b.features.shape().to_string() +
                                   ", expected rows of " + options_.example_shape.to_string());
    }
    cuda_device_guard guard(device_);
    // Work issued on `compute` since the last call used the previous batch: mark its slot's release.
    if (count_ > 0) {
      slot& prev = slots_[(count_ - 1) % slots_.size()];
      prev.released.record(compute);
      prev.has_release = true;
    }
    slot& s = slots_[count_ % slots_.size()];
    // The pinned buffer is free once its previous copy finished (host wait, usually already done);
    // the device buffer is free once compute on its previous batch finished (GPU wait).
    if (s.used) PARTRAIN_CUDA_CHECK(cudaEventSynchronize(s.copied.get()));
    if (s.has_release) PARTRAIN_CUDA_CHECK(cudaStreamWaitEvent(stream_->get(), s.released.get(), 0));
    const std::size_t n = b.size();
    std::memcpy(s.host_features.data(), b.features.data(), b.features.size_bytes());
    std::memcpy(s.host_labels.data(), b.labels.data(), b.labels.size_bytes());
    PARTRAIN_CUDA_CHECK(cudaMemcpyAsync(s.dev_features.data(), s.host_features.data(), b.features.size_bytes(),
                                        cudaMemcpyHostToDevice, stream_->get()));
    PARTRAIN_CUDA_CHECK(cudaMemcpyAsync(s.dev_labels.data(), s.host_labels.data(), b.labels.size_bytes(),
                                        cudaMemcpyHostToDevice, stream_->get()));
    s.copied.record(stream_->get());
    PARTRAIN_CUDA_CHECK(cudaStreamWaitEvent(compute, s.copied.get(), 0));
    s.used = true;
    ++count_;
    s.view = device_batch{tensor_view<const float, cuda>(s.dev_features.data(), b.features.shape()),
                          tensor_view<const std::int32_t, cuda>(s.dev_labels.data(), n), b.indices, s.copied.get()};
    return s.view;
  }

  [[nodiscard]] cudaStream_t copy_stream() const noexcept { return stream_->get(); }
  [[nodiscard]] int device() const noexcept { return device_; }

 private:
  struct slot {
    slot(std::size_t rows, std::size_t row, int dev)
        : host_features(rows * row, dev), host_labels(rows, dev), dev_features(rows * row, dev), dev_labels(rows, dev) {}
    pinned_buffer<float> host_features;
    pinned_buffer<std::int32_t> host_labels;
    device_buffer<float> dev_features;
    device_buffer<std::int32_t> dev_labels;
    cuda_event copied;
    cuda_event released;
    bool used = false;
    bool has_release = false;
    device_batch view{};
  };

  int device_;
  staging_options options_;
  std::size_t row_ = 0;
  std::unique_ptr<cuda_stream> stream_;
  std::vector<slot> slots_;
  std::size_t count_ = 0;
};

}  // namespace partrain::inline v0
