#include <catch2/catch.hpp>

#include <partrain/core/buffer.hpp>
#include <partrain/core/device.hpp>
#include <partrain/core/tensor_view.hpp>

#include <vector>

using namespace partrain;

namespace {
constexpr bool shape_math() {
  shape s{4, 3, 2, 5};
  if (s.rank() != 4 || s.numel() != 120 || s.row_numel() != 30) return false;
  float data[120]{};
  tensor_view<float> v(data, s);
  auto rows = v.slice(1, 3);
  if (rows.extent(0) != 2 || rows.size() != 60 || rows.data() != data + 30) return false;
  auto flat = v.reshape({120});
  return flat.rank() == 1 && flat.size_bytes() == 480;
}
static_assert(shape_math());
static_assert(std::ranges::contiguous_range<tensor_view<float>>);
static_assert(tensor_view_like<tensor_view<const double, cuda>>);
}  // namespace

TEST_CASE("tensor_view slices the batch dimension", "[core][tensor_view]") {
  std::vector<float> v(24);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  tensor_view<float> t(v.data(), shape{4, 6});
  auto s = t.slice(2, 4);
  CHECK(s.shape() == shape{2, 6});
  CHECK(s[0] == 12.0f);
  CHECK(t.slice(4, 4).empty());
  CHECK_THROWS_AS(t.slice(3, 5), invalid_argument_error);
  CHECK_THROWS_WITH(t.reshape({5, 5}), Catch::Contains("25 elements"));
  tensor_view<const float> c = t;  // adds const
  CHECK(c.data() == t.data());
  tensor_view from_vec(v);
  CHECK(from_vec.size() == 24);
  CHECK(tensor_view<float>::dtype() == dtype::float32);
}

TEST_CASE("host_buffer owns aligned zeroed memory", "[core][buffer]") {
  host_buffer<double> b(shape{3, 5});
  CHECK(b.size() == 15);
  CHECK(reinterpret_cast<std::uintptr_t>(b.data()) % 64 == 0);
  for (double x : b) CHECK(x == 0.0);
  b[3] = 2.5;
  host_buffer<double> copy = b;
  CHECK(copy[3] == 2.5);
  host_buffer<double> moved = std::move(b);
  CHECK(moved.view().shape() == shape{3, 5});
}

TEST_CASE("device parses torch spellings", "[core][device]") {
  CHECK(device::parse("cpu") == device::cpu());
  CHECK(device::parse("cuda:1") == device::cuda(1));
  CHECK_THROWS_WITH(device::parse("tpu"), Catch::Contains("expected 'cpu'"));
  CHECK_THROWS_AS(device::parse("cuda:x"), config_error);
}

TEST_CASE("default views and buffers are empty, not scalars", "[core][buffer]") {
  CHECK(tensor_view<float>().size() == 0);
  CHECK(tensor_view<float>().empty());
  host_buffer<float> b;
  CHECK(b.size() == 0);
  host_buffer<float> copy = b;  // copying an empty buffer touches no memory
  CHECK(copy.size() == 0);
  CHECK(shape{}.numel() == 1);  // a rank-0 shape is a scalar, as in PyTorch
}
