// partrain/parallel/detail/zero_layout.hpp: where sharded data parallel's elements live: the
// flat parameter space (every parameter concatenated in model order, N elements), the buckets
// it is communicated in and each rank's blocks of them (see layout). Padding elements are zero
// on the way in and dropped on the way out: they never reach a parameter.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <span>
#include <vector>

#include <partrain/core/for_each_index.hpp>
#include <partrain/core/memory_space.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/parallel/detail/ddp_elements.hpp>
#include <partrain/parallel/detail/zero_space.hpp>

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

// The buckets of one model over one world, and each rank's blocks in them. Two partitions:
//  - contiguous (layout(N, n, c)): rank r owns shard_of(N, n, r), padded to L = ceil(N/n) and cut
//    into windows of c; bucket k holds window k of every shard. A rank's elements are one range,
//    but the first layers' shard is final last in backward, so no reduce_scatter can start
//    before backward ends.
//  - per bucket (layout::per_bucket): the flat space is cut into buckets of whole parameters
//    (DDP's, in backward order), and each bucket of M elements among the ranks, rank q owning
//    shard_of(M, n, q) of it, padded to ceil(M/n). A bucket is reduced the moment its gradients
//    are final; a rank's elements are one range per bucket.
// Either way bucket k is n blocks of window_size(k) in the bucket-major space, rank q's block at
// q * window_size(k), its real elements first and its padding after them.
class layout {
 public:
  layout() = default;
  // Contiguous. total: N; world: n; window: c, the elements of one rank's block in a bucket (>= 1).
  layout(std::size_t total, std::size_t world, std::size_t window) : total_(total), world_(world) {
    const std::size_t shard = (total + world - 1) / world;
    const std::size_t c = std::max<std::size_t>(window, 1);
    for (std::size_t at = 0; at < shard; at += c) add_bucket({at, at}, std::min(c, shard - at));
    finish();
  }
  // Per bucket: `buckets` are ranges of the flat space [0, total) in the order they are reduced,
  // covering it once.
  [[nodiscard]] static layout per_bucket(std::size_t total, std::size_t world, const std::vector<flat_range>& buckets) {
    layout l;
    l.total_ = total;
    l.world_ = world;
    l.per_bucket_ = true;
    for (const auto& b : buckets) l.add_bucket(b, (b.size() + world - 1) / world);
    l.finish();
    return l;
  }

  [[nodiscard]] constexpr std::size_t total() const noexcept { return total_; }
  [[nodiscard]] constexpr std::size_t world() const noexcept { return world_; }
  [[nodiscard]] constexpr bool is_per_bucket() const noexcept { return per_bucket_; }
  // Every rank's padded share: the sum of the windows.
  [[nodiscard]] constexpr std::size_t padded_shard() const noexcept { return padded_shard_; }
  // n times that: the padded bucket-major space; padded() - total() elements are padding.
  [[nodiscard]] constexpr std::size_t padded() const noexcept { return padded_shard_ * world_; }
  // The largest window: what one bucket slot per rank must hold.
  [[nodiscard]] constexpr std::size_t window() const noexcept { return max_window_; }
  [[nodiscard]] std::size_t buckets() const noexcept { return buckets_.size(); }
  // Where bucket k's block lies in every rank's padded share, and its length.
  [[nodiscard]] std::size_t window_begin(std::size_t k) const noexcept { return buckets_[k].window_begin; }
  [[nodiscard]] std::size_t window_size(std::size_t k) const noexcept { return buckets_[k].window; }
  // Bucket k in the bucket-major padded space: n blocks of window_size(k), starting here.
  [[nodiscard]] std::size_t bucket_offset(std::size_t k) const noexcept { return world_ * window_begin(k); }
  // The real (unpadded) part of rank q's block in bucket k, as a flat range.
  [[nodiscard]] flat_range real_block(std::size_t k, std::size_t q) const noexcept {
    const auto& b = buckets_[k];
    if (per_bucket_) {
      const auto s = shard_of(b.span.size(), world_, q);
      return {b.span.begin + s.begin, b.span.begin + s.end};
    }
    const auto s = shard_of(total_, world_, q);
    const std::size_t from = std::min(s.begin + b.window_begin, s.end);
    return {from, std::min(from + b.window, s.end)};
  }
  // The flat ranges rank q owns, ascending, adjacent ones merged (contiguous: one range).
  [[nodiscard]] std::vector<flat_range> segments(std::size_t q) const {
    std::vector<flat_range> out;
    for (std::size_t k = 0; k < buckets(); ++k) {
      if (const auto r = real_block(k, q); r.size()) out.push_back(r);
    }
    std::sort(out.begin(), out.end(), [](flat_range a, flat_range b) { return a.begin < b.begin; });
    std::vector<flat_range> merged;
    for (const auto& r : out) {
      if (!merged.empty() && merged.back().end == r.begin) {
        merged.back().end = r.end;
      } else {
        merged.push_back(r);
      }
    }
    return merged;
  }
  // Where rank q's real elements of bucket k start among its elements laid end to end in flat
  // order (the order of segments(q), of the shard's optimizer state and of its checkpoint).
  [[nodiscard]] std::size_t element_offset(std::size_t k, std::size_t q) const noexcept {
    const auto mine = real_block(k, q);
    std::size_t at = 0;
    for (std::size_t j = 0; j < buckets(); ++j) {
      if (const auto r = real_block(j, q); r.begin < mine.begin) at += r.size();
    }
    return at;
  }

