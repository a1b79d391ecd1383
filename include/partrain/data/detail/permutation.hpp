// partrain/data/detail/permutation.hpp: the one shuffle every sampler uses. It must give the same
// permutation on every rank, compiler and standard library, so it avoids std::shuffle and
// std::uniform_int_distribution (their outputs are implementation-defined) and spells out:
// splitmix64 (Steele, Lea, Flood 2014) seeded with the 64-bit seed, unbiased bounded draws by
// rejection, and Fisher-Yates from the back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <numeric>
#include <utility>
#include <vector>

namespace partrain::inline v0::detail {

class splitmix64 {
 public:
  constexpr explicit splitmix64(std::uint64_t seed) noexcept : state_(seed) {}
  constexpr std::uint64_t operator()() noexcept {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, bound), bound > 0. Rejects the low 2^64 mod bound values so that every
  // residue is equally likely (the arc4random_uniform construction).
  constexpr std::uint64_t below(std::uint64_t bound) noexcept {
    const std::uint64_t threshold = (0 - bound) % bound;
    for (;;) {
      const std::uint64_t r = (*this)();
      if (r >= threshold) return r % bound;
    }
  }

 private:
  std::uint64_t state_;
};

}  // namespace partrain::inline v0::detail

namespace partrain::inline v0::detail::data {

// A permutation of [0, n) determined by `seed` alone.
[[nodiscard]] constexpr std::vector<std::size_t> permutation(std::size_t n, std::uint64_t seed) {
  std::vector<std::size_t> p(n);
  std::iota(p.begin(), p.end(), std::size_t{0});
  splitmix64 rng(seed);
  for (std::size_t i = n; i > 1; --i) {
    const auto j = static_cast<std::size_t>(rng.below(i));
    std::swap(p[i - 1], p[j]);
  }
  return p;
}

}  // namespace partrain::inline v0::detail::data
