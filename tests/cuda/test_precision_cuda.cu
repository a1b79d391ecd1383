// Mixed precision on a CUDA device against the host path: the fused casts and the fused unscale +
// inf check (partrain/precision/detail/kernels.cuh) give bit for bit what the host loops give, and
// the example's CUDA MLP in fp16/bf16 computes the loss and gradients the host MLP computes in the
// same precision. The main (gpu_main.cpp) skips, saying so, when no CUDA device is present.
#include <catch2/catch.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include <partrain/core/half.hpp>
#include <partrain/cuda/device_buffer.hpp>
#include <partrain/precision/cast.hpp>
#include <partrain/precision/detail/host_kernels.hpp>
#include <partrain/precision/detail/kernels.cuh>
#include <partrain/precision/grad_scaler.hpp>
#include <partrain/precision/low_precision_copy.hpp>

#if PARTRAIN_TEST_WITH_MLP
#include <partrain/optim/sgd.hpp>
#include <partrain/precision/mixed_precision.hpp>

#include "mlp_cuda.cuh"
#include "mlp_host.hpp"
#endif

using namespace partrain;

namespace {

// A fixed generator (splitmix64) so that every run checks the same values.
struct test_rng {
  std::uint64_t s;
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float uniform(float lo, float hi) { return lo + (hi - lo) * static_cast<float>(next() >> 40) * (1.0f / 16777216.0f); }
};

float from_bits(std::uint32_t b) { return std::bit_cast<float>(b); }
std::uint32_t bits_of(float f) { return std::bit_cast<std::uint32_t>(f); }

// Every kind of float the conversions treat specially, then random bit patterns (all exponents,
// NaNs included) and random values near the 16-bit types' rounding boundaries.
std::vector<float> cast_inputs() {
  constexpr float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v{0.0f, -0.0f, 1.0f, -1.0f, inf, -inf,
                       std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
                       std::numeric_limits<float>::signaling_NaN(), from_bits(0x7F800001u), from_bits(0xFFC12345u),
                       from_bits(0x7FFFFFFFu), from_bits(0x7FA00000u),
                       std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::denorm_min(),
                       from_bits(0x007FFFFFu), std::numeric_limits<float>::min(), std::numeric_limits<float>::max(),
                       -std::numeric_limits<float>::max(),
                       // half: largest finite, the last value that rounds to it, the first that overflows
                       65504.0f, 65519.996f, 65520.0f, -65520.0f, 65536.0f,
                       // half subnormals: smallest (2^-24), the tie below it (2^-25 -> 0), 3 * 2^-25 (tie -> 2^-23)
                       std::ldexp(1.0f, -24), std::ldexp(1.0f, -25), std::ldexp(3.0f, -25), std::ldexp(1.0f, -26),
                       std::ldexp(1.0f, -14), std::ldexp(1023.0f, -24), std::ldexp(2047.0f, -25),
                       // ties to even in the normal range: half (11 bits) and bfloat16 (8 bits)
                       1.0f + std::ldexp(1.0f, -11), 1.0f + std::ldexp(3.0f, -11), -(1.0f + std::ldexp(1.0f, -11)),
                       1.0f + std::ldexp(1.0f, -8), 1.0f + std::ldexp(3.0f, -8), 1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20),
                       // bfloat16: largest finite, and values around its overflow
                       from_bits(0x7F7F0000u), from_bits(0x7F7F7FFFu), from_bits(0x7F7F8000u), from_bits(0x7F7F8001u),
                       // bfloat16 subnormals
                       from_bits(0x00010000u), from_bits(0x00008000u), from_bits(0x00018000u), from_bits(0x00000001u)};
  test_rng r{11};
  for (int i = 0; i < 100000; ++i) v.push_back(from_bits(static_cast<std::uint32_t>(r.next())));
  for (int i = 0; i < 100000; ++i) {
    // Exponents around the half range, low mantissa bits at the rounding point (ties included).
    const float base = std::ldexp(r.uniform(1.0f, 2.0f), static_cast<int>(r.next() % 50) - 30);
    const std::uint32_t b = (bits_of(base) & ~0x1FFFu) | (r.next() % 4 == 0 ? 0x1000u : static_cast<std::uint32_t>(r.next() & 0x1FFFu));
    v.push_back(r.next() % 2 ? from_bits(b) : -from_bits(b));
  }
  return v;
}

