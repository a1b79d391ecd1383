// A small deterministic host model for the optimizer, DDP and checkpoint tests: a two-layer
// perceptron (tanh hidden layer, linear output, mean squared error), in float or double, with
// or without gradient-ready notification.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <partrain/core/tensor_view.hpp>
#include <partrain/model/concepts.hpp>

namespace partrain::testing {

// A deterministic generator (SplitMix64) so every run and every rank sees the same numbers.
class toy_rng {
 public:
  explicit toy_rng(std::uint64_t seed) : s_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [-1, 1).
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-52 - 1.0; }

 private:
  std::uint64_t s_;
};

template <class T>
struct toy_batch {
  std::size_t n = 0, in = 0, out = 0;
  std::vector<T> x;  // [n, in]
  std::vector<T> y;  // [n, out]
  [[nodiscard]] std::size_t size() const noexcept { return n; }
};

// Samples [first, first + n) of a fixed synthetic data set (sample i depends only on i).
template <class T>
toy_batch<T> make_toy_batch(std::size_t first, std::size_t n, std::size_t in = 6, std::size_t out = 3) {
  toy_batch<T> b{n, in, out, std::vector<T>(n * in), std::vector<T>(n * out)};
  for (std::size_t s = 0; s < n; ++s) {
    toy_rng r(1000 + first + s);
    for (std::size_t j = 0; j < in; ++j) b.x[s * in + j] = static_cast<T>(r.uniform());
    for (std::size_t k = 0; k < out; ++k) {
      double t = 0;
      for (std::size_t j = 0; j < in; ++j) t += std::sin(static_cast<double>(j + k + 1)) * static_cast<double>(b.x[s * in + j]);
      b.y[s * out + k] = static_cast<T>(t);
    }
  }
  return b;
}

// Concatenation of consecutive batches (what one process sees when N ranks see the parts).
template <class T>
toy_batch<T> concat(const std::vector<toy_batch<T>>& parts) {
  toy_batch<T> b{0, parts.at(0).in, parts.at(0).out, {}, {}};
  for (const auto& p : parts) {
    b.n += p.n;
    b.x.insert(b.x.end(), p.x.begin(), p.x.end());
    b.y.insert(b.y.end(), p.y.begin(), p.y.end());
  }
  return b;
}

template <class T>
class toy_param {
 public:
  toy_param(std::string name, partrain::shape s) : name_(std::move(name)), shape_(s), value_(s.numel()), grad_(s.numel()) {}
  [[nodiscard]] tensor_view<T> value() { return {value_.data(), shape_}; }
  [[nodiscard]] tensor_view<T> grad() { return {grad_.data(), shape_}; }
  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  [[nodiscard]] std::vector<T>& values() noexcept { return value_; }
  [[nodiscard]] const std::vector<T>& values() const noexcept { return value_; }
  [[nodiscard]] std::vector<T>& grads() noexcept { return grad_; }

 private:
  std::string name_;
  partrain::shape shape_;
  std::vector<T> value_, grad_;
};

// y = W2 tanh(W1 x + b1) + b2, loss = mean over samples of 0.5 ||y - t||². Parameters in the
// order W1, b1, W2, b2; backward finishes them in reverse order.
template <class T, bool Notify = true>
class toy_mlp {
 public:
  explicit toy_mlp(std::uint64_t seed = 7, std::size_t in = 6, std::size_t hidden = 5, std::size_t out = 3)
      : in_(in), hidden_(hidden), out_(out) {
    params_.emplace_back("fc1.weight", partrain::shape{hidden, in});
    params_.emplace_back("fc1.bias", partrain::shape{hidden});
    params_.emplace_back("fc2.weight", partrain::shape{out, hidden});
    params_.emplace_back("fc2.bias", partrain::shape{out});
    toy_rng r(seed);
    for (auto& p : params_) {
      for (auto& v : p.values()) v = static_cast<T>(0.5 * r.uniform());
    }
  }

  [[nodiscard]] std::vector<toy_param<T>>& parameters() noexcept { return params_; }
  [[nodiscard]] const std::vector<toy_param<T>>& parameters() const noexcept { return params_; }

  double train_step(const toy_batch<T>& b) { return run(b, nullptr); }
  double train_step(const toy_batch<T>& b, const grad_ready_fn& ready)
    requires Notify
  {
    return run(b, &ready);
  }

  [[nodiscard]] eval_result eval_step(const toy_batch<T>& b) {
    eval_result r;
    std::vector<T> h(hidden_), y(out_);
    for (std::size_t s = 0; s < b.n; ++s) {
      forward(&b.x[s * in_], h.data(), y.data());
      double l = 0;
      std::size_t arg_y = 0, arg_t = 0;
      for (std::size_t k = 0; k < out_; ++k) {
        const double d = static_cast<double>(y[k]) - static_cast<double>(b.y[s * out_ + k]);
        l += 0.5 * d * d;
        if (y[k] > y[arg_y]) arg_y = k;
        if (b.y[s * out_ + k] > b.y[s * out_ + arg_t]) arg_t = k;
      }
      r.loss_sum += l;
      r.correct += arg_y == arg_t ? 1 : 0;
      ++r.count;
    }
    return r;
  }

