// partrain/optim/detail/state_buffer.hpp: optimizer state beside the parameters (momentum,
// Adam moments) and the element loops on the host: the functors of optim/detail/elements.hpp run
// through for_each_index(host_exec). The CUDA twins (the same functors, launched) live in
// partrain/optim/detail/kernels.cuh and are picked by overload on the memory space.
#pragma once

#include <cstddef>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>

#include <partrain/core/memory_space.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/core/detail/packet.hpp>
#include <partrain/core/for_each_index.hpp>
#include <partrain/optim/detail/elements.hpp>
#include <partrain/optim/detail/update_rules.hpp>

namespace partrain::inline v0::detail::optim {

template <class T, class Space>
class state_buffer;

template <class T>
class state_buffer<T, host> {
 public:
  // device_index and stream matter to the CUDA twin only (kernels.cuh).
  void assign_zero(std::size_t n, int /*device_index*/ = -1, void* /*stream*/ = nullptr) { v_.assign(n, T(0)); }
  [[nodiscard]] T* data() noexcept { return v_.data(); }
  [[nodiscard]] std::size_t size() const noexcept { return v_.size(); }
  void copy_to_host(std::span<T> out) const {
    if (!v_.empty()) std::memcpy(out.data(), v_.data(), v_.size() * sizeof(T));
  }
  void copy_from_host(std::span<const T> in, int /*device_index*/ = -1) { v_.assign(in.begin(), in.end()); }

 private:
  std::vector<T> v_;
};

// The rule's loop-invariant choices (momentum, first step, Nesterov, weight decay) become
// constants of one loop each, so every loop is branch-free and GCC vectorizes it; with them as
// run-time flags it left the common cases scalar ("control flow in loop"), at a quarter of
// memcpy's speed (bench_elementwise). The element rule is still the one sgd_element.
template <class T>
void sgd_update(tensor_view<T, host> v, tensor_view<const T, host> g, T* buf, const sgd_coeffs<T>& c, bool first,
                void* /*stream: the CUDA twin's*/ = nullptr) {
  auto loop = [&]<bool Momentum, bool First, bool Nesterov, bool Decay>() {
    sgd_coeffs<T> k = c;
    k.has_momentum = Momentum;
    k.nesterov = Nesterov;
    k.has_weight_decay = Decay;
    for_each_index(host_exec{}, v.size(), sgd_update_fn<T>{v.data(), g.data(), Momentum ? buf : nullptr, k, First});
  };
  auto with_decay = [&]<bool Momentum, bool First, bool Nesterov>() {
    if (c.has_weight_decay) {
      loop.template operator()<Momentum, First, Nesterov, true>();
    } else {
      loop.template operator()<Momentum, First, Nesterov, false>();
    }
  };
  if (!c.has_momentum || !buf) {
    with_decay.template operator()<false, false, false>();
  } else if (first) {
    c.nesterov ? with_decay.template operator()<true, true, true>() : with_decay.template operator()<true, true, false>();
  } else {
    c.nesterov ? with_decay.template operator()<true, false, true>() : with_decay.template operator()<true, false, false>();
  }
}

template <class T>
void adamw_update(tensor_view<T, host> v, tensor_view<const T, host> g, T* m, T* s, const adamw_coeffs<T>& c,
                  void* /*stream: the CUDA twin's*/ = nullptr) {
  const adamw_update_fn<T> f{v.data(), g.data(), m, s, c};
  std::size_t done = 0;
#if PARTRAIN_HOST_PACKETS
  // Four lanes at a time through the same rule (std::sqrt keeps the scalar loop from vectorizing:
  // see core/detail/packet.hpp); the last few elements go through the scalar loop below.
  if constexpr (std::is_same_v<T, float>) {
    for (; done + packet4f_lanes <= v.size(); done += packet4f_lanes) {
      packet4f pv = load_packet(f.v + done), pm = load_packet(f.m + done), ps = load_packet(f.s + done);
      adamw_element(pv, load_packet(f.g + done), pm, ps, f.c);
      store_packet(f.v + done, pv);
      store_packet(f.m + done, pm);
      store_packet(f.s + done, ps);
    }
  }
#endif
  for (; done < v.size(); ++done) f(done);
}

// Σ g² accumulated in double: eight partial sums (the elements i mod 8), added pairwise at the
// end, then the tail. A fixed order, so the same on every run; with one running sum the loop
// waited on every addition (clipping ran at 0.17 of memcpy). The CUDA twin folds in its own
// (also fixed) order: the two agree to rounding, as any two summation orders do.
template <class T>
[[nodiscard]] double sum_squares(tensor_view<const T, host> g, void* /*stream*/ = nullptr) {
  constexpr std::size_t lanes = 8;
  const square_as_double_fn<T> sq{g.data()};
  double part[lanes] = {};
  std::size_t i = 0;
  for (; i + lanes <= g.size(); i += lanes) {
    for (std::size_t k = 0; k < lanes; ++k) part[k] += sq(i + k);
  }
  for (std::size_t width = lanes / 2; width > 0; width /= 2) {
    for (std::size_t k = 0; k < width; ++k) part[k] += part[k + width];
  }
  double total = part[0];
  for (; i < g.size(); ++i) total += sq(i);
  return total;
}

template <class T>
void scale_in_place(tensor_view<T, host> g, T coef, void* /*stream*/ = nullptr) {
  for_each_index(host_exec{}, g.size(), scale_fn<T>{g.data(), coef});
}

template <class T>
void fill_zero(tensor_view<T, host> g, void* /*stream*/ = nullptr) {
  for_each_index(host_exec{}, g.size(), fill_zero_fn<T>{g.data()});
}

}  // namespace partrain::inline v0::detail::optim
