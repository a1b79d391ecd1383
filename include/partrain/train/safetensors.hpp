// partrain/train/safetensors.hpp: Hugging Face safetensors files, read and written, so weights
// move between partrain and PyTorch / transformers / numpy. Layout: u64 N (little-endian), N bytes
// of JSON header ({name: {"dtype", "shape", "data_offsets"}}, optional "__metadata__" of strings),
// then the tensors' bytes, little-endian, C order.
//
// Low level: read_safetensors(path) checks everything the reference reader does (header size,
// the tensors tiling the buffer from 0 with no hole or overlap, sizes = numel x dtype size with
// overflow checked, the buffer's end = the file's) and refuses with a checkpoint_error naming the
// file, the tensor and what was expected; write_safetensors writes as the reference writer does
// (header padded with spaces to a multiple of 8, tensors by dtype, larger alignment first, then name),
// atomically. Model level: save_safetensors / load_safetensors for any `model`, parameters named
// "params.<k>" (k: the position in parameters(); a parameter's own name() where it has one) unless
// names are given, buffers "buffers.<k>". Sharded modes: save on rank 0 from the whole model,
// e.g. `auto full = fsdp.summon_full_params(); save_safetensors(path, full);` (collective: every
// rank summons, rank 0 saves); load into the model before wrapping it (DDP, ZeRO, FSDP take the
// values they are given).
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <partrain/core/detail/json_parse.hpp>
#include <partrain/core/detail/json_text.hpp>
#include <partrain/core/detail/regular_file.hpp>
#include <partrain/core/dtype.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/half.hpp>
#include <partrain/core/memory_space.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/model/concepts.hpp>
#include <partrain/model/traits.hpp>
#include <partrain/optim/optimizer.hpp>
#include <partrain/parallel/detail/host_staging.hpp>
#include <partrain/train/detail/atomic_file.hpp>

namespace partrain::inline v0 {

static_assert(std::endian::native == std::endian::little,
              "partrain: safetensors files are little-endian; this reader copies bytes as they are");

// The reference reader's limit on the header.
inline constexpr std::uint64_t safetensors_max_header_bytes = 100'000'000;

// One tensor of a safetensors file: what the header says and its bytes (in the file's buffer
// when read; the caller's memory when written).
struct safetensors_tensor {
  std::string name;
  std::string dtype_name;  // as the file spells it: "F32", "BF16", "BOOL", ...
  std::vector<std::uint64_t> shape{};
  std::span<const std::byte> data{};
};

namespace detail::safetensors {

struct dtype_info {
  std::string_view name;
  std::size_t size;
  std::optional<dtype> type;  // partrain's, where it has one
};
// The dtypes read and written, in the order of the reference's Dtype enum (its writer puts the
// later ones first); the rest of the format's (F8_*, F6_*, F4, C64) are refused by name.
inline constexpr dtype_info dtypes[] = {
    {"BOOL", 1, std::nullopt},     {"U8", 1, dtype::uint8},  {"I8", 1, std::nullopt},       {"I16", 2, std::nullopt},
    {"U16", 2, std::nullopt},      {"F16", 2, dtype::float16}, {"BF16", 2, dtype::bfloat16}, {"I32", 4, dtype::int32},
    {"U32", 4, std::nullopt},      {"F32", 4, dtype::float32}, {"F64", 8, dtype::float64},   {"I64", 8, dtype::int64},
    {"U64", 8, std::nullopt}};
inline constexpr std::string_view supported = "BOOL, U8, I8, I16, U16, I32, U32, I64, U64, F16, BF16, F32 or F64";

[[nodiscard]] inline const dtype_info* find_dtype(std::string_view name) noexcept {
  for (const auto& d : dtypes) {
    if (d.name == name) return &d;
  }
  return nullptr;
}
[[nodiscard]] inline std::string_view name_of(dtype t) noexcept {
  for (const auto& d : dtypes) {
    if (d.type == t) return d.name;
  }
  return {};
}

[[nodiscard]] inline std::string shape_text(std::span<const std::uint64_t> s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(s[i]);
  }
  return out + "]";
}
[[nodiscard]] inline std::string json_quoted(std::string_view s) {
  std::string out;
  json::append_string(out, s);
  return out;
}

// The bytes prod(shape) x size, or nullopt on overflow.
[[nodiscard]] inline std::optional<std::uint64_t> byte_count(std::span<const std::uint64_t> shape, std::size_t size) {
  std::uint64_t n = size;
  for (const auto d : shape) {
    if (d != 0 && n > UINT64_MAX / d) return std::nullopt;
    n *= d;
  }
  return n;
}

}  // namespace detail::safetensors