template <class T>
std::vector<T> to_host(const device_buffer<T>& d) {
  std::vector<T> h(d.size());
  d.copy_to(tensor_view<T>(h.data(), h.size()));
  return h;
}

template <class T>
device_buffer<T> to_device(const std::vector<T>& h) {
  device_buffer<T> d(h.size(), 0);
  d.copy_from(tensor_view<const T>(h.data(), h.size()));
  return d;
}

// float -> T16 on the device bit for bit equals the host conversion; T16 -> float exactly too,
// over all 65,536 patterns.
template <class T16>
void check_cast_bits() {
  const auto src = cast_inputs();
  auto d_src = to_device(src);
  device_buffer<T16> d_low(src.size(), 0);
  cast(tensor_view<const float, partrain::cuda>(d_src.data(), src.size()), d_low.view());
  const auto low = to_host(d_low);
  std::size_t mismatches = 0;
  for (std::size_t i = 0; i < src.size(); ++i) {
    if (low[i].bits != T16(src[i]).bits && mismatches++ < 10) {
      UNSCOPED_INFO("float bits 0x" << std::hex << bits_of(src[i]) << ": device 0x" << low[i].bits << ", host 0x"
                                    << T16(src[i]).bits << std::dec);
    }
  }
  CHECK(mismatches == 0);

  std::vector<T16> all(65536);
  for (std::uint32_t b = 0; b < 65536; ++b) all[b] = T16::from_bits(static_cast<std::uint16_t>(b));
  auto d_all = to_device(all);
  device_buffer<float> d_wide(all.size(), 0);
  cast(tensor_view<const T16, partrain::cuda>(d_all.data(), all.size()), d_wide.view());
  const auto wide = to_host(d_wide);
  mismatches = 0;
  for (std::uint32_t b = 0; b < 65536; ++b) {
    if (bits_of(wide[b]) != bits_of(static_cast<float>(all[b])) && mismatches++ < 10) {
      UNSCOPED_INFO("16-bit pattern 0x" << std::hex << b << ": device 0x" << bits_of(wide[b]) << ", host 0x"
                                        << bits_of(static_cast<float>(all[b])) << std::dec);
    }
  }
  CHECK(mismatches == 0);
}

}  // namespace

TEST_CASE("CUDA casts round as the host conversions do, bit for bit", "[cuda][precision][gpu]") {
  SECTION("half") { check_cast_bits<partrain::half>(); }
  SECTION("bfloat16") { check_cast_bits<partrain::bfloat16>(); }
}

// More tensors than one launch's table holds (and empty ones among them): every element of every
// pair is converted, nothing beyond them is written.
TEST_CASE("CUDA cast_views converts many tensors of many sizes in fused launches", "[cuda][precision][gpu]") {
  constexpr std::size_t tensors = 2 * detail::amp::segments_per_launch + 7;
  test_rng r{5};
  std::vector<std::size_t> sizes(tensors), offsets(tensors);
  std::size_t total = 0;
  for (std::size_t k = 0; k < tensors; ++k) {
    sizes[k] = k % 9 == 0 ? 0 : (k == 3 ? 300000 : r.next() % 700);
    offsets[k] = total;
    total += sizes[k] + 1;  // one guard element after each tensor
  }
  std::vector<float> src(total);
  for (auto& x : src) x = r.uniform(-70000.0f, 70000.0f) * std::ldexp(1.0f, static_cast<int>(r.next() % 40) - 30);
  auto d_src = to_device(src);
  const std::uint16_t guard = 0xABCD;
  std::vector<partrain::half> init(total, partrain::half::from_bits(guard));
  auto d_dst = to_device(init);

  std::vector<tensor_view<const float, partrain::cuda>> sv;
  std::vector<tensor_view<partrain::half, partrain::cuda>> dv;
  for (std::size_t k = 0; k < tensors; ++k) {
    sv.emplace_back(d_src.data() + offsets[k], sizes[k]);
    dv.emplace_back(d_dst.data() + offsets[k], sizes[k]);
  }
  detail::amp::cast_views<float, partrain::half>(std::span<const tensor_view<const float, partrain::cuda>>(sv),
                                  std::span<const tensor_view<partrain::half, partrain::cuda>>(dv));
  const auto dst = to_host(d_dst);
  std::size_t wrong = 0, guards = 0;
  for (std::size_t k = 0; k < tensors; ++k) {
    for (std::size_t j = 0; j < sizes[k]; ++j) wrong += dst[offsets[k] + j].bits != partrain::half(src[offsets[k] + j]).bits;
    guards += dst[offsets[k] + sizes[k]].bits == guard;
  }
  CHECK(wrong == 0);
  CHECK(guards == tensors);

  // Mismatched pairs are refused by name before anything runs.
  std::vector<tensor_view<partrain::half, partrain::cuda>> short_dst(dv.begin(), dv.end() - 1);
  CHECK_THROWS_WITH((detail::amp::cast_views<float, partrain::half>(std::span<const tensor_view<const float, partrain::cuda>>(sv),
                                                     std::span<const tensor_view<partrain::half, partrain::cuda>>(short_dst))),
                    Catch::Contains("destination"));
}

