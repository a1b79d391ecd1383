// models/mlp_layers.hpp: the same MLP as mlp_host.hpp, written as a sequence of
// stage-able layers (each with forward, backward given the output gradient, and parameters), the
// shape partrain's pipeline splits into stages. Small float layers on the host: linear, relu,
// softmax cross-entropy, and an MLP factory.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <partrain/comm/process_group.hpp>
#include <partrain/core/buffer.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/model/concepts.hpp>
#include <partrain/model/layer.hpp>

namespace models::layers {

using namespace partrain;

struct host_param {
  host_buffer<float> v, g;
  explicit host_param(shape s) : v(s), g(s) {}
  [[nodiscard]] tensor_view<float> value() { return bound_ ? bound_value_ : v.view(); }
  [[nodiscard]] tensor_view<float> grad() { return bound_ ? bound_grad_ : g.view(); }
  // Fully sharded data parallel (partrain/parallel/fsdp.hpp) owns the storage from here on:
  // value() and grad() view its buffers (empty while this rank holds only its shard) and ours
  // are freed. A copy of a bound parameter views the same buffers.
  void bind(tensor_view<float> value, tensor_view<float> grad) noexcept {
    v = {};
    g = {};
    bound_value_ = value;
    bound_grad_ = grad;
    bound_ = true;
  }
  // Tensor parallel: the group this parameter is split across, each rank holding a slice (null:
  // whole on every rank). Clipping over a mesh sums its squares over that group.
  [[nodiscard]] partrain::process_group* shard_group() const noexcept { return shard_group_; }
  void set_shard_group(partrain::process_group* g) noexcept { shard_group_ = g; }

 private:
  tensor_view<float> bound_value_, bound_grad_;
  bool bound_ = false;
  partrain::process_group* shard_group_ = nullptr;
};

// A linear layer's initial weights w [out, in] and bias b [out]: uniform in +-1/sqrt(in), from
// seed (every model built from these layers starts from the same values).
inline void init_linear(std::size_t in, std::uint32_t seed, tensor_view<float> w, tensor_view<float> b) {
  std::mt19937 gen(seed);
  const float bound = 1.0f / std::sqrt(static_cast<float>(in));
  std::uniform_real_distribution<float> d(-bound, bound);
  for (auto& x : w) x = d(gen);
  for (auto& x : b) x = d(gen);
}

// The polymorphic base, so one sequence can hold different layer types.
class host_layer {
 public:
  virtual ~host_layer() = default;
  [[nodiscard]] virtual shape output_shape(const shape& in) const = 0;
  virtual void forward(tensor_view<const float> in, tensor_view<float> out) = 0;
  virtual void backward(tensor_view<const float> in, tensor_view<const float> out, tensor_view<const float> gout,
                        tensor_view<float> gin) = 0;
  [[nodiscard]] virtual std::vector<host_param>& parameters() = 0;
  [[nodiscard]] virtual std::unique_ptr<host_layer> clone() const = 0;

  // Training or evaluation (sequential's train(bool) and eval_step reach every layer through it):
  // only layers that behave differently (dropout) override it.
  virtual void train(bool) {}

