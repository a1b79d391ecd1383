// models/mlp_device.hpp: the device MLP's whole step, written once over a backend. mlp_cuda.cuh
// instantiates it with the CUDA backend (cuBLAS, the element functors launched on the model's
// stream); mlp_host_twin.hpp with the host backend (the same functors through
// for_each_index(host_exec), and the GEMMs through OpenBLAS with cuBLAS's column-major
// conventions). So the CPU tier runs every line of the CUDA model's step and checks it against
// mlp_host.hpp (tests/cpu_tier/test_mlp_step_cpu_tier.cpp). Same layout, same initial weights
// for the same seed as mlp_host.
//
// Mixed precision (precision fp16 or bf16) follows mlp_host.hpp step for step: fp32 master
// weights and gradients (what parameters() exposes), a 16-bit copy of the weights refreshed after
// each optimizer step, the input and every stored activation and backward gradient rounded to 16
// bits, each GEMM with 16-bit inputs and fp32 accumulation, logits and the softmax cross-entropy
// in fp32.
//
// A backend B provides (see mlp_cuda.cuh and mlp_host_twin.hpp):
//   B::space, B::array<T> (data(), size()), B::model_name, B::check_device(device), B(device)
//   make<T>(n) zero-filled, reserve(array, n) grows, activate() makes the device current,
//   launch(n, f) runs f(i) for i < n in stream order, sgemm / gemm16 (column-major,
//   C = op(A) op(B); sgemm_strided, a strided batch of them, for the ViT's layers), upload /
//   download (queued in stream order), synchronize().
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <partrain/core/device.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/model/concepts.hpp>
#include <partrain/precision/low_precision_copy.hpp>
#include <partrain/precision/precision.hpp>

#include "mlp_elements.hpp"
#include "mlp_host.hpp"

namespace models {

template <class Space>
struct device_parameter {
  std::string name;
  partrain::tensor_view<float, Space> value_view;
  partrain::tensor_view<float, Space> grad_view;
  [[nodiscard]] partrain::tensor_view<float, Space> value() const noexcept { return value_view; }
  [[nodiscard]] partrain::tensor_view<float, Space> grad() const noexcept { return grad_view; }
};

template <class Backend>
class basic_mlp_device {
  template <class T>
  using array = typename Backend::template array<T>;

 public:
  // precision fp16 or bf16: mixed precision (see the top of this file); fp32: plain fp32 training.
  explicit basic_mlp_device(mlp_layout layout = {}, std::uint64_t seed = 0, partrain::device dev = Backend::default_device(),
                            partrain::precision p = partrain::precision::fp32)
      : layout_(std::move(layout)), dev_(dev), precision_(p) {
    layout_.validate();
    Backend::check_device(dev);
    state_ = std::make_unique<state>(layout_.parameter_count(), dev);
    set_values(layout_.initial_values(seed));
    bind();
    // On dev (current now): the copy's storage goes to the model's device.
    if (low_precision()) low_ = partrain::make_low_precision_copy(precision_, *this);
  }
  basic_mlp_device(basic_mlp_device&&) noexcept = default;
  basic_mlp_device& operator=(basic_mlp_device&&) noexcept = default;

  [[nodiscard]] const mlp_layout& layout() const noexcept { return layout_; }
  [[nodiscard]] partrain::device device() const noexcept { return dev_; }
  [[nodiscard]] partrain::precision precision() const noexcept { return precision_; }
  [[nodiscard]] std::vector<device_parameter<typename Backend::space>>& parameters() noexcept { return params_; }
  [[nodiscard]] auto stream() const noexcept { return state_->backend.stream(); }

  // Mixed precision (partrain::amp_step calls these): the loss's gradient is multiplied by s in
  // backward (every precision); the 16-bit copy is re-cast from the masters after each optimizer
  // step (after this model's stream has drained).
  void set_loss_scale(float s) noexcept { loss_scale_ = s; }
  void refresh_low_precision() {
    if (!low_precision()) return;
    be().activate();
    be().synchronize();
    low_.refresh();
  }
  // Bytes of every buffer the model holds now (they only grow): masters, gradients, the 16-bit
  // copy, the batch, stored activations and scratch. What the benchmark reports as peak model
  // memory (cuBLAS's own workspace is not counted).
  [[nodiscard]] std::size_t memory_bytes() const noexcept {
    const auto& s = *state_;
    std::size_t b = low_.bytes();
    for (const auto* a : {&s.values, &s.grads, &s.x, &s.delta, &s.prev, &s.loss}) b += a->size() * sizeof(float);
    for (const auto* a : {&s.labels, &s.correct}) b += a->size() * sizeof(std::int32_t);
    for (const auto& a : s.acts) b += a.size() * sizeof(float);
    for (const auto* a : {&s.x16, &s.delta16, &s.prev16}) b += a->size() * sizeof(std::uint16_t);
    for (const auto& a : s.acts16) b += a.size() * sizeof(std::uint16_t);
    return b;
  }

