#include <catch2/catch.hpp>

#include "fifo.hpp"
#include "temp_dir.hpp"
#include "toy_models.hpp"

#include <partrain/train/safetensors.hpp>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

using namespace partrain;
namespace fs = std::filesystem;
using Catch::Contains;

namespace {

// A model of parameters of any shape (rank 0 and empty ones included), with buffers when B.
template <class T>
struct plain_param {
  shape s;
  std::vector<T> v, g;
  explicit plain_param(shape sh) : s(sh), v(sh.numel()), g(sh.numel()) {}
  [[nodiscard]] tensor_view<T> value() { return {v.data(), s}; }
  [[nodiscard]] tensor_view<T> grad() { return {g.data(), s}; }
};
template <class T, bool B = false>
struct plain_model {
  std::vector<plain_param<T>> ps;
  std::vector<std::vector<float>> bufs;
  explicit plain_model(std::vector<shape> shapes, std::uint32_t seed = 1) {
    for (const auto& s : shapes) ps.emplace_back(s);
    if (B) bufs = {std::vector<float>(3), std::vector<float>(2)};
    fill(seed);
  }
  // Arbitrary bit patterns (NaNs with payloads included): a round trip must keep every bit.
  void fill(std::uint32_t seed) {
    std::uint32_t x = seed * 2654435761u + 1;
    const auto next = [&] {
      x ^= x << 13;
      x ^= x >> 17;
      x ^= x << 5;
      return x;
    };
    for (auto& p : ps) {
      for (auto& e : p.v) {
        for (std::size_t b = 0; b < sizeof(T); ++b) reinterpret_cast<unsigned char*>(&e)[b] = static_cast<unsigned char>(next());
      }
    }
    for (auto& b : bufs) {
      for (auto& e : b) e = static_cast<float>(next() % 1000) / 8.0f;
    }
  }
  [[nodiscard]] std::vector<plain_param<T>>& parameters() { return ps; }
  [[nodiscard]] std::vector<tensor_view<float>> buffers()
    requires B
  {
    std::vector<tensor_view<float>> out;
    for (auto& b : bufs) out.emplace_back(b.data(), shape{b.size()});
    return out;
  }
};

template <class T, bool B>
bool same_bits(const plain_model<T, B>& a, const plain_model<T, B>& b) {
  for (std::size_t i = 0; i < a.ps.size(); ++i) {
    if (a.ps[i].v.size() != b.ps[i].v.size()) return false;
    if (!a.ps[i].v.empty() && std::memcmp(a.ps[i].v.data(), b.ps[i].v.data(), a.ps[i].v.size() * sizeof(T)) != 0) return false;
  }
  return a.bufs == b.bufs;
}

std::vector<std::byte> file_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::vector<char> c((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::byte> b(c.size());
  if (!c.empty()) std::memcpy(b.data(), c.data(), c.size());
  return b;
}
// A file by hand: the header length (given, or the header's), the header as written, the buffer.
std::vector<std::byte> handmade(std::string_view header, std::size_t buffer_bytes, std::uint64_t n = UINT64_MAX) {
  if (n == UINT64_MAX) n = header.size();
  std::vector<std::byte> out(8 + header.size() + buffer_bytes, std::byte{0});
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}
std::string refusal(std::string_view header, std::size_t buffer_bytes, std::uint64_t n = UINT64_MAX) {
  try {
    (void)parse_safetensors(handmade(header, buffer_bytes, n), "bad.safetensors");
  } catch (const checkpoint_error& e) {
    return e.what();
  }
  return "(accepted)";
}

std::string header_of(const std::vector<std::byte>& file) {
  std::uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  return {reinterpret_cast<const char*>(file.data() + 8), static_cast<std::size_t>(n)};
}

}  // namespace

TEMPLATE_TEST_CASE("safetensors: a model round trips bit for bit, empty and rank-0 tensors included",
                   "[train][safetensors]", float, double, half, bfloat16) {
  testing::temp_dir dir("partrain_st");
  const std::vector<shape> shapes{shape{2, 3}, shape{0, 4}, shape{}, shape{5}, shape{1, 2, 1, 2}};
  plain_model<TestType> a(shapes, 1), b(shapes, 2);
  REQUIRE_FALSE(same_bits(a, b));
  const auto path = dir.path / "m.safetensors";
  save_safetensors(path, a);
  load_safetensors(path, b);
  CHECK(same_bits(a, b));

  const auto f = read_safetensors(path);
  const std::string dt(safetensors_dtype_name(dtype_of<TestType>));
  REQUIRE(f.tensors().size() == 5);
  for (std::size_t k = 0; k < 5; ++k) {
    const auto* t = f.find("params." + std::to_string(k));
    REQUIRE(t != nullptr);
    CHECK(t->dtype_name == dt);
    CHECK(t->shape == std::vector<std::uint64_t>(shapes[k].dims().begin(), shapes[k].dims().end()));
    CHECK(t->data.size() == shapes[k].numel() * sizeof(TestType));
  }
  CHECK(f.find("params.2")->shape.empty());   // the scalar: shape []
  CHECK(f.find("params.1")->data.empty());    // the empty tensor: no bytes
  CHECK(header_of(file_bytes(path)).find("\"params.2\":{\"dtype\":\"" + dt + "\",\"shape\":[],") != std::string::npos);
}

TEST_CASE("safetensors: the header is padded with spaces to a multiple of 8, tensors by alignment then name",
          "[train][safetensors]") {
  testing::temp_dir dir("partrain_st");
  const std::vector<std::byte> one(1), two(2), four(4), eight(8);
  const std::vector<safetensors_tensor> ts{{"z", "U8", {1}, one},   {"a", "F16", {1}, two}, {"c", "F32", {1}, four},
                                           {"b", "F64", {1}, eight}, {"y", "I32", {1}, four}};
  for (const std::string meta : {"", "x", "xy", "xyz", "abcdefg"}) {
    const auto path = dir.path / "p.safetensors";
    write_safetensors(path, ts, meta.empty() ? std::map<std::string, std::string>{} : std::map<std::string, std::string>{{"k", meta}});
    const auto bytes = file_bytes(path);
    const std::string h = header_of(bytes);
    CHECK(h.size() % 8 == 0);
    CHECK(h.find_last_not_of(' ') == h.rfind('}'));  // only spaces after the JSON
    CHECK(bytes.size() == 8 + h.size() + 19);
    if (!meta.empty()) CHECK(h.starts_with("{\"__metadata__\":{\"k\":\"" + meta + "\"},"));
    std::vector<std::string> order;
    const auto f = read_safetensors(path);
    for (const auto& t : f.tensors()) order.push_back(t.name);
    CHECK(order == std::vector<std::string>{"b", "c", "y", "a", "z"});
  }
}

TEST_CASE("safetensors: metadata and names with escapes round trip", "[train][safetensors]") {
  testing::temp_dir dir("partrain_st");
  const std::vector<std::byte> four(4, std::byte{0x3f});
  const std::string odd = "q\"uote\\ new\nline \x01 \xc3\xa9 \xf0\x9f\x98\x80";
  const std::map<std::string, std::string> meta{{"format", "pt"}, {odd, odd}};
  const std::vector<safetensors_tensor> ts{{odd, "F32", {}, four}};
  write_safetensors(dir.path / "e.safetensors", ts, meta);
  const auto f = read_safetensors(dir.path / "e.safetensors");
  CHECK(f.metadata() == meta);
  REQUIRE(f.find(odd) != nullptr);
  CHECK(f.find(odd)->data.size() == 4);
}

TEST_CASE("safetensors: the reader takes any key order and \\u escapes", "[train][safetensors]") {
  // JSON order differs from buffer order; names spelled with escapes, a surrogate pair included.
  const std::string h = R"({"b":{"data_offsets":[8,12],"shape":[1],"dtype":"F32"},"__metadata__":{"k":"v"},)"
                        R"("\u00e9\ud83d\ude00":{"shape":[2],"dtype":"I32","data_offsets":[0,8]}})";
  const auto f = parse_safetensors(handmade(h, 12));
  REQUIRE(f.tensors().size() == 2);
  CHECK(f.tensors()[0].name == "\xc3\xa9\xf0\x9f\x98\x80");
  CHECK(f.tensors()[1].name == "b");
  CHECK(f.metadata().at("k") == "v");
  CHECK(parse_safetensors(handmade("{}", 0)).tensors().empty());
  CHECK(parse_safetensors(handmade(R"({"e":{"dtype":"F16","shape":[0],"data_offsets":[0,0]}}   )", 0)).tensors().size() == 1);
}

TEST_CASE("safetensors: malformed files are refused, saying what is wrong", "[train][safetensors]") {
  const std::string a = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  CHECK_THAT(refusal("{" + a + R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12),
             Contains("bad.safetensors") && Contains("tensor \"b\" begins at byte 4, inside tensor \"a\"") &&
                 Contains("tensors overlap"));
  CHECK_THAT(refusal("{" + a + R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}})", 20),
             Contains("tensor \"b\" begins at byte 12, expected 8") && Contains("a hole of 4 bytes"));
  CHECK_THAT(refusal(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8),
             Contains("data_offsets [8, 0] end before they begin"));
  CHECK_THAT(refusal(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
             Contains("tensor \"a\" has 8 bytes") && Contains("expected 12 for F32 [3]"));
  CHECK_THAT(refusal(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8),
             Contains("overflows 64 bits"));
  CHECK_THAT(refusal("{}", 0, 1000), Contains("header length 1000 runs past the end of the file (10 bytes"));
  CHECK_THAT(refusal("{}", 0, 3), Contains("header length 3 runs past the end of the file (10 bytes, so at most 2)"));
  CHECK_THAT(refusal("{}", 0, std::uint64_t{1} << 40), Contains("more than the limit of 100000000 bytes"));
  CHECK_THAT(refusal(R"({"a": })", 0), Contains("header is not valid JSON") && Contains("at byte 6"));
  CHECK_THAT(refusal("{} x", 0), Contains("unexpected 'x' after the value"));
  CHECK_THAT(refusal("{" + a + "," + a + "}", 8), Contains("duplicate key \"a\""));
  CHECK_THAT(refusal(R"({"a":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]}})", 2),
             Contains("tensor \"a\" has dtype \"F8_E4M3\", which this reader does not support") && Contains("BF16"));
  CHECK_THAT(refusal(R"({"__metadata__":{"k":1}})", 0), Contains("__metadata__ \"k\" is a number, expected a string"));
  CHECK_THAT(refusal(R"({"__metadata__":["k"]})", 0), Contains("__metadata__ is an array"));
  CHECK_THAT(refusal("{" + a + "}", 4), Contains("tensor \"a\" ends at byte 8, past the end of the buffer (4 bytes"));
  CHECK_THAT(refusal("{" + a + "}", 12), Contains("the buffer holds 12 bytes after the header, the tensors 8"));
  CHECK_THAT(refusal(R"({"a":{"dtype":"F32","shape":[2]}})", 8), Contains("tensor \"a\" has no data_offsets"));
  CHECK_THAT(refusal(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", 8), Contains("unknown field \"x\""));
  CHECK_THAT(refusal(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8), Contains("not a non-negative integer"));
  CHECK_THAT(refusal(R"({"a":{"dtype":"F32","shape":[02],"data_offsets":[0,8]}})", 8), Contains("leading zero"));
  CHECK_THAT(refusal(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,18446744073709551616]}})", 8),
             Contains("larger than 2^64 - 1"));
  CHECK_THAT(refusal(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,9]}})", 8), Contains("has 3 entries"));
  CHECK_THAT(refusal(R"({"\ud800":1})", 0), Contains("without its low half"));
  CHECK_THAT(refusal(R"({"\udc00":1})", 0), Contains("lone low surrogate"));
  CHECK_THAT(refusal("{\"\xc3\x28\":1}", 0), Contains("invalid UTF-8"));
  CHECK_THAT(refusal("{\"\xe0\x80\xaf\":1}", 0), Contains("invalid UTF-8 sequence at byte 2"));  // overlong '/'
  CHECK_THAT(refusal("{\"\xed\xa0\x80\":1}", 0), Contains("invalid UTF-8 sequence at byte 2"));  // a surrogate
  CHECK_THAT(refusal(R"(["a"])", 0), Contains("the header is an array, expected an object"));
  CHECK_THAT(refusal(std::string(100, '[') + std::string(100, ']'), 0), Contains("nested deeper than 64 levels"));
  CHECK_THAT(refusal("", 0, 0), Contains("unexpected end of input"));
  std::string truncated;
  try {
    (void)parse_safetensors(std::vector<std::byte>(5), "short.safetensors");
  } catch (const checkpoint_error& e) {
    truncated = e.what();
  }
  CHECK_THAT(truncated, Contains("'short.safetensors': truncated: 5 bytes"));
}

