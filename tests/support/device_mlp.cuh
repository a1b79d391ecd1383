// tests/support/device_mlp.cuh: the toy MLP with its parameters and gradients in CUDA memory (the
// math runs on the host), for the tests of policies that meet CUDA parameters (DDP's staging,
// local SGD's and DiLoCo's host mirrors): their result must equal the host toy_mlp's exactly.
// nvcc only; the tests that use it carry the gpu label and skip without a device.
#pragma once

#include <cuda_runtime.h>

#include <partrain/cuda/device_buffer.hpp>
#include <partrain/cuda/stream.hpp>

#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "toy_models.hpp"

namespace partrain::testing {

// A parameter and its gradient in device memory on GPU 0 (partrain's device_buffer).
struct device_param {
  device_buffer<float> v, g;
  explicit device_param(partrain::shape sh) : v(sh, 0), g(sh, 0) {}
  tensor_view<float, cuda> value() { return v.view(); }
  tensor_view<float, cuda> grad() { return g.view(); }
};

// The toy MLP's math runs on the host; its parameters and gradients live on the device, so DDP
// sees CUDA views and must stage them. Reports readiness (overlap path) like the host model.
// With `own_stream` the model queues its copies on a non-blocking stream of its own (stream()) and
// reports a gradient ready without waiting for its copy: DDP's staging (and the optimizer) must
// order their work on that stream, or they read the gradient before it arrived.
class device_mlp {
 public:
  explicit device_mlp(std::uint64_t seed, bool own_stream = false) : host_(seed) {
    if (own_stream) stream_.emplace(0);
    for (auto& p : host_.parameters()) {
      auto& d = params_.emplace_back(p.value().shape());
      d.v.copy_from(tensor_view<const float>(p.values().data(), p.values().size()));
    }
  }
  std::vector<device_param>& parameters() { return params_; }
  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_ ? stream_->get() : nullptr; }
  double train_step(const toy_batch<float>& b) { return step(b, nullptr); }
  double train_step(const toy_batch<float>& b, const grad_ready_fn& f) { return step(b, &f); }
  std::vector<float> values() {
    sync();
    std::vector<float> all;
    for (auto& d : params_) {
      std::vector<float> h(d.v.size());
      d.v.copy_to(tensor_view<float>(h.data(), h.size()));
      all.insert(all.end(), h.begin(), h.end());
    }
    return all;
  }

 private:
  // Runs on the ranks' threads, where Catch2's assertions are not safe: a failure throws, and
  // run_local reports it.
  static void check(cudaError_t rc, const char* what) {
    if (rc != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(rc));
  }
  void sync() const {
    if (stream_) check(cudaStreamSynchronize(stream_->get()), "cudaStreamSynchronize (model stream)");
  }
  double step(const toy_batch<float>& b, const grad_ready_fn* f) {
    auto& hp = host_.parameters();
    sync();  // the optimizer's last step ran on our stream
    for (std::size_t i = 0; i < hp.size(); ++i) {
      params_[i].v.copy_to(tensor_view<float>(hp[i].values().data(), hp[i].values().size()));
    }
    const double loss = host_.train_step(b);
    // The host gradients must outlive the queued copies: kept per parameter until the next step.
    staged_.resize(hp.size());
    for (std::size_t i = hp.size(); i-- > 0;) {
      if (stream_) {
        staged_[i] = hp[i].grads();
        check(cudaMemcpyAsync(params_[i].g.data(), staged_[i].data(), staged_[i].size() * sizeof(float),
                              cudaMemcpyHostToDevice, stream_->get()),
              "cudaMemcpyAsync (gradient on the model stream)");
      } else {
        params_[i].g.copy_from(tensor_view<const float>(hp[i].grads().data(), hp[i].grads().size()));
      }
      if (f) (*f)(i);
    }
    return loss;
  }
  toy_mlp<float, false> host_;
  std::optional<cuda_stream> stream_;
  std::vector<device_param> params_;
  std::vector<std::vector<float>> staged_;
};

}  // namespace partrain::testing
