// partrain/parallel/deterministic.hpp: data parallel whose result does not depend on the layout.
// The same global batch gives the same gradient, bit for bit, at any world size (1 up to the
// number of shards), on any backend, and so the same trained parameters: a debugging run on one
// rank equals the 8-rank run, a job resumed on fewer nodes goes on where it was.
//
// How: every rank is handed the whole global batch. It is cut into `shards` fixed micro-shards by
// position alone (shard k: rows k B/S .. (k+1) B/S), and shard k is computed by rank
// k * world / S. Each shard's gradient is the model's own train_step on those rows (the same
// shapes, so the same bits, wherever it runs). The shards' gradients are then summed exactly: each
// is turned into 64-bit fixed point at a scale the group agrees on (from the largest magnitude of
// every parameter tensor over all shards, an all-reduce max, exact), integers add up the same in
// any order, and an int64 reduce_scatter sums each rank's block of them over the ranks. The mean
// is that sum / S, and an all_gather of the blocks' means (floats) gives every rank all of it.
// Losses likewise (one int64 all-reduce). Every rank then holds the same gradient and steps its
// optimizer identically.
//
// The contract: bit-identical results for any world size and backend on the same machine type
// and library builds (the model's kernels, e.g. OpenBLAS's, must give the same bits for the same
// shapes; another CPU's or GPU's kernels may not). The fixed-point sum keeps 51 bits below the
// largest possible sum: elements below 2^-51 of their tensor's largest shard gradient x S are
// rounded away (float keeps 24 bits of each). A model whose train_step draws random numbers per
// call (dropout advancing with each call) must key them by the shard, not the call.
//
// Gradient accumulation: with set_gradient_accumulation_steps(A) a step's global batch comes in A
// micro-batches (accumulate_step for all but the last, then train_step), each cut into S / A of
// the step's S shards. A shard is the same rows whichever micro-batch carries it, every shard's
// gradient is kept until the step's last micro-batch, and the exact sum covers them all: the
// result is the same bits for any A that divides S (and any world size), as long as the global
// batches are the same rows.
//
//   deterministic_data_parallel ddp(model, group, {.shards = 8});   // world 1, 2, 4 or 8
//   double loss = ddp.train_step(global_batch);                     // the same batch on every rank
//   opt.step();
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <partrain/comm/process_group.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/memory_space.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/data/batch.hpp>
#include <partrain/model/concepts.hpp>
#include <partrain/model/traits.hpp>
#include <partrain/parallel/detail/evaluate.hpp>