  void set_values(std::span<const float> v) {
    if (v.size() != layout_.parameter_count()) {
      throw partrain::invalid_argument_error(std::string(Backend::model_name) + "::set_values: " + std::to_string(v.size()) +
                                             " values, expected " + std::to_string(layout_.parameter_count()));
    }
    be().activate();
    be().upload(state_->values.data(), v.data(), v.size_bytes());
    be().synchronize();
    refresh_low_precision();  // the copy follows the new masters (nothing to do before it exists)
  }
  [[nodiscard]] std::vector<float> values_to_host() const { return to_host(state_->values); }
  [[nodiscard]] std::vector<float> grads_to_host() const { return to_host(state_->grads); }

  // The batch is on the host (the loader's buffer); it is copied to the device first.
  template <labelled_batch B>
  double train_step(const B& b) {
    return step(b, nullptr);
  }
  // Gradient readiness: the stream is synchronised before each notification, so a reducer on
  // another stream (NCCL) reads final values.
  template <labelled_batch B>
  double train_step(const B& b, const partrain::grad_ready_fn& ready) {
    return step(b, &ready);
  }

  template <labelled_batch B>
  partrain::eval_result eval_step(const B& b) {
    check_batch(b, layout_, (std::string(Backend::model_name) + "::eval_step").c_str());
    const std::size_t n = b.labels.size();
    partrain::eval_result r;
    if (n == 0) return r;
    upload(b);
    const float* logits = forward(n);
    auto& s = *state_;
    be().launch(n, elements::softmax_cross_entropy_fn{logits, s.labels.data(), layout_.classes(), 0.0f, 1.0f, nullptr,
                                                      s.loss.data(), s.correct.data()});
    std::vector<float> loss(n);
    std::vector<std::int32_t> correct(n);
    be().download(loss.data(), s.loss.data(), n * sizeof(float));
    be().download(correct.data(), s.correct.data(), n * sizeof(std::int32_t));
    be().synchronize();
    for (std::size_t i = 0; i < n; ++i) {
      r.loss_sum += loss[i];
      r.correct += static_cast<std::size_t>(correct[i]);
    }
    r.count = n;
    return r;
  }

  [[nodiscard]] basic_mlp_device replicate_to(partrain::device d) const {
    basic_mlp_device copy(layout_, 0, d, precision_);
    copy.set_values(values_to_host());
    copy.loss_scale_ = loss_scale_;
    return copy;
  }

 private:
  struct state {
    state(std::size_t params, const partrain::device& d)
        : backend(d), values(backend.template make<float>(params)), grads(backend.template make<float>(params)) {}
    Backend backend;  // first: the arrays below are its memory
    array<float> values, grads;
    array<float> x, delta, prev, loss;
    array<std::int32_t> labels, correct;
    std::vector<array<float>> acts;
    // Mixed precision only: the input, the hidden activations and the flowing gradient in 16 bits.
    array<std::uint16_t> x16, delta16, prev16;
    std::vector<array<std::uint16_t>> acts16;
  };

  [[nodiscard]] Backend& be() const noexcept { return state_->backend; }
  template <class T>
  void reserve(array<T>& a, std::size_t n) {
    be().reserve(a, n);
  }
  [[nodiscard]] bool low_precision() const noexcept { return precision_ != partrain::precision::fp32; }
  [[nodiscard]] bool bf16() const noexcept { return precision_ == partrain::precision::bf16; }
  [[nodiscard]] const std::uint16_t* low16(std::size_t i) const { return static_cast<const std::uint16_t*>(low_.data(i)); }

  void bind() {
    params_.clear();
    float* v = state_->values.data();
    float* g = state_->grads.data();
    for (std::size_t l = 0; l < layout_.layers(); ++l) {
      const std::size_t out = layout_.widths[l + 1], in = layout_.widths[l];
      const std::string idx = std::to_string(l + 1);
      params_.push_back({"fc" + idx + ".weight", {v + layout_.weight_offset(l), {out, in}},
                         {g + layout_.weight_offset(l), {out, in}}});
      params_.push_back({"fc" + idx + ".bias", {v + layout_.bias_offset(l), {out}}, {g + layout_.bias_offset(l), {out}}});
    }
  }

