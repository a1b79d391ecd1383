// models/mlp_host.hpp: a user-defined model, written the way a partrain user
// would: a multi-layer perceptron (784-256-128-10 by default), ReLU between layers, softmax
// cross-entropy, its GEMMs on OpenBLAS. partrain never sees inside: it only uses the members
// the model concepts ask for (parameters(), train_step(), eval_step(), replicate_to()).
//
// Mixed precision (--precision fp16|bf16): the parameters stay fp32 (the master weights that DDP
// reduces and the optimizer steps); the forward and backward read a 16-bit copy of them and keep
// every value they store (input, activations, the gradients flowing back, the weight gradients)
// rounded to 16 bits, computing each GEMM in fp32 as a tensor core accumulates. Logits and the
// softmax cross-entropy stay fp32, as under PyTorch's autocast. The host has no 16-bit
// arithmetic, so this is the correct (not the fast) path; mlp_cuda.cuh runs the same on cuBLAS.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <cblas.h>

#include <partrain/core/buffer.hpp>
#include <partrain/core/device.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/model/concepts.hpp>
#include <partrain/precision/low_precision_copy.hpp>
#include <partrain/precision/precision.hpp>

namespace models {

// What the model reads from a batch: features [n, inputs] float, labels [n] int32. partrain's
// data::batch has these members; so can a user's own batch type.
template <class B>
concept labelled_batch = requires(const B& b) {
  { b.features.data() } -> std::convertible_to<const float*>;
  { b.features.size() } -> std::convertible_to<std::size_t>;
  { b.labels.data() } -> std::convertible_to<const std::int32_t*>;
  { b.labels.size() } -> std::convertible_to<std::size_t>;
};

// A deterministic generator (splitmix64), so every run and every rank draws the same weights.
class splitmix64 {
 public:
  explicit splitmix64(std::uint64_t seed) noexcept : state_(seed) {}
  std::uint64_t next() noexcept {
    std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [lo, hi), from the top 24 bits (exact in float).
  float uniform(float lo, float hi) noexcept {
    return lo + (hi - lo) * static_cast<float>(next() >> 40) * (1.0f / 16777216.0f);
  }

 private:
  std::uint64_t state_;
};

// A parameter as partrain sees it: views of its value and its gradient.
struct host_parameter {
  std::string name;
  partrain::tensor_view<float> value_view;
  partrain::tensor_view<float> grad_view;
  [[nodiscard]] partrain::tensor_view<float> value() const noexcept { return value_view; }
  [[nodiscard]] partrain::tensor_view<float> grad() const noexcept { return grad_view; }
};

// The layer widths and the shapes of the parameters, shared by the host and CUDA versions.
struct mlp_layout {
  std::vector<std::size_t> widths{784, 256, 128, 10};

  [[nodiscard]] std::size_t layers() const noexcept { return widths.size() - 1; }
  [[nodiscard]] std::size_t inputs() const noexcept { return widths.front(); }
  [[nodiscard]] std::size_t classes() const noexcept { return widths.back(); }
  // Offsets of W_l [out, in] and b_l [out] in one flat array, in the order W1, b1, W2, b2, ...
  // (PyTorch's named_parameters() order for a Sequential of Linear layers).
  [[nodiscard]] std::size_t weight_offset(std::size_t l) const noexcept {
    std::size_t off = 0;
    for (std::size_t i = 0; i < l; ++i) off += widths[i + 1] * (widths[i] + 1);
    return off;
  }
  [[nodiscard]] std::size_t bias_offset(std::size_t l) const noexcept {
    return weight_offset(l) + widths[l + 1] * widths[l];
  }
  [[nodiscard]] std::size_t parameter_count() const noexcept { return weight_offset(layers()); }

  void validate() const {
    if (widths.size() < 2) throw partrain::invalid_argument_error("mlp: needs at least an input and an output width");
    for (auto w : widths) {
      if (w == 0) throw partrain::invalid_argument_error("mlp: every layer width must be at least 1");
    }
  }