namespace {

// Runs the device and the host unscale on copies of the same gradients; returns both flags and
// checks the values agree bit for bit (NaN as NaN: the GPU does not keep NaN payloads through a
// multiplication, and nothing reads them).
std::pair<bool, bool> unscale_both(const std::vector<std::vector<float>>& grads, float inv_scale) {
  std::vector<device_buffer<float>> dev;
  std::vector<tensor_view<float, partrain::cuda>> dv;
  std::vector<std::vector<float>> host = grads;
  std::vector<tensor_view<float>> hv;
  for (std::size_t k = 0; k < grads.size(); ++k) {
    dev.push_back(to_device(grads[k]));
    dv.push_back(dev.back().view());
    hv.emplace_back(host[k].data(), host[k].size());
  }
  const bool d_found = detail::amp::unscale_and_check(std::span<const tensor_view<float, partrain::cuda>>(dv), inv_scale);
  const bool h_found = detail::amp::unscale_and_check(std::span<const tensor_view<float>>(hv), inv_scale);
  std::size_t wrong = 0;
  for (std::size_t k = 0; k < grads.size(); ++k) {
    const auto d = to_host(dev[k]);
    for (std::size_t j = 0; j < d.size(); ++j) {
      const bool same = std::isnan(host[k][j]) ? std::isnan(d[j]) : bits_of(d[j]) == bits_of(host[k][j]);
      wrong += !same;
    }
  }
  CHECK(wrong == 0);
  return {d_found, h_found};
}

}  // namespace

TEST_CASE("CUDA unscale_and_check scales and finds inf/NaN as the host does", "[cuda][precision][gpu]") {
  // 138 tensors, 20 of them empty: 118 in two launches.
  constexpr std::size_t tensors = 2 * detail::amp::segments_per_launch + 10;
  test_rng r{9};
  std::vector<std::vector<float>> grads(tensors);
  for (std::size_t k = 0; k < tensors; ++k) {
    grads[k].resize(k % 7 == 0 ? 0 : 1 + r.next() % 5000);
    for (auto& g : grads[k]) g = r.uniform(-1.0f, 1.0f) * std::ldexp(1.0f, static_cast<int>(r.next() % 60) - 20);
  }
  const float inv = static_cast<float>(1.0 / 65536.0);

  SECTION("all finite: no overflow, every value unscaled") {
    const auto [d, h] = unscale_both(grads, inv);
    CHECK_FALSE(h);
    CHECK_FALSE(d);
  }
  SECTION("an inf in a tensor of the second launch") {
    REQUIRE_FALSE(grads[tensors - 1].empty());
    grads[tensors - 1][grads[tensors - 1].size() / 2] = std::numeric_limits<float>::infinity();
    const auto [d, h] = unscale_both(grads, inv);
    CHECK(h);
    CHECK(d);
  }
  SECTION("a NaN as the first element of the first launch") {
    grads[1][0] = std::numeric_limits<float>::quiet_NaN();
    const auto [d, h] = unscale_both(grads, inv);
    CHECK(h);
    CHECK(d);
  }
  SECTION("finite values that overflow only as fp16 are not an overflow of the fp32 gradients") {
    grads[2][0] = 3.0e38f;
    const auto [d, h] = unscale_both(grads, 1.0f);
    CHECK_FALSE(h);
    CHECK_FALSE(d);
  }
  SECTION("no gradients at all") {
    CHECK_FALSE(detail::amp::unscale_and_check(std::span<const tensor_view<float, partrain::cuda>>(), inv));
  }
}