TEST_CASE("safetensors: a FIFO or a missing file is refused by name", "[train][safetensors]") {
  using namespace std::chrono_literals;
  testing::temp_dir dir("partrain_st");
  const auto fifo = testing::make_fifo(dir.path / "w.safetensors");
  CHECK_THAT(testing::error_within(5s, fifo, [&] { (void)read_safetensors(fifo); }),
             Contains("safetensors file '" + fifo.string() + "' is a FIFO, expected a regular file"));
  CHECK_THROWS_AS(read_safetensors(dir.path / "none.safetensors"), checkpoint_error);
}

TEST_CASE("safetensors: load lists every mismatch by name and changes nothing", "[train][safetensors]") {
  testing::temp_dir dir("partrain_st");
  const auto path = dir.path / "m.safetensors";
  plain_model<float> saved({shape{2, 3}, shape{4}, shape{3}});
  save_safetensors(path, saved, {.names = {"w", "b", "extra"}});
  plain_model<float> m({shape{2, 3}, shape{5}, shape{1}}, 9);
  const auto before = m.ps;
  std::string msg;
  try {
    load_safetensors(path, m, {.names = {"w", "b", "gone"}});
  } catch (const checkpoint_error& e) {
    msg = e.what();
  }
  CHECK_THAT(msg, Contains("'" + path.string() + "' does not match the model (3 problems)") &&
                      Contains("\"b\" is F32 [4] in the file, expected F32 [5]") &&
                      Contains("missing \"gone\" (expected F32 [1])") &&
                      Contains("unexpected \"extra\" (F32 [3]) in the file"));
  CHECK_THAT(msg, !Contains("\"w\""));
  for (std::size_t i = 0; i < m.ps.size(); ++i) CHECK(m.ps[i].v == before[i].v);

  plain_model<double> wide({shape{2, 3}, shape{4}, shape{3}});
  CHECK_THROWS_WITH(load_safetensors(path, wide, {.names = {"w", "b", "extra"}}),
                    Contains("\"w\" is F32 [2, 3] in the file, expected F64 [2, 3]") && !Contains("convert"));
}

