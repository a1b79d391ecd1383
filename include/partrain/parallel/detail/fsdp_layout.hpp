// partrain/parallel/detail/fsdp_layout.hpp: how fully sharded data parallel cuts one unit (one
// layer's parameters, concatenated in order: N elements) over n ranks. The unit is padded to n*L
// elements, L = ceil(N/n), and rank r owns chunk r, [min(r*L, N), min((r+1)*L, N)) (torch.chunk's
// split, as FSDP's flat parameter). Not zero_layout's balanced split on purpose: here the
// all_gather lands in the buffer the layer computes with, so every padding element must sit after
// the N real ones, which only the chunked split gives. Shards may differ by up to L elements (the
// last ranks may own none); every rank still sends L elements, its padding zero.
#pragma once

#include <algorithm>
#include <cstddef>

#include <partrain/parallel/detail/zero_layout.hpp>

namespace partrain::inline v0::detail::fsdp {

using zero::flat_range;

class chunking {
 public:
  constexpr chunking() = default;
  constexpr chunking(std::size_t total, std::size_t world) noexcept
      : total_(total), world_(std::max<std::size_t>(world, 1)), chunk_((total + world_ - 1) / world_) {}

  [[nodiscard]] constexpr std::size_t total() const noexcept { return total_; }
  [[nodiscard]] constexpr std::size_t world() const noexcept { return world_; }
  // L: the elements each rank sends and receives per rank in the unit's collectives.
  [[nodiscard]] constexpr std::size_t chunk() const noexcept { return chunk_; }
  // n*L: the gathered buffer; its elements past total() are padding.
  [[nodiscard]] constexpr std::size_t padded() const noexcept { return chunk_ * world_; }
  // Rank r's real elements of the unit.
  [[nodiscard]] constexpr flat_range owned(std::size_t r) const noexcept {
    return {std::min(r * chunk_, total_), std::min((r + 1) * chunk_, total_)};
  }

 private:
  std::size_t total_ = 0;
  std::size_t world_ = 1;
  std::size_t chunk_ = 0;
};

// The arithmetic, checked where it is compiled.
[[nodiscard]] consteval bool chunking_selftest() {
  const chunking a(53, 4);  // 14, 14, 14, 11
  const chunking b(6, 4);   // 2, 2, 2, 0: the last rank owns nothing
  const chunking c(44, 4);  // 11 each, no padding
  return a.chunk() == 14 && a.owned(3) == flat_range{42, 53} && a.padded() == 56 && b.owned(3).size() == 0 &&
         b.owned(2) == flat_range{4, 6} && c.padded() == 44 && c.owned(1) == flat_range{11, 22} &&
         chunking(0, 3).chunk() == 0 && chunking(5, 1).owned(0) == flat_range{0, 5};
}
static_assert(chunking_selftest());

}  // namespace partrain::inline v0::detail::fsdp
