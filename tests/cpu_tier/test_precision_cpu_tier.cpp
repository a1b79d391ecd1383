// Mixed precision's element functors (precision/detail/elements.hpp) through the launch helper:
// the casts against a case-by-case reference conversion, the fused unscale + inf/NaN check, and
// the segment tables that put many tensors into one launch.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include <partrain/precision/detail/elements.hpp>

#include "reference_16.hpp"
#include "tier.hpp"

namespace precision_cases {

namespace pd = partrain::detail;

// Every edge the conversions have, then random bit patterns (all exponents, NaN payloads).
std::vector<float> cast_inputs() {
  std::vector<float> v{0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.99f, 65520.0f, -65520.0f, 1e30f, -1e30f,
                       std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                       std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min(), -1e-40f,
                       std::ldexp(1.0f, -14), std::ldexp(1.0f, -24), std::ldexp(1.0f, -25), std::ldexp(3.0f, -26),
                       std::ldexp(1.0f, -14) - std::ldexp(1.0f, -25), 1.0f + std::ldexp(1.0f, -11),  // ties
                       1.0f + std::ldexp(3.0f, -11), 1.0f + std::ldexp(1.0f, -8), 1.0f + std::ldexp(3.0f, -8),
                       std::bit_cast<float>(0x7FC00001u), std::bit_cast<float>(0xFF812345u),  // NaNs with payloads
                       std::bit_cast<float>(0x7F800001u), std::bit_cast<float>(0x7F7FFFFFu),
                       std::bit_cast<float>(0x7F7F8000u)};  // bf16 max's halfway point: rounds to inf
  std::mt19937 gen(11);
  for (int i = 0; i < 20000; ++i) v.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(gen())));
  for (std::uint32_t b = 0x33000000u; b < 0x38900000u; b += 0x1FFu) v.push_back(std::bit_cast<float>(b));  // half subnormals
  return v;
}

}  // namespace precision_cases

TEST_CASE("cast_fn float -> half / bfloat16 is round to nearest even, NaN kept", "[cpu_tier][precision][cast]") {
  using namespace precision_cases;
  const auto in = cast_inputs();
  const std::size_t n = in.size();
  tier::vec<float> x(n);
  tier::vec<partrain::half> h(n);
  tier::vec<partrain::bfloat16> b(n);
  for (std::size_t i = 0; i < n; ++i) x[i] = in[i];
  pd::for_each_index(tier::exec(), n, pd::amp::cast_fn<float, partrain::half>{x.data(), h.data()});
  pd::for_each_index(tier::exec(), n, pd::amp::cast_fn<float, partrain::bfloat16>{x.data(), b.data()});
  tier::finish();
  std::size_t bad_h = 0, bad_b = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (h[i].bits != tier::ref::float_to_half(in[i])) {
      if (bad_h++ < 5) UNSCOPED_INFO("half of " << std::bit_cast<std::uint32_t>(in[i]) << ": " << h[i].bits);
    }
    if (b[i].bits != tier::ref::float_to_bfloat16(in[i])) {
      if (bad_b++ < 5) UNSCOPED_INFO("bfloat16 of " << std::bit_cast<std::uint32_t>(in[i]) << ": " << b[i].bits);
    }
  }
  CHECK(bad_h == 0);
  CHECK(bad_b == 0);
}

TEST_CASE("cast_fn half / bfloat16 -> float is exact for all 65536 patterns", "[cpu_tier][precision][cast]") {
  using namespace precision_cases;
  const std::size_t n = 65536;
  tier::vec<partrain::half> h(n);
  tier::vec<partrain::bfloat16> b(n);
  tier::vec<float> fh(n), fb(n);
  for (std::size_t i = 0; i < n; ++i) {
    h[i] = partrain::half::from_bits(static_cast<std::uint16_t>(i));
    b[i] = partrain::bfloat16::from_bits(static_cast<std::uint16_t>(i));
  }
  pd::for_each_index(tier::exec(), n, pd::amp::cast_fn<partrain::half, float>{h.data(), fh.data()});
  pd::for_each_index(tier::exec(), n, pd::amp::cast_fn<partrain::bfloat16, float>{b.data(), fb.data()});
  tier::finish();
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const auto bits = static_cast<std::uint16_t>(i);
    bad += std::bit_cast<std::uint32_t>(fh[i]) != std::bit_cast<std::uint32_t>(tier::ref::half_to_float(bits));
    bad += std::bit_cast<std::uint32_t>(fb[i]) != std::bit_cast<std::uint32_t>(tier::ref::bfloat16_to_float(bits));
  }
  CHECK(bad == 0);
}

