// partrain/optim/detail/update_rules.hpp: the per-element update rules, shared by the host
// loops and the CUDA kernels so both paths run the same arithmetic.
#pragma once

#include <cmath>

#include <partrain/config.hpp>
#include <partrain/core/detail/packet.hpp>

namespace partrain::inline v0::detail {

// In detail, beside core/detail/packet.hpp's packet4f overload, so one unqualified call sees both.
template <class T>
PARTRAIN_HOST_DEVICE inline T opt_sqrt(T x) {
#if defined(__CUDA_ARCH__)
  return ::sqrt(x);
#else
  return std::sqrt(x);
#endif
}

}  // namespace partrain::inline v0::detail

namespace partrain::inline v0::detail::optim {

// torch.optim.SGD (single-tensor path), in the parameter's precision.
template <class T>
struct sgd_coeffs {
  T lr, momentum, one_minus_dampening, weight_decay;
  bool nesterov;
  bool has_momentum;
  bool has_weight_decay;
};

// `first`: the momentum buffer does not exist yet (PyTorch clones the gradient into it).
template <class T>
PARTRAIN_HOST_DEVICE inline void sgd_element(T& v, T g, T* buf, const sgd_coeffs<T>& c, bool first) {
  T d = g;
  if (c.has_weight_decay) d = d + c.weight_decay * v;  // grad.add(param, alpha=weight_decay)
  if (c.has_momentum) {
    T b = first ? d : *buf * c.momentum + c.one_minus_dampening * d;  // buf.mul_(m).add_(d, alpha=1-damp)
    *buf = b;
    d = c.nesterov ? d + c.momentum * b : b;
  }
  v = v + (-c.lr) * d;  // param.add_(d, alpha=-lr)
}

// torch.optim.AdamW (single-tensor path): decoupled decay, then the Adam moments. V is T, or on
// the host a packet of T (core/detail/packet.hpp) updated lane by lane with the same operations.
template <class T>
struct adamw_coeffs {
  T decay_factor;           // 1 - lr * weight_decay
  T one_minus_beta1;        // lerp weight
  T beta1_as_t;             // 1 - weight, for lerp's weight >= 0.5 branch
  T beta2, one_minus_beta2;
  T bias_correction2_sqrt;  // sqrt(1 - beta2^step)
  T eps;
  T neg_step_size;          // -lr / (1 - beta1^step)
};

template <class V, class T>
PARTRAIN_HOST_DEVICE inline void adamw_element(V& v, V g, V& m, V& s, const adamw_coeffs<T>& c) {
  v = v * c.decay_factor;
  // exp_avg.lerp_(grad, 1 - beta1), with lerp's two branches as ATen computes them
  m = c.one_minus_beta1 < T(0.5) ? m + c.one_minus_beta1 * (g - m) : g - (g - m) * c.beta1_as_t;
  s = s * c.beta2 + c.one_minus_beta2 * g * g;  // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2)
  const V denom = opt_sqrt(s) / c.bias_correction2_sqrt + c.eps;
  v = v + c.neg_step_size * m / denom;  // param.addcdiv_(exp_avg, denom, value=-step_size)
}

}  // namespace partrain::inline v0::detail::optim
