// models/mlp_layers_device.hpp: mlp_layers.hpp's layers (linear, relu, softmax cross-entropy)
// computing where a backend of mlp_device.hpp runs: on a CUDA device (mlp_cuda.cuh: cuBLAS, the
// element functors of mlp_elements.hpp as kernels on the backend's stream) or on its host twin
// (mlp_host_twin.hpp: OpenBLAS, the same functors on the host), so the CPU tier runs the CUDA
// layers' code. Fully sharded data parallel shards them (their parameters bind to its buffers);
// make_device_mlp starts from make_mlp's weights for the same seed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <partrain/comm/process_group.hpp>
#include <partrain/core/buffer.hpp>
#include <partrain/core/device.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/model/concepts.hpp>
#include <partrain/model/layer.hpp>

#include "mlp_elements.hpp"
#include "mlp_layers.hpp"

namespace models::layers {

// A parameter in the backend's memory, with its own storage until fully sharded data parallel
// binds it to its buffers (then value() and grad() view those, and the storage is freed).
template <class Backend>
class device_param {
 public:
  using space = typename Backend::space;
  device_param(const Backend& be, shape s) : v_(be.template make<float>(s.numel())), g_(be.template make<float>(s.numel())), shape_(s) {}
  [[nodiscard]] partrain::tensor_view<float, space> value() {
    return bound_ ? bound_value_ : partrain::tensor_view<float, space>(v_.data(), shape_);
  }
  [[nodiscard]] partrain::tensor_view<float, space> grad() {
    return bound_ ? bound_grad_ : partrain::tensor_view<float, space>(g_.data(), shape_);
  }
  void bind(partrain::tensor_view<float, space> value, partrain::tensor_view<float, space> grad) noexcept {
    v_ = array{};  // freed (a moved-in empty vector gives its memory back too)
    g_ = array{};
    bound_value_ = value;
    bound_grad_ = grad;
    bound_ = true;
  }
  // Tensor parallel: the group over which each rank holds a slice of this parameter (clipping
  // counts each element once), as host_param's.
  [[nodiscard]] partrain::process_group* shard_group() const noexcept { return shard_group_; }
  void set_shard_group(partrain::process_group* g) noexcept { shard_group_ = g; }

 private:
  using array = typename Backend::template array<float>;
  array v_, g_;
  shape shape_;
  partrain::tensor_view<float, space> bound_value_, bound_grad_;
  bool bound_ = false;
  partrain::process_group* shard_group_ = nullptr;
};

// The polymorphic base; every layer of a model shares one backend (its stream and cuBLAS handle).
template <class Backend>
class device_layer {
 public:
  using space = typename Backend::space;
  using in_view = partrain::tensor_view<const float, space>;
  using out_view = partrain::tensor_view<float, space>;
  explicit device_layer(std::shared_ptr<Backend> be) : be_(std::move(be)) {}
  virtual ~device_layer() = default;
  [[nodiscard]] virtual shape output_shape(const shape& in) const = 0;
  virtual void forward(in_view in, out_view out) = 0;
  virtual void backward(in_view in, in_view out, in_view gout, out_view gin) = 0;
  [[nodiscard]] virtual std::vector<device_param<Backend>>& parameters() = 0;
  // Training or evaluation: only layers with dropout override it.
  virtual void train(bool) {}
  // Saved activations (partrain::keeps_activations), as host_layer's: none unless a layer
  // overrides these three (device_saving_layer).
  using call = partrain::layer_call<space>;
  [[nodiscard]] virtual std::size_t saved_size(const shape&) const { return 0; }
  virtual void forward(in_view in, out_view out, const call&) { forward(in, out); }
  virtual void backward(in_view in, in_view out, const call&, in_view gout, out_view gin) { backward(in, out, gout, gin); }
  // The stream the layer's work is queued on (null: none, or the legacy one).
  [[nodiscard]] void* stream() const noexcept { return static_cast<void*>(be_->stream()); }
  [[nodiscard]] const std::shared_ptr<Backend>& backend() const noexcept { return be_; }

 protected:
  std::shared_ptr<Backend> be_;
};

// The base of a device layer that keeps activations: it writes the three saved-activation
// members, and the plain forward and backward run through them in memory of their own (the
// backward after recomputing the forward), as host_saving_layer does.
template <class Backend>
class device_saving_layer : public device_layer<Backend> {
  using base = device_layer<Backend>;

