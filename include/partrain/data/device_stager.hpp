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
#include <partrain/cuda/device_guard.hpp>
#include <partrain/data/batch.hpp>

namespace partrain::inline v0 {

namespace detail {

inline void staging_check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) {
    throw error(error_kind::internal, std::string("device_stager: ") + what + " failed: " + cudaGetErrorString(rc));
  }
}

// RAII for the four CUDA handles the stager owns. Destruction never throws (errors are ignored:
// the context may already be torn down at exit).
template <class T>
class pinned_block {
 public:
  pinned_block() = default;
  explicit pinned_block(std::size_t n) : n_(n) {
    if (n) staging_check(cudaHostAlloc(reinterpret_cast<void**>(&p_), n * sizeof(T), cudaHostAllocDefault), "cudaHostAlloc");
  }
  pinned_block(pinned_block&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  pinned_block& operator=(pinned_block&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  ~pinned_block() {
    if (p_) (void)cudaFreeHost(p_);
  }
  [[nodiscard]] T* data() const noexcept { return p_; }

 private:
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

template <class T>
class device_block {
 public:
  device_block() = default;
  explicit device_block(std::size_t n) {
    if (n) staging_check(cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)), "cudaMalloc");
  }
  device_block(device_block&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  device_block& operator=(device_block&& o) noexcept {
    std::swap(p_, o.p_);
    return *this;
  }
  ~device_block() {
    if (p_) (void)cudaFree(p_);
  }
  [[nodiscard]] T* data() const noexcept { return p_; }

 private:
  T* p_ = nullptr;
};

class staging_stream {
 public:
  staging_stream() { staging_check(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), "cudaStreamCreate"); }
  staging_stream(const staging_stream&) = delete;
  staging_stream& operator=(const staging_stream&) = delete;
  ~staging_stream() { (void)cudaStreamDestroy(s_); }
  [[nodiscard]] cudaStream_t get() const noexcept { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

class staging_event {
 public:
  staging_event() { staging_check(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming), "cudaEventCreate"); }
  staging_event(staging_event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  staging_event& operator=(staging_event&& o) noexcept {
    std::swap(e_, o.e_);
    return *this;
  }
  ~staging_event() {
    if (e_) (void)cudaEventDestroy(e_);
  }
  [[nodiscard]] cudaEvent_t get() const noexcept { return e_; }

 private:
  cudaEvent_t e_ = nullptr;
};

// The library's guard: it does not switch when the device is already current, and does not
// restore a device that nobody had set (that would create a context on GPU 0).
using device_guard = cuda_device_guard;

}  // namespace detail

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
    detail::device_guard guard(device_);
    stream_ = std::make_unique<detail::staging_stream>();
    for (std::size_t i = 0; i < options_.depth; ++i) slots_.emplace_back(options_.max_rows, row_);
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
    detail::device_guard guard(device_);
    // Work issued on `compute` since the last call used the previous batch: mark its slot's release.
    if (count_ > 0) {
      slot& prev = slots_[(count_ - 1) % slots_.size()];
      detail::staging_check(cudaEventRecord(prev.released.get(), compute), "cudaEventRecord");
      prev.has_release = true;
    }
    slot& s = slots_[count_ % slots_.size()];
    // The pinned buffer is free once its previous copy finished (host wait, usually already done);
    // the device buffer is free once compute on its previous batch finished (GPU wait).
    if (s.used) detail::staging_check(cudaEventSynchronize(s.copied.get()), "cudaEventSynchronize");
    if (s.has_release) {
      detail::staging_check(cudaStreamWaitEvent(stream_->get(), s.released.get(), 0), "cudaStreamWaitEvent");
    }
    const std::size_t n = b.size();
    std::memcpy(s.host_features.data(), b.features.data(), b.features.size_bytes());
    std::memcpy(s.host_labels.data(), b.labels.data(), b.labels.size_bytes());
    detail::staging_check(cudaMemcpyAsync(s.dev_features.data(), s.host_features.data(), b.features.size_bytes(),
                                          cudaMemcpyHostToDevice, stream_->get()),
                          "cudaMemcpyAsync (features)");
    detail::staging_check(cudaMemcpyAsync(s.dev_labels.data(), s.host_labels.data(), b.labels.size_bytes(),
                                          cudaMemcpyHostToDevice, stream_->get()),
                          "cudaMemcpyAsync (labels)");
    detail::staging_check(cudaEventRecord(s.copied.get(), stream_->get()), "cudaEventRecord");
    detail::staging_check(cudaStreamWaitEvent(compute, s.copied.get(), 0), "cudaStreamWaitEvent");
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
    slot(std::size_t rows, std::size_t row)
        : host_features(rows * row), host_labels(rows), dev_features(rows * row), dev_labels(rows) {}
    detail::pinned_block<float> host_features;
    detail::pinned_block<std::int32_t> host_labels;
    detail::device_block<float> dev_features;
    detail::device_block<std::int32_t> dev_labels;
    detail::staging_event copied;
    detail::staging_event released;
    bool used = false;
    bool has_release = false;
    device_batch view{};
  };

  int device_;
  staging_options options_;
  std::size_t row_ = 0;
  std::unique_ptr<detail::staging_stream> stream_;
  std::vector<slot> slots_;
  std::size_t count_ = 0;
};

}  // namespace partrain::inline v0
