// partrain/parallel/detail/zero_layout.hpp: where sharded data parallel's elements live. The flat
// parameter space (every parameter concatenated in model order, N elements) is cut into n
// contiguous shards, rank r owning [floor(r*N/n), floor((r+1)*N/n)); the shards differ by at most
// one element. Communication runs over a padded, bucket-major space: each shard is padded to
// L = ceil(N/n) and cut into windows of c elements; bucket k holds window k of every shard, rank
// q's window as block q, so one reduce_scatter or all_gather per bucket moves equal blocks.
// Padding elements are zero on the way in and dropped on the way out: they never reach a
// parameter.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <span>
#include <vector>

#include <partrain/core/for_each_index.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/parallel/detail/ddp_elements.hpp>

namespace partrain::inline v0::detail::zero {

// [begin, end) of the flat parameter space.
struct flat_range {
  std::size_t begin = 0;
  std::size_t end = 0;
  [[nodiscard]] constexpr std::size_t size() const noexcept { return end - begin; }
  friend constexpr bool operator==(flat_range, flat_range) = default;
};

// Rank r's shard of N elements over n ranks: [floor(r*N/n), floor((r+1)*N/n)), written so that
// r*N cannot overflow.
[[nodiscard]] constexpr std::size_t shard_begin(std::size_t total, std::size_t world, std::size_t r) noexcept {
  return r * (total / world) + r * (total % world) / world;
}
[[nodiscard]] constexpr flat_range shard_of(std::size_t total, std::size_t world, std::size_t r) noexcept {
  return {shard_begin(total, world, r), shard_begin(total, world, r + 1)};
}

// The shards and buckets of one model over one world.
class layout {
 public:
  layout() = default;
  // total: N; world: n; window: c, the elements of one rank's block in a bucket (>= 1).
  layout(std::size_t total, std::size_t world, std::size_t window)
      : total_(total), world_(world), padded_shard_((total + world - 1) / world),
        window_(std::max<std::size_t>(window, 1)) {}

  [[nodiscard]] constexpr std::size_t total() const noexcept { return total_; }
  [[nodiscard]] constexpr std::size_t world() const noexcept { return world_; }
  [[nodiscard]] flat_range shard(std::size_t r) const noexcept { return shard_of(total_, world_, r); }
  // L = ceil(N/n): every shard's padded length.
  [[nodiscard]] constexpr std::size_t padded_shard() const noexcept { return padded_shard_; }
  // n*L: the padded flat space; padded() - total() elements are padding.
  [[nodiscard]] constexpr std::size_t padded() const noexcept { return padded_shard_ * world_; }
  [[nodiscard]] constexpr std::size_t window() const noexcept { return window_; }
  [[nodiscard]] constexpr std::size_t buckets() const noexcept { return (padded_shard_ + window_ - 1) / window_; }
  // Bucket k's window within every shard: [k*c, min((k+1)*c, L)).
  [[nodiscard]] constexpr std::size_t window_begin(std::size_t k) const noexcept { return k * window_; }
  [[nodiscard]] constexpr std::size_t window_size(std::size_t k) const noexcept {
    return std::min(window_, padded_shard_ - k * window_);
  }
  // Bucket k in the bucket-major padded space: n blocks of window_size(k), starting here.
  [[nodiscard]] constexpr std::size_t bucket_offset(std::size_t k) const noexcept { return world_ * k * window_; }
  // The real (unpadded) part of rank q's block in bucket k, as a flat range.
  [[nodiscard]] flat_range real_block(std::size_t k, std::size_t q) const noexcept {
    const auto s = shard(q);
    const std::size_t from = std::min(s.begin + window_begin(k), s.end);
    const std::size_t to = std::min(from + window_size(k), s.end);
    return {from, to};
  }

 private:
  std::size_t total_ = 0;
  std::size_t world_ = 1;
  std::size_t padded_shard_ = 0;
  std::size_t window_ = 1;
};

// The model's tensors (values or gradients) seen as one flat space, without copying them.
template <class T>
class flat_views {
 public:
  flat_views() = default;
  explicit flat_views(std::vector<tensor_view<T>> views) : views_(std::move(views)) {
    starts_.reserve(views_.size() + 1);
    std::size_t at = 0;
    for (const auto& v : views_) {
      starts_.push_back(at);
      at += v.size();
    }
    starts_.push_back(at);
  }
  [[nodiscard]] std::size_t total() const noexcept { return starts_.empty() ? 0 : starts_.back(); }

  // Calls fn(T* piece, std::size_t offset_in_range, std::size_t length) for each tensor's part of
  // the flat range r, in order.
  template <class F>
  void for_each_piece(flat_range r, F&& fn) const {
    if (r.size() == 0) return;
    // The tensor holding r.begin: the last start <= r.begin (empty tensors share a start).
    auto it = std::upper_bound(starts_.begin(), starts_.end() - 1, r.begin);
    std::size_t t = static_cast<std::size_t>(it - starts_.begin()) - 1;
    std::size_t at = r.begin;
    while (at < r.end) {
      const std::size_t in_tensor = at - starts_[t];
      const std::size_t len = std::min(views_[t].size() - in_tensor, r.end - at);
      if (len) fn(views_[t].data() + in_tensor, at - r.begin, len);
      at += len;
      ++t;
    }
  }

  // dst[0, r.size()) = the flat range r (add: +=).
  void read(flat_range r, T* dst, bool add) const {
    for_each_piece(r, [&](const T* p, std::size_t off, std::size_t len) {
      if (add) {
        for_each_index(host_exec{}, len, ddp::accumulate_fn<T>{dst + off, p});
      } else {
        std::memcpy(dst + off, p, len * sizeof(T));
      }
    });
  }
  // The flat range r = src[0, r.size()).
  void write(flat_range r, const T* src) const {
    for_each_piece(r, [&](T* p, std::size_t off, std::size_t len) { std::memcpy(p, src + off, len * sizeof(T)); });
  }

 private:
  std::vector<tensor_view<T>> views_;
  std::vector<std::size_t> starts_;
};

// Bucket k of the flat space into `dst` (n blocks of window_size(k), bucket-major), padding
// zeroed; add: accumulate into what dst holds (padding stays zero).
template <class T>
void pack_bucket(const layout& l, std::size_t k, const flat_views<T>& src, T* dst, bool add) {
  const std::size_t w = l.window_size(k);
  for (std::size_t q = 0; q < l.world(); ++q) {
    const auto real = l.real_block(k, q);
    T* block = dst + q * w;
    src.read(real, block, add);
    if (!add) std::fill(block + real.size(), block + w, T(0));
  }
}

// Bucket k's blocks (as an all_gather leaves them) back into the flat space, except rank `skip`'s
// (already in place); padding is dropped.
template <class T>
void unpack_bucket(const layout& l, std::size_t k, const T* src, const flat_views<T>& dst, std::size_t skip) {
  const std::size_t w = l.window_size(k);
  for (std::size_t q = 0; q < l.world(); ++q) {
    if (q == skip) continue;
    dst.write(l.real_block(k, q), src + q * w);
  }
}

}  // namespace partrain::inline v0::detail::zero
