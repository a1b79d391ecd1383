// tests/support/dp_models.hpp: a small replicable model for the data_parallel tests and bench:
// softmax regression (logits = x W^T + b, mean cross-entropy) on partrain::batch, in float, with
// test hooks shared by all replicas: sleep per example (slower on one device, for balance mode)
// and throw on one device (failure handling).
#pragma once

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <partrain/core/device.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/data/batch.hpp>
#include <partrain/model/concepts.hpp>

namespace partrain::test {

// Shared by a model and all its replicas.
struct dp_control {
  std::atomic<int> throw_on_device{-1};          // device index whose train_step throws
  std::atomic<int> slow_device{-1};              // device index that sleeps slow_factor times longer
  std::atomic<double> slow_factor{1.0};
  std::atomic<long> sleep_us_per_example{0};
  std::atomic<long> hang_ms_on_throw_device{0};  // instead of throwing, sleep this long (timeouts)
};

class dp_softmax_model {
 public:
  struct param {
    tensor_view<float> v, g;
    [[nodiscard]] tensor_view<float> value() const noexcept { return v; }
    [[nodiscard]] tensor_view<float> grad() const noexcept { return g; }
  };

  dp_softmax_model(std::size_t in, std::size_t classes, std::uint64_t seed = 1)
      : in_(in), classes_(classes), w_(in * classes), b_(classes), gw_(in * classes), gb_(classes),
        control_(std::make_shared<dp_control>()) {
    std::uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (auto& x : w_) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      x = (static_cast<float>(s >> 40) / static_cast<float>(1ull << 24) - 0.5f) * 0.2f;
    }
    bind();
  }
  dp_softmax_model(dp_softmax_model&& o) noexcept
      : in_(o.in_), classes_(o.classes_), w_(std::move(o.w_)), b_(std::move(o.b_)), gw_(std::move(o.gw_)),
        gb_(std::move(o.gb_)), control_(std::move(o.control_)), device_(o.device_) {
    bind();
  }
  dp_softmax_model(const dp_softmax_model&) = delete;
  dp_softmax_model& operator=(const dp_softmax_model&) = delete;
  dp_softmax_model& operator=(dp_softmax_model&&) = delete;

  [[nodiscard]] std::vector<param>& parameters() noexcept { return params_; }
  [[nodiscard]] std::size_t output_size() const noexcept { return classes_; }
  [[nodiscard]] dp_control& control() const noexcept { return *control_; }
  [[nodiscard]] const device& where() const noexcept { return device_; }

  [[nodiscard]] dp_softmax_model replicate_to(device d) const {
    dp_softmax_model m(in_, classes_);
    m.w_ = w_;
    m.b_ = b_;
    m.control_ = control_;
    m.device_ = d;
    m.bind();
    return m;
  }

  void forward(const batch& bt, tensor_view<float> out) const {
    check(bt);
    for (std::size_t r = 0; r < bt.size(); ++r) logits(bt.features.data() + r * in_, out.data() + r * classes_);
  }

  double train_step(const batch& bt) {
    check(bt);
    hooks(bt.size());
    std::fill(gw_.begin(), gw_.end(), 0.0f);
    std::fill(gb_.begin(), gb_.end(), 0.0f);
    const std::size_t n = bt.size();
    std::vector<float> z(classes_);
    double loss = 0;
    for (std::size_t r = 0; r < n; ++r) {
      const float* x = bt.features.data() + r * in_;
      const auto y = static_cast<std::size_t>(bt.labels[r]);
      softmax(x, z);
      loss -= std::log(std::max(z[y], 1e-30f));
      for (std::size_t k = 0; k < classes_; ++k) {
        const float d = (z[k] - (k == y ? 1.0f : 0.0f)) / static_cast<float>(n);
        gb_[k] += d;
        for (std::size_t j = 0; j < in_; ++j) gw_[k * in_ + j] += d * x[j];
      }
    }
    return loss / static_cast<double>(n);
  }

