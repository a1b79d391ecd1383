// partrain/data/idx.hpp: the IDX format of MNIST and Fashion-MNIST (http://yann.lecun.com/exdb/mnist/):
//   bytes 0-1  zero; byte 2  element type (0x08 ubyte, 0x09 sbyte, 0x0B int16, 0x0C int32,
//   0x0D float32, 0x0E float64); byte 3  number of dimensions; then one big-endian uint32 per
//   dimension; then the elements, big-endian, row-major.
// read_idx reads plain or gzip-compressed files (detected by the gzip magic, so either name
// works) and checks everything before trusting it: a hostile file gets a data_error naming the
// file and the problem, never a crash or an allocation larger than the data present; a FIFO or a
// device is refused by name, and no file is read (or inflated) past what its header declares.
// Needs zlib: link partrain::data (or ZLIB::ZLIB).
#pragma once

#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <vector>

#include <partrain/core/detail/regular_file.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/data/detail/gzip.hpp>

namespace partrain::inline v0 {

enum class idx_type : std::uint8_t { u8 = 0x08, i8 = 0x09, i16 = 0x0B, i32 = 0x0C, f32 = 0x0D, f64 = 0x0E };

[[nodiscard]] constexpr std::size_t size_of(idx_type t) noexcept {
  switch (t) {
    case idx_type::u8: case idx_type::i8: return 1;
    case idx_type::i16: return 2;
    case idx_type::i32: case idx_type::f32: return 4;
    case idx_type::f64: return 8;
  }
  return 0;
}
[[nodiscard]] constexpr std::string_view to_string(idx_type t) noexcept {
  switch (t) {
    case idx_type::u8: return "ubyte";
    case idx_type::i8: return "sbyte";
    case idx_type::i16: return "int16";
    case idx_type::i32: return "int32";
    case idx_type::f32: return "float32";
    case idx_type::f64: return "float64";
  }
  return "unknown";
}

template <class T>
inline constexpr bool is_idx_element_v = std::is_same_v<T, std::uint8_t> || std::is_same_v<T, std::int8_t> ||
                                         std::is_same_v<T, std::int16_t> || std::is_same_v<T, std::int32_t> ||
                                         std::is_same_v<T, float> || std::is_same_v<T, double>;

template <class T>
  requires is_idx_element_v<T>
inline constexpr idx_type idx_type_of = std::is_same_v<T, std::uint8_t>  ? idx_type::u8
                                        : std::is_same_v<T, std::int8_t> ? idx_type::i8
                                        : std::is_same_v<T, std::int16_t> ? idx_type::i16
                                        : std::is_same_v<T, std::int32_t> ? idx_type::i32
                                        : std::is_same_v<T, float>        ? idx_type::f32
                                                                          : idx_type::f64;

namespace detail::data {
template <class T>
[[nodiscard]] inline T load_be(const std::byte* p) noexcept {
  using U = std::conditional_t<sizeof(T) == 1, std::uint8_t,
                               std::conditional_t<sizeof(T) == 2, std::uint16_t,
                                                  std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>>>;
  U u;
  std::memcpy(&u, p, sizeof(U));
  if constexpr (std::endian::native == std::endian::little && sizeof(U) > 1) {
    if constexpr (sizeof(U) == 2) u = __builtin_bswap16(u);
    else if constexpr (sizeof(U) == 4) u = __builtin_bswap32(u);
    else u = __builtin_bswap64(u);
  }
  return std::bit_cast<T>(u);
}
template <class T>
inline void store_be(std::byte* p, T value) noexcept {
  auto u = std::bit_cast<std::conditional_t<
      sizeof(T) == 1, std::uint8_t,
      std::conditional_t<sizeof(T) == 2, std::uint16_t, std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>>>>(
      value);
  if constexpr (std::endian::native == std::endian::little && sizeof(T) > 1) {
    if constexpr (sizeof(T) == 2) u = __builtin_bswap16(u);
    else if constexpr (sizeof(T) == 4) u = __builtin_bswap32(u);
    else u = __builtin_bswap64(u);
  }
  std::memcpy(p, &u, sizeof(u));
}
}  // namespace detail::data

// One IDX array: its element type, dimensions and elements (kept big-endian as in the file).
class idx_array {
 public:
  idx_array() = default;