  std::vector<float> to_host(const array<float>& a) const {
    std::vector<float> h(a.size());
    be().synchronize();
    be().download(h.data(), a.data(), a.size() * sizeof(float));
    be().synchronize();
    return h;
  }

  template <class B>
  void upload(const B& b) {
    const std::size_t n = b.labels.size();
    auto& s = *state_;
    be().activate();
    reserve(s.x, n * layout_.inputs());
    reserve(s.labels, n);
    reserve(s.loss, n);
    reserve(s.correct, n);
    be().upload(s.x.data(), b.features.data(), n * layout_.inputs() * sizeof(float));
    be().upload(s.labels.data(), b.labels.data(), n * sizeof(std::int32_t));
  }

  // Forward pass on the uploaded batch; returns the logits [n, classes] (fp32 in every precision).
  const float* forward(std::size_t n) { return low_precision() ? forward16(n) : forward32(n); }

  const float* forward32(std::size_t n) {
    auto& s = *state_;
    s.acts.resize(layout_.layers());
    const float* in = s.x.data();
    for (std::size_t l = 0; l < layout_.layers(); ++l) {
      const int out_w = static_cast<int>(layout_.widths[l + 1]);
      const int in_w = static_cast<int>(layout_.widths[l]);
      auto& h = s.acts[l];
      reserve(h, n * static_cast<std::size_t>(out_w));
      // Row-major H[n, out] = X[n, in] . W^T is column-major H^T = W^T(as stored) ^T . X^T.
      be().sgemm(true, false, out_w, static_cast<int>(n), in_w, s.values.data() + layout_.weight_offset(l), in_w, in, in_w,
                 h.data(), out_w);
      const std::size_t count = n * static_cast<std::size_t>(out_w);
      be().launch(count, elements::bias_activation_fn{h.data(), s.values.data() + layout_.bias_offset(l),
                                                      static_cast<std::size_t>(out_w), l + 1 < layout_.layers()});
      in = h.data();
    }
    return s.acts.back().data();
  }

  // Input rounded to 16 bits (x16); each layer's GEMM from the 16-bit input and weights into fp32,
  // plus the 16-bit bias in fp32, ReLU, stored as 16 bits (acts16); the last layer's logits stay
  // fp32 (acts.back()). The hidden layers' fp32 GEMM output is scratch (prev).
  const float* forward16(std::size_t n) {
    auto& s = *state_;
    const std::size_t layers = layout_.layers();
    s.acts.resize(layers);
    s.acts16.resize(layers - 1);
    const std::size_t in_count = n * layout_.inputs();
    reserve(s.x16, in_count);
    be().launch(in_count, elements::to_16_fn{s.x.data(), s.x16.data(), bf16()});
    const std::uint16_t* in = s.x16.data();
    for (std::size_t l = 0; l < layers; ++l) {
      const int out_w = static_cast<int>(layout_.widths[l + 1]);
      const int in_w = static_cast<int>(layout_.widths[l]);
      const std::size_t count = n * static_cast<std::size_t>(out_w);
      const bool last = l + 1 == layers;
      auto& h = last ? s.acts[l] : s.prev;
      reserve(h, count);
      std::uint16_t* out16 = nullptr;
      if (!last) {
        reserve(s.acts16[l], count);
        out16 = s.acts16[l].data();
      }
      be().gemm16(true, false, out_w, static_cast<int>(n), in_w, low16(2 * l), in_w, in, in_w, h.data(), out_w, bf16());
      be().launch(count, elements::bias_activation16_fn{h.data(), low16(2 * l + 1), static_cast<std::size_t>(out_w), !last,
                                                        out16, bf16()});
      in = out16;
    }
    return s.acts.back().data();
  }

  void notify(const partrain::grad_ready_fn* ready, std::size_t l) {
    if (!ready) return;
    be().synchronize();
    (*ready)(2 * l + 1);
    (*ready)(2 * l);
  }

  template <class B>
  double step(const B& b, const partrain::grad_ready_fn* ready) {
    const std::string where = std::string(Backend::model_name) + "::train_step";
    check_batch(b, layout_, where.c_str());
    const std::size_t n = b.labels.size();
    if (n == 0) throw partrain::invalid_argument_error(where + ": the batch is empty");
    upload(b);
    const float* logits = forward(n);
    auto& s = *state_;
    const std::size_t c = layout_.classes();
    reserve(s.delta, n * c);
    // d(mean loss)/d(logits) = (softmax - onehot) / n, times the loss scale
    be().launch(n, elements::softmax_cross_entropy_fn{logits, s.labels.data(), c, 1.0f / static_cast<float>(n), loss_scale_,
                                                      s.delta.data(), s.loss.data(), nullptr});
    std::vector<float> loss(n);
    be().download(loss.data(), s.loss.data(), n * sizeof(float));
    if (low_precision()) {
      backward16(n, ready);
    } else {
      backward32(n, ready);
    }
    be().synchronize();
    double total = 0;
    for (float v : loss) total += v;
    return total / static_cast<double>(n);
  }