namespace partrain::inline v0 {

struct deterministic_options {
  std::size_t shards = 0;  // fixed micro-shards per global batch (>= the world size; divides the batch)
  // The int64 elements one reduce_scatter of the exact sum takes from a rank (every rank's piece
  // of a chunk of the blocks); 0: the whole flattened gradient in one. With a bucket the sum's
  // scratch is at most the bucket plus this rank's block, not the whole gradient (ZeRO-2's
  // bounded gradient memory); integers add up the same in any grouping, so the bits do not change.
  std::size_t bucket_elements = 0;
};

namespace detail::deterministic {

// Fixed point within 2^51: a double adds 1.5 x 2^52 to such a value and leaves it, rounded to
// the nearest integer (ties to even, the one IEEE rounding every rank shares), in its low
// mantissa bits, so both conversions are two adds, branch-free and vectorised; and S shards of
// it still sum well inside an int64.
inline constexpr double magic = 6755399441055744.0;  // 1.5 x 2^52
inline constexpr int fixed_bits = 51;
// The scale of the shards' mean losses in fixed point: 2^32, so their sum may reach 2^19.
inline constexpr double loss_scale = 4294967296.0;

// 2^e with e the largest exponent such that `bound` x 2^e stays below 2^51 (1 when bound is 0).
[[nodiscard]] inline double fixed_point_scale(double bound) {
  if (!(bound > 0.0)) return 1.0;
  int e = 0;
  (void)std::frexp(bound, &e);  // bound < 2^e
  return std::ldexp(1.0, fixed_bits - e);
}
// v x scale (a power of two, so exact; below 2^51 in magnitude) to the nearest integer.
[[nodiscard]] inline std::int64_t to_fixed(double v, double scale) noexcept {
  return std::bit_cast<std::int64_t>(v * scale + magic) - std::bit_cast<std::int64_t>(magic);
}
// An integer below 2^51 in magnitude back to a double, exactly.
[[nodiscard]] inline double from_fixed(std::int64_t q) noexcept {
  return std::bit_cast<double>(q + std::bit_cast<std::int64_t>(magic)) - magic;
}

// The shards of `shards` that rank r of `world` computes: k with k * world / shards == r
// (contiguous, as even as the count allows; with fewer shards than ranks, some ranks get none).
[[nodiscard]] inline std::vector<std::size_t> shards_of(std::size_t r, std::size_t world, std::size_t shards) {
  std::vector<std::size_t> out;
  for (std::size_t k = 0; k < shards; ++k) {
    if (k * world / shards == r) out.push_back(k);
  }
  return out;
}

// The largest magnitude of v[0, n), or +inf when any element is inf or NaN: what the exact sums'
// scales come from. NaN is reported as inf because an all_reduce max may drop a NaN (max(x, NaN)
// is x) but never an inf, so every rank sees the bad gradient and fails alike. A lane adding v x 0
// turns NaN at the first inf or NaN. With GCC or Clang, eight floats a turn in two 4-float vector
// lanes (baseline SSE2): the compiler keeps a scalar max loop scalar, and this pass reads the
// whole gradient every step.
[[nodiscard]] inline float largest_magnitude(const float* v, std::size_t n) noexcept {
  float m[8] = {}, bad[8] = {};
  std::size_t i = 0;
#if defined(__GNUC__) && !defined(__CUDA_ARCH__)
  typedef float f32x4 __attribute__((vector_size(16)));
  typedef std::int32_t i32x4 __attribute__((vector_size(16)));
  f32x4 m0{}, m1{}, b0{}, b1{};
  const i32x4 magnitude = {0x7fffffff, 0x7fffffff, 0x7fffffff, 0x7fffffff};
  for (; i + 8 <= n; i += 8) {
    f32x4 x0, x1;
    __builtin_memcpy(&x0, v + i, sizeof x0);
    __builtin_memcpy(&x1, v + i + 4, sizeof x1);
    b0 += x0 * 0.0f;
    b1 += x1 * 0.0f;
    const auto a0 = (f32x4)((i32x4)x0 & magnitude), a1 = (f32x4)((i32x4)x1 & magnitude);
    const i32x4 up0 = a0 > m0, up1 = a1 > m1;  // all ones where the new value is larger
    m0 = (f32x4)(((i32x4)a0 & up0) | ((i32x4)m0 & ~up0));
    m1 = (f32x4)(((i32x4)a1 & up1) | ((i32x4)m1 & ~up1));
  }
  __builtin_memcpy(m, &m0, sizeof m0);
  __builtin_memcpy(m + 4, &m1, sizeof m1);
  __builtin_memcpy(bad, &b0, sizeof b0);
  __builtin_memcpy(bad + 4, &b1, sizeof b1);
#endif
  for (; i < n; ++i) {
    const float a = std::abs(v[i]);
    m[0] = a > m[0] ? a : m[0];
    bad[0] += v[i] * 0.0f;
  }
  float out = 0.0f;
  for (std::size_t k = 0; k < 8; ++k) {
    if (bad[k] != 0.0f) return std::numeric_limits<float>::infinity();  // NaN compares unequal
    out = m[k] > out ? m[k] : out;
  }
  return out;
}

}  // namespace detail::deterministic

template <class M, class C>
class deterministic_data_parallel {
  static_assert(model<M>, "partrain: deterministic_data_parallel takes a model (parameters() with value() and grad())");
  static_assert(std::same_as<model_space_t<M>, host>,
                "partrain: deterministic_data_parallel sums host gradients (the model's parameters live in host memory)");

 public:
  deterministic_data_parallel(M& m, C& comm, deterministic_options o) : model_(&m), comm_(&comm), opts_(o) {
    const auto world = static_cast<std::size_t>(comm.size());
    if (opts_.shards < world) {
      throw invalid_argument_error(where() + std::to_string(opts_.shards) + " shard(s) for " + std::to_string(world) +
                                   " ranks (expected at least one shard per rank; the shards, not the ranks, fix the result)");
    }
    check_agreed();
  }