  // From native values, e.g. to write a file.
  template <class T>
    requires is_idx_element_v<T>
  [[nodiscard]] static idx_array from(std::span<const T> values, partrain::shape dims) {
    if (dims.numel() != values.size()) {
      throw invalid_argument_error("idx_array::from: shape " + dims.to_string() + " has " +
                                   std::to_string(dims.numel()) + " elements, given " + std::to_string(values.size()));
    }
    idx_array a;
    a.type_ = idx_type_of<T>;
    a.shape_ = dims;
    a.storage_.resize(values.size() * sizeof(T));
    for (std::size_t i = 0; i < values.size(); ++i) detail::data::store_be(a.storage_.data() + i * sizeof(T), values[i]);
    return a;
  }

  [[nodiscard]] idx_type type() const noexcept { return type_; }
  [[nodiscard]] const partrain::shape& shape() const noexcept { return shape_; }
  [[nodiscard]] std::size_t size() const noexcept { return shape_.numel(); }
  // The elements as stored in the file (big-endian).
  [[nodiscard]] std::span<const std::byte> payload() const noexcept {
    return {storage_.data() + offset_, storage_.size() - offset_};
  }

  // Element i converted to double (exact for every IDX type).
  [[nodiscard]] double at(std::size_t i) const noexcept {
    const std::byte* p = payload().data() + i * size_of(type_);
    switch (type_) {
      case idx_type::u8: return static_cast<double>(detail::data::load_be<std::uint8_t>(p));
      case idx_type::i8: return static_cast<double>(detail::data::load_be<std::int8_t>(p));
      case idx_type::i16: return static_cast<double>(detail::data::load_be<std::int16_t>(p));
      case idx_type::i32: return static_cast<double>(detail::data::load_be<std::int32_t>(p));
      case idx_type::f32: return static_cast<double>(detail::data::load_be<float>(p));
      case idx_type::f64: return detail::data::load_be<double>(p);
    }
    return 0;
  }

  // All elements as float into out (out.size() == size()), each multiplied by `scale`.
  void to_float(std::span<float> out, float scale = 1.0f) const {
    if (out.size() != size()) {
      throw invalid_argument_error("idx_array::to_float: output has " + std::to_string(out.size()) +
                                   " elements, expected " + std::to_string(size()));
    }
    float* dst = out.data();
    const std::size_t n = out.size();
    if (type_ == idx_type::u8) {
      // The common case (images): raw pointers, so it vectorises and stays quick in debug builds.
      const auto* src = reinterpret_cast<const std::uint8_t*>(payload().data());
      for (std::size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]) * scale;
    } else {
      for (std::size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(at(i)) * scale;
    }
  }

  // The file image: header then elements.
  [[nodiscard]] std::vector<std::byte> serialize() const {
    std::vector<std::byte> out(4 + 4 * shape_.rank());
    out[2] = static_cast<std::byte>(type_);
    out[3] = static_cast<std::byte>(shape_.rank());
    for (std::size_t d = 0; d < shape_.rank(); ++d) {
      detail::data::store_be(out.data() + 4 + 4 * d, static_cast<std::uint32_t>(shape_[d]));
    }
    const auto data = payload();
    out.insert(out.end(), data.begin(), data.end());
    return out;
  }

