// The C++ half of safetensors_interop.sh: `write FILE` writes the tensors below with partrain,
// `check FILE` reads FILE (written by the Python package) and checks every tensor's name, dtype,
// shape and bytes, and the metadata. The Python half builds the same tensors from the same rule.
#include <partrain/train/safetensors.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace {

struct spec {
  const char* name;
  const char* dtype;
  std::vector<std::uint64_t> shape;
};
// Every dtype numpy has (not BF16), an empty tensor, a scalar, a name outside ASCII.
const std::vector<spec> specs = {
    {"bool", "BOOL", {3}},      {"u8", "U8", {2, 3}},     {"i8", "I8", {4}},         {"i16", "I16", {2, 2}},
    {"u16", "U16", {3}},        {"i32", "I32", {2, 1, 2}}, {"u32", "U32", {2}},       {"i64", "I64", {3}},
    {"u64", "U64", {1}},        {"f16", "F16", {2, 3}},   {"f32", "F32", {3, 2}},    {"f64", "F64", {2}},
    {"empty", "F32", {0, 3}},   {"scalar", "F64", {}},    {"w\xc3\xa9ight", "F32", {2}}};
// One entry: the package writes its metadata in hash order, which a byte-for-byte comparison cannot follow.
const std::map<std::string, std::string> metadata = {{"note", "caf\xc3\xa9 \"q\""}};

// Byte j of tensor k: the same rule as the Python side (BOOL: 0 or 1). Floats get arbitrary bit
// patterns, NaN payloads included: a bit-for-bit copy must keep them.
std::vector<std::byte> bytes_of(std::size_t k, const spec& s) {
  std::size_t n = partrain::detail::safetensors::find_dtype(s.dtype)->size;
  for (const auto d : s.shape) n *= d;
  std::vector<std::byte> b(n);
  for (std::size_t j = 0; j < n; ++j) {
    b[j] = std::string_view(s.dtype) == "BOOL" ? std::byte((j + k) & 1) : std::byte((j * 7 + k * 13 + 1) & 0xff);
  }
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace partrain;
  if (argc != 3) {
    std::fprintf(stderr, "usage: safetensors_interop write|check FILE\n");
    return 2;
  }
  const std::string mode = argv[1];
  try {
    std::vector<std::vector<std::byte>> data;
    for (std::size_t k = 0; k < specs.size(); ++k) data.push_back(bytes_of(k, specs[k]));
    if (mode == "write") {
      std::vector<safetensors_tensor> ts;
      for (std::size_t k = 0; k < specs.size(); ++k) ts.push_back({specs[k].name, specs[k].dtype, specs[k].shape, data[k]});
      write_safetensors(argv[2], ts, metadata);
      return 0;
    }
    const auto f = read_safetensors(argv[2]);
    int bad = 0;
    const auto fail = [&](const std::string& what) {
      std::fprintf(stderr, "FAIL %s\n", what.c_str());
      ++bad;
    };
    if (f.tensors().size() != specs.size()) fail(std::to_string(f.tensors().size()) + " tensors, expected " + std::to_string(specs.size()));
    for (std::size_t k = 0; k < specs.size(); ++k) {
      const auto* t = f.find(specs[k].name);
      if (!t) {
        fail(std::string("no tensor ") + specs[k].name);
        continue;
      }
      if (t->dtype_name != specs[k].dtype) fail(t->name + ": dtype " + t->dtype_name);
      if (t->shape != specs[k].shape) fail(t->name + ": shape " + detail::safetensors::shape_text(t->shape));
      if (!std::equal(t->data.begin(), t->data.end(), data[k].begin(), data[k].end())) fail(t->name + ": bytes differ");
    }
    if (f.metadata() != metadata) fail("metadata differs");
    std::printf("checked %zu tensors and %zu metadata entries: %s\n", f.tensors().size(), f.metadata().size(),
                bad ? "MISMATCH" : "all equal");
    return bad ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "safetensors_interop: %s\n", e.what());
    return 1;
  }
}