  // Saved activations (partrain::keeps_activations): none unless a layer overrides these three.
  [[nodiscard]] virtual std::size_t saved_size(const shape&) const { return 0; }
  virtual void forward(tensor_view<const float> in, tensor_view<float> out, const layer_call<>&) { forward(in, out); }
  virtual void backward(tensor_view<const float> in, tensor_view<const float> out, const layer_call<>&,
                        tensor_view<const float> gout, tensor_view<float> gin) {
    backward(in, out, gout, gin);
  }
};

// The base of a layer that keeps activations: it writes the three saved-activation members, and
// the plain forward and backward (for callers that keep nothing) run through them, the backward
// after recomputing the forward.
class host_saving_layer : public host_layer {
 public:
  using host_layer::backward;
  using host_layer::forward;
  void forward(tensor_view<const float> in, tensor_view<float> out) final {
    std::vector<float> saved(saved_size(in.shape()));
    forward(in, out, layer_call<>{tensor_view<float>(saved.data(), shape{saved.size()}), 0});
  }
  void backward(tensor_view<const float> in, tensor_view<const float> out, tensor_view<const float> gout,
                tensor_view<float> gin) final {
    std::vector<float> saved(saved_size(in.shape())), again(out.size());
    const layer_call<> call{tensor_view<float>(saved.data(), shape{saved.size()}), 0};
    forward(in, tensor_view<float>(again.data(), out.shape()), call);
    backward(in, out, call, gout, gin);
  }
};

// y = x W^T + b, W is [out, in]. Sums over the batch in double, so the result barely depends
// on how the batch was split into micro-batches.
class linear final : public host_layer {
 public:
  using host_layer::backward;  // the saved-activation forms stay visible
  using host_layer::forward;
  linear(std::size_t in, std::size_t out, std::uint32_t seed) : in_(in), out_(out) {
    params_.emplace_back(shape{out, in});
    params_.emplace_back(shape{out});
    init_linear(in, seed, params_[0].v.view(), params_[1].v.view());
  }
  [[nodiscard]] shape output_shape(const shape& s) const override {
    if (s.rank() != 2 || s[1] != in_) {
      throw invalid_argument_error("linear: input shape " + s.to_string() + ", expected [batch, " + std::to_string(in_) + "]");
    }
    return {s[0], out_};
  }
  void forward(tensor_view<const float> x, tensor_view<float> y) override {
    const auto n = x.extent(0);
    const float* w = params_[0].value().data();  // value(), not v: the storage may be bound elsewhere
    const float* b = params_[1].value().data();
    for (std::size_t r = 0; r < n; ++r) {
      for (std::size_t o = 0; o < out_; ++o) {
        double acc = b[o];
        for (std::size_t i = 0; i < in_; ++i) acc += static_cast<double>(w[o * in_ + i]) * x[r * in_ + i];
        y[r * out_ + o] = static_cast<float>(acc);
      }
    }
  }
  void backward(tensor_view<const float> x, tensor_view<const float>, tensor_view<const float> gy,
                tensor_view<float> gx) override {
    const auto n = x.extent(0);
    float* gw = params_[0].grad().data();
    float* gb = params_[1].grad().data();
    const float* w = params_[0].value().data();
    // Loops run along contiguous rows; sums are kept in double and rounded once.
    std::vector<double> sw(out_ * in_, 0.0), sb(out_, 0.0), sx(in_);
    for (std::size_t r = 0; r < n; ++r) {
      const float* xr = x.data() + r * in_;
      const float* gr = gy.data() + r * out_;
      std::fill(sx.begin(), sx.end(), 0.0);
      for (std::size_t o = 0; o < out_; ++o) {
        const double g = gr[o];
        sb[o] += g;
        double* swo = sw.data() + o * in_;
        const float* wo = w + o * in_;
        for (std::size_t i = 0; i < in_; ++i) {
          swo[i] += g * xr[i];
          sx[i] += g * wo[i];
        }
      }
      for (std::size_t i = 0; i < in_; ++i) gx[r * in_ + i] = static_cast<float>(sx[i]);
    }
    for (std::size_t k = 0; k < out_ * in_; ++k) gw[k] += static_cast<float>(sw[k]);
    for (std::size_t o = 0; o < out_; ++o) gb[o] += static_cast<float>(sb[o]);
  }
  [[nodiscard]] std::vector<host_param>& parameters() override { return params_; }
  [[nodiscard]] std::unique_ptr<host_layer> clone() const override { return std::make_unique<linear>(*this); }