TEST_CASE("unscale_check_fn multiplies every element and flags inf and NaN", "[cpu_tier][precision][unscale]") {
  using namespace precision_cases;
  const float inv = 1.0f / 1024.0f;
  for (const std::size_t n : tier::ragged_sizes) {
    for (const int poison : {0, 1, 2}) {  // none, an inf, a NaN (at the last element: no early exit)
      CAPTURE(n, poison, tier::name);
      auto in = tier::awkward_floats(n, 5);
      for (auto& x : in) x = std::isfinite(x) ? x : 1.0f;
      if (n && poison == 1) in[n - 1] = -std::numeric_limits<float>::infinity();
      if (n && poison == 2) in[n - 1] = std::numeric_limits<float>::quiet_NaN();
      tier::vec<float> g(n);
      for (std::size_t i = 0; i < n; ++i) g[i] = in[i];
      const int found =
          pd::transform_reduce_index(tier::exec(), n, 0, pd::amp::unscale_check_fn{g.data(), inv}, pd::bit_or_fn{});
      CHECK(found == (n && poison ? 1 : 0));
      std::size_t bad = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const float want = in[i] * inv;
        bad += !(std::isnan(want) ? std::isnan(g[i]) : g[i] == want);
      }
      CHECK(bad == 0);
    }
  }
}

TEST_CASE("segment tables: many tensors, empty ones skipped, more than one table", "[cpu_tier][precision][segments]") {
  using namespace precision_cases;
  // 2 * 64 + 30 tensors of ragged sizes, every eleventh empty (15): 143 segments, so two full
  // tables and a partial third.
  const std::size_t tensors = 2 * pd::amp::segments_per_launch + 30;
  std::vector<std::vector<float>> src(tensors);
  std::vector<std::size_t> sizes(tensors);
  std::size_t total = 0;
  for (std::size_t k = 0; k < tensors; ++k) {
    sizes[k] = k % 11 == 0 ? 0 : (k * 37) % 300 + 1;
    src[k] = tier::awkward_floats(sizes[k], static_cast<std::uint32_t>(k));
    total += sizes[k];
  }
  // One flat allocation carved into the tensors (the device sees one managed block).
  tier::vec<float> flat(total + 1), back(total + 1);
  tier::vec<partrain::half> flat16(total + 1);
  std::vector<std::size_t> at(tensors);
  for (std::size_t k = 0, o = 0; k < tensors; o += sizes[k], ++k) {
    at[k] = o;
    for (std::size_t j = 0; j < sizes[k]; ++j) flat[o + j] = src[k][j];
  }
  std::size_t tables = 0, covered = 0;
  pd::amp::for_each_table(
      tensors, [&](std::size_t k) { return pd::amp::segment{flat.data() + at[k], flat16.data() + at[k], sizes[k], 0}; },
      [&](const pd::amp::segment_table& t) {
        ++tables;
        covered += t.total;
        for (unsigned s = 0; s < t.count; ++s) CHECK(t.seg[s].n != 0);
        pd::for_each_index(tier::exec(), t.total, pd::amp::segmented_cast_fn<float, partrain::half>{t});
      });
  tier::finish();
  CHECK(tables == 3);
  CHECK(covered == total);
  std::size_t bad = 0;
  for (std::size_t k = 0; k < tensors; ++k) {
    for (std::size_t j = 0; j < sizes[k]; ++j) bad += flat16[at[k] + j].bits != tier::ref::float_to_half(src[k][j]);
  }
  CHECK(bad == 0);

  // Back to float through the tables, then the fused unscale over them with one NaN in the middle.
  pd::amp::for_each_table(
      tensors, [&](std::size_t k) { return pd::amp::segment{flat16.data() + at[k], back.data() + at[k], sizes[k], 0}; },
      [&](const pd::amp::segment_table& t) {
        pd::for_each_index(tier::exec(), t.total, pd::amp::segmented_cast_fn<partrain::half, float>{t});
      });
  tier::finish();
  bad = 0;
  for (std::size_t i = 0; i < total; ++i) {
    const float want = tier::ref::half_to_float(flat16[i].bits);
    bad += std::bit_cast<std::uint32_t>(back[i]) != std::bit_cast<std::uint32_t>(want);
  }
  CHECK(bad == 0);
  for (std::size_t i = 0; i < total; ++i) back[i] = std::isfinite(back[i]) ? back[i] : 2.0f;
  back[total / 2] = std::numeric_limits<float>::quiet_NaN();
  int found = 0;
  pd::amp::for_each_table(
      tensors, [&](std::size_t k) { return pd::amp::segment{back.data() + at[k], back.data() + at[k], sizes[k], 0}; },
      [&](const pd::amp::segment_table& t) {
        found |= pd::transform_reduce_index(tier::exec(), t.total, 0, pd::amp::segmented_unscale_check_fn{t, 0.5f}, pd::bit_or_fn{});
      });
  CHECK(found == 1);
  bad = 0;
  for (std::size_t i = 0; i < total; ++i) {
    if (i == total / 2) continue;
    const float f = tier::ref::half_to_float(flat16[i].bits);
    bad += back[i] != (std::isfinite(f) ? f : 2.0f) * 0.5f;
  }
  CHECK(bad == 0);
  CHECK(back[total] == 0.0f);  // one past the last tensor: untouched
}
