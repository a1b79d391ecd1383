// partrain/data/sequential.hpp: views::sequential(n), the indices 0, 1, ..., n-1 in order
// (PyTorch's SequentialSampler). A random-access sized view; set_epoch is accepted and ignored
// so that loops can call it on any sampler.
#pragma once

#include <cstddef>
#include <cstdint>

#include <partrain/data/detail/indexed_view.hpp>

namespace partrain::inline v0 {

class sequential_view : public detail::data::indexed_view_base<sequential_view> {
 public:
  constexpr sequential_view() noexcept = default;
  constexpr explicit sequential_view(std::size_t n) noexcept : n_(n) {}

  [[nodiscard]] constexpr std::size_t size() const noexcept { return n_; }
  [[nodiscard]] constexpr std::size_t element(std::size_t k) const noexcept { return k; }
  constexpr sequential_view& set_epoch(std::uint64_t) & noexcept { return *this; }
  constexpr sequential_view set_epoch(std::uint64_t) && noexcept { return *this; }

 private:
  std::size_t n_ = 0;
};

namespace views {
struct sequential_t {
  [[nodiscard]] constexpr sequential_view operator()(std::size_t n) const noexcept { return sequential_view{n}; }
};
inline constexpr sequential_t sequential{};
}  // namespace views

}  // namespace partrain::inline v0