 private:
  std::size_t in_, out_;
  std::vector<host_param> params_;
};

class relu final : public host_layer {
 public:
  using host_layer::backward;  // the saved-activation forms stay visible
  using host_layer::forward;
  [[nodiscard]] shape output_shape(const shape& s) const override { return s; }
  // Raw pointers and the size read once: tensor_view::size() multiplies out the shape, and a
  // loop that calls it each time does not vectorize (6x slower on a CNN's [32, 8, 28, 28]).
  void forward(tensor_view<const float> x, tensor_view<float> y) override {
    const float* __restrict in = x.data();
    float* __restrict out = y.data();
    const std::size_t n = x.size();
    for (std::size_t i = 0; i < n; ++i) out[i] = std::max(in[i], 0.0f);
  }
  void backward(tensor_view<const float> x, tensor_view<const float>, tensor_view<const float> gy,
                tensor_view<float> gx) override {
    const float* __restrict in = x.data();
    const float* __restrict g = gy.data();
    float* __restrict out = gx.data();
    const std::size_t n = x.size();
    for (std::size_t i = 0; i < n; ++i) out[i] = in[i] > 0 ? g[i] : 0.0f;
  }
  [[nodiscard]] std::vector<host_param>& parameters() override { return none_; }
  [[nodiscard]] std::unique_ptr<host_layer> clone() const override { return std::make_unique<relu>(); }

 private:
  std::vector<host_param> none_;
};

using host_model = std::vector<std::unique_ptr<host_layer>>;

// linear(w0 -> w1), relu, linear(w1 -> w2), relu, ..., linear (no relu at the end).
[[nodiscard]] inline host_model make_mlp(const std::vector<std::size_t>& widths, std::uint32_t seed) {
  host_model m;
  for (std::size_t i = 0; i + 1 < widths.size(); ++i) {
    m.push_back(std::make_unique<linear>(widths[i], widths[i + 1], seed + static_cast<std::uint32_t>(i)));
    if (i + 2 < widths.size()) m.push_back(std::make_unique<relu>());
  }
  return m;
}

[[nodiscard]] inline host_model clone_model(const host_model& m) {
  host_model c;
  for (const auto& l : m) c.push_back(l->clone());
  return c;
}

// Softmax over the last dimension + cross-entropy with int32 class labels.
struct softmax_cross_entropy {
  double forward_backward(tensor_view<const float> logits, tensor_view<const std::int32_t> labels,
                          tensor_view<float> grad, float scale) const {
    return run(logits, labels, &grad, scale, nullptr);
  }
  eval_result evaluate(tensor_view<const float> logits, tensor_view<const std::int32_t> labels) const {
    eval_result r;
    r.loss_sum = run(logits, labels, nullptr, 0, &r.correct);
    r.count = logits.extent(0);
    return r;
  }

 private:
  static double run(tensor_view<const float> z, tensor_view<const std::int32_t> y, tensor_view<float>* grad,
                    float scale, std::size_t* correct) {
    const auto n = z.extent(0), k = z.shape().row_numel();
    if (y.size() != n) {
      throw invalid_argument_error("softmax_cross_entropy: " + std::to_string(y.size()) + " labels for " +
                                   std::to_string(n) + " rows (expected one label per row)");
    }
    double total = 0;
    for (std::size_t r = 0; r < n; ++r) {
      const float* row = z.data() + r * k;
      const auto label = y[r];
      if (label < 0 || static_cast<std::size_t>(label) >= k) {
        throw invalid_argument_error("softmax_cross_entropy: label " + std::to_string(label) + " in row " +
                                     std::to_string(r) + " (expected 0 <= label < " + std::to_string(k) + ")");
      }
      const float mx = *std::max_element(row, row + k);
      double sum = 0;
      for (std::size_t c = 0; c < k; ++c) sum += std::exp(static_cast<double>(row[c] - mx));
      total += std::log(sum) - static_cast<double>(row[label] - mx);
      if (grad) {
        for (std::size_t c = 0; c < k; ++c) {
          const double p = std::exp(static_cast<double>(row[c] - mx)) / sum;
          (*grad)[r * k + c] = static_cast<float>(scale * (p - (static_cast<std::size_t>(label) == c ? 1.0 : 0.0)));
        }
      }
      if (correct && static_cast<std::size_t>(std::max_element(row, row + k) - row) == static_cast<std::size_t>(label)) {
        ++*correct;
      }
    }
    return total;
  }
};

static_assert(layer<host_layer>);
static_assert(layer_sequence<host_model>);
static_assert(layer_loss<softmax_cross_entropy, std::int32_t>);

}  // namespace models::layers