TEST_CASE("safetensors: names are checked, by default name() or params.<k> and buffers.<k>", "[train][safetensors]") {
  testing::temp_dir dir("partrain_st");
  const auto path = dir.path / "n.safetensors";
  plain_model<float> m({shape{2}, shape{3}});
  CHECK_THROWS_WITH(save_safetensors(path, m, {.names = {"a"}}), Contains("1 names for 2 parameters"));
  CHECK_THROWS_WITH(save_safetensors(path, m, {.names = {"a", "a"}}), Contains("the name \"a\" is given twice"));
  CHECK_THROWS_WITH(save_safetensors(path, m, {.names = {"a", ""}}), Contains("parameter #1 has an empty name"));
  CHECK_THROWS_AS(save_safetensors(path, m, {.names = {"a", "__metadata__"}}), invalid_argument_error);
  CHECK_FALSE(fs::exists(path));

  testing::toy_mlp<float, false> toy;
  save_safetensors(path, toy);
  std::vector<std::string> names;
  const auto toy_file = read_safetensors(path);
  for (const auto& t : toy_file.tensors()) names.push_back(t.name);
  std::ranges::sort(names);
  CHECK(names == std::vector<std::string>{"fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"});

  plain_model<float, true> with_buffers({shape{2}}, 3), other({shape{2}}, 4);
  save_safetensors(path, with_buffers, {.metadata = {{"format", "pt"}}});
  const auto f = read_safetensors(path);
  CHECK(f.find("buffers.0") != nullptr);
  CHECK(f.find("buffers.1")->shape == std::vector<std::uint64_t>{2});
  CHECK(f.metadata().at("format") == "pt");
  load_safetensors(path, other);
  CHECK(same_bits(with_buffers, other));
  plain_model<float> no_buffers({shape{2}});
  CHECK_THROWS_WITH(load_safetensors(path, no_buffers), Contains("unexpected \"buffers.0\"") && Contains("unexpected \"buffers.1\""));
}