  [[nodiscard]] eval_result eval_step(const batch& bt) const {
    check(bt);
    eval_result r;
    std::vector<float> z(classes_);
    for (std::size_t i = 0; i < bt.size(); ++i) {
      softmax(bt.features.data() + i * in_, z);
      const auto y = static_cast<std::size_t>(bt.labels[i]);
      r.loss_sum -= std::log(std::max(z[y], 1e-30f));
      std::size_t best = 0;
      for (std::size_t k = 1; k < classes_; ++k) best = z[k] > z[best] ? k : best;
      r.correct += best == y ? 1 : 0;
      ++r.count;
    }
    return r;
  }

 private:
  void bind() {
    params_ = {param{tensor_view<float>(w_.data(), shape{classes_, in_}), tensor_view<float>(gw_.data(), shape{classes_, in_})},
               param{tensor_view<float>(b_), tensor_view<float>(gb_)}};
  }
  void check(const batch& bt) const {
    if (bt.features.size() != bt.size() * in_) throw std::invalid_argument("dp_softmax_model: feature size mismatch");
  }
  void hooks(std::size_t n) const {
    const bool mine = control_->throw_on_device.load() == device_.index;
    if (mine && control_->hang_ms_on_throw_device.load() > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(control_->hang_ms_on_throw_device.load()));
    } else if (mine) {
      throw std::runtime_error("injected failure in replica on " + device_.to_string());
    }
    if (const long us = control_->sleep_us_per_example.load(); us > 0) {
      double f = control_->slow_device.load() == device_.index ? control_->slow_factor.load() : 1.0;
      std::this_thread::sleep_for(std::chrono::microseconds(static_cast<long>(static_cast<double>(us * static_cast<long>(n)) * f)));
    }
  }
  void logits(const float* x, float* out) const {
    for (std::size_t k = 0; k < classes_; ++k) {
      float a = b_[k];
      for (std::size_t j = 0; j < in_; ++j) a += w_[k * in_ + j] * x[j];
      out[k] = a;
    }
  }
  void softmax(const float* x, std::vector<float>& z) const {
    logits(x, z.data());
    float mx = z[0];
    for (float v : z) mx = std::max(mx, v);
    float sum = 0;
    for (float& v : z) sum += (v = std::exp(v - mx));
    for (float& v : z) v /= sum;
  }

  std::size_t in_, classes_;
  std::vector<float> w_, b_, gw_, gb_;
  std::vector<param> params_;
  std::shared_ptr<dp_control> control_;
  device device_ = device::cpu(0);
};

// Deterministic classification data: n examples of `in` features in [-1, 1), labels in [0, classes).
struct dp_dataset {
  std::size_t in, classes;
  std::vector<float> features;
  std::vector<std::int32_t> labels;
  std::vector<std::size_t> indices;

  dp_dataset(std::size_t n, std::size_t in_, std::size_t classes_, std::uint64_t seed = 7)
      : in(in_), classes(classes_), features(n * in_), labels(n), indices(n) {
    std::uint64_t s = seed;
    auto next = [&] {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      return s >> 33;
    };
    for (std::size_t i = 0; i < n; ++i) {
      labels[i] = static_cast<std::int32_t>(next() % classes);
      indices[i] = i;
      for (std::size_t j = 0; j < in; ++j) {
        // Class-dependent mean so the model can learn something.
        const float base = (static_cast<std::size_t>(labels[i]) % in == j) ? 0.8f : 0.0f;
        features[i * in + j] = base + static_cast<float>(next() % 2000) / 1000.0f - 1.0f;
      }
    }
  }
  [[nodiscard]] std::size_t size() const noexcept { return labels.size(); }
  // Rows [first, first + n) as a partrain::batch.
  [[nodiscard]] batch rows(std::size_t first, std::size_t n) const {
    return batch{tensor_view<const float>(features.data() + first * in, shape{n, in}),
                 tensor_view<const std::int32_t>(labels.data() + first, n),
                 std::span<const std::size_t>(indices.data() + first, n)};
  }
};

}  // namespace partrain::test