TEST_CASE("a low_precision_copy in CUDA memory lives on the current device and refreshes", "[cuda][precision][gpu]") {
  int dev = 0;
  REQUIRE(cudaGetDevice(&dev) == cudaSuccess);
  std::vector<float> masters{1.0f, 1.0f + std::ldexp(1.0f, -11), -2.5f, 70000.0f, 1e-9f};
  auto d = to_device(masters);
  low_precision_copy<partrain::cuda> copy(precision::fp16, {d.view()});
  cudaPointerAttributes attr{};
  REQUIRE(cudaPointerGetAttributes(&attr, copy.data(0)) == cudaSuccess);
  CHECK(attr.type == cudaMemoryTypeDevice);
  CHECK(attr.device == dev);
  auto read = [&] {
    std::vector<partrain::half> h(masters.size());
    REQUIRE(cudaMemcpy(h.data(), copy.data(0), h.size() * sizeof(partrain::half), cudaMemcpyDeviceToHost) == cudaSuccess);
    return h;
  };
  auto low = read();
  for (std::size_t i = 0; i < masters.size(); ++i) CHECK(low[i].bits == partrain::half(masters[i]).bits);
  masters[2] = 3.0f;
  d.copy_from(tensor_view<const float>(masters.data(), masters.size()));
  copy.refresh();
  low = read();
  CHECK(static_cast<float>(low[2]) == 3.0f);
}

#if PARTRAIN_TEST_WITH_MLP