  // Every value of every parameter, in order (what the tests compare).
  [[nodiscard]] std::vector<T> flat_values() const {
    std::vector<T> all;
    for (const auto& p : params_) all.insert(all.end(), p.values().begin(), p.values().end());
    return all;
  }
  [[nodiscard]] std::vector<T> flat_grads() {
    std::vector<T> all;
    for (auto& p : params_) all.insert(all.end(), p.grads().begin(), p.grads().end());
    return all;
  }

  int steps_run = 0;

 private:
  void forward(const T* x, T* h, T* y) const {
    const auto& w1 = params_[0].values();
    const auto& b1 = params_[1].values();
    const auto& w2 = params_[2].values();
    const auto& b2 = params_[3].values();
    for (std::size_t j = 0; j < hidden_; ++j) {
      T a = b1[j];
      for (std::size_t i = 0; i < in_; ++i) a += w1[j * in_ + i] * x[i];
      h[j] = std::tanh(a);
    }
    for (std::size_t k = 0; k < out_; ++k) {
      T a = b2[k];
      for (std::size_t j = 0; j < hidden_; ++j) a += w2[k * hidden_ + j] * h[j];
      y[k] = a;
    }
  }

  double run(const toy_batch<T>& b, const grad_ready_fn* ready) {
    ++steps_run;
    const std::size_t n = b.n;
    std::vector<T> h(n * hidden_), dy(n * out_);
    std::vector<T> y(out_);
    double loss = 0;
    const T inv_n = T(1) / static_cast<T>(n);
    for (std::size_t s = 0; s < n; ++s) {
      forward(&b.x[s * in_], &h[s * hidden_], y.data());
      for (std::size_t k = 0; k < out_; ++k) {
        const T d = y[k] - b.y[s * out_ + k];
        loss += 0.5 * static_cast<double>(d) * static_cast<double>(d);
        dy[s * out_ + k] = d * inv_n;
      }
    }
    for (auto& p : params_) std::fill(p.grads().begin(), p.grads().end(), T(0));
    auto& gw2 = params_[2].grads();
    auto& gb2 = params_[3].grads();
    const auto& w2 = params_[2].values();
    // Output layer first: its gradients are final before the hidden layer's are computed.
    for (std::size_t s = 0; s < n; ++s) {
      for (std::size_t k = 0; k < out_; ++k) {
        gb2[k] += dy[s * out_ + k];
        for (std::size_t j = 0; j < hidden_; ++j) gw2[k * hidden_ + j] += dy[s * out_ + k] * h[s * hidden_ + j];
      }
    }
    if (ready) {
      (*ready)(3);
      (*ready)(2);
    }
    auto& gw1 = params_[0].grads();
    auto& gb1 = params_[1].grads();
    for (std::size_t s = 0; s < n; ++s) {
      for (std::size_t j = 0; j < hidden_; ++j) {
        T dh = 0;
        for (std::size_t k = 0; k < out_; ++k) dh += w2[k * hidden_ + j] * dy[s * out_ + k];
        const T hv = h[s * hidden_ + j];
        const T da = dh * (T(1) - hv * hv);
        gb1[j] += da;
        for (std::size_t i = 0; i < in_; ++i) gw1[j * in_ + i] += da * b.x[s * in_ + i];
      }
    }
    if (ready) {
      (*ready)(1);
      (*ready)(0);
    }
    return loss / static_cast<double>(n);
  }

  std::size_t in_, hidden_, out_;
  std::vector<toy_param<T>> params_;
};

// The toy model with a loss scale applied to its gradients (what a mixed-precision model's
// backward does), an overflow a test can plant in one rank's gradients at one step, and a count
// of 16-bit refreshes.
template <class T>
class scaled_toy_mlp : public toy_mlp<T, false> {
 public:
  using toy_mlp<T, false>::toy_mlp;
  void set_loss_scale(float s) { scale_ = s; }
  double train_step(const toy_batch<T>& b) {
    const double loss = toy_mlp<T, false>::train_step(b);
    for (auto& p : this->parameters()) {
      for (T& g : p.grads()) g *= static_cast<T>(scale_);
    }
    if (this->steps_run == poison_at) this->parameters()[1].grads()[2] = std::numeric_limits<T>::infinity();
    return loss;
  }
  int poison_at = -1;  // steps_run value (1-based) at which to plant inf
  int refreshes = 0;
  void refresh_low_precision() { ++refreshes; }

 private:
  float scale_ = 1;
};

}  // namespace partrain::testing