  [[nodiscard]] M& module() noexcept { return *model_; }
  [[nodiscard]] C& comm() noexcept { return *comm_; }
  [[nodiscard]] std::size_t shards() const noexcept { return opts_.shards; }
  // This rank's test batches, summed over the ranks (as DDP evaluates).
  template <class Range>
  [[nodiscard]] eval_result evaluate(Range&& batches) {
    return detail::ddp::evaluate_summed(*model_, *comm_, std::forward<Range>(batches));
  }
  // The micro-batches of one step (fit's gradient_accumulation_steps): each carries S / A of the
  // step's shards, so A must divide S. Between steps only.
  void set_gradient_accumulation_steps(std::size_t a) {
    if (a == 0 || opts_.shards % a != 0) {
      throw invalid_argument_error(where() + std::to_string(a) + " micro-batches a step for " + std::to_string(opts_.shards) +
                                   " shards (expected a count that divides the shards: each micro-batch carries whole shards)");
    }
    if (pending_ > 0) {
      throw invalid_argument_error(where() + "set_gradient_accumulation_steps inside a step (after " +
                                   std::to_string(pending_) + " micro-batch(es)); call it between steps");
    }
    micro_batches_ = a;
  }
  // The shards of a micro-batch rank r computes: k with k * world / (S / A) == r (contiguous, as
  // even as the count allows; with fewer shards in a micro-batch than ranks, some ranks wait).
  [[nodiscard]] std::vector<std::size_t> shards_of(int r) const {
    return detail::deterministic::shards_of(static_cast<std::size_t>(r), static_cast<std::size_t>(comm_->size()), per_call());
  }

  // The global batch's mean loss and, in the model's gradients, its mean gradient: the same bits
  // on every rank and at every world size. Every rank passes the same batch. Under accumulation,
  // the step's last micro-batch: the gradient is the mean over every shard of the step, the loss
  // this micro-batch's.
  double train_step(const batch& global) {
    const double loss = compute(global, true);
    reduce(true);
    return loss;
  }
  // A micro-batch before a step's last: its shards' gradients kept for the step's sum; returns its
  // mean loss (the same on every rank).
  double accumulate_step(const batch& micro) {
    const double loss = compute(micro, false);
    ++pending_;
    return loss;
  }

  // The same as train_step, but only this rank's block of the flattened gradients ([r B,
  // min(N, (r + 1) B)), B = ceil(N / world), block()) holds the mean; the rest hold this rank's
  // last shard's gradient. For a mode that steps only that block (deterministic_sharded.hpp): no
  // all_gather.
  double train_step_block(const batch& global) {
    const double loss = compute(global, true);
    reduce(false);
    return loss;
  }
  // This rank's block of the flattened gradients: [first, last) of total elements, in blocks of
  // `width` (the last ones padded) on every rank.
  struct block_layout {
    std::size_t first = 0, last = 0, width = 0, total = 0;
  };
  // The exact sum's int64 scratch this rank holds: one reduce_scatter's input (all ranks' blocks,
  // or one bucket of them: deterministic_options::bucket_elements) and this rank's block of sums.
  [[nodiscard]] std::size_t reduction_scratch_bytes() const noexcept {
    return (sum_.capacity() + part_.capacity()) * sizeof(std::int64_t);
  }
  [[nodiscard]] block_layout block() {
    std::size_t total = 0;
    for (auto&& p : model_->parameters()) total += p.grad().size();
    return layout(total);
  }

 private:
  [[nodiscard]] std::size_t per_call() const noexcept { return opts_.shards / micro_batches_; }

  // Every rank's options, gathered through one all_reduce: ranks that disagree on the shards or the
  // bucket would run different collectives (or cut the batch differently), so all of them fail here.
  void check_agreed() {
    const auto world = static_cast<std::size_t>(comm_->size()), r = static_cast<std::size_t>(comm_->rank());
    std::vector<std::int64_t> all(2 * world, 0);
    all[2 * r] = static_cast<std::int64_t>(opts_.shards);
    all[2 * r + 1] = static_cast<std::int64_t>(opts_.bucket_elements);
    comm_->all_reduce(tensor_view<std::int64_t>(all)).wait();
    for (std::size_t q = 1; q < world; ++q) {
      if (all[2 * q] == all[0] && all[2 * q + 1] == all[1]) continue;
      throw config_error(where() + "rank " + std::to_string(q) + " has deterministic_options{.shards = " +
                         std::to_string(all[2 * q]) + ", .bucket_elements = " + std::to_string(all[2 * q + 1]) +
                         "}, rank 0 {" + std::to_string(all[0]) + ", " + std::to_string(all[1]) +
                         "} (expected the same options on every rank)");
    }
  }