// Where partrain's dtype has a safetensors name ("F32"), that name; else empty.
[[nodiscard]] inline std::string_view safetensors_dtype_name(dtype t) noexcept { return detail::safetensors::name_of(t); }
// partrain's dtype for a safetensors dtype name, where it has one.
[[nodiscard]] inline std::optional<dtype> safetensors_dtype(std::string_view name) noexcept {
  const auto* d = detail::safetensors::find_dtype(name);
  return d ? d->type : std::nullopt;
}

// A read file: its bytes, and the tensors (in buffer order) and metadata its header names. Move
// only: the tensors' spans point into the bytes it owns.
class safetensors_file {
 public:
  safetensors_file() = default;
  safetensors_file(safetensors_file&&) noexcept = default;
  safetensors_file& operator=(safetensors_file&&) noexcept = default;
  safetensors_file(const safetensors_file&) = delete;
  safetensors_file& operator=(const safetensors_file&) = delete;

  [[nodiscard]] const std::vector<safetensors_tensor>& tensors() const noexcept { return tensors_; }
  [[nodiscard]] const std::map<std::string, std::string>& metadata() const noexcept { return metadata_; }
  [[nodiscard]] const safetensors_tensor* find(std::string_view name) const noexcept {
    for (const auto& t : tensors_) {
      if (t.name == name) return &t;
    }
    return nullptr;
  }

