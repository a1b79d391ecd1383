// partrain/parallel/detail/zero_optimizer.hpp: the optimizer state of one rank's shard (SGD's
// momentum or AdamW's moments over the shard's elements only) and its update, through the same
// coefficients and element functions as optim/sgd.hpp and optim/adamw.hpp, so a sharded step is
// the replicated step's arithmetic on a slice.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include <partrain/core/error.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/optim/adamw.hpp>
#include <partrain/optim/detail/state_buffer.hpp>
#include <partrain/optim/sgd.hpp>

namespace partrain::inline v0 {

// The optimizer a sharded data parallel steps its shard with (PyTorch's ZeroRedundancyOptimizer
// takes the optimizer class the same way).
using shard_optimizer_options = std::variant<sgd_options, adamw_options>;

// One rank's optimizer state, as flat arrays over its shard (what a sharded checkpoint stores).
template <class T>
struct shard_optimizer_state {
  std::string kind;                   // "sgd" or "adamw"
  std::int64_t steps = 0;
  std::vector<std::vector<T>> arrays;  // sgd: {momentum} once it exists; adamw: {exp_avg, exp_avg_sq} once stepped
};

namespace detail::zero {

// S: where the shard's values, gradients and state live; on a CUDA device (device_index) the
// element loops queue on `stream` and have finished on return (optim/detail/kernels.cuh).
template <class T, class S = host>
class shard_optimizer {
 public:
  shard_optimizer(shard_optimizer_options o, std::size_t elements, int device_index = -1, void* stream = nullptr)
      : opts_(o), elements_(elements), device_(device_index), stream_(stream) {
    std::visit([](const auto& x) { optim::validate(x); }, opts_);
  }

  [[nodiscard]] bool is_sgd() const noexcept { return std::holds_alternative<sgd_options>(opts_); }
  [[nodiscard]] std::string kind() const { return is_sgd() ? "sgd" : "adamw"; }
  [[nodiscard]] std::int64_t steps() const noexcept { return steps_; }
  [[nodiscard]] double lr() const noexcept { return std::visit([](const auto& x) { return x.lr; }, opts_); }
  void set_lr(double lr) {
    if (!(lr >= 0)) throw invalid_argument_error("sharded_data_parallel::set_lr: lr must be >= 0, got " + std::to_string(lr));
    std::visit([lr](auto& x) { x.lr = lr; }, opts_);
  }
  [[nodiscard]] const shard_optimizer_options& options() const noexcept { return opts_; }

  // Starts a step: allocates the state the first step needs and fixes the coefficients.
  void begin_step() {
    first_ = !has_state_;
    if (!has_state_) {
      if (is_sgd()) {
        if (std::get<sgd_options>(opts_).momentum != 0) {
          a_.assign_zero(elements_, device_, stream_);
          has_state_ = true;
        }
      } else {
        a_.assign_zero(elements_, device_, stream_);
        b_.assign_zero(elements_, device_, stream_);
        has_state_ = true;
      }
    }
    ++steps_;
    if (is_sgd()) {
      sgd_ = optim::sgd_coeffs_of<T>(std::get<sgd_options>(opts_));
    } else {
      adamw_ = optim::adamw_coeffs_of<T>(std::get<adamw_options>(opts_), steps_);
    }
  }
  // Updates the values v (n elements) at shard offset `at`, with their gradients g.
  void update(T* v, const T* g, std::size_t at, std::size_t n) {
    const tensor_view<T, S> vv(v, n);
    const tensor_view<const T, S> gv(g, n);
    if (is_sgd()) {
      optim::sgd_update(vv, gv, has_state_ ? a_.data() + at : nullptr, sgd_, first_, stream_);
    } else {
      optim::adamw_update(vv, gv, a_.data() + at, b_.data() + at, adamw_, stream_);
    }
  }

  [[nodiscard]] std::size_t state_bytes() const noexcept { return (a_.size() + b_.size()) * sizeof(T); }

  [[nodiscard]] shard_optimizer_state<T> state() const {
    shard_optimizer_state<T> s{kind(), steps_, {}};
    if (!has_state_) return s;
    s.arrays.emplace_back(elements_);
    a_.copy_to_host(s.arrays.back());
    if (!is_sgd()) {
      s.arrays.emplace_back(elements_);
      b_.copy_to_host(s.arrays.back());
    }
    return s;
  }
  // Restores what state() returned (possibly assembled from other shards: same kind, arrays of
  // this shard's length). `source` names where it came from in messages.
  void load(const shard_optimizer_state<T>& s, const std::string& source) {
    if (s.kind != kind()) {
      throw checkpoint_error(source + " holds " + s.kind + " optimizer state, this run steps with " + kind());
    }
    const bool momentum = is_sgd() && std::get<sgd_options>(opts_).momentum != 0;
    const std::size_t want = is_sgd() ? (momentum ? 1 : 0) : 2;
    if (!s.arrays.empty() && s.arrays.size() != want) {
      throw checkpoint_error(source + " holds " + std::to_string(s.arrays.size()) + " " + s.kind +
                             " state arrays, expected " + std::to_string(want));
    }
    for (const auto& a : s.arrays) {
      if (a.size() != elements_) {
        throw checkpoint_error(source + " holds optimizer state of " + std::to_string(a.size()) +
                               " elements for this rank's shard of " + std::to_string(elements_));
      }
    }
    has_state_ = !s.arrays.empty();
    a_ = {};
    b_ = {};
    if (has_state_) {
      a_.copy_from_host(s.arrays[0], device_);
      if (s.arrays.size() > 1) b_.copy_from_host(s.arrays[1], device_);
    }
    steps_ = s.steps;
  }

 private:
  shard_optimizer_options opts_;
  std::size_t elements_;
  int device_ = -1;
  void* stream_ = nullptr;
  optim::state_buffer<T, S> a_, b_;  // momentum | exp_avg, exp_avg_sq
  bool has_state_ = false;
  bool first_ = false;  // this step creates the momentum (SGD clones the gradient into it)
  std::int64_t steps_ = 0;
  optim::sgd_coeffs<T> sgd_{};
  optim::adamw_coeffs<T> adamw_{};
};

}  // namespace detail::zero

}  // namespace partrain::inline v0
