// partrain/data/shard.hpp: views::shard(n, world_size, rank), this rank's contiguous block of
// [0, n) without padding: [n * rank / world_size, n * (rank + 1) / world_size). Every index is
// held by exactly one rank (block sizes differ by at most one), so evaluation summed over the
// ranks counts each test example once; views::distributed pads to equal sizes (PyTorch's
// DistributedSampler), which would count some twice. set_epoch is accepted and ignored.
//
//   loader test(test_set, views::shard(test_set.size(), world, rank), {.batch_size = 1000});
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include <partrain/core/error.hpp>
#include <partrain/data/detail/indexed_view.hpp>

namespace partrain::inline v0 {

class shard_view : public detail::data::indexed_view_base<shard_view> {
 public:
  shard_view() = default;
  shard_view(std::size_t n, int world_size, int rank) {
    if (world_size < 1) {
      throw invalid_argument_error("views::shard: world_size is " + std::to_string(world_size) + ", expected at least 1");
    }
    if (rank < 0 || rank >= world_size) {
      throw invalid_argument_error("views::shard: rank " + std::to_string(rank) +
                                   " is out of range, expected 0 <= rank < world_size = " + std::to_string(world_size));
    }
    const auto w = static_cast<std::size_t>(world_size), r = static_cast<std::size_t>(rank);
    // n * r / w without overflow for any n below SIZE_MAX / world_size.
    first_ = n / w * r + n % w * r / w;
    last_ = n / w * (r + 1) + n % w * (r + 1) / w;
  }

  [[nodiscard]] std::size_t size() const noexcept { return last_ - first_; }
  [[nodiscard]] std::size_t element(std::size_t k) const noexcept { return first_ + k; }
  shard_view& set_epoch(std::uint64_t) & noexcept { return *this; }
  shard_view set_epoch(std::uint64_t) && noexcept { return *this; }

 private:
  std::size_t first_ = 0, last_ = 0;
};

namespace views {
struct shard_t {
  [[nodiscard]] shard_view operator()(std::size_t n, int world_size, int rank) const { return {n, world_size, rank}; }
};
inline constexpr shard_t shard{};
}  // namespace views

}  // namespace partrain::inline v0
