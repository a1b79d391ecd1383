// partrain/core/detail/regular_file.hpp: the one way partrain reads a file a user named (a data
// file, a checkpoint, a metrics file): only a regular file, refused by name before open() when it
// is anything else (a FIFO would block open() forever, /dev/zero never ends, a folder reads as
// EISDIR), and never more bytes than the caller asks for. Each reader names its own error type,
// so a data file still fails with a data_error and a checkpoint with a checkpoint_error.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include <partrain/core/detail/fd.hpp>
#include <partrain/core/error.hpp>

namespace partrain::inline v0::detail {

// What a file of this mode is, in a sentence's words ("a FIFO"); empty for a regular file.
[[nodiscard]] constexpr std::string_view special_file_kind(mode_t mode) noexcept {
  if (S_ISREG(mode)) return {};
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// "'<path>' is a FIFO, expected a regular file": what every reader says of a special file. `what`
// names the file's role ("checkpoint", "IDX file").
[[nodiscard]] inline std::string special_file_message(std::string_view what, const std::filesystem::path& path,
                                                      std::string_view kind) {
  return std::string(what) + " '" + path.string() + "' is " + std::string(kind) + ", expected a regular file";
}

// When `path` exists and is not a regular file (symbolic links followed): the message saying so;
// empty when it is one or does not exist. For paths that are created when missing (a store's file).
[[nodiscard]] inline std::string refuse_special_file(std::string_view what, const std::filesystem::path& path) {
  struct ::stat st {};
  if (::stat(path.c_str(), &st) != 0) return {};
  const auto kind = special_file_kind(st.st_mode);
  return kind.empty() ? std::string() : special_file_message(what, path, kind);
}

// A regular file open for reading, and its size when it was opened.
struct regular_file {
  unique_fd fd;
  std::uint64_t size = 0;
};

// Opens `path` for reading if it is a regular file; else throws Error naming the path and what it
// is. The kind is checked by name before open() (which would block on a FIFO) and again on the
// descriptor (opened non-blocking, so a FIFO swapped in between cannot block it either).
template <class Error>
[[nodiscard]] regular_file open_regular_file(const std::filesystem::path& path, std::string_view what) {
  const auto cannot_open = [&](int err) {
    return Error("cannot open " + std::string(what) + " '" + path.string() + "': " + errno_text(err));
  };
  struct ::stat st {};
  if (::stat(path.c_str(), &st) != 0) throw cannot_open(errno);
  if (const auto kind = special_file_kind(st.st_mode); !kind.empty()) throw Error(special_file_message(what, path, kind));
  regular_file f;
  f.fd.reset(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  if (!f.fd) throw cannot_open(errno);
  if (::fstat(f.fd.get(), &st) != 0) throw cannot_open(errno);
  if (const auto kind = special_file_kind(st.st_mode); !kind.empty()) throw Error(special_file_message(what, path, kind));
  f.size = static_cast<std::uint64_t>(st.st_size);
  return f;
}

// Reads up to `n` bytes from where `f` stands: fewer only where the file ends.
template <class Error>
[[nodiscard]] std::vector<std::byte> read_up_to(const regular_file& f, std::uint64_t n, const std::filesystem::path& path,
                                                std::string_view what) {
  if (n > std::numeric_limits<std::size_t>::max()) n = std::numeric_limits<std::size_t>::max();
  std::vector<std::byte> out;
  out.reserve(static_cast<std::size_t>(std::min<std::uint64_t>(n, f.size)));
  std::byte chunk[1 << 16];
  while (out.size() < n) {
    const auto want = static_cast<std::size_t>(std::min<std::uint64_t>(n - out.size(), sizeof chunk));
    const ::ssize_t got = ::read(f.fd.get(), chunk, want);
    if (got < 0) {
      if (errno == EINTR) continue;
      throw Error("cannot read " + std::string(what) + " '" + path.string() + "': " + errno_text(errno));
    }
    if (got == 0) break;
    out.insert(out.end(), chunk, chunk + got);
  }
  return out;
}

// The whole of a regular file, refused unread when it holds more than max_bytes.
template <class Error>
[[nodiscard]] std::vector<std::byte> read_regular_file(const std::filesystem::path& path, std::string_view what,
                                                       std::uint64_t max_bytes = std::numeric_limits<std::uint64_t>::max()) {
  const regular_file f = open_regular_file<Error>(path, what);
  if (f.size > max_bytes) {
    throw Error(std::string(what) + " '" + path.string() + "' is " + std::to_string(f.size) + " bytes, more than the limit of " +
                std::to_string(max_bytes));
  }
  // The size seen at open bounds the read: a file that grows meanwhile (or never ends) is not followed.
  return read_up_to<Error>(f, f.size, path, what);
}

}  // namespace partrain::inline v0::detail