 public:
  using base::backward;
  using base::base;
  using base::forward;
  void forward(typename base::in_view in, typename base::out_view out) final {
    auto saved = this->be_->template make<float>(this->saved_size(in.shape()));
    forward(in, out, typename base::call{typename base::out_view(saved.data(), shape{saved.size()}), 0});
    this->be_->synchronize();  // saved is freed on return
  }
  void backward(typename base::in_view in, typename base::in_view out, typename base::in_view gout,
                typename base::out_view gin) final {
    auto saved = this->be_->template make<float>(this->saved_size(in.shape()));
    auto again = this->be_->template make<float>(out.size());
    const typename base::call c{typename base::out_view(saved.data(), shape{saved.size()}), 0};
    forward(in, typename base::out_view(again.data(), out.shape()), c);
    backward(in, out, c, gout, gin);
    this->be_->synchronize();
  }
};

// y = x W^T + b, W is [out, in]: in cuBLAS's column-major terms y^T = W'^T x^T with W' = W^T.
template <class Backend>
class device_linear final : public device_layer<Backend> {
  using base = device_layer<Backend>;

 public:
  using base::backward;  // the saved-activation forms stay visible
  using base::forward;
  device_linear(std::shared_ptr<Backend> be, std::size_t in, std::size_t out, std::uint32_t seed)
      : base(std::move(be)), in_(in), out_(out) {
    params_.emplace_back(*this->be_, shape{out, in});
    params_.emplace_back(*this->be_, shape{out});
    host_buffer<float> w(shape{out, in}), b(shape{out});
    init_linear(in, seed, w.view(), b.view());
    this->be_->upload(params_[0].value().data(), w.data(), w.size_bytes());
    this->be_->upload(params_[1].value().data(), b.data(), b.size_bytes());
    this->be_->synchronize();  // the host copies go when this returns
  }
  [[nodiscard]] shape output_shape(const shape& s) const override {
    if (s.rank() != 2 || s[1] != in_) {
      throw invalid_argument_error("device_linear: input shape " + s.to_string() + ", expected [batch, " +
                                   std::to_string(in_) + "]");
    }
    return {s[0], out_};
  }
  void forward(typename base::in_view x, typename base::out_view y) override {
    const int n = static_cast<int>(x.extent(0)), in = static_cast<int>(in_), out = static_cast<int>(out_);
    this->be_->sgemm(true, false, out, n, in, params_[0].value().data(), in, x.data(), in, y.data(), out);
    this->be_->launch(y.size(), elements::bias_activation_fn{y.data(), params_[1].value().data(), out_, false});
  }
  void backward(typename base::in_view x, typename base::in_view, typename base::in_view gy,
                typename base::out_view gx) override {
    const int n = static_cast<int>(x.extent(0)), in = static_cast<int>(in_), out = static_cast<int>(out_);
    // gW' += x^T gy^T (gW' = gW^T, [in x out] column-major); gb += column sums of gy; gx = gy W.
    this->be_->sgemm(false, true, in, out, n, x.data(), in, gy.data(), out, params_[0].grad().data(), in, 1.0f);
    this->be_->launch(out_, elements::column_sums_fn{gy.data(), x.extent(0), out_, params_[1].grad().data(), true});
    this->be_->sgemm(false, false, in, n, out, params_[0].value().data(), in, gy.data(), out, gx.data(), in);
  }
  [[nodiscard]] std::vector<device_param<Backend>>& parameters() override { return params_; }

 private:
  std::size_t in_, out_;
  std::vector<device_param<Backend>> params_;
};

template <class Backend>
class device_relu final : public device_layer<Backend> {
  using base = device_layer<Backend>;

 public:
  using base::backward;
  using base::base;
  using base::forward;
  [[nodiscard]] shape output_shape(const shape& s) const override { return s; }
  void forward(typename base::in_view x, typename base::out_view y) override {
    this->be_->launch(x.size(), elements::relu_fn{x.data(), y.data()});
  }
  void backward(typename base::in_view x, typename base::in_view, typename base::in_view gy,
                typename base::out_view gx) override {
    this->be_->launch(x.size(), elements::relu_grad_fn{x.data(), gy.data(), gx.data()});
  }
  [[nodiscard]] std::vector<device_param<Backend>>& parameters() override { return none_; }

