// partrain/train/detail/atomic_file.hpp: whole-file writes that a crash cannot leave half done
// (temporary file in the same folder, fsync, rename over the target, fsync the folder), and
// whole-file reads. POSIX.
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <partrain/core/error.hpp>

namespace partrain::inline v0::detail {

[[nodiscard]] inline std::string errno_text() { return std::strerror(errno); }

inline void write_file_atomically(const std::filesystem::path& path, std::span<const std::byte> bytes) {
  std::filesystem::path tmp = path;
  tmp += ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw checkpoint_error("cannot create '" + tmp.string() + "': " + errno_text());
  auto fail = [&](const std::string& what) {
    const std::string why = errno_text();
    ::close(fd);
    ::unlink(tmp.c_str());
    throw checkpoint_error(what + " '" + tmp.string() + "': " + why);
  };
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ::ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("cannot write");
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) fail("cannot fsync");
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    throw checkpoint_error("cannot close '" + tmp.string() + "': " + errno_text());
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = errno_text();
    ::unlink(tmp.c_str());
    throw checkpoint_error("cannot rename '" + tmp.string() + "' to '" + path.string() + "': " + why);
  }
  // The rename itself is durable only once the folder is synced.
  const auto dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

[[nodiscard]] inline std::vector<std::byte> read_whole_file(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw checkpoint_error("cannot open checkpoint '" + path.string() + "': " + errno_text());
  std::vector<std::byte> out;
  struct ::stat st {};
  if (::fstat(fd, &st) == 0 && st.st_size > 0) out.reserve(static_cast<std::size_t>(st.st_size));
  std::byte chunk[1 << 16];
  for (;;) {
    const ::ssize_t n = ::read(fd, chunk, sizeof chunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      const std::string why = errno_text();
      ::close(fd);
      throw checkpoint_error("cannot read checkpoint '" + path.string() + "': " + why);
    }
    if (n == 0) break;
    out.insert(out.end(), chunk, chunk + n);
  }
  ::close(fd);
  return out;
}

}  // namespace partrain::inline v0::detail