  void backward32(std::size_t n, const partrain::grad_ready_fn* ready) {
    auto& s = *state_;
    for (std::size_t l = layout_.layers(); l-- > 0;) {
      const int out_w = static_cast<int>(layout_.widths[l + 1]);
      const int in_w = static_cast<int>(layout_.widths[l]);
      const float* in = l == 0 ? s.x.data() : s.acts[l - 1].data();
      float* gw = s.grads.data() + layout_.weight_offset(l);
      float* gb = s.grads.data() + layout_.bias_offset(l);
      be().launch(static_cast<std::size_t>(out_w),
                  elements::column_sums_fn{s.delta.data(), n, static_cast<std::size_t>(out_w), gb});
      // dW[out, in] = delta^T . X: column-major dW^T[in, out] = X^T[in, n] . delta[n, out].
      be().sgemm(false, true, in_w, out_w, static_cast<int>(n), in, in_w, s.delta.data(), out_w, gw, in_w);
      notify(ready, l);
      if (l == 0) break;
      // dX[n, in] = delta[n, out] . W[out, in]: column-major dX^T = W^T(as stored) . delta^T.
      reserve(s.prev, n * static_cast<std::size_t>(in_w));
      be().sgemm(false, false, in_w, static_cast<int>(n), out_w, s.values.data() + layout_.weight_offset(l), in_w,
                 s.delta.data(), out_w, s.prev.data(), in_w);
      const std::size_t count = n * static_cast<std::size_t>(in_w);
      be().launch(count, elements::relu_backward_fn{s.prev.data(), in});
      std::swap(s.delta, s.prev);
    }
  }

  // The same GEMMs on 16-bit operands: delta (already scaled) rounded to 16 bits; db = column sums
  // of delta16 in fp32 and dW = delta16^T . in16 with fp32 accumulation, both rounded to 16 bits
  // and written to the fp32 gradients (an fp16 overflow shows up as inf, for the gradient scaler);
  // delta_prev = delta16 . W16, ReLU mask, rounded to 16 bits.
  void backward16(std::size_t n, const partrain::grad_ready_fn* ready) {
    auto& s = *state_;
    const std::size_t c = layout_.classes();
    reserve(s.delta16, n * c);
    be().launch(n * c, elements::to_16_fn{s.delta.data(), s.delta16.data(), bf16()});
    for (std::size_t l = layout_.layers(); l-- > 0;) {
      const int out_w = static_cast<int>(layout_.widths[l + 1]);
      const int in_w = static_cast<int>(layout_.widths[l]);
      const std::uint16_t* in = l == 0 ? s.x16.data() : s.acts16[l - 1].data();
      float* gw = s.grads.data() + layout_.weight_offset(l);
      float* gb = s.grads.data() + layout_.bias_offset(l);
      be().launch(static_cast<std::size_t>(out_w),
                  elements::column_sums16_fn{s.delta16.data(), n, static_cast<std::size_t>(out_w), gb, bf16()});
      be().gemm16(false, true, in_w, out_w, static_cast<int>(n), in, in_w, s.delta16.data(), out_w, gw, in_w, bf16());
      const std::size_t wcount = static_cast<std::size_t>(out_w) * static_cast<std::size_t>(in_w);
      be().launch(wcount, elements::round_16_fn{gw, bf16()});
      notify(ready, l);
      if (l == 0) break;
      const std::size_t count = n * static_cast<std::size_t>(in_w);
      reserve(s.prev, count);
      be().gemm16(false, false, in_w, static_cast<int>(n), out_w, low16(2 * l), in_w, s.delta16.data(), out_w,
                  s.prev.data(), in_w, bf16());
      reserve(s.prev16, count);
      be().launch(count, elements::relu_backward16_fn{s.prev.data(), in, s.prev16.data(), bf16()});
      std::swap(s.delta16, s.prev16);
    }
  }

  mlp_layout layout_;
  partrain::device dev_;
  partrain::precision precision_ = partrain::precision::fp32;
  float loss_scale_ = 1.0f;
  std::unique_ptr<state> state_;  // on the heap: the parameter views stay valid when the model moves
  std::vector<device_parameter<typename Backend::space>> params_;
  partrain::low_precision_copy<typename Backend::space> low_;  // the 16-bit weights (fp16/bf16 only)
};

}  // namespace models
