// partrain/optim/optimizer.hpp: what an optimizer is, and the parameter traits the optimizers,
// clipping and checkpoints share.
#pragma once

#include <concepts>
#include <cstddef>
#include <ranges>
#include <string>
#include <type_traits>
#include <utility>

#include <partrain/core/error.hpp>
#include <partrain/core/memory_space.hpp>
#include <partrain/model/concepts.hpp>
#include <partrain/model/traits.hpp>
#include <partrain/optim/state_io.hpp>

namespace partrain::inline v0 {

// Anything the training loop can step and clear (torch.optim.Optimizer's two verbs).
template <class O>
concept optimizer = requires(O& o) {
  o.step();
  o.zero_grad();
};

// An optimizer whose state (momentum, moments, step count) a checkpoint can carry.
template <class O>
concept stateful_optimizer = optimizer<O> && requires(const O& co, O& o, state_writer& w, state_reader& r) {
  co.save_state(w);
  o.load_state(r);
};

namespace detail::optim {

// The optimizers update in the parameters' own precision, as PyTorch does; 16-bit models keep
// fp32 master weights and step those.
template <class T>
concept optimizable_element = std::same_as<T, float> || std::same_as<T, double>;

template <class T, class S>
consteval bool check_optimizable() {
  static_assert(optimizable_element<T>,
                "partrain: optimizers and clipping update float or double parameters; for 16-bit models step fp32 "
                "master weights");
#if !defined(__CUDACC__)
  static_assert(!std::same_as<S, cuda>,
                "partrain: optimizing CUDA parameters needs the translation unit compiled by nvcc (the kernels are "
                "in partrain/optim/detail/kernels.cuh)");
#endif
  return true;
}

template <class V, class G>
void check_same_size(const V& v, const G& g, std::size_t index, const char* who) {
  if (v.size() != g.size()) {
    throw invalid_argument_error(std::string(who) + ": parameter #" + std::to_string(index) + " has " +
                                 std::to_string(v.size()) + " values but its gradient has " + std::to_string(g.size()) +
                                 " elements (expected the same shape)");
  }
}

}  // namespace detail::optim

namespace detail {

template <model M>
[[nodiscard]] std::size_t parameter_count(M& m) {
  std::size_t n = 0;
  for (auto&& p : m.parameters()) {
    (void)p;
    ++n;
  }
  return n;
}

// A parameter's name for messages and checkpoints: its name() when it has one, else "#index".
template <class P>
[[nodiscard]] std::string param_name(const P& p, std::size_t index) {
  if constexpr (requires { { p.name() } -> std::convertible_to<std::string>; }) {
    return std::string(p.name());
  } else {
    // Appended, not "#" + to_string(): GCC 12 warns (-Wrestrict, a false positive) on the insert
    // that operator+ inlines to.
    std::string s = "#";
    s += std::to_string(index);
    return s;
  }
}

}  // namespace detail

}  // namespace partrain::inline v0
