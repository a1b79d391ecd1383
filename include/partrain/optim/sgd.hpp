// partrain/optim/sgd.hpp: stochastic gradient descent with momentum, dampening, weight decay and
// Nesterov momentum, following torch.optim.SGD's update rule step for step.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <partrain/core/error.hpp>
#include <partrain/model/concepts.hpp>
#include <partrain/model/traits.hpp>
#include <partrain/optim/detail/state_buffer.hpp>
#include <partrain/optim/detail/update_rules.hpp>
#include <partrain/optim/optimizer.hpp>
#include <partrain/optim/state_io.hpp>

#if defined(__CUDACC__)
#include <partrain/optim/detail/kernels.cuh>
#endif

namespace partrain::inline v0 {

struct sgd_options {
  double lr = 0.01;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
};

namespace detail::optim {
inline void validate(const sgd_options& o) {
  auto bad = [](const std::string& what) { throw invalid_argument_error("sgd_options: " + what); };
  if (!(o.lr >= 0)) bad("lr must be >= 0, got " + std::to_string(o.lr));
  if (!(o.momentum >= 0)) bad("momentum must be >= 0, got " + std::to_string(o.momentum));
  if (!(o.weight_decay >= 0)) bad("weight_decay must be >= 0, got " + std::to_string(o.weight_decay));
  if (o.nesterov && (o.momentum <= 0 || o.dampening != 0)) {
    bad("nesterov momentum requires momentum > 0 and dampening == 0 (got momentum " + std::to_string(o.momentum) +
        ", dampening " + std::to_string(o.dampening) + ")");
  }
}

// The element rule's coefficients in the parameters' precision (also what a sharded optimizer
// steps its slice with, so both paths run the same arithmetic).
template <class T>
[[nodiscard]] sgd_coeffs<T> sgd_coeffs_of(const sgd_options& o) {
  return {T(o.lr), T(o.momentum), T(1 - o.dampening), T(o.weight_decay), o.nesterov, o.momentum != 0,
          o.weight_decay != 0};
}

// save_state's layout, in one place for whoever writes it (a sharded checkpoint loaded into a
// replicated sgd too): kind tag, step count, parameter count, then per parameter whether a
// momentum buffer exists and its values.
inline void put_sgd_state_header(state_writer& w, std::int64_t steps, std::size_t params) {
  w.put_string("sgd");
  w.put(steps);
  w.put(static_cast<std::uint64_t>(params));
}
template <class T>
void put_sgd_state_entry(state_writer& w, bool has_momentum, std::span<const T> momentum) {
  w.put(static_cast<std::uint8_t>(has_momentum ? 1 : 0));
  if (has_momentum) w.put_array(momentum);
}
}  // namespace detail::optim

template <class M>
class sgd {
  static_assert(check_model<M>(), "partrain: sgd steps a model's parameters");
  using T = model_element_t<M>;
  using S = model_space_t<M>;
  static_assert(detail::optim::check_optimizable<T, S>());

 public:
  sgd(M& m, sgd_options o) : model_(&m), opts_(o), stream_(model_stream(m)), device_(model_cuda_device(m)) {
    detail::optim::validate(o);
    const auto n = detail::parameter_count(m);
    buffers_.resize(n);
    has_buffer_.assign(n, 0);
  }

  void step() {
    const auto c = detail::optim::sgd_coeffs_of<T>(opts_);
    std::size_t i = 0;
    for (auto&& p : model_->parameters()) {
      check_index(i);
      auto v = p.value();
      tensor_view<const T, S> g = p.grad();
      detail::optim::check_same_size(v, g, i, "sgd");
      T* buf = nullptr;
      const bool first = !has_buffer_[i];
      if (c.has_momentum) {
        if (first) buffers_[i].assign_zero(v.size(), device_, stream_);
        buf = buffers_[i].data();
        has_buffer_[i] = 1;
      }
      detail::optim::sgd_update(v, g, buf, c, first, stream_);
      ++i;
    }
    ++steps_;
  }

  void zero_grad() {
    for (auto&& p : model_->parameters()) detail::optim::fill_zero(p.grad(), stream_);
  }

  [[nodiscard]] const sgd_options& options() const noexcept { return opts_; }
  void set_lr(double lr) {
    if (!(lr >= 0)) throw invalid_argument_error("sgd::set_lr: lr must be >= 0, got " + std::to_string(lr));
    opts_.lr = lr;
  }
  [[nodiscard]] std::int64_t steps() const noexcept { return steps_; }

  // State: kind tag, step count, then per parameter whether a momentum buffer exists and its values.
  void save_state(state_writer& w) const {
    detail::optim::put_sgd_state_header(w, steps_, buffers_.size());
    std::vector<T> host;
    for (std::size_t i = 0; i < buffers_.size(); ++i) {
      host.resize(has_buffer_[i] ? buffers_[i].size() : 0);
      if (has_buffer_[i]) buffers_[i].copy_to_host(host);
      detail::optim::put_sgd_state_entry(w, has_buffer_[i] != 0, std::span<const T>(host));
    }
  }
  void load_state(state_reader& r) {
    const auto kind = r.get_string("optimizer kind");
    if (kind != "sgd") throw checkpoint_error("optimizer state is for '" + kind + "', expected 'sgd'");
    const auto steps = r.get<std::int64_t>("sgd step count");
    const auto n = r.get<std::uint64_t>("sgd parameter count");
    if (n != buffers_.size()) {
      throw checkpoint_error("sgd state has " + std::to_string(n) + " parameters, the model has " +
                             std::to_string(buffers_.size()));
    }
    std::vector<std::size_t> sizes;
    for (auto&& p : model_->parameters()) sizes.push_back(p.value().size());
    std::vector<T> host;
    for (std::size_t i = 0; i < n; ++i) {
      has_buffer_[i] = r.get<std::uint8_t>("sgd momentum flag");
      if (!has_buffer_[i]) continue;
      host.resize(sizes[i]);
      r.get_array(std::span<T>(host), "sgd momentum of parameter #" + std::to_string(i));
      buffers_[i].copy_from_host(host, device_);
    }
    steps_ = steps;
  }

 private:
  void check_index(std::size_t i) const {
    if (i >= buffers_.size()) {
      throw invalid_argument_error("sgd: the model now has more than " + std::to_string(buffers_.size()) +
                                   " parameters (its parameter list must not change after the optimizer is made)");
    }
  }

  M* model_;
  sgd_options opts_;
  void* stream_;  // the model's (model_stream): device work on its tensors is queued there
  int device_;    // the model's CUDA device (-1: host, or the current one): where the state lives
  std::vector<detail::optim::state_buffer<T, S>> buffers_;
  std::vector<std::uint8_t> has_buffer_;
  std::int64_t steps_ = 0;
};

}  // namespace partrain::inline v0