 private:
  friend safetensors_file parse_safetensors(std::vector<std::byte> bytes, std::string_view source);
  std::vector<std::byte> bytes_;
  std::vector<safetensors_tensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Checks and indexes the bytes of a safetensors file; `source` names it in errors.
[[nodiscard]] inline safetensors_file parse_safetensors(std::vector<std::byte> bytes, std::string_view source = "<memory>") {
  namespace st = detail::safetensors;
  const std::string where = "safetensors file '" + std::string(source) + "'";
  const auto fail = [&](const std::string& why) { return checkpoint_error(where + ": " + why); };
  if (bytes.size() < 8) {
    throw fail("truncated: " + std::to_string(bytes.size()) + " bytes, less than the 8-byte header length");
  }
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  if (n > safetensors_max_header_bytes) {
    throw fail("the header length " + std::to_string(n) + " is more than the limit of " +
               std::to_string(safetensors_max_header_bytes) + " bytes");
  }
  if (n > bytes.size() - 8) {
    throw fail("the header length " + std::to_string(n) + " runs past the end of the file (" +
               std::to_string(bytes.size()) + " bytes, so at most " + std::to_string(bytes.size() - 8) + ")");
  }
  const std::string_view text(reinterpret_cast<const char*>(bytes.data() + 8), n);
  const auto header = detail::json::parse<checkpoint_error>(text, where + " header");
  if (header.type != detail::json::value::kind::object) {
    throw fail("the header is " + std::string(detail::json::kind_name(header.type)) + ", expected an object");
  }
  const std::span<const std::byte> buffer(bytes.data() + 8 + n, bytes.size() - 8 - n);

  safetensors_file out;
  struct placed {
    std::uint64_t begin, end;
    std::size_t index;
  };
  std::vector<placed> order;
  for (const auto& entry : header.object) {
    const std::string& name = entry.first;
    const detail::json::value& info = entry.second;  // not a structured binding: clang 14's lambdas cannot capture one
    if (name == "__metadata__") {
      if (info.type != detail::json::value::kind::object) {
        throw fail("__metadata__ is " + std::string(detail::json::kind_name(info.type)) + ", expected an object of strings");
      }
      for (const auto& [k, v] : info.object) {
        if (v.type != detail::json::value::kind::string) {
          throw fail("__metadata__ " + st::json_quoted(k) + " is " + std::string(detail::json::kind_name(v.type)) +
                     ", expected a string (metadata maps strings to strings)");
        }
        out.metadata_.emplace(k, v.string);
      }
      continue;
    }
    const std::string t = "tensor " + st::json_quoted(name);
    if (info.type != detail::json::value::kind::object) {
      throw fail(t + " is " + std::string(detail::json::kind_name(info.type)) +
                 ", expected an object with dtype, shape and data_offsets");
    }
    for (const auto& [k, v] : info.object) {
      (void)v;
      if (k != "dtype" && k != "shape" && k != "data_offsets") {
        throw fail(t + " has the unknown field " + st::json_quoted(k) + " (expected dtype, shape and data_offsets)");
      }
    }
    const auto field = [&](std::string_view key, detail::json::value::kind kind, std::string_view expected) {
      const auto* v = info.find(key);
      if (!v) throw fail(t + " has no " + std::string(key) + " (expected " + std::string(expected) + ")");
      if (v->type != kind) {
        throw fail(t + ": " + std::string(key) + " is " + std::string(detail::json::kind_name(v->type)) + ", expected " +
                   std::string(expected));
      }
      return v;
    };
    const auto integers = [&](const detail::json::value& v, std::string_view key, std::string_view expected) {
      std::vector<std::uint64_t> r;
      for (const auto& e : v.array) {
        if (e.type != detail::json::value::kind::integer) {
          throw fail(t + ": " + std::string(key) + " holds " + std::string(detail::json::kind_name(e.type)) + ", expected " +
                     std::string(expected));
        }
        r.push_back(e.integer);
      }
      return r;
    };
    const auto* dt = field("dtype", detail::json::value::kind::string, "a dtype name such as \"F32\"");
    const auto* info_dtype = st::find_dtype(dt->string);
    if (!info_dtype) {
      throw fail(t + " has dtype " + st::json_quoted(dt->string) + ", which this reader does not support (expected " +
                 std::string(st::supported) + ")");
    }
    safetensors_tensor tensor{.name = name, .dtype_name = dt->string};
    tensor.shape = integers(*field("shape", detail::json::value::kind::array, "an array of extents"), "shape",
                            "non-negative integer extents");
    const auto offsets = integers(*field("data_offsets", detail::json::value::kind::array, "[begin, end]"), "data_offsets",
                                  "two byte offsets [begin, end]");
    if (offsets.size() != 2) {
      throw fail(t + ": data_offsets has " + std::to_string(offsets.size()) + " entries, expected two [begin, end]");
    }
    if (offsets[1] < offsets[0]) {
      throw fail(t + ": data_offsets [" + std::to_string(offsets[0]) + ", " + std::to_string(offsets[1]) +
                 "] end before they begin");
    }
    const auto want = st::byte_count(tensor.shape, info_dtype->size);
    if (!want) throw fail(t + ": shape " + st::shape_text(tensor.shape) + " overflows 64 bits of bytes");
    if (*want != offsets[1] - offsets[0]) {
      throw fail(t + " has " + std::to_string(offsets[1] - offsets[0]) + " bytes (data_offsets [" +
                 std::to_string(offsets[0]) + ", " + std::to_string(offsets[1]) + "]), expected " + std::to_string(*want) +
                 " for " + tensor.dtype_name + " " + st::shape_text(tensor.shape));
    }
    order.push_back({offsets[0], offsets[1], out.tensors_.size()});
    out.tensors_.push_back(std::move(tensor));
  }
  // Sorted by offset, the tensors must tile the buffer: each begins where the last one ended.
  std::ranges::stable_sort(order, [](const placed& a, const placed& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  std::uint64_t at = 0;
  std::string previous = "the buffer's start";
  for (const auto& p : order) {
    const std::string t = "tensor " + st::json_quoted(out.tensors_[p.index].name);
    if (p.begin < at) {
      throw fail(t + " begins at byte " + std::to_string(p.begin) + ", inside " + previous + " (which ends at byte " +
                 std::to_string(at) + "): tensors overlap");
    }
    if (p.begin > at) {
      throw fail(t + " begins at byte " + std::to_string(p.begin) + ", expected " + std::to_string(at) + " (the end of " +
                 previous + "): a hole of " + std::to_string(p.begin - at) + " bytes");
    }
    if (p.end > buffer.size()) {
      throw fail(t + " ends at byte " + std::to_string(p.end) + ", past the end of the buffer (" +
                 std::to_string(buffer.size()) + " bytes after the header)");
    }
    at = p.end;
    previous = t;
  }
  if (at != buffer.size()) {
    throw fail("the buffer holds " + std::to_string(buffer.size()) + " bytes after the header, the tensors " +
               std::to_string(at) + " (expected the file to end with the last tensor)");
  }
  std::vector<safetensors_tensor> sorted;
  sorted.reserve(order.size());
  for (const auto& p : order) {
    auto& t = out.tensors_[p.index];
    t.data = buffer.subspan(static_cast<std::size_t>(p.begin), static_cast<std::size_t>(p.end - p.begin));
    sorted.push_back(std::move(t));
  }
  out.tensors_ = std::move(sorted);
  out.bytes_ = std::move(bytes);  // the spans stay valid: moving a vector keeps its storage
  return out;
}

// Reads and checks the safetensors file at `path` (a regular file; a FIFO or a device is refused).
// The header length is checked against the file's size before anything is allocated for it.
[[nodiscard]] inline safetensors_file read_safetensors(const std::filesystem::path& path) {
  const auto f = detail::open_regular_file<checkpoint_error>(path, "safetensors file");
  auto bytes = detail::read_up_to<checkpoint_error>(f, f.size, path, "safetensors file");
  return parse_safetensors(std::move(bytes), path.string());
}

// The bytes of a safetensors file holding `tensors` (any order, names unique) and `metadata`.
[[nodiscard]] inline std::vector<std::byte> safetensors_bytes(std::span<const safetensors_tensor> tensors,
                                                             const std::map<std::string, std::string>& metadata = {}) {
  namespace st = detail::safetensors;
  std::vector<std::pair<std::ptrdiff_t, const safetensors_tensor*>> order;  // (dtype's place in dtypes, tensor)
  for (const auto& t : tensors) {
    const auto* d = st::find_dtype(t.dtype_name);
    if (!d) {
      throw invalid_argument_error("write_safetensors: tensor " + st::json_quoted(t.name) + " has dtype " +
                                   st::json_quoted(t.dtype_name) + " (expected " + std::string(st::supported) + ")");
    }
    if (t.name == "__metadata__") throw invalid_argument_error("write_safetensors: \"__metadata__\" is not a tensor name");
    const auto want = st::byte_count(t.shape, d->size);
    if (!want || *want != t.data.size()) {
      throw invalid_argument_error("write_safetensors: tensor " + st::json_quoted(t.name) + " has " +
                                   std::to_string(t.data.size()) + " bytes, expected " +
                                   (want ? std::to_string(*want) : std::string("more than 2^64")) + " for " + t.dtype_name +
                                   " " + st::shape_text(t.shape));
    }
    order.emplace_back(d - st::dtypes, &t);
  }
  // The reference writer's order: by dtype, descending (so larger alignment first), then by name.
  std::ranges::sort(order, [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second->name < b.second->name;
  });
  for (std::size_t i = 1; i < order.size(); ++i) {
    if (order[i].second->name == order[i - 1].second->name) {
      throw invalid_argument_error("write_safetensors: two tensors are named " + st::json_quoted(order[i].second->name));
    }
  }
  std::string h = "{";
  if (!metadata.empty()) {
    h += "\"__metadata__\":{";
    for (const auto& [k, v] : metadata) {
      if (h.back() != '{') h += ',';
      detail::json::append_string(h, k);
      h += ':';
      detail::json::append_string(h, v);
    }
    h += '}';
  }
  std::uint64_t at = 0;
  for (const auto& [place, t] : order) {
    if (h.size() > 1) h += ',';
    detail::json::append_string(h, t->name);
    h += ":{\"dtype\":\"" + t->dtype_name + "\",\"shape\":[";
    for (std::size_t i = 0; i < t->shape.size(); ++i) {
      if (i) h += ',';
      h += std::to_string(t->shape[i]);
    }
    h += "],\"data_offsets\":[" + std::to_string(at) + "," + std::to_string(at + t->data.size()) + "]}";
    at += t->data.size();
  }
  h += '}';
  h.append((8 - h.size() % 8) % 8, ' ');  // the buffer starts 8-aligned
  const std::uint64_t n = h.size();
  std::vector<std::byte> out(8 + h.size() + at);
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, h.data(), h.size());
  std::size_t pos = 8 + h.size();
  for (const auto& [place, t] : order) {
    if (!t->data.empty()) std::memcpy(out.data() + pos, t->data.data(), t->data.size());
    pos += t->data.size();
  }
  return out;
}

// Writes `tensors` to `path` atomically (temporary file, fsync, rename).
inline void write_safetensors(const std::filesystem::path& path, std::span<const safetensors_tensor> tensors,
                              const std::map<std::string, std::string>& metadata = {}) {
  detail::ckpt::write_file_atomically(path, safetensors_bytes(tensors, metadata));
}

// save_safetensors: names one per parameter (empty: "params.<k>", or the parameter's name());
// dtype the file's (empty: the model's own; float32, float16 or bfloat16 convert a model of one
// of these three, rounding to nearest even); metadata the header's "__metadata__".
struct safetensors_save_options {
  std::vector<std::string> names{};
  std::optional<partrain::dtype> dtype{};
  std::map<std::string, std::string> metadata{};
};
// load_safetensors: names as saved; convert lets an F16, BF16 or F32 tensor fill a parameter of
// another of these three (off: the dtypes must match exactly).
struct safetensors_load_options {
  std::vector<std::string> names{};
  bool convert = false;
};

namespace detail::safetensors {

template <model M>
consteval bool check_model() {
  static_assert(partrain::check_model<M>());
  static_assert(element_type<model_element_t<M>>,
                "partrain: safetensors parameters must have a partrain dtype (float, double, half, bfloat16, int32, "
                "int64, uint8)");
  return true;
}

// The names of the parameters then the buffers, checked: one per parameter, none empty, none twice.
template <model M>
[[nodiscard]] std::vector<std::string> names_of(M& m, const std::vector<std::string>& given, const char* who) {
  std::vector<std::string> names;
  std::size_t k = 0;
  for (auto&& p : m.parameters()) {
    if constexpr (requires { { p.name() } -> std::convertible_to<std::string>; }) {
      names.push_back(given.empty() ? std::string(p.name()) : std::string());
    } else {
      names.push_back(given.empty() ? "params." + std::to_string(k) : std::string());
    }
    ++k;
  }
  if (!given.empty()) {
    if (given.size() != names.size()) {
      throw invalid_argument_error(std::string(who) + ": " + std::to_string(given.size()) + " names for " +
                                   std::to_string(names.size()) + " parameters (expected one per parameter)");
    }
    names = given;
  }
  if constexpr (has_buffers<M>) {
    std::size_t b = 0;
    for (auto&& v : m.buffers()) {
      (void)v;
      names.push_back("buffers." + std::to_string(b++));
    }
  }
  std::vector<const std::string*> sorted;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (names[i].empty()) throw invalid_argument_error(std::string(who) + ": parameter #" + std::to_string(i) + " has an empty name");
    if (names[i] == "__metadata__") throw invalid_argument_error(std::string(who) + ": \"__metadata__\" is not a tensor name");
    sorted.push_back(&names[i]);
  }
  std::ranges::sort(sorted, [](const std::string* a, const std::string* b) { return *a < *b; });
  for (std::size_t i = 1; i < sorted.size(); ++i) {
    if (*sorted[i] == *sorted[i - 1]) {
      throw invalid_argument_error(std::string(who) + ": the name " + json_quoted(*sorted[i]) +
                                   " is given twice (expected one name per tensor)");
    }
  }
  return names;
}

// The 16- and 32-bit floats convert into each other (through float: exact, then one rounding).
[[nodiscard]] constexpr bool convertible(dtype t) noexcept {
  return t == dtype::float32 || t == dtype::float16 || t == dtype::bfloat16;
}
[[nodiscard]] inline float load_float(const std::byte* p, dtype t) noexcept {
  if (t == dtype::float32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  std::uint16_t bits;
  std::memcpy(&bits, p, 2);
  return t == dtype::float16 ? static_cast<float>(half::from_bits(bits)) : static_cast<float>(bfloat16::from_bits(bits));
}
inline void store_float(std::byte* p, dtype t, float f) noexcept {
  if (t == dtype::float32) {
    std::memcpy(p, &f, 4);
    return;
  }
  const std::uint16_t bits = t == dtype::float16 ? half(f).bits : bfloat16(f).bits;
  std::memcpy(p, &bits, 2);
}
// dst (n elements of `to`) from src (n elements of `from`): the bytes themselves when the dtypes
// match, else converted.
inline void convert(std::byte* dst, dtype to, const std::byte* src, dtype from, std::size_t n) noexcept {
  if (to == from) {
    if (n) std::memcpy(dst, src, n * size_of(to));
    return;
  }
  for (std::size_t i = 0; i < n; ++i) store_float(dst + i * size_of(to), to, load_float(src + i * size_of(from), from));
}

// Calls f(views): host views of every parameter, in order (CUDA parameters through a host copy,
// written back afterwards when `write_back`).
template <model M, class F>
void with_host_parameters(M& m, bool write_back, const char* who, F&& f) {
  using T = model_element_t<M>;
  if constexpr (std::same_as<model_space_t<M>, host>) {
    std::vector<tensor_view<T>> views;
    for (auto&& p : m.parameters()) views.push_back(p.value());
    f(std::span<const tensor_view<T>>(views));
  } else {
    host_values<M> copy(m);
    copy.pull(who);
    f(copy.views());
    if (write_back) copy.push();
  }
}

[[nodiscard]] inline std::vector<std::uint64_t> extents(const shape& s) {
  return {s.dims().begin(), s.dims().end()};
}

}  // namespace detail::safetensors

// Writes the model's parameters (and buffers) to `path` as a safetensors file, atomically. Call it
// on one rank (e.g. rank 0), with the whole model: under FSDP the object summon_full_params()
// returns, which every rank must create.
template <model M>
void save_safetensors(const std::filesystem::path& path, M& m, const safetensors_save_options& o = {}) {
  static_assert(detail::safetensors::check_model<M>());
  namespace st = detail::safetensors;
  using T = model_element_t<M>;
  constexpr dtype mine = dtype_of<T>;
  const dtype to = o.dtype.value_or(mine);
  if (to != mine && !(st::convertible(to) && st::convertible(mine))) {
    throw invalid_argument_error("save_safetensors: cannot write " + std::string(to_string(mine)) + " parameters as " +
                                 std::string(to_string(to)) + " (conversions: between float32, float16 and bfloat16)");
  }
  const auto names = st::names_of(m, o.names, "save_safetensors");
  std::vector<std::vector<std::byte>> values;
  std::vector<safetensors_tensor> tensors;
  st::with_host_parameters(m, false, "save_safetensors", [&](std::span<const tensor_view<T>> views) {
    for (const auto& v : views) {
      auto& bytes = values.emplace_back(v.size() * size_of(to));
      st::convert(bytes.data(), to, reinterpret_cast<const std::byte*>(v.data()), mine, v.size());
      tensors.push_back({.name = names[tensors.size()], .dtype_name = std::string(st::name_of(to)),
                         .shape = st::extents(v.shape()), .data = bytes});
    }
  });
  if constexpr (has_buffers<M>) {
    for (auto&& b : m.buffers()) {
      const tensor_view<float> v(b);
      tensors.push_back({.name = names[tensors.size()], .dtype_name = "F32", .shape = st::extents(v.shape()),
                         .data = std::as_bytes(std::span<const float>(v.data(), v.size()))});
    }
  }
  write_safetensors(path, tensors, o.metadata);
}

// Fills the model's parameters (and buffers) from the safetensors file at `path`. Every tensor is
// checked first: a name missing from the file, a tensor the model does not have, a shape or dtype
// that differs are all listed, by name, in one checkpoint_error, and the model is left unchanged.
template <model M>
void load_safetensors(const std::filesystem::path& path, M& m, const safetensors_load_options& o = {}) {
  static_assert(detail::safetensors::check_model<M>());
  namespace st = detail::safetensors;
  using T = model_element_t<M>;
  constexpr dtype mine = dtype_of<T>;
  const auto names = st::names_of(m, o.names, "load_safetensors");
  const safetensors_file file = read_safetensors(path);

  // Expected: each name with its dtype and shape, parameters then buffers.
  std::vector<std::pair<dtype, shape>> want;
  for (auto&& p : m.parameters()) want.emplace_back(mine, p.value().shape());
  if constexpr (has_buffers<M>) {
    for (auto&& b : m.buffers()) want.emplace_back(dtype::float32, tensor_view<float>(b).shape());
  }
  std::vector<const safetensors_tensor*> found(names.size(), nullptr);
  std::vector<std::string> problems;
  for (std::size_t i = 0; i < names.size(); ++i) {
    const auto [type, shp] = want[i];
    const std::string expected = std::string(st::name_of(type)) + " " + shp.to_string();
    const auto* t = file.find(names[i]);
    if (!t) {
      problems.push_back("missing " + st::json_quoted(names[i]) + " (expected " + expected + ")");
      continue;
    }
    const auto got = safetensors_dtype(t->dtype_name);
    const bool type_ok = got == type || (o.convert && got && st::convertible(*got) && st::convertible(type));
    const bool shape_ok = t->shape == st::extents(shp);
    if (!type_ok || !shape_ok) {
      problems.push_back(st::json_quoted(names[i]) + " is " + t->dtype_name + " " + st::shape_text(t->shape) +
                         " in the file, expected " + expected +
                         (!type_ok && got && st::convertible(*got) && st::convertible(type) ? " (convert = true converts)" : ""));
      continue;
    }
    found[i] = t;
  }
  for (const auto& t : file.tensors()) {
    if (std::ranges::find(names, t.name) == names.end()) {
      problems.push_back("unexpected " + st::json_quoted(t.name) + " (" + t.dtype_name + " " + st::shape_text(t.shape) +
                         ") in the file, not in the model");
    }
  }
  if (!problems.empty()) {
    std::string msg = "safetensors file '" + path.string() + "' does not match the model (" +
                      std::to_string(problems.size()) + (problems.size() == 1 ? " problem): " : " problems): ");
    for (std::size_t i = 0; i < problems.size(); ++i) {
      if (i) msg += "; ";
      msg += problems[i];
    }
    throw checkpoint_error(msg);
  }
  st::with_host_parameters(m, true, "load_safetensors", [&](std::span<const tensor_view<T>> views) {
    for (std::size_t i = 0; i < views.size(); ++i) {
      st::convert(reinterpret_cast<std::byte*>(views[i].data()), mine, found[i]->data.data(),
                  *safetensors_dtype(found[i]->dtype_name), views[i].size());
    }
  });
  if constexpr (has_buffers<M>) {
    std::size_t i = detail::parameter_count(m);
    for (auto&& b : m.buffers()) {
      const tensor_view<float> v(b);
      if (v.size()) std::memcpy(v.data(), found[i]->data.data(), v.size_bytes());
      ++i;
    }
  }
}

}  // namespace partrain::inline v0