  // 1. This rank's shards of one micro-batch (the whole global batch without accumulation): the
  // model's own step on each. Their gradients are kept for reduce() (in buffers kept from step to
  // step: fresh ones cost a page fault per 4 KiB every step), but the step's very last one, which
  // stays in the model. Returns the micro-batch's mean loss, summed exactly over the ranks.
  double compute(const batch& part, bool last_call) {
    const std::size_t n = part.size(), s = per_call();
    if (n == 0 || n % s != 0) {
      pending_ = 0;  // the step is abandoned: the next call starts a new one
      throw invalid_argument_error(where() + "a " + (micro_batches_ > 1 ? "micro-batch" : "global batch") + " of " +
                                   std::to_string(n) + " rows in " + std::to_string(s) +
                                   " shards (expected a non-empty batch whose size the shard count divides)");
    }
    const std::size_t rows = n / s;
    if (pending_ > 0 && rows != rows_) {
      pending_ = 0;
      throw invalid_argument_error(where() + "a micro-batch of " + std::to_string(n) + " rows after ones of " +
                                   std::to_string(rows_ * s) + " (expected the same size for every micro-batch of a step)");
    }
    auto& params = model_->parameters();
    if (pending_ == 0) {
      total_ = 0;
      for (auto&& p : params) total_ += p.grad().size();
      largest_.assign(std::ranges::size(params), 0.0f);
      stashed_ = 0;
      rows_ = rows;
    }
    const auto mine = shards_of(comm_->rank());
    in_model_ = last_call && !mine.empty();
    std::int64_t loss_sum = 0;
    for (std::size_t j = 0; j < mine.size(); ++j) {
      const std::size_t first = mine[j] * rows;
      const batch shard{part.features.slice(first, first + rows), part.labels.slice(first, first + rows),
                        part.indices.empty() ? part.indices : part.indices.subspan(first, rows)};
      loss_sum += detail::deterministic::to_fixed(static_cast<double>(model_->train_step(shard)), detail::deterministic::loss_scale);
      const bool keep = !(last_call && j + 1 == mine.size());
      if (keep && stash_.size() < (stashed_ + 1) * total_) stash_.resize((stashed_ + 1) * total_);
      float* to = keep ? stash_.data() + stashed_ * total_ : nullptr;
      std::size_t i = 0;
      for (auto&& p : params) {
        const auto g = p.grad();
        if (to) {
          std::copy(g.begin(), g.end(), to);
          to += g.size();
        }
        largest_[i] = std::max(largest_[i], detail::deterministic::largest_magnitude(g.data(), g.size()));
        ++i;
      }
      if (keep) ++stashed_;
    }
    comm_->all_reduce(tensor_view<std::int64_t>(&loss_sum, 1)).wait();
    return detail::deterministic::from_fixed(loss_sum) / detail::deterministic::loss_scale / static_cast<double>(s);
  }

