// partrain/train/detail/framed_file.hpp: the frame of partrain's binary files (checkpoints, their
// shards and indexes): an 8-byte magic, a format version, the payload's CRC-32 and size, then the
// payload. Reading checks all four before a byte of the payload is trusted, naming the file in
// every refusal; a file is read only when it is a regular file, and past its header only when the
// header is partrain's.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <partrain/core/detail/regular_file.hpp>
#include <partrain/core/error.hpp>
#include <partrain/train/detail/crc32.hpp>

namespace partrain::inline v0::detail::ckpt {

inline constexpr std::size_t frame_header_bytes = 8 + 4 + 4 + 8;

[[nodiscard]] inline std::vector<std::byte> frame(const std::array<char, 8>& magic, std::uint32_t version,
                                                  std::span<const std::byte> payload) {
  const std::uint32_t crc = crc32(payload);
  const std::uint64_t size = payload.size();
  std::vector<std::byte> out(frame_header_bytes + payload.size());
  std::memcpy(out.data(), magic.data(), 8);
  std::memcpy(out.data() + 8, &version, 4);
  std::memcpy(out.data() + 12, &crc, 4);
  std::memcpy(out.data() + 16, &size, 8);
  if (!payload.empty()) std::memcpy(out.data() + frame_header_bytes, payload.data(), payload.size());
  return out;
}

// Every partrain frame's magic starts so ("PTRNCKPT", "PTRNZIDX", ...).
inline constexpr std::array<char, 4> frame_magic_prefix{'P', 'T', 'R', 'N'};

// The bytes of the framed file at `path` (`what` names its role: "checkpoint", "rank checkpoint"),
// for unframe or load_checkpoint_bytes to check. A FIFO, a device or a folder is refused by name
// before it is opened; a file whose header is not partrain's is read no further than the header
// (the caller's check then says so), and a partrain file no further than its header declares, so
// a large file given by mistake is never loaded whole.
[[nodiscard]] inline std::vector<std::byte> read_framed_file(const std::filesystem::path& path, std::string_view what) {
  const regular_file f = open_regular_file<checkpoint_error>(path, what);
  auto out = read_up_to<checkpoint_error>(f, frame_header_bytes, path, what);
  if (out.size() < frame_header_bytes || f.size < frame_header_bytes ||
      std::memcmp(out.data(), frame_magic_prefix.data(), frame_magic_prefix.size()) != 0) {
    return out;
  }
  // The payload: no more than the header declares (fewer bytes than that are the parser's to
  // report as truncated; more are refused here, unread).
  std::uint64_t declared = 0;
  std::memcpy(&declared, out.data() + 16, 8);
  const std::uint64_t have = f.size - frame_header_bytes;
  if (have > declared) {
    throw checkpoint_error(std::string(what) + " '" + path.string() + "' has trailing bytes: the header says " +
                           std::to_string(declared) + " payload bytes, the file has " + std::to_string(have));
  }
  const auto rest = read_up_to<checkpoint_error>(f, have, path, what);
  out.insert(out.end(), rest.begin(), rest.end());
  return out;
}

// The versions a reader accepts (a newer format keeps reading the files of the older ones).
struct frame_versions {
  std::uint32_t oldest = 0;
  std::uint32_t newest = 0;
};

// The payload of a framed file whose version is in `accepted` (the version found in
// *version_out); `what` names it ("sharded checkpoint index 'run/m.ckpt'").
[[nodiscard]] inline std::span<const std::byte> unframe(std::span<const std::byte> file, const std::array<char, 8>& magic,
                                                        frame_versions accepted, std::string_view what,
                                                        std::uint32_t* crc_out = nullptr,
                                                        std::uint32_t* version_out = nullptr) {
  const std::string w(what);
  if (file.size() < frame_header_bytes) {
    throw checkpoint_error(w + " is truncated: " + std::to_string(file.size()) + " bytes, less than the " +
                           std::to_string(frame_header_bytes) + "-byte header");
  }
  if (std::memcmp(file.data(), magic.data(), 8) != 0) {
    throw checkpoint_error(w + " has the wrong magic (expected \"" + std::string(magic.data(), 8) + "\")");
  }
  std::uint32_t v = 0, crc = 0;
  std::uint64_t size = 0;
  std::memcpy(&v, file.data() + 8, 4);
  std::memcpy(&crc, file.data() + 12, 4);
  std::memcpy(&size, file.data() + 16, 8);
  if (v < accepted.oldest || v > accepted.newest) {
    throw checkpoint_error(w + " has format version " + std::to_string(v) + ", this build reads version" +
                           (accepted.oldest == accepted.newest
                                ? " " + std::to_string(accepted.newest)
                                : "s " + std::to_string(accepted.oldest) + " to " + std::to_string(accepted.newest)));
  }
  if (version_out) *version_out = v;
  const std::size_t have = file.size() - frame_header_bytes;
  if (size != have) {
    throw checkpoint_error(w + (have < size ? " is truncated" : " has trailing bytes") + ": the header says " +
                           std::to_string(size) + " payload bytes, the file has " + std::to_string(have));
  }
  const auto payload = file.subspan(frame_header_bytes);
  if (const auto got = crc32(payload); got != crc) {
    throw checkpoint_error(w + " is corrupted: the payload's CRC-32 is " + std::to_string(got) + ", the header says " +
                           std::to_string(crc));
  }
  if (crc_out) *crc_out = crc;
  return payload;
}

// The payload of a framed file of exactly `version`.
[[nodiscard]] inline std::span<const std::byte> unframe(std::span<const std::byte> file, const std::array<char, 8>& magic,
                                                        std::uint32_t version, std::string_view what,
                                                        std::uint32_t* crc_out = nullptr) {
  return unframe(file, magic, frame_versions{version, version}, what, crc_out);
}

}  // namespace partrain::inline v0::detail::ckpt