 private:
  std::vector<device_param<Backend>> none_;
};

template <class Backend>
using device_model = std::vector<std::unique_ptr<device_layer<Backend>>>;

// make_mlp's layers and weights (for the same widths and seed) on the backend's device.
template <class Backend>
[[nodiscard]] device_model<Backend> make_device_mlp(const std::vector<std::size_t>& widths, std::uint32_t seed,
                                                    const partrain::device& where) {
  Backend::check_device(where);
  auto be = std::make_shared<Backend>(where);
  device_model<Backend> m;
  for (std::size_t i = 0; i + 1 < widths.size(); ++i) {
    m.push_back(std::make_unique<device_linear<Backend>>(be, widths[i], widths[i + 1], seed + static_cast<std::uint32_t>(i)));
    if (i + 2 < widths.size()) m.push_back(std::make_unique<device_relu<Backend>>(be));
  }
  return m;
}

// Softmax over the last dimension + cross-entropy with int32 class labels, on the backend's
// device (softmax_cross_entropy_fn, a row per thread); the sums come back to the host. The
// labels are checked on the host first: a kernel cannot report a label out of range.
template <class Backend>
class device_softmax_cross_entropy {
  using space = typename Backend::space;

 public:
  // On the model's backend: the loss runs on the layers' stream, after their forward.
  explicit device_softmax_cross_entropy(const device_model<Backend>& m) : be_(backend_of(m)) {}

  double forward_backward(partrain::tensor_view<const float, space> logits, partrain::tensor_view<const std::int32_t, space> labels,
                          partrain::tensor_view<float, space> grad, float scale) {
    return run(logits, labels, grad.data(), scale, nullptr);
  }
  eval_result evaluate(partrain::tensor_view<const float, space> logits, partrain::tensor_view<const std::int32_t, space> labels) {
    eval_result r;
    r.loss_sum = run(logits, labels, nullptr, 0.0f, &r.correct);
    r.count = logits.extent(0);
    return r;
  }

 private:
  static std::shared_ptr<Backend> backend_of(const device_model<Backend>& m) {
    if (m.empty()) throw invalid_argument_error("device_softmax_cross_entropy: the model has no layers to take the backend of");
    return m.front()->backend();
  }
  double run(partrain::tensor_view<const float, space> z, partrain::tensor_view<const std::int32_t, space> y, float* delta,
             float scale, std::size_t* correct) {
    const std::size_t n = z.extent(0), k = z.shape().row_numel();
    if (y.size() != n) {
      throw invalid_argument_error("device_softmax_cross_entropy: " + std::to_string(y.size()) + " labels for " +
                                   std::to_string(n) + " rows (expected one label per row)");
    }
    std::vector<std::int32_t> labels(n);
    be_->download(labels.data(), y.data(), n * sizeof(std::int32_t));
    be_->synchronize();
    for (std::size_t r = 0; r < n; ++r) {
      if (labels[r] < 0 || static_cast<std::size_t>(labels[r]) >= k) {
        throw invalid_argument_error("device_softmax_cross_entropy: label " + std::to_string(labels[r]) + " in row " +
                                     std::to_string(r) + " (expected 0 <= label < " + std::to_string(k) + ")");
      }
    }
    be_->reserve(loss_, n);
    be_->reserve(correct_, n);
    be_->launch(n, elements::softmax_cross_entropy_fn{z.data(), y.data(), k, scale, 1.0f, delta, loss_.data(),
                                                      correct ? correct_.data() : nullptr});
    std::vector<float> loss(n);
    std::vector<std::int32_t> right(correct ? n : 0);
    be_->download(loss.data(), loss_.data(), n * sizeof(float));
    if (correct) be_->download(right.data(), correct_.data(), n * sizeof(std::int32_t));
    be_->synchronize();
    double sum = 0;
    for (float l : loss) sum += l;
    if (correct) {
      for (std::int32_t c : right) *correct += static_cast<std::size_t>(c);
    }
    return sum;
  }

  std::shared_ptr<Backend> be_;
  typename Backend::template array<float> loss_;
  typename Backend::template array<std::int32_t> correct_;
};

}  // namespace models::layers
