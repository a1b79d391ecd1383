// partrain/data/shuffled.hpp: views::shuffled(n, seed), a permutation of 0..n-1 (PyTorch's
// RandomSampler without replacement). The order is a pure function of seed + epoch (see
// detail/permutation.hpp), identical on every rank and platform; set_epoch(e) reshuffles.
//
//   auto order = views::shuffled(60000, /*seed=*/42).set_epoch(epoch);
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include <partrain/data/detail/indexed_view.hpp>
#include <partrain/data/detail/permutation.hpp>

namespace partrain::inline v0 {

class shuffled_view : public detail::data::indexed_view_base<shuffled_view> {
 public:
  shuffled_view() = default;
  shuffled_view(std::size_t n, std::uint64_t seed, std::uint64_t epoch = 0) : n_(n), seed_(seed) { set_epoch(epoch); }

  [[nodiscard]] std::size_t size() const noexcept { return n_; }
  [[nodiscard]] std::size_t element(std::size_t k) const noexcept { return (*order_)[k]; }
  [[nodiscard]] std::uint64_t seed() const noexcept { return seed_; }
  [[nodiscard]] std::uint64_t epoch() const noexcept { return epoch_; }

  // Copies of the view share the permutation; set_epoch gives this copy a new one.
  shuffled_view& set_epoch(std::uint64_t epoch) & {
    epoch_ = epoch;
    order_ = std::make_shared<const std::vector<std::size_t>>(detail::data::permutation(n_, seed_ + epoch_));
    return *this;
  }
  shuffled_view set_epoch(std::uint64_t epoch) && {
    set_epoch(epoch);
    return std::move(*this);
  }

 private:
  std::size_t n_ = 0;
  std::uint64_t seed_ = 0;
  std::uint64_t epoch_ = 0;
  std::shared_ptr<const std::vector<std::size_t>> order_ = std::make_shared<const std::vector<std::size_t>>();
};

namespace views {
struct shuffled_t {
  [[nodiscard]] shuffled_view operator()(std::size_t n, std::uint64_t seed = 0) const { return {n, seed}; }
};
inline constexpr shuffled_t shuffled{};
}  // namespace views

}  // namespace partrain::inline v0
