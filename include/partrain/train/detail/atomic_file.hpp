// partrain/train/detail/atomic_file.hpp: whole-file writes that a crash cannot leave half done
// (temporary file in the same folder, fsync, rename over the target, fsync the folder). POSIX. A
// save also removes the temporaries that killed savers left behind. (Reads: detail/framed_file.hpp
// for checkpoints, core/detail/regular_file.hpp for any file.)
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <partrain/core/error.hpp>

namespace partrain::inline v0::detail::ckpt {

[[nodiscard]] inline std::string errno_text() { return std::strerror(errno); }

[[nodiscard]] inline std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

// Removes `<path>.tmp.<host>.<pid>` files (and the older `<path>.tmp.<pid>`) that a process of
// this host left when it was killed mid-save: their pid no longer exists. Temporaries of other
// hosts (a shared folder) and of live processes are left alone; failures are ignored, since
// this is tidying, not the save.
inline void remove_stale_temporaries(const std::filesystem::path& path, const std::string& host) {
  namespace fs = std::filesystem;
  const auto dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  const std::string prefix = path.filename().string() + ".tmp.";
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.starts_with(prefix)) continue;
    const std::string rest = name.substr(prefix.size());  // "<host>.<pid>" or "<pid>"
    const auto dot = rest.rfind('.');
    const std::string pid_text = dot == std::string::npos ? rest : rest.substr(dot + 1);
    if (dot != std::string::npos && rest.substr(0, dot) != host) continue;
    if (pid_text.empty() || pid_text.size() > 9 || pid_text.find_first_not_of("0123456789") != std::string::npos) continue;
    const auto pid = static_cast<::pid_t>(std::stol(pid_text));
    if (pid <= 0 || pid == ::getpid()) continue;
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive (or not ours to probe)
    std::error_code ignored;
    fs::remove(it->path(), ignored);
  }
}

// Creates `dir` when missing and checks that this process may write there, so a bad output path
// fails before training rather than after it. `what` says what would be written, e.g.
// "fit: cannot write checkpoints".
inline void ensure_writable_folder(const std::filesystem::path& dir, const std::string& what) {
  const auto d = dir.empty() ? std::filesystem::path(".") : dir;
  std::error_code ec;
  std::filesystem::create_directories(d, ec);
  if (ec || ::access(d.c_str(), W_OK) != 0) {
    throw config_error(what + " in " + d.string() + " (" + (ec ? ec.message() : std::string("not writable")) +
                       "); expected a writable folder");
  }
}

inline void write_file_atomically(const std::filesystem::path& path, std::span<const std::byte> bytes) {
  const std::string host = host_name();
  remove_stale_temporaries(path, host);
  std::filesystem::path tmp = path;
  tmp += ".tmp." + host + "." + std::to_string(::getpid());
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

}  // namespace partrain::inline v0::detail::ckpt