  // Initial values as PyTorch's nn.Linear draws them: W and b uniform in +-1/sqrt(fan_in).
  [[nodiscard]] std::vector<float> initial_values(std::uint64_t seed) const {
    std::vector<float> v(parameter_count());
    splitmix64 rng(seed);
    for (std::size_t l = 0; l < layers(); ++l) {
      const float bound = 1.0f / std::sqrt(static_cast<float>(widths[l]));
      const std::size_t n = widths[l + 1] * (widths[l] + 1);
      for (std::size_t i = 0; i < n; ++i) v[weight_offset(l) + i] = rng.uniform(-bound, bound);
    }
    return v;
  }
};

template <class B>
void check_batch(const B& b, const mlp_layout& layout, const char* where) {
  const std::size_t n = b.labels.size();
  if (b.features.size() != n * layout.inputs()) {
    throw partrain::invalid_argument_error(std::string(where) + ": the batch has " + std::to_string(n) +
                                           " labels and " + std::to_string(b.features.size()) +
                                           " feature values; expected " + std::to_string(layout.inputs()) +
                                           " features per example");
  }
  const std::int32_t* y = b.labels.data();
  for (std::size_t i = 0; i < n; ++i) {
    if (y[i] < 0 || static_cast<std::size_t>(y[i]) >= layout.classes()) {
      throw partrain::data_error(std::string(where) + ": label " + std::to_string(y[i]) + " of example " +
                                 std::to_string(i) + " is outside [0, " + std::to_string(layout.classes()) + ")");
    }
  }
}

// 16-bit storage on the host: float values to and from the words of the run's precision.
inline void encode16(partrain::precision p, const float* src, std::uint16_t* dst, std::size_t n) {
  if (p == partrain::precision::fp16) {
    for (std::size_t i = 0; i < n; ++i) dst[i] = partrain::half(src[i]).bits;
  } else {
    for (std::size_t i = 0; i < n; ++i) dst[i] = partrain::bfloat16(src[i]).bits;
  }
}
inline void decode16(partrain::precision p, const std::uint16_t* src, float* dst, std::size_t n) {
  if (p == partrain::precision::fp16) {
    for (std::size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(partrain::half::from_bits(src[i]));
  } else {
    for (std::size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(partrain::bfloat16::from_bits(src[i]));
  }
}
// x[i] = the nearest 16-bit value (ties to even), kept as float for the next fp32 GEMM.
inline void round16(partrain::precision p, float* x, std::size_t n) {
  if (p == partrain::precision::fp16) {
    for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>(partrain::half(x[i]));
  } else {
    for (std::size_t i = 0; i < n; ++i) x[i] = static_cast<float>(partrain::bfloat16(x[i]));
  }
}

class mlp_host {
 public:
  explicit mlp_host(mlp_layout layout = {}, std::uint64_t seed = 0, partrain::precision p = partrain::precision::fp32)
      : layout_(std::move(layout)), precision_(p) {
    layout_.validate();
    // One BLAS thread per rank: the ranks (processes or threads) already use the cores.
    openblas_set_num_threads(1);
    values_ = partrain::host_buffer<float>(layout_.parameter_count());
    grads_ = partrain::host_buffer<float>(layout_.parameter_count());
    const auto init = layout_.initial_values(seed);
    std::copy(init.begin(), init.end(), values_.begin());
    bind();
  }
  mlp_host(const mlp_host& o)
      : layout_(o.layout_), precision_(o.precision_), loss_scale_(o.loss_scale_), values_(o.values_), grads_(o.grads_) {
    bind();
  }
  mlp_host& operator=(const mlp_host& o) {
    if (this != &o) {
      layout_ = o.layout_;
      precision_ = o.precision_;
      loss_scale_ = o.loss_scale_;
      values_ = o.values_;
      grads_ = o.grads_;
      bind();
    }
    return *this;
  }
  mlp_host(mlp_host&&) noexcept = default;  // buffers move with their memory: the views stay valid
  mlp_host& operator=(mlp_host&&) noexcept = default;
  ~mlp_host() = default;

  [[nodiscard]] const mlp_layout& layout() const noexcept { return layout_; }
  // W1, b1, W2, b2, ... in a stable order (the same on every rank).
  [[nodiscard]] std::vector<host_parameter>& parameters() noexcept { return params_; }
  [[nodiscard]] const std::vector<host_parameter>& parameters() const noexcept { return params_; }
  // All values and all gradients as single flat views (handy for tests and comparisons).
  [[nodiscard]] partrain::tensor_view<float> flat_values() noexcept { return values_.view(); }
  [[nodiscard]] partrain::tensor_view<float> flat_grads() noexcept { return grads_.view(); }

  [[nodiscard]] partrain::precision precision() const noexcept { return precision_; }
  // Mixed precision (partrain::amp_step calls these): the loss's gradient is multiplied by s in
  // backward; the 16-bit copy is re-cast from the masters after each optimizer step.
  void set_loss_scale(float s) noexcept { loss_scale_ = s; }
  void refresh_low_precision() {
    if (low_precision()) low_.refresh();
  }
  // Bytes of every buffer the model holds now (they only grow): masters, gradients, the 16-bit
  // copy, stored activations and scratch. What the benchmark reports as peak model memory.
  [[nodiscard]] std::size_t memory_bytes() const noexcept {
    std::size_t b = (values_.size() + grads_.size()) * sizeof(float) + low_.bytes();
    for (const auto& a : acts_) b += a.capacity() * sizeof(float);
    for (const auto& a : acts16_) b += a.capacity() * sizeof(std::uint16_t);
    for (const auto* v : {&delta_, &prev_, &input_, &scratch_, &weights_}) b += v->capacity() * sizeof(float);
    return b;
  }

  // Forward and backward on the batch; gradients are overwritten. Returns the mean loss.
  template <labelled_batch B>
  double train_step(const B& b) {
    return step(b, nullptr);
  }
  // The same, telling `ready(i)` the moment parameter i's gradient is final: the last layer's
  // bias and weight first, while the earlier layers' backward still runs.
  template <labelled_batch B>
  double train_step(const B& b, const partrain::grad_ready_fn& ready) {
    return step(b, &ready);
  }

  // Forward only: summed loss, correct predictions and count. Gradients are left alone.
  template <labelled_batch B>
  partrain::eval_result eval_step(const B& b) {
    check_batch(b, layout_, "mlp_host::eval_step");
    const std::size_t n = b.labels.size();
    partrain::eval_result r;
    if (n == 0) return r;
    const float* logits = forward(b.features.data(), n);
    const std::size_t c = layout_.classes();
    for (std::size_t i = 0; i < n; ++i) {
      const float* z = logits + i * c;
      const std::size_t best = static_cast<std::size_t>(std::max_element(z, z + c) - z);
      const auto y = static_cast<std::size_t>(b.labels.data()[i]);
      r.loss_sum += cross_entropy(z, c, y);
      r.correct += best == y ? 1 : 0;
    }
    r.count = n;
    return r;
  }

  // The host model lives on the CPU; a copy on another CPU "device" is a plain copy.
  [[nodiscard]] mlp_host replicate_to(partrain::device d) const {
    if (d.is_cuda()) {
      throw partrain::invalid_argument_error("mlp_host::replicate_to(" + d.to_string() +
                                             "): the host model runs on the CPU only; use mlp_cuda for CUDA devices");
    }
    return *this;
  }

 private:
  void bind() {
    params_.clear();
    for (std::size_t l = 0; l < layout_.layers(); ++l) {
      const std::size_t out = layout_.widths[l + 1], in = layout_.widths[l];
      const std::string idx = std::to_string(l + 1);
      params_.push_back({"fc" + idx + ".weight", partrain::tensor_view<float>(values_.data() + layout_.weight_offset(l), {out, in}),
                         partrain::tensor_view<float>(grads_.data() + layout_.weight_offset(l), {out, in})});
      params_.push_back({"fc" + idx + ".bias", partrain::tensor_view<float>(values_.data() + layout_.bias_offset(l), {out}),
                         partrain::tensor_view<float>(grads_.data() + layout_.bias_offset(l), {out})});
    }
    if (precision_ != partrain::precision::fp32) low_ = partrain::make_low_precision_copy(precision_, *this);
  }

  [[nodiscard]] const float* weight(std::size_t l) const noexcept { return values_.data() + layout_.weight_offset(l); }
  [[nodiscard]] const float* bias(std::size_t l) const noexcept { return values_.data() + layout_.bias_offset(l); }

  // A row's loss, log(sum_j exp(z_j - m)) - (z_y - m), from the float sum of the exponentials that
  // the softmax computes anyway (exp in double as well cost 1% of a training step), taken to double
  // for the log and the mean. The loss is only reported: the gradients never read it.
  static double row_loss(float exp_sum, float zy_minus_max) noexcept {
    return std::log(static_cast<double>(exp_sum)) - static_cast<double>(zy_minus_max);
  }
  static double cross_entropy(const float* z, std::size_t c, std::size_t y) noexcept {
    const float m = *std::max_element(z, z + c);
    float s = 0;
    for (std::size_t j = 0; j < c; ++j) s += std::exp(z[j] - m);
    return row_loss(s, z[y] - m);
  }

  [[nodiscard]] bool low_precision() const noexcept { return precision_ != partrain::precision::fp32; }

  // Forward pass; returns the logits [n, classes] (fp32 in every precision).
  const float* forward(const float* x, std::size_t n) {
    return low_precision() ? forward16(x, n) : forward32(x, n);
  }

  // out[n, out_w] = in . W^T + b: seed out with the bias rows, then let sgemm accumulate.
  static void linear(const float* in, const float* w, const float* b, float* out, std::size_t n, int in_w, int out_w) {
    for (std::size_t i = 0; i < n; ++i) std::copy(b, b + out_w, out + i * static_cast<std::size_t>(out_w));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n), out_w, in_w, 1.0f, in, in_w, w, in_w,
                1.0f, out, out_w);
  }

  // fp32: acts_[l] = output of layer l (after ReLU except for the last, which keeps the logits).
  const float* forward32(const float* x, std::size_t n) {
    acts_.resize(layout_.layers());
    const float* in = x;
    for (std::size_t l = 0; l < layout_.layers(); ++l) {
      const int out_w = static_cast<int>(layout_.widths[l + 1]);
      auto& h = acts_[l];
      h.resize(n * static_cast<std::size_t>(out_w));
      linear(in, weight(l), bias(l), h.data(), n, static_cast<int>(layout_.widths[l]), out_w);
      if (l + 1 < layout_.layers()) {
        for (auto& v : h) v = v > 0.0f ? v : 0.0f;
      }
      in = h.data();
    }
    return acts_.back().data();
  }

  // The 16-bit copy of parameter i, widened to float in `out` (for the fp32 GEMM).
  void widen_parameter(std::size_t i, std::vector<float>& out) const {
    const std::size_t size = params_[i].value_view.size();
    out.resize(size);
    decode16(precision_, static_cast<const std::uint16_t*>(low_.data(i)), out.data(), size);
  }

  // 16 bits: input_ = the batch rounded to 16 bits; acts16_[l] = the hidden activations as
  // 16-bit words; acts_ holds only the fp32 logits.
  const float* forward16(const float* x, std::size_t n) {
    const std::size_t layers = layout_.layers();
    acts16_.resize(layers - 1);
    acts_.resize(1);
    input_.assign(x, x + n * layout_.inputs());
    round16(precision_, input_.data(), input_.size());
    std::vector<float> bias16;
    for (std::size_t l = 0; l < layers; ++l) {
      const std::size_t out_w = layout_.widths[l + 1];
      const float* in = input_.data();
      if (l > 0) {
        scratch_.resize(n * layout_.widths[l]);
        decode16(precision_, acts16_[l - 1].data(), scratch_.data(), scratch_.size());
        in = scratch_.data();
      }
      widen_parameter(2 * l, weights_);
      widen_parameter(2 * l + 1, bias16);
      std::vector<float>& h = l + 1 < layers ? prev_ : acts_[0];
      h.resize(n * out_w);
      linear(in, weights_.data(), bias16.data(), h.data(), n, static_cast<int>(layout_.widths[l]), static_cast<int>(out_w));
      if (l + 1 < layers) {
        for (auto& v : h) v = v > 0.0f ? v : 0.0f;
        acts16_[l].resize(h.size());
        encode16(precision_, h.data(), acts16_[l].data(), h.size());
      }
    }
    return acts_[0].data();
  }

  template <class B>
  double step(const B& b, const partrain::grad_ready_fn* ready) {
    check_batch(b, layout_, "mlp_host::train_step");
    const std::size_t n = b.labels.size();
    if (n == 0) throw partrain::invalid_argument_error("mlp_host::train_step: the batch is empty");
    const float* x = b.features.data();
    const float* logits = forward(x, n);

    // d(mean loss)/d(logits) = (softmax - onehot) / n, times the loss scale
    const std::size_t c = layout_.classes();
    delta_.resize(n * c);
    double loss = 0;
    const float inv_n = 1.0f / static_cast<float>(n);
    for (std::size_t i = 0; i < n; ++i) {
      const float* z = logits + i * c;
      float* d = delta_.data() + i * c;
      const auto y = static_cast<std::size_t>(b.labels.data()[i]);
      const float m = *std::max_element(z, z + c);
      float s = 0;
      for (std::size_t j = 0; j < c; ++j) s += (d[j] = std::exp(z[j] - m));
      for (std::size_t j = 0; j < c; ++j) d[j] = d[j] / s * inv_n;
      loss += row_loss(s, z[y] - m);
      d[y] -= inv_n;
    }
    if (loss_scale_ != 1.0f) {
      for (auto& d : delta_) d *= loss_scale_;
    }
    if (low_precision()) {
      backward16(n, ready);
    } else {
      backward32(x, n, ready);
    }
    return loss / static_cast<double>(n);
  }

  // db = column sums of delta [n, out_w].
  void bias_grad(float* gb, std::size_t n, int out_w) const {
    std::fill(gb, gb + out_w, 0.0f);
    for (std::size_t i = 0; i < n; ++i) {
      const float* d = delta_.data() + i * static_cast<std::size_t>(out_w);
      for (int j = 0; j < out_w; ++j) gb[j] += d[j];
    }
  }
  // dW = delta^T . in
  void weight_grad(float* gw, const float* in, std::size_t n, int in_w, int out_w) const {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out_w, in_w, static_cast<int>(n), 1.0f, delta_.data(), out_w,
                in, in_w, 0.0f, gw, in_w);
  }
  // prev_ = (delta . W) * relu'(in): the gradient reaching the layer below.
  void input_grad(const float* w, const float* in, std::size_t n, int in_w, int out_w) {
    prev_.resize(n * static_cast<std::size_t>(in_w));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(n), in_w, out_w, 1.0f, delta_.data(), out_w,
                w, in_w, 0.0f, prev_.data(), in_w);
    // A select rather than a conditional store: it vectorizes and does not branch on the sign,
    // which a trained ReLU makes a coin toss (the branch cost 6% of the step in perf).
    for (std::size_t i = 0; i < prev_.size(); ++i) prev_[i] = in[i] <= 0.0f ? 0.0f : prev_[i];
  }

