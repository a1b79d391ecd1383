// partrain/data/distributed.hpp: views::distributed(n, world_size, rank, options), this rank's
// indices with exactly PyTorch's DistributedSampler semantics (torch/utils/data/distributed.py):
//
//   1. order = shuffle ? permutation of [0, n) from seed + epoch : 0, 1, ..., n-1
//   2. drop_last = false: pad by repeating from the FRONT of `order` until the length is a
//      multiple of world_size (cycling if n < world_size); drop_last = true: cut the tail to
//      num_samples * world_size
//   3. rank r takes positions r, r + W, r + 2W, ... (interleaved, not contiguous blocks)
//
// so every rank has num_samples = drop_last && n % W ? floor(n / W) : ceil(n / W) indices, and
// ranks agree on the order without communicating (the permutation is a pure function of
// seed + epoch: pass the same seed on every rank). Call set_epoch(e) before each epoch, or the
// order never changes; the permutation itself is partrain's (detail/permutation.hpp), not
// torch.randperm's, so indices match PyTorch only with shuffle = false.
//
//   auto mine = views::distributed(60000, world, rank, {.shuffle = true, .seed = 0}).set_epoch(e);
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <partrain/core/error.hpp>
#include <partrain/data/detail/indexed_view.hpp>
#include <partrain/data/detail/permutation.hpp>

namespace partrain::inline v0 {

struct distributed_options {
  bool shuffle = true;
  std::uint64_t seed = 0;
  bool drop_last = false;
};

// Indices per rank, as DistributedSampler.num_samples.
[[nodiscard]] constexpr std::size_t distributed_num_samples(std::size_t n, std::size_t world_size,
                                                            bool drop_last) noexcept {
  if (world_size == 0) return 0;
  if (drop_last && n % world_size != 0) return n / world_size;  // == ceil((n - W) / W), 0 when n < W
  return (n + world_size - 1) / world_size;
}

class distributed_view : public detail::data::indexed_view_base<distributed_view> {
 public:
  distributed_view() = default;
  distributed_view(std::size_t n, int world_size, int rank, distributed_options options = {})
      : n_(n), world_size_(world_size), rank_(rank), options_(options) {
    if (world_size < 1) {
      throw invalid_argument_error("views::distributed: world_size is " + std::to_string(world_size) +
                                   ", expected at least 1");
    }
    if (rank < 0 || rank >= world_size) {
      throw invalid_argument_error("views::distributed: rank " + std::to_string(rank) +
                                   " is out of range, expected 0 <= rank < world_size = " +
                                   std::to_string(world_size));
    }
    num_samples_ = distributed_num_samples(n, static_cast<std::size_t>(world_size), options.drop_last);
    set_epoch(0);
  }

  [[nodiscard]] std::size_t size() const noexcept { return num_samples_; }
  [[nodiscard]] std::size_t element(std::size_t k) const noexcept {
    // Position in the padded order; padding repeats the front, so position p holds order[p % n].
    const std::size_t p = (static_cast<std::size_t>(rank_) + k * static_cast<std::size_t>(world_size_)) % n_;
    return order_ ? (*order_)[p] : p;
  }
  // All ranks together hold this many indices (n rounded up or down to a multiple of world_size).
  [[nodiscard]] std::size_t total_size() const noexcept { return num_samples_ * static_cast<std::size_t>(world_size_); }
  [[nodiscard]] std::size_t dataset_size() const noexcept { return n_; }
  [[nodiscard]] int world_size() const noexcept { return world_size_; }
  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] std::uint64_t epoch() const noexcept { return epoch_; }
  [[nodiscard]] const distributed_options& options() const noexcept { return options_; }

  distributed_view& set_epoch(std::uint64_t epoch) & {
    epoch_ = epoch;
    if (options_.shuffle) {
      order_ = std::make_shared<const std::vector<std::size_t>>(detail::data::permutation(n_, options_.seed + epoch_));
    }
    return *this;
  }
  distributed_view set_epoch(std::uint64_t epoch) && {
    set_epoch(epoch);
    return std::move(*this);
  }

 private:
  std::size_t n_ = 0;
  int world_size_ = 1;
  int rank_ = 0;
  distributed_options options_{};
  std::size_t num_samples_ = 0;
  std::uint64_t epoch_ = 0;
  std::shared_ptr<const std::vector<std::size_t>> order_;  // null: identity order (shuffle = false)
};

namespace views {
struct distributed_t {
  [[nodiscard]] distributed_view operator()(std::size_t n, int world_size, int rank,
                                            distributed_options options = {}) const {
    return {n, world_size, rank, options};
  }
};
inline constexpr distributed_t distributed{};
}  // namespace views

}  // namespace partrain::inline v0
