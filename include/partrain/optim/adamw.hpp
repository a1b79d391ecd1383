// partrain/optim/adamw.hpp: Adam with decoupled weight decay, following torch.optim.AdamW's
// single-tensor update (bias-corrected moments, eps added after the square root).
#pragma once

#include <cmath>
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

struct adamw_options {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

namespace detail::optim {
inline void validate(const adamw_options& o) {
  auto bad = [](const std::string& what) { throw invalid_argument_error("adamw_options: " + what); };
  if (!(o.lr >= 0)) bad("lr must be >= 0, got " + std::to_string(o.lr));
  if (!(o.beta1 >= 0 && o.beta1 < 1)) bad("beta1 must be in [0, 1), got " + std::to_string(o.beta1));
  if (!(o.beta2 >= 0 && o.beta2 < 1)) bad("beta2 must be in [0, 1), got " + std::to_string(o.beta2));
  if (!(o.eps >= 0)) bad("eps must be >= 0, got " + std::to_string(o.eps));
  if (!(o.weight_decay >= 0)) bad("weight_decay must be >= 0, got " + std::to_string(o.weight_decay));
}

// The element rule's coefficients for step `step` (1-based), in the parameters' precision (also
// what a sharded optimizer steps its slice with, so both paths run the same arithmetic).
template <class T>
[[nodiscard]] adamw_coeffs<T> adamw_coeffs_of(const adamw_options& o, std::int64_t step) {
  // PyTorch computes the bias corrections as Python floats (double), then the tensor ops take
  // them in the parameter's precision.
  const double bc1 = 1 - std::pow(o.beta1, static_cast<double>(step));
  const double bc2 = 1 - std::pow(o.beta2, static_cast<double>(step));
  return {T(1 - o.lr * o.weight_decay), T(1 - o.beta1),      T(1) - T(1 - o.beta1), T(o.beta2),
          T(1 - o.beta2),               T(std::sqrt(bc2)),   T(o.eps),              T(-(o.lr / bc1))};
}

// save_state's layout, in one place for whoever writes it (a sharded checkpoint loaded into a
// replicated adamw too): kind tag, step count, parameter count, then (once a step was taken)
// both moments of every parameter.
inline void put_adamw_state_header(state_writer& w, std::int64_t steps, std::size_t params) {
  w.put_string("adamw");
  w.put(steps);
  w.put(static_cast<std::uint64_t>(params));
}
template <class T>
void put_adamw_state_entry(state_writer& w, std::span<const T> exp_avg, std::span<const T> exp_avg_sq) {
  w.put_array(exp_avg);
  w.put_array(exp_avg_sq);
}
}  // namespace detail::optim

template <class M>
class adamw {
  static_assert(check_model<M>(), "partrain: adamw steps a model's parameters");
  using T = model_element_t<M>;
  using S = model_space_t<M>;
  static_assert(detail::optim::check_optimizable<T, S>());

 public:
  adamw(M& m, adamw_options o) : model_(&m), opts_(o), stream_(model_stream(m)), device_(model_cuda_device(m)) {
    detail::optim::validate(o);
    const auto n = detail::parameter_count(m);
    exp_avg_.resize(n);
    exp_avg_sq_.resize(n);
  }

  void step() {
    if (step_ == 0) {
      std::size_t i = 0;
      for (auto&& p : model_->parameters()) {
        check_index(i);
        exp_avg_[i].assign_zero(p.value().size(), device_, stream_);
        exp_avg_sq_[i].assign_zero(p.value().size(), device_, stream_);
        ++i;
      }
    }
    ++step_;
    const auto c = detail::optim::adamw_coeffs_of<T>(opts_, step_);
    std::size_t i = 0;
    for (auto&& p : model_->parameters()) {
      check_index(i);
      auto v = p.value();
      tensor_view<const T, S> g = p.grad();
      detail::optim::check_same_size(v, g, i, "adamw");
      detail::optim::adamw_update(v, g, exp_avg_[i].data(), exp_avg_sq_[i].data(), c, stream_);
      ++i;
    }
  }

  void zero_grad() {
    for (auto&& p : model_->parameters()) detail::optim::fill_zero(p.grad(), stream_);
  }

  [[nodiscard]] const adamw_options& options() const noexcept { return opts_; }
  void set_lr(double lr) {
    if (!(lr >= 0)) throw invalid_argument_error("adamw::set_lr: lr must be >= 0, got " + std::to_string(lr));
    opts_.lr = lr;
  }
  [[nodiscard]] std::int64_t steps() const noexcept { return step_; }

  // State: kind tag, step count, then both moments of every parameter (once a step was taken).
  void save_state(state_writer& w) const {
    detail::optim::put_adamw_state_header(w, step_, exp_avg_.size());
    if (step_ == 0) return;
    std::vector<T> m, s;
    for (std::size_t i = 0; i < exp_avg_.size(); ++i) {
      m.resize(exp_avg_[i].size());
      s.resize(exp_avg_sq_[i].size());
      exp_avg_[i].copy_to_host(m);
      exp_avg_sq_[i].copy_to_host(s);
      detail::optim::put_adamw_state_entry(w, std::span<const T>(m), std::span<const T>(s));
    }
  }
  void load_state(state_reader& r) {
    const auto kind = r.get_string("optimizer kind");
    if (kind != "adamw") throw checkpoint_error("optimizer state is for '" + kind + "', expected 'adamw'");
    const auto step = r.get<std::int64_t>("adamw step count");
    const auto n = r.get<std::uint64_t>("adamw parameter count");
    if (n != exp_avg_.size()) {
      throw checkpoint_error("adamw state has " + std::to_string(n) + " parameters, the model has " +
                             std::to_string(exp_avg_.size()));
    }
    if (step > 0) {
      std::vector<std::size_t> sizes;
      for (auto&& p : model_->parameters()) sizes.push_back(p.value().size());
      std::vector<T> host;
      for (std::size_t i = 0; i < n; ++i) {
        host.resize(sizes[i]);
        r.get_array(std::span<T>(host), "adamw exp_avg of parameter #" + std::to_string(i));
        exp_avg_[i].copy_from_host(host, device_);
        r.get_array(std::span<T>(host), "adamw exp_avg_sq of parameter #" + std::to_string(i));
        exp_avg_sq_[i].copy_from_host(host, device_);
      }
    }
    step_ = step;
  }

 private:
  void check_index(std::size_t i) const {
    if (i >= exp_avg_.size()) {
      throw invalid_argument_error("adamw: the model now has more than " + std::to_string(exp_avg_.size()) +
                                   " parameters (its parameter list must not change after the optimizer is made)");
    }
  }

  M* model_;
  adamw_options opts_;
  void* stream_;  // the model's (model_stream): device work on its tensors is queued there
  int device_;    // the model's CUDA device (-1: host, or the current one): where the state lives
  std::vector<detail::optim::state_buffer<T, S>> exp_avg_;
  std::vector<detail::optim::state_buffer<T, S>> exp_avg_sq_;
  std::int64_t step_ = 0;
};

}  // namespace partrain::inline v0
