// partrain/optim/state_io.hpp: the byte streams an optimizer writes its state to and reads it
// from (what checkpoints store). Little-endian hosts only, as every supported platform is.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <partrain/core/error.hpp>

namespace partrain::inline v0 {

// Appends plain values, strings and arrays to a growing byte vector.
class state_writer {
 public:
  template <class T>
    requires std::is_trivially_copyable_v<T>
  void put(const T& v) {
    append(&v, sizeof(T));
  }
  void put_bytes(std::span<const std::byte> b) {
    put(static_cast<std::uint64_t>(b.size()));
    append(b.data(), b.size());
  }
  void put_string(std::string_view s) { put_bytes(std::as_bytes(std::span(s.data(), s.size()))); }
  // An array whose element count the reader checks against what it expects.
  template <class T>
    requires std::is_trivially_copyable_v<T>
  void put_array(std::span<const T> a) {
    put_bytes(std::as_bytes(a));
  }
  [[nodiscard]] const std::vector<std::byte>& bytes() const noexcept { return bytes_; }
  [[nodiscard]] std::vector<std::byte> release() noexcept { return std::move(bytes_); }

 private:
  // resize + memcpy, not vector::insert: GCC 12 at -O3 (nvcc's host pass) warns, wrongly, that
  // insert's memmove may get the empty vector's null pointer.
  void append(const void* p, std::size_t n) {
    if (n == 0) return;
    const std::size_t at = bytes_.size();
    bytes_.resize(at + n);
    std::memcpy(bytes_.data() + at, p, n);
  }
  std::vector<std::byte> bytes_;
};

// Reads what a state_writer wrote; running past the end or a size that disagrees with what the
// caller expects is a checkpoint_error naming `what` (and `source`, the file, when given).
class state_reader {
 public:
  explicit state_reader(std::span<const std::byte> b, std::string source = {}) noexcept
      : bytes_(b), source_(std::move(source)) {}

  template <class T>
    requires std::is_trivially_copyable_v<T>
  [[nodiscard]] T get(std::string_view what) {
    T v;
    std::memcpy(&v, take(sizeof(T), what).data(), sizeof(T));
    return v;
  }
  [[nodiscard]] std::span<const std::byte> get_bytes(std::string_view what) {
    const auto n = get<std::uint64_t>(what);
    return take(n, what);
  }
  [[nodiscard]] std::string get_string(std::string_view what) {
    const auto b = get_bytes(what);
    return {reinterpret_cast<const char*>(b.data()), b.size()};
  }
  // Fills `out` exactly; a stored array of another length is refused.
  template <class T>
    requires std::is_trivially_copyable_v<T>
  void get_array(std::span<T> out, std::string_view what) {
    const auto b = get_bytes(what);
    if (b.size() != out.size_bytes()) {
      throw checkpoint_error(where() + std::string(what) + ": stored array has " + std::to_string(b.size() / sizeof(T)) +
                             " elements, expected " + std::to_string(out.size()));
    }
    if (!b.empty()) std::memcpy(static_cast<void*>(out.data()), b.data(), b.size());
  }
  [[nodiscard]] std::size_t remaining() const noexcept { return bytes_.size() - pos_; }

 private:
  std::span<const std::byte> take(std::size_t n, std::string_view what) {
    if (n > remaining()) {
      throw checkpoint_error(where() + std::string(what) + ": needs " + std::to_string(n) + " more bytes but only " +
                             std::to_string(remaining()) + " remain (truncated or malformed state)");
    }
    auto s = bytes_.subspan(pos_, n);
    pos_ += n;
    return s;
  }

  [[nodiscard]] std::string where() const { return source_.empty() ? std::string() : source_ + ": "; }

  std::span<const std::byte> bytes_;
  std::string source_;
  std::size_t pos_ = 0;
};

}  // namespace partrain::inline v0