 private:
  friend idx_array parse_idx(std::vector<std::byte>&& bytes, std::string_view name);
  idx_type type_ = idx_type::u8;
  partrain::shape shape_{};
  std::vector<std::byte> storage_;
  std::size_t offset_ = 0;  // header bytes at the front of storage_ (kept to avoid a copy)
};

namespace detail::data {
// What an IDX header declares: the element type, the dimensions, and the bytes of header and of
// data that a well-formed file holds.
struct idx_header {
  idx_type type = idx_type::u8;
  partrain::shape dims{};
  std::size_t header_bytes = 0;
  std::size_t data_bytes = 0;
};

[[nodiscard]] inline data_error idx_error(std::string_view name, const std::string& what) {
  return data_error("IDX file '" + std::string(name) + "': " + what);
}

// The most header bytes an IDX file can have (4 + 4 per dimension).
inline constexpr std::size_t idx_max_header_bytes = 4 + 4 * max_rank;

// Parses the header at the front of `bytes` (the whole file, or at least its first
// idx_max_header_bytes; `file_bytes` is the whole file's size, for messages), checking everything.
[[nodiscard]] inline idx_header parse_idx_header(std::span<const std::byte> bytes, std::size_t file_bytes,
                                                 std::string_view name) {
  if (bytes.size() < 4) {
    throw idx_error(name, "truncated: " + std::to_string(file_bytes) + " bytes, expected at least a 4-byte header");
  }
  if (bytes[0] != std::byte{0} || bytes[1] != std::byte{0}) {
    char hex[16];
    std::snprintf(hex, sizeof hex, "0x%02x%02x%02x%02x", static_cast<unsigned>(bytes[0]), static_cast<unsigned>(bytes[1]),
                  static_cast<unsigned>(bytes[2]), static_cast<unsigned>(bytes[3]));
    throw idx_error(name, std::string("wrong magic ") + hex + ", expected two zero bytes, a type code and a dimension count");
  }
  const auto code = static_cast<unsigned>(bytes[2]);
  if (code != 0x08 && code != 0x09 && code != 0x0B && code != 0x0C && code != 0x0D && code != 0x0E) {
    throw idx_error(name, "unsupported element type code " + std::to_string(code) +
                              ", expected 0x08 (ubyte), 0x09 (sbyte), 0x0B (int16), 0x0C (int32), 0x0D (float32) or "
                              "0x0E (float64)");
  }
  idx_header h;
  h.type = static_cast<idx_type>(code);
  const std::size_t rank = static_cast<std::size_t>(bytes[3]);
  if (rank == 0 || rank > max_rank) {
    throw idx_error(name, std::to_string(rank) + " dimensions, expected 1 to " + std::to_string(max_rank));
  }
  h.header_bytes = 4 + 4 * rank;
  if (bytes.size() < h.header_bytes) {
    throw idx_error(name, "truncated header: " + std::to_string(rank) + " dimensions need " +
                              std::to_string(h.header_bytes) + " bytes, the file has " + std::to_string(file_bytes));
  }
  std::vector<std::size_t> d(rank);
  std::size_t numel = 1;
  bool overflow = false;
  for (std::size_t i = 0; i < rank; ++i) {
    d[i] = load_be<std::uint32_t>(bytes.data() + 4 + 4 * i);
    if (d[i] != 0 && numel > std::numeric_limits<std::size_t>::max() / size_of(h.type) / d[i]) overflow = true;
    else numel *= d[i];
  }
  h.dims = partrain::shape(std::span<const std::size_t>(d));
  if (overflow) throw idx_error(name, "dimensions " + h.dims.to_string() + " describe more data than can be addressed");
  h.data_bytes = numel * size_of(h.type);
  return h;
}

// The data after the header must be exactly what the header declares.
inline void check_idx_data_size(const idx_header& h, std::size_t present, std::string_view name) {
  if (present < h.data_bytes) {
    throw idx_error(name, "truncated: " + h.dims.to_string() + " " + std::string(to_string(h.type)) + " needs " +
                              std::to_string(h.data_bytes) + " bytes of data, the file has " + std::to_string(present));
  }
  if (present > h.data_bytes) {
    throw idx_error(name, std::to_string(present - h.data_bytes) + " unexpected bytes after the " +
                              std::to_string(h.data_bytes) + " bytes of data for " + h.dims.to_string());
  }
}
}  // namespace detail::data

// Parses a whole IDX image (already decompressed). `name` (a path) appears in every error.
[[nodiscard]] inline idx_array parse_idx(std::vector<std::byte>&& bytes, std::string_view name) {
  const auto h = detail::data::parse_idx_header(bytes, bytes.size(), name);
  detail::data::check_idx_data_size(h, bytes.size() - h.header_bytes, name);
  idx_array a;
  a.type_ = h.type;
  a.shape_ = h.dims;
  a.storage_ = std::move(bytes);
  a.offset_ = h.header_bytes;
  return a;
}

[[nodiscard]] inline idx_array parse_idx(std::span<const std::byte> bytes, std::string_view name) {
  return parse_idx(std::vector<std::byte>(bytes.begin(), bytes.end()), name);
}

struct idx_read_options {
  // Largest decompressed size accepted (guards against gzip bombs).
  std::size_t max_bytes = std::size_t{4} << 30;
};

namespace detail::data {
struct file_closer {
  void operator()(std::FILE* f) const noexcept { std::fclose(f); }
};

// Inflates a gzip IDX image, stopping as soon as its header is bad or the output runs past what
// the header declares: a gzip file is never inflated beyond the data it says it holds.
[[nodiscard]] inline std::vector<std::byte> gunzip_idx(std::span<const std::byte> gz, std::size_t max_bytes,
                                                       std::string_view name) {
  std::optional<idx_header> h;
  return gunzip(gz, max_bytes, name, [&](std::span<const std::byte> out) {
    if (!h) {
      if (out.size() < 4 || out.size() < std::min(idx_max_header_bytes, 4 + 4 * std::to_integer<std::size_t>(out[3]))) {
        return;  // the header is not all out yet
      }
      h = parse_idx_header(out, out.size(), name);
    }
    if (out.size() > h->header_bytes + h->data_bytes) {
      throw idx_error(name, "the gzip data decompresses past the " + std::to_string(h->data_bytes) +
                                " bytes of data its header declares for " + h->dims.to_string());
    }
  });
}
}  // namespace detail::data

// Decodes an IDX image from memory, inflating it first if it is gzip data.
[[nodiscard]] inline idx_array decode_idx(std::span<const std::byte> bytes, std::string_view name,
                                          const idx_read_options& options = {}) {
  if (detail::data::is_gzip(bytes)) return parse_idx(detail::data::gunzip_idx(bytes, options.max_bytes, name), name);
  return parse_idx(bytes, name);
}

// Reads a plain or gzip-compressed IDX file: a regular file only (a FIFO or a device is refused by
// name before it is opened), and no more of it than its header declares.
[[nodiscard]] inline idx_array read_idx(const std::filesystem::path& path, const idx_read_options& options = {}) {
  constexpr std::string_view what = "IDX file";
  const std::string name = path.string();
  const auto f = detail::open_regular_file<data_error>(path, what);
  if (f.size > options.max_bytes) {
    throw data_error("IDX file '" + name + "' is " + std::to_string(f.size) + " bytes, more than " +
                     std::to_string(options.max_bytes) + " bytes, the limit");
  }
  auto bytes = detail::read_up_to<data_error>(f, std::min<std::uint64_t>(f.size, detail::data::idx_max_header_bytes), path, what);
  if (detail::data::is_gzip(bytes)) {
    const auto rest = detail::read_up_to<data_error>(f, f.size - bytes.size(), path, what);
    bytes.insert(bytes.end(), rest.begin(), rest.end());
    return parse_idx(detail::data::gunzip_idx(bytes, options.max_bytes, name), name);
  }
  // A plain file: its size is checked against the header before the data is read.
  const auto h = detail::data::parse_idx_header(bytes, static_cast<std::size_t>(f.size), name);
  detail::data::check_idx_data_size(h, static_cast<std::size_t>(f.size) - h.header_bytes, name);
  const auto rest = detail::read_up_to<data_error>(f, h.header_bytes + h.data_bytes - bytes.size(), path, what);
  bytes.insert(bytes.end(), rest.begin(), rest.end());
  return parse_idx(std::move(bytes), name);
}

// Writes an IDX file atomically (a temporary beside it, then rename), gzip-compressed if asked.
inline void write_idx(const std::filesystem::path& path, const idx_array& array, bool compress = false) {
  auto bytes = array.serialize();
  if (compress) bytes = detail::data::gzip(bytes, path.string());
  auto tmp = path;
  tmp += ".tmp";
  {
    std::unique_ptr<std::FILE, detail::data::file_closer> f(std::fopen(tmp.c_str(), "wb"));
    if (!f) {
      const int e = errno;
      throw data_error("cannot create '" + tmp.string() + "': " + std::generic_category().message(e));
    }
    if (std::fwrite(bytes.data(), 1, bytes.size(), f.get()) != bytes.size() || std::fflush(f.get()) != 0) {
      const int e = errno;
      f.reset();
      std::error_code ignored;
      std::filesystem::remove(tmp, ignored);
      throw data_error("cannot write '" + tmp.string() + "': " + std::generic_category().message(e));
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    throw data_error("cannot rename '" + tmp.string() + "' to '" + path.string() + "': " + ec.message());
  }
}

}  // namespace partrain::inline v0