  void backward32(const float* x, std::size_t n, const partrain::grad_ready_fn* ready) {
    for (std::size_t l = layout_.layers(); l-- > 0;) {
      const int out_w = static_cast<int>(layout_.widths[l + 1]);
      const int in_w = static_cast<int>(layout_.widths[l]);
      const float* in = l == 0 ? x : acts_[l - 1].data();
      bias_grad(grads_.data() + layout_.bias_offset(l), n, out_w);
      if (ready) (*ready)(2 * l + 1);
      weight_grad(grads_.data() + layout_.weight_offset(l), in, n, in_w, out_w);
      if (ready) (*ready)(2 * l);
      if (l == 0) break;
      input_grad(weight(l), in, n, in_w, out_w);
      delta_.swap(prev_);
    }
  }

  // The same with every stored gradient rounded to 16 bits: the flowing gradient (delta) and the
  // parameters' gradients (an fp16 overflow shows up here as inf, for the gradient scaler).
  void backward16(std::size_t n, const partrain::grad_ready_fn* ready) {
    round16(precision_, delta_.data(), delta_.size());
    for (std::size_t l = layout_.layers(); l-- > 0;) {
      const int out_w = static_cast<int>(layout_.widths[l + 1]);
      const int in_w = static_cast<int>(layout_.widths[l]);
      const float* in = input_.data();
      if (l > 0) {
        scratch_.resize(acts16_[l - 1].size());
        decode16(precision_, acts16_[l - 1].data(), scratch_.data(), scratch_.size());
        in = scratch_.data();
      }
      float* gb = grads_.data() + layout_.bias_offset(l);
      bias_grad(gb, n, out_w);
      round16(precision_, gb, static_cast<std::size_t>(out_w));
      if (ready) (*ready)(2 * l + 1);
      float* gw = grads_.data() + layout_.weight_offset(l);
      weight_grad(gw, in, n, in_w, out_w);
      round16(precision_, gw, static_cast<std::size_t>(out_w) * static_cast<std::size_t>(in_w));
      if (ready) (*ready)(2 * l);
      if (l == 0) break;
      widen_parameter(2 * l, weights_);
      input_grad(weights_.data(), in, n, in_w, out_w);
      round16(precision_, prev_.data(), prev_.size());
      delta_.swap(prev_);
    }
  }

  mlp_layout layout_;
  partrain::precision precision_ = partrain::precision::fp32;
  float loss_scale_ = 1.0f;
  partrain::host_buffer<float> values_;
  partrain::host_buffer<float> grads_;
  std::vector<host_parameter> params_;
  partrain::low_precision_copy<> low_;  // the 16-bit weights (fp16/bf16 only)
  std::vector<std::vector<float>> acts_;  // scratch, reused across steps
  std::vector<std::vector<std::uint16_t>> acts16_;
  std::vector<float> delta_, prev_, input_, scratch_, weights_;
};

}  // namespace models