namespace {

struct test_batch {
  tensor_view<const float> features;
  tensor_view<const std::int32_t> labels;
};

// Inputs in [0, 1) (Fashion-MNIST's range after scaling) and labels 0..classes-1.
struct batch_data {
  std::vector<float> x;
  std::vector<std::int32_t> y;
  batch_data(std::size_t n, const models::mlp_layout& layout, std::uint64_t seed) : x(n * layout.inputs()), y(n) {
    test_rng r{seed};
    for (auto& v : x) v = r.uniform(0.0f, 1.0f);
    for (auto& l : y) l = static_cast<std::int32_t>(r.next() % layout.classes());
  }
  [[nodiscard]] test_batch batch() const { return {{x.data(), x.size()}, {y.data(), y.size()}}; }
};

// How far the CUDA model may be from the host model in a 16-bit precision, relative to the
// largest gradient (or loss). Both round the same fp32 masters to the same 16-bit values (the
// casts are bit-identical, tested above), every product of two 16-bit values is exact in fp32,
// and both accumulate in fp32: the only difference is cuBLAS's summation order against
// OpenBLAS's, about k * 2^-24 of a sum of k terms (k <= 784 here, so < 5e-5 of it). Such a
// difference changes a stored 16-bit value only when the fp32 result lies that close to a
// rounding boundary, and then by one unit in its last place (2^-10 of it for fp16, 2^-7 for
// bf16); a flipped activation or delta moves the sums downstream by a fraction of one unit. So
// every gradient is within two units in the last place of the largest one: 2^-9 (fp16) or 2^-6
// (bf16) of it. A wrong rounding, a missing rounding or a wrong operand is far larger.
double tolerance(precision p) { return p == precision::fp16 ? std::ldexp(1.0, -9) : std::ldexp(1.0, -6); }

struct grad_diff {
  double max_abs = 0, max_ref = 0, l1 = 0;
  std::size_t non_finite_host = 0, non_finite_gpu = 0;
};

grad_diff diff(const std::vector<float>& gpu, tensor_view<float> host) {
  REQUIRE(gpu.size() == host.size());
  grad_diff d;
  for (std::size_t i = 0; i < gpu.size(); ++i) {
    d.non_finite_host += !std::isfinite(host.data()[i]);
    d.non_finite_gpu += !std::isfinite(gpu[i]);
    if (!std::isfinite(host.data()[i]) || !std::isfinite(gpu[i])) continue;
    const double e = std::abs(static_cast<double>(gpu[i]) - host.data()[i]);
    d.max_abs = std::max(d.max_abs, e);
    d.l1 += e;
    d.max_ref = std::max(d.max_ref, std::abs(static_cast<double>(host.data()[i])));
  }
  return d;
}

void compare_one_step(precision p, float loss_scale) {
  const models::mlp_layout layout{{784, 256, 128, 10}};
  const batch_data data(64, layout, 21);
  models::mlp_host host(layout, 7, p);
  models::mlp_cuda gpu(layout, 7, device::cuda(0), p);
  REQUIRE(gpu.values_to_host() == std::vector<float>(host.flat_values().begin(), host.flat_values().end()));
  host.set_loss_scale(loss_scale);
  gpu.set_loss_scale(loss_scale);

  std::vector<std::size_t> ready;
  const double hl = host.train_step(data.batch());
  const double gl = gpu.train_step(data.batch(), [&](std::size_t i) { ready.push_back(i); });
  INFO(to_string(p) << ", loss scale " << loss_scale << ": loss host " << hl << ", cuda " << gl);
  CHECK(std::abs(gl - hl) <= tolerance(p) * std::abs(hl));

  const auto d = diff(gpu.grads_to_host(), host.flat_grads());
  INFO("largest gradient difference " << d.max_abs << ", largest host gradient " << d.max_ref);
  CHECK(d.non_finite_host == 0);
  CHECK(d.non_finite_gpu == 0);
  CHECK(d.max_ref > 0);
  CHECK(d.max_abs <= tolerance(p) * d.max_ref);
  CHECK(ready == std::vector<std::size_t>{5, 4, 3, 2, 1, 0});

  // The 16-bit rounding is really there: nearly every gradient of the fp32 model differs from
  // these, while the two 16-bit models differ only where a summation order flipped a rounding.
  models::mlp_host fp32(layout, 7);
  fp32.set_loss_scale(loss_scale);
  (void)fp32.train_step(data.batch());
  const auto d32 = diff(gpu.grads_to_host(), fp32.flat_grads());
  INFO("summed gradient difference: cuda vs host " << d.l1 << ", cuda vs host fp32 " << d32.l1);
  CHECK(d32.l1 > 4 * d.l1);

  // Evaluation reads the same 16-bit weights.
  const auto he = host.eval_step(data.batch());
  const auto ge = gpu.eval_step(data.batch());
  CHECK(ge.count == he.count);
  CHECK(std::abs(ge.loss_sum - he.loss_sum) <= tolerance(p) * std::abs(he.loss_sum));
}

}  // namespace

static_assert(loss_scalable<models::mlp_cuda>);
static_assert(has_low_precision_copy<models::mlp_cuda>);

TEST_CASE("the fp16/bf16 CUDA MLP computes the loss and gradients of the host MLP", "[cuda][precision][gpu][examples]") {
  SECTION("fp16, unscaled") { compare_one_step(precision::fp16, 1.0f); }
  // 2^15: the gradients move out of fp16's subnormal range and stay well below 65504 (the largest,
  // the last layer's, are about scale * 0.2 here).
  SECTION("fp16, loss scale 2^15") { compare_one_step(precision::fp16, 32768.0f); }
  SECTION("bf16") { compare_one_step(precision::bf16, 1.0f); }
}

// The fp32 path applies the loss scale too (fp32 + a scaler works): a power of two scales every
// gradient exactly, so the scaled CUDA gradients are the unscaled ones times the scale, and agree
// with the host's as in test_mlp_cuda (summation order only: 1e-4 of the largest gradient).
TEST_CASE("the fp32 CUDA MLP applies the loss scale as the host MLP does", "[cuda][precision][gpu][examples]") {
  const models::mlp_layout layout{{784, 64, 10}};
  const batch_data data(32, layout, 12);
  models::mlp_host host(layout, 9);
  models::mlp_cuda plain(layout, 9);
  models::mlp_cuda scaled(layout, 9);
  host.set_loss_scale(1024.0f);
  scaled.set_loss_scale(1024.0f);
  (void)host.train_step(data.batch());
  (void)plain.train_step(data.batch());
  (void)scaled.train_step(data.batch());
  const auto g1 = plain.grads_to_host();
  const auto gs = scaled.grads_to_host();
  std::size_t not_scaled = 0;
  for (std::size_t i = 0; i < g1.size(); ++i) not_scaled += gs[i] != g1[i] * 1024.0f;
  CHECK(not_scaled == 0);
  const auto d = diff(gs, host.flat_grads());
  INFO("largest gradient difference " << d.max_abs << ", largest host gradient " << d.max_ref);
  CHECK(d.max_abs <= 1e-4 * d.max_ref);
}