 private:
  struct bucket {
    flat_range span;  // per bucket: the flat range it covers (contiguous: unused)
    std::size_t window = 0;
    std::size_t window_begin = 0;
  };
  void add_bucket(flat_range span, std::size_t window) {
    buckets_.push_back({span, window, padded_shard_});
    padded_shard_ += window;
  }
  void finish() {
    for (const auto& b : buckets_) max_window_ = std::max(max_window_, b.window);
  }

  std::size_t total_ = 0;
  std::size_t world_ = 1;
  bool per_bucket_ = false;
  std::vector<bucket> buckets_;
  std::size_t padded_shard_ = 0;
  std::size_t max_window_ = 0;
};

// The model's tensors (values or gradients) seen as one flat space, without copying them; S is
// their memory space, and every copy goes through a place of it (zero_space.hpp).
template <class T, class S = host>
class flat_views {
 public:
  flat_views() = default;
  explicit flat_views(std::vector<tensor_view<T, S>> views) : views_(std::move(views)) {
    starts_.reserve(views_.size() + 1);
    std::size_t at = 0;
    for (const auto& v : views_) {
      starts_.push_back(at);
      at += v.size();
    }
    starts_.push_back(at);
  }
  [[nodiscard]] std::size_t total() const noexcept { return starts_.empty() ? 0 : starts_.back(); }
  // The first element when the tensors lie back to back in one buffer, in flat order (a model
  // that keeps all its parameters in one allocation); else nullptr.
  [[nodiscard]] T* contiguous_data() const noexcept {
    T* next = nullptr;
    T* first = nullptr;
    for (const auto& v : views_) {
      if (v.size() == 0) continue;
      if (!first) {
        first = v.data();
      } else if (v.data() != next) {
        return nullptr;
      }
      next = v.data() + v.size();
    }
    return first;
  }

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

  // dst[0, r.size()) (in the same place) = the flat range r (add: +=), converted to U (16-bit
  // gradients widened into float buckets).
  template <class U, class P = place<S>>
  void read(flat_range r, U* dst, bool add, const P& at = P{}) const {
    for_each_piece(r, [&](const T* p, std::size_t off, std::size_t len) {
      if constexpr (std::same_as<U, T>) {
        if (add) {
          for_each_index(at.exec(), len, ddp::accumulate_fn<T>{dst + off, p});
        } else {
          at.copy(dst + off, p, len);
        }
      } else if (add) {
        for_each_index(at.exec(), len, ddp::accumulate_widened_fn<T, U>{dst + off, p});
      } else {
        for_each_index(at.exec(), len, ddp::decompress_16_fn<T, U>{p, dst + off});
      }
    });
  }
  // The same with dst and src in host memory (a checkpoint's), finished on return.
  template <class P = place<S>>
  void read_to_host(flat_range r, T* dst, const P& at = P{}) const {
    for_each_piece(r, [&](const T* p, std::size_t off, std::size_t len) { at.to_host(dst + off, p, len); });
  }
  template <class P = place<S>>
  void write_from_host(flat_range r, const T* src, const P& at = P{}) const {
    for_each_piece(r, [&](T* p, std::size_t off, std::size_t len) { at.from_host(p, src + off, len); });
  }
  // The flat range r = src[0, r.size()) (in the same place).
  template <class P = place<S>>
  void write(flat_range r, const T* src, const P& at = P{}) const {
    for_each_piece(r, [&](T* p, std::size_t off, std::size_t len) { at.copy(p, src + off, len); });
  }

 private:
  std::vector<tensor_view<T, S>> views_;
  std::vector<std::size_t> starts_;
};

// Bucket k of the flat space into `dst` (n blocks of window_size(k), bucket-major), padding
// zeroed; add: accumulate into what dst holds (padding stays zero).
template <class T, class S, class U, class P = place<S>>
void pack_bucket(const layout& l, std::size_t k, const flat_views<T, S>& src, U* dst, bool add, const P& at = P{}) {
  const std::size_t w = l.window_size(k);
  for (std::size_t q = 0; q < l.world(); ++q) {
    const auto real = l.real_block(k, q);
    U* block = dst + q * w;
    src.read(real, block, add, at);
    if (!add) at.fill_zero(block + real.size(), w - real.size());
  }
}

// Bucket k's blocks (as an all_gather leaves them) back into the flat space, except rank `skip`'s
// (already in place); padding is dropped.
template <class T, class S, class P = place<S>>
void unpack_bucket(const layout& l, std::size_t k, const T* src, const flat_views<T, S>& dst, std::size_t skip,
                   const P& at = P{}) {
  const std::size_t w = l.window_size(k);
  for (std::size_t q = 0; q < l.world(); ++q) {
    if (q == skip) continue;
    dst.write(l.real_block(k, q), src + q * w, at);
  }
}

}  // namespace partrain::inline v0::detail::zero