TEST_CASE("safetensors: F16/BF16/F32 conversions on request only", "[train][safetensors]") {
  testing::temp_dir dir("partrain_st");
  const auto path = dir.path / "c.safetensors";
  plain_model<float> m({shape{3, 2}});
  m.ps[0].v = {0.1f, -2.5f, 65504.0f, 1e-8f, 3.14159f, 70000.0f};
  save_safetensors(path, m, {.dtype = dtype::float16});
  const auto f = read_safetensors(path);
  REQUIRE(f.tensors().at(0).dtype_name == "F16");
  for (std::size_t i = 0; i < 6; ++i) {
    std::uint16_t bits;
    std::memcpy(&bits, f.tensors()[0].data.data() + 2 * i, 2);
    CHECK(bits == half(m.ps[0].v[i]).bits);
  }
  plain_model<float> back({shape{3, 2}}, 5);
  CHECK_THROWS_WITH(load_safetensors(path, back),
                    Contains("\"params.0\" is F16 [3, 2] in the file, expected F32 [3, 2] (convert = true converts)"));
  load_safetensors(path, back, {.convert = true});
  for (std::size_t i = 0; i < 6; ++i) CHECK(back.ps[0].v[i] == static_cast<float>(half(m.ps[0].v[i])));

  save_safetensors(path, m);  // F32 into a bfloat16 model: rounded to nearest even
  plain_model<bfloat16> b16({shape{3, 2}});
  load_safetensors(path, b16, {.convert = true});
  for (std::size_t i = 0; i < 6; ++i) CHECK(b16.ps[0].v[i].bits == bfloat16(m.ps[0].v[i]).bits);

  plain_model<double> d({shape{1}});
  CHECK_THROWS_WITH(save_safetensors(path, d, {.dtype = dtype::float16}), Contains("cannot write float64 parameters as float16"));
}