TEST_CASE("an fp16 overflow in the CUDA MLP's backward reaches its fp32 gradients as inf/NaN",
          "[cuda][precision][gpu][examples]") {
  const models::mlp_layout layout{{784, 32, 10}};
  const batch_data data(16, layout, 4);
  models::mlp_host host(layout, 3, precision::fp16);
  models::mlp_cuda gpu(layout, 3, device::cuda(0), precision::fp16);
  // (softmax - onehot) / 16 * 2^30 is far beyond fp16's 65504.
  host.set_loss_scale(std::ldexp(1.0f, 30));
  gpu.set_loss_scale(std::ldexp(1.0f, 30));
  (void)host.train_step(data.batch());
  (void)gpu.train_step(data.batch());
  grad_scaler hs, gs;
  CHECK(hs.unscale(host));
  CHECK(gs.unscale(gpu));
  // bf16 has float's range: the same scale does not overflow.
  models::mlp_cuda wide(layout, 3, device::cuda(0), precision::bf16);
  wide.set_loss_scale(std::ldexp(1.0f, 30));
  (void)wide.train_step(data.batch());
  grad_scaler ws;
  CHECK_FALSE(ws.unscale(wide));
}

TEST_CASE("amp_step trains the fp16 CUDA MLP as it trains the host MLP", "[cuda][precision][gpu][examples]") {
  const models::mlp_layout layout{{784, 64, 10}};
  const batch_data data(32, layout, 8);
  models::mlp_host host(layout, 5, precision::fp16);
  models::mlp_cuda gpu(layout, 5, device::cuda(0), precision::fp16);
  const std::vector<float> initial(host.flat_values().begin(), host.flat_values().end());
  sgd<models::mlp_host> host_opt(host, {.lr = 0.1});
  sgd<models::mlp_cuda> gpu_opt(gpu, {.lr = 0.1});
  // A small growth interval so the scale changes within the test.
  grad_scaler host_scaler({.init_scale = 1024.0f, .growth_interval = 2});
  grad_scaler gpu_scaler({.init_scale = 1024.0f, .growth_interval = 2});
  for (int step = 0; step < 4; ++step) {
    const auto h = amp_step(host, host_opt, host_scaler, data.batch());
    const auto g = amp_step(gpu, gpu_opt, gpu_scaler, data.batch());
    CHECK(g.skipped == h.skipped);
    CHECK(g.scale == h.scale);
    CHECK(std::abs(g.loss - h.loss) <= tolerance(precision::fp16) * std::abs(h.loss));
  }
  CHECK(gpu_scaler.scale() == 4096.0f);
  const auto v = gpu.values_to_host();
  double moved = 0, apart = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    moved = std::max(moved, std::abs(static_cast<double>(host.flat_values()[i]) - initial[i]));
    apart = std::max(apart, std::abs(static_cast<double>(v[i]) - host.flat_values()[i]));
  }
  INFO("largest change of a weight " << moved << ", largest difference cuda - host " << apart);
  // The weights moved by four steps of lr * gradient, each gradient within tolerance * (largest
  // gradient) of the host's, so the two models stay within about tolerance * moved of each other
  // (4x slack for the 16-bit copies' roundings that the small differences flip). A stale 16-bit
  // copy or a missed step would put them a sizeable part of `moved` apart.
  CHECK(moved > 1e-3);
  CHECK(apart <= 4 * tolerance(precision::fp16) * moved + 1e-6);
}

#endif  // PARTRAIN_TEST_WITH_MLP
