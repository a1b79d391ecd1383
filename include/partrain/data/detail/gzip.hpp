// partrain/data/detail/gzip.hpp: whole-buffer gzip inflate and deflate over zlib. Needs zlib at
// link time (the partrain::data CMake target brings ZLIB::ZLIB). Without zlib's header, plain IDX
// files still read and a gzip file gets a data_error saying that gzip support is missing.
#pragma once

#include <algorithm>
#include <bit>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <partrain/core/error.hpp>

#if __has_include(<zlib.h>)
#include <zlib.h>
#define PARTRAIN_HAS_ZLIB 1
#else
#define PARTRAIN_HAS_ZLIB 0
#endif

namespace partrain::inline v0::detail::data {

[[nodiscard]] inline bool is_gzip(std::span<const std::byte> bytes) noexcept {
  return bytes.size() >= 2 && bytes[0] == std::byte{0x1f} && bytes[1] == std::byte{0x8b};
}

#if PARTRAIN_HAS_ZLIB

// RAII for a z_stream set up for inflate or deflate.
class zstream {
 public:
  enum class mode { inflate, deflate };
  zstream(mode m, std::string_view name) : mode_(m) {
    // 16 + MAX_WBITS: gzip framing (header and CRC trailer), not raw zlib.
    const int rc = m == mode::inflate ? inflateInit2(&zs_, 16 + MAX_WBITS)
                                      : deflateInit2(&zs_, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 16 + MAX_WBITS, 8,
                                                     Z_DEFAULT_STRATEGY);
    if (rc != Z_OK) throw data_error(std::string(name) + ": zlib could not start (code " + std::to_string(rc) + ")");
  }
  zstream(const zstream&) = delete;
  zstream& operator=(const zstream&) = delete;
  ~zstream() {
    if (mode_ == mode::inflate) inflateEnd(&zs_);
    else deflateEnd(&zs_);
  }
  z_stream* get() noexcept { return &zs_; }

 private:
  z_stream zs_{};
  mode mode_;
};

// Inflates every gzip member of `in` (concatenated members are one stream, as gzip -d reads them).
// Refuses to produce more than max_bytes, so a small hostile file cannot exhaust memory. `watch`,
// when set, sees the output so far after every inflate step and may throw to stop early (a format
// whose header declares its size stops at that size).
[[nodiscard]] inline std::vector<std::byte> gunzip(std::span<const std::byte> in, std::size_t max_bytes,
                                                   std::string_view name,
                                                   const std::function<void(std::span<const std::byte>)>& watch = {}) {
  std::vector<std::byte> out;
  // The trailer's ISIZE (size mod 2^32 of the last member) is a good first guess, but only a
  // guess: a hostile or truncated file can say anything, so it is capped by deflate's best
  // ratio (about 1032:1) and by max_bytes.
  if (in.size() >= 18) {
    std::uint32_t isize = 0;
    std::memcpy(&isize, in.data() + in.size() - 4, 4);  // little-endian in the file
    if constexpr (std::endian::native == std::endian::big) isize = __builtin_bswap32(isize);
    out.reserve(std::min({std::size_t{isize}, max_bytes, in.size() * 1032}));
  }
  std::size_t pos = 0;
  while (pos < in.size()) {
    zstream zs(zstream::mode::inflate, name);
    z_stream* s = zs.get();
    int rc = Z_OK;
    while (rc != Z_STREAM_END) {
      if (s->avail_in == 0) {
        if (pos >= in.size()) {
          throw data_error(std::string(name) + ": truncated gzip stream (ends before the compressed data does)");
        }
        const std::size_t chunk = std::min<std::size_t>(in.size() - pos, 1u << 30);
        // zlib takes non-const input but does not write to it.
        s->next_in = reinterpret_cast<Bytef*>(const_cast<std::byte*>(in.data() + pos));
        s->avail_in = static_cast<uInt>(chunk);
        pos += chunk;
      }
      if (out.size() == out.capacity()) {
        if (out.size() >= max_bytes) {
          throw data_error(std::string(name) + ": decompresses to more than " + std::to_string(max_bytes) +
                           " bytes, the limit for one file");
        }
        out.reserve(std::min(max_bytes, std::max<std::size_t>(out.size() * 2, 1u << 16)));
      }
      const std::size_t old_size = out.size();
      // Bounded steps, so resize's zero fill never runs far ahead of what inflate writes.
      const std::size_t room = std::min<std::size_t>(out.capacity() - old_size, 1u << 20);
      out.resize(old_size + room);
      s->next_out = reinterpret_cast<Bytef*>(out.data() + old_size);
      s->avail_out = static_cast<uInt>(room);
      rc = inflate(s, Z_NO_FLUSH);
      out.resize(old_size + room - s->avail_out);
      if (rc == Z_NEED_DICT || rc == Z_DATA_ERROR || rc == Z_MEM_ERROR || rc == Z_STREAM_ERROR) {
        throw data_error(std::string(name) + ": corrupt gzip data (" + (s->msg ? s->msg : "zlib error") + ")");
      }
      if (rc == Z_BUF_ERROR && s->avail_in != 0 && s->avail_out != 0) {
        throw data_error(std::string(name) + ": corrupt gzip data (no progress)");
      }
      if (watch) watch(out);
    }
    // Rewind to the first byte after this member; a following member starts there.
    pos -= s->avail_in;
    // Padding zeros after the last member are tolerated, as gzip does.
    if (std::all_of(in.begin() + static_cast<std::ptrdiff_t>(pos), in.end(), [](std::byte b) { return b == std::byte{0}; })) break;
  }
  return out;
}

[[nodiscard]] inline std::vector<std::byte> gzip(std::span<const std::byte> in, std::string_view name) {
  if (in.size() > UINT_MAX) throw data_error(std::string(name) + ": more than 4 GiB to compress in one call");
  zstream zs(zstream::mode::deflate, name);
  z_stream* s = zs.get();
  std::vector<std::byte> out(deflateBound(s, static_cast<uLong>(in.size())) + 64);
  s->next_in = reinterpret_cast<Bytef*>(const_cast<std::byte*>(in.data()));
  s->avail_in = static_cast<uInt>(in.size());
  s->next_out = reinterpret_cast<Bytef*>(out.data());
  s->avail_out = static_cast<uInt>(out.size());
  if (deflate(s, Z_FINISH) != Z_STREAM_END) throw data_error(std::string(name) + ": gzip compression failed");
  out.resize(out.size() - s->avail_out);
  return out;
}

#else

[[nodiscard]] inline std::vector<std::byte> gunzip(std::span<const std::byte>, std::size_t, std::string_view name,
                                                   const std::function<void(std::span<const std::byte>)>& = {}) {
  throw data_error(std::string(name) + ": is gzip-compressed, and partrain was built without zlib (install zlib, "
                   "link partrain::data)");
}
[[nodiscard]] inline std::vector<std::byte> gzip(std::span<const std::byte>, std::string_view name) {
  throw data_error(std::string(name) + ": gzip output needs zlib (install zlib, link partrain::data)");
}

#endif  // PARTRAIN_HAS_ZLIB

}  // namespace partrain::inline v0::detail::data
