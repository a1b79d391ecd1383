// partrain/parallel/detail/binned_sum.hpp: an exact sum of float gradients whose result does not
// depend on the order or grouping of its adds, built up one group at a time (the binned
// accumulation ReproBLAS uses, cut down to two bins): what deterministic FSDP folds its shards'
// gradients with, round after round, without knowing the largest gradient of the step ahead.
//
// Magnitudes are cut into bins of `bin_bits` bits on one fixed grid (bin t: [2^(tW), 2^((t+1)W))).
// A tensor's values are added in the bin of its largest magnitude, t, and the one below: each
// value v as n = trunc(v / 2^((t-1)W)), split into hi = trunc(n / 2^W) (bin t) and lo = n - hi 2^W
// (bin t - 1), two integer counters. Counters of the same bin add exactly, in any order. When a
// later group's largest value lies in a higher bin, the accumulator moves up: bin t - 1 is dropped,
// bin t becomes the low one. Truncation toward zero nests (trunc(trunc(x / a) / b) =
// trunc(x / (ab))), so what survives is each value truncated at the final low bin whichever group
// it came in: the same integers, so the same sum, for any order, grouping or world size. Every
// value keeps at least W - 1 = 30 bits below the largest one's bin (a float has 24).
#pragma once

#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>

namespace partrain::inline v0::detail::deterministic {

inline constexpr int bin_bits = 31;
inline constexpr int no_bin = INT_MIN;  // an accumulator (or a group) of zeros only
inline constexpr std::int64_t bin_unit = std::int64_t{1} << bin_bits;

// The bin of a tensor whose largest magnitude is `largest` (finite, > 0): the t with
// 2^(tW) <= 2^e <= 2^((t+1)W - 1), largest < 2^e, so every |v| <= largest gives |hi| < 2^(W-1)
// and |n| < 2^(2W-1), inside an int64.
[[nodiscard]] inline int bin_of(float largest) noexcept {
  int e = 0;
  (void)std::frexp(static_cast<double>(largest), &e);
  return e >= 0 ? e / bin_bits : -((-e + bin_bits - 1) / bin_bits);  // floor(e / W)
}

// Adds the two digits of v[0, n) in bin t (t != no_bin) to hi[0, n) and lo[0, n). The scaling by a
// power of two is exact in double for every float (t lies in [-5, 4]).
inline void add_digits(const float* v, std::size_t n, int t, std::int64_t* hi, std::int64_t* lo) noexcept {
  const double s = std::ldexp(1.0, -(t - 1) * bin_bits);
  for (std::size_t i = 0; i < n; ++i) {
    const auto q = static_cast<std::int64_t>(static_cast<double>(v[i]) * s);  // truncates toward zero
    const std::int64_t h = q / bin_unit;
    hi[i] += h;
    lo[i] += q - h * bin_unit;
  }
}

// Adds a group's digit sums, made in bin t_in, to an accumulator in bin t (no_bin: empty so far),
// which moves up to t_in when that is higher. Counters stay far inside an int64 for fewer than
// 2^30 groups.
inline void merge_bins(int& t, std::int64_t* hi, std::int64_t* lo, const std::int64_t* hi_in, const std::int64_t* lo_in,
                       std::size_t n, int t_in) noexcept {
  if (t_in == no_bin) return;
  if (t == no_bin || t_in >= t + 2) {  // nothing kept survives below the new low bin
    for (std::size_t i = 0; i < n; ++i) {
      hi[i] = hi_in[i];
      lo[i] = lo_in[i];
    }
  } else if (t_in == t + 1) {  // bin t becomes the low one, bin t - 1 is dropped
    for (std::size_t i = 0; i < n; ++i) {
      lo[i] = hi[i] + lo_in[i];
      hi[i] = hi_in[i];
    }
  } else if (t_in == t) {
    for (std::size_t i = 0; i < n; ++i) {
      hi[i] += hi_in[i];
      lo[i] += lo_in[i];
    }
  } else if (t_in == t - 1) {  // the group's high bin is our low one; its low bin is dropped
    for (std::size_t i = 0; i < n; ++i) lo[i] += hi_in[i];
  }  // else the whole group lies below our low bin
  if (t == no_bin || t_in > t) t = t_in;
}

// The accumulated sum of one element as a double (one rounding: hi 2^W is exact, adding lo rounds).
[[nodiscard]] inline double bins_value(int t, std::int64_t hi, std::int64_t lo) noexcept {
  if (t == no_bin) return 0.0;
  return std::ldexp(static_cast<double>(hi) * static_cast<double>(bin_unit) + static_cast<double>(lo), (t - 1) * bin_bits);
}

}  // namespace partrain::inline v0::detail::deterministic
