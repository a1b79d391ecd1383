// Casts between fp32 and the 16-bit types, the low-precision copy of a model's weights, and the
// precision names.
#include <catch2/catch.hpp>

#include <partrain/precision/cast.hpp>
#include <partrain/precision/low_precision_copy.hpp>
#include <partrain/precision/precision.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "toy_models.hpp"

using namespace partrain;

namespace {

// Values that exercise rounding: ties, subnormals, overflow, the largest finite values, NaN.
std::vector<float> special_values() {
  std::vector<float> v{0.0f, -0.0f, 1.0f, -1.0f, 65504.0f, 65519.0f, 65520.0f, 1e-8f, 6e-8f, 3e-5f,
                       std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                       std::numeric_limits<float>::quiet_NaN(), 3.0e38f, 1.0f + 1.0f / 2048.0f,
                       1.0f + 3.0f / 2048.0f, 1.0f + 1.0f / 256.0f, 1.0f + 3.0f / 256.0f};
  partrain::testing::toy_rng r(3);
  for (int i = 0; i < 1000; ++i) v.push_back(static_cast<float>(r.uniform() * std::pow(2.0, static_cast<double>(i % 60) - 30)));
  return v;
}

template <class T16>
void check_round_trip() {
  const auto src = special_values();
  std::vector<T16> low(src.size());
  std::vector<float> back(src.size());
  cast(tensor_view<const float>(src), tensor_view<T16>(low));
  cast(tensor_view<const T16>(low), tensor_view<float>(back));
  for (std::size_t i = 0; i < src.size(); ++i) {
    INFO("element " << i << " = " << src[i]);
    CHECK(low[i].bits == T16(src[i]).bits);  // the exhaustive rounding test is in tests/core/test_half.cpp
    const float expect = static_cast<float>(T16(src[i]));
    if (std::isnan(expect)) {
      CHECK(std::isnan(back[i]));
    } else {
      CHECK(std::bit_cast<std::uint32_t>(back[i]) == std::bit_cast<std::uint32_t>(expect));
    }
  }
}

}  // namespace

TEST_CASE("cast rounds fp32 to half and bfloat16 as the scalar conversions do, and back exactly", "[precision]") {
  check_round_trip<half>();
  check_round_trip<bfloat16>();
}

// Every 977th float pattern (NaNs, infinities, subnormals, ties among them) and every 16-bit
// pattern, through cast() (on x86-64 with AVX2/F16C: the wide loops) against the scalar rules.
template <class T16>
void check_all_patterns() {
  std::vector<float> src;
  for (std::uint64_t b = 0; b < (std::uint64_t{1} << 32); b += 977) src.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(b)));
  std::vector<T16> low(src.size());
  cast(tensor_view<const float>(src), tensor_view<T16>(low));
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < src.size(); ++i) wrong += low[i].bits != T16(src[i]).bits ? 1 : 0;
  CHECK(wrong == 0);
  std::vector<T16> all(65536);
  for (std::uint32_t b = 0; b < 65536; ++b) all[b] = T16::from_bits(static_cast<std::uint16_t>(b));
  std::vector<float> back(all.size());
  cast(tensor_view<const T16>(all), tensor_view<float>(back));
  wrong = 0;
  for (std::size_t i = 0; i < all.size(); ++i) {
    wrong += std::bit_cast<std::uint32_t>(back[i]) != std::bit_cast<std::uint32_t>(static_cast<float>(all[i])) ? 1 : 0;
  }
  CHECK(wrong == 0);
}

TEST_CASE("cast gives the scalar conversions' bits for a stride of all floats and all 16-bit patterns", "[precision]") {
  check_all_patterns<half>();
  check_all_patterns<bfloat16>();
}

TEST_CASE("cast refuses views of different sizes", "[precision]") {
  std::vector<float> a(4);
  std::vector<half> b(3);
  CHECK_THROWS_WITH(cast(tensor_view<const float>(a), tensor_view<half>(b)),
                    Catch::Contains("4 source elements but 3 destination elements"));
}

TEST_CASE("precision names parse and print", "[precision]") {
  CHECK(parse_precision("fp16") == precision::fp16);
  CHECK(parse_precision("bfloat16") == precision::bf16);
  CHECK(parse_precision("fp32") == precision::fp32);
  CHECK(to_string(precision::bf16) == "bf16");
  CHECK_THROWS_WITH(parse_precision("int8"), Catch::Contains("'int8' is not one of fp32, fp16, bf16"));
}

TEST_CASE("low_precision_copy holds every master rounded, and refresh follows the masters", "[precision]") {
  partrain::testing::toy_mlp<float> m(5);
  auto copy = make_low_precision_copy(precision::bf16, m);
  REQUIRE(copy.size() == m.parameters().size());
  std::size_t total = 0;
  for (std::size_t i = 0; i < copy.size(); ++i) {
    const auto& vals = m.parameters()[i].values();
    const auto v = copy.get<bfloat16>(i);
    REQUIRE(v.size() == vals.size());
    CHECK(v.shape() == m.parameters()[i].value().shape());
    for (std::size_t j = 0; j < vals.size(); ++j) CHECK(v.data()[j].bits == bfloat16(vals[j]).bits);
    total += vals.size();
  }
  CHECK(copy.bytes() == total * 2);

  m.parameters()[2].values()[1] = 3.14159f;
  CHECK(copy.get<bfloat16>(2).data()[1].bits != bfloat16(3.14159f).bits);  // not yet refreshed
  copy.refresh();
  CHECK(copy.get<bfloat16>(2).data()[1].bits == bfloat16(3.14159f).bits);

  CHECK_THROWS_WITH(copy.get<half>(0), Catch::Contains("holds bf16, asked for half"));
  CHECK_THROWS_WITH(copy.data(9), Catch::Contains("parameter 9 out of range"));
  CHECK_THROWS_WITH(make_low_precision_copy(precision::fp32, m), Catch::Contains("expected fp16 or bf16"));
}