  // 2-4. The step's sum over every shard of its micro-batches, exact, and its mean.
  void reduce(bool gather) {
    const std::size_t s = (pending_ + 1) * per_call();  // the step's shards (fewer if its last micro-batches are missing)
    pending_ = 0;
    auto& params = model_->parameters();
    const std::size_t count = std::ranges::size(params), total = total_;
    // 2. The scale of each tensor, from its largest magnitude over every shard (max is exact).
    comm_->all_reduce(tensor_view<float>(largest_), reduce_op::max).wait();
    for (const float v : largest_) {  // inf for any rank's inf or NaN: every rank fails here alike
      if (!std::isfinite(v)) {
        throw invalid_argument_error(where() + "a shard's gradient is not finite (inf or NaN) on some rank: nothing exact can be summed");
      }
    }
    // 3. Each tensor's shard gradients in fixed point, summed exactly: int64 reduce_scatters give
    // each rank the sums of its block of elements (integers add up the same in any order).
    const auto world = static_cast<std::size_t>(comm_->size());
    const block_layout mine_block = layout(total);
    const std::size_t b = mine_block.width;
    std::vector<double> scale(count);
    for (std::size_t i = 0; i < count; ++i) {
      scale[i] = detail::deterministic::fixed_point_scale(static_cast<double>(largest_[i]) * static_cast<double>(s));
    }
    // Chunks of every rank's block: reduce_scatter c sums elements [r b + c0, r b + c0 + len) of
    // each rank r into this rank's part_[c0, c0 + len).
    const std::size_t chunk =
        opts_.bucket_elements == 0 ? b : std::clamp<std::size_t>(opts_.bucket_elements / world, 1, std::max<std::size_t>(b, 1));
    part_.resize(b);
    for (std::size_t c0 = 0; c0 < b; c0 += chunk) {
      const std::size_t len = std::min(chunk, b - c0);
      sum_.assign(len * world, 0);
      for (std::size_t r = 0; r < world; ++r) add_fixed(r * b + c0, r * b + c0 + len, scale, sum_.data() + r * len);
      comm_->reduce_scatter(tensor_view<const std::int64_t>(sum_), tensor_view<std::int64_t>(part_.data() + c0, len)).wait();
    }
    // 4. This rank's block as the mean (the same on every rank); then, unless only the block is
    // wanted, every block to every rank as floats, into the model's gradients.
    const std::size_t lo0 = mine_block.first, hi0 = mine_block.last;
    if (gather) mean_.assign(b, 0.0f);
    std::size_t begin = 0, i = 0;
    for (auto&& p : params) {
      auto g = p.grad();
      const std::size_t end = begin + g.size(), lo = std::max(begin, lo0), hi = std::min(end, hi0);
      const double k = 1.0 / (scale[i] * static_cast<double>(s));  // the same on every rank
      if (lo < hi) {
        float* to = gather ? mean_.data() + (lo - lo0) : g.data() + (lo - begin);
        const std::int64_t* from = part_.data() + (lo - lo0);
        for (std::size_t e = 0; e < hi - lo; ++e) to[e] = static_cast<float>(detail::deterministic::from_fixed(from[e]) * k);
      }
      begin = end;
      ++i;
    }
    if (gather) {
      all_.resize(b * world);
      comm_->all_gather(tensor_view<const float>(mean_), tensor_view<float>(all_)).wait();
      std::size_t at = 0;
      for (auto&& p : params) {
        auto g = p.grad();
        std::copy_n(all_.begin() + static_cast<std::ptrdiff_t>(at), g.size(), g.begin());
        at += g.size();
      }
    }
  }

  // Adds every shard gradient of the step (the stashed ones, then the model's) at the flattened
  // elements [lo, hi) in fixed point into to[0, hi - lo); elements past the gradients (the last
  // block's padding) add nothing.
  void add_fixed(std::size_t lo, std::size_t hi, const std::vector<double>& scale, std::int64_t* to) {
    auto& params = model_->parameters();
    for (std::size_t j = 0; j < stashed_ + (in_model_ ? 1 : 0); ++j) {
      std::size_t begin = 0, i = 0;
      for (auto&& p : params) {
        const std::size_t len = p.grad().size(), from = std::max(begin, lo), until = std::min(begin + len, hi);
        if (from < until) {
          const float* g = (j < stashed_ ? stash_.data() + j * total_ + begin : p.grad().data()) + (from - begin);
          std::int64_t* acc = to + (from - lo);
          const double k = scale[i];
          for (std::size_t e = 0; e < until - from; ++e) acc[e] += detail::deterministic::to_fixed(static_cast<double>(g[e]), k);
        }
        begin += len;
        ++i;
      }
    }
  }

  [[nodiscard]] block_layout layout(std::size_t total) const {
    const auto world = static_cast<std::size_t>(comm_->size());
    const std::size_t width = (total + world - 1) / world;
    const std::size_t first = std::min(total, width * static_cast<std::size_t>(comm_->rank()));
    return {first, std::min(total, first + width), width, total};
  }

  [[nodiscard]] std::string where() const {
    return "rank " + std::to_string(comm_->rank()) + " deterministic_data_parallel: ";
  }

  M* model_;
  C* comm_;
  deterministic_options opts_;
  std::size_t micro_batches_ = 1;     // a step's micro-batches (gradient accumulation)
  std::size_t pending_ = 0;           // micro-batches of the step under way already computed
  std::size_t rows_ = 0;              // its shards' rows
  std::size_t total_ = 0;             // the model's gradient elements
  std::size_t stashed_ = 0;           // shard gradients in stash_ this step
  bool in_model_ = false;             // the step's last shard gradient is in the model's gradients
  std::vector<float> largest_;        // each tensor's largest magnitude over the step's shards so far
  std::vector<float> stash_;          // this rank's shards' gradients but the last, shard after shard
  std::vector<std::int64_t> sum_;     // their fixed-point sum over one chunk of every block
  std::vector<std::int64_t> part_;    // this rank's block of every rank's sums
  std::vector<float> mean_, all_;     // this rank's block as the mean; every block
};

}  // namespace partrain::inline v0
