// partrain/rendezvous/file_store.hpp: a rendezvous store in one file on a filesystem every rank can
// see (torch's FileStore; the file:// init method). The file is an append-only log of
// records, guarded by an open-file-description lock (fcntl F_OFD_SETLK), so processes and
// threads of one process exclude each other alike. Like torch's, the file must be new (or
// empty) for each job: the caller removes it afterwards.
//
// Record: u32 key length, key, u32 value length (0xFFFFFFFF = the key was deleted), value;
// little endian. A writer appends whole records under the exclusive lock; a record cut short
// by a writer that died mid-append is dropped by the next writer.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <partrain/comm/store.hpp>
#include <partrain/core/detail/fd.hpp>
#include <partrain/core/detail/regular_file.hpp>
#include <partrain/core/error.hpp>

namespace partrain::inline v0 {

class file_store final : public store {
 public:
  // timeout bounds taking the file lock (and set/add/check, which take it).
  // who (e.g. "rank 3") names the caller in errors' text, rank in their rank() (-1: not a rank).
  explicit file_store(std::string path, std::chrono::milliseconds timeout = std::chrono::milliseconds(300'000),
                      std::string who = {}, int rank = -1)
      : path_(std::move(path)), timeout_(timeout), who_(who.empty() ? std::string() : std::move(who) + ": "), rank_(rank) {
    if (path_.empty()) throw config_error("file_store: empty path (expected a file on a filesystem all ranks share)");
    // A FIFO or a device would block or never end the store's reads.
    if (auto special = detail::refuse_special_file("file_store: the store file", path_); !special.empty()) {
      throw config_error(special);
    }
    fd_.reset(::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
    if (!fd_) {
      throw config_error("file_store: cannot open '" + path_ + "': " + detail::errno_text(errno) +
                         " (expected a writable path on a filesystem all ranks share)");
    }
  }

  [[nodiscard]] const std::string& path() const noexcept { return path_; }

  using store::set;
  void set(const std::string& key, std::span<const std::byte> value) override {
    std::lock_guard g(mutex_);
    file_lock lock(*this, F_WRLCK, "set('" + key + "')");
    append(key, value, false);
  }

  [[nodiscard]] std::vector<std::byte> get(const std::string& key, std::chrono::milliseconds timeout) override {
    std::vector<std::byte> out;
    poll_until("store get", timeout, [&] {
      if (auto it = cache_.find(key); it != cache_.end()) {
        out = it->second;
        return true;
      }
      return false;
    }, [&] { return "file_store get('" + key + "') on '" + path_ + "' timed out after " + std::to_string(timeout.count()) +
                    " ms: the key was never set"; });
    return out;
  }

  std::int64_t add(const std::string& key, std::int64_t delta) override {
    std::lock_guard g(mutex_);
    file_lock lock(*this, F_WRLCK, "add('" + key + "')");
    std::int64_t cur = 0;
    if (auto it = cache_.find(key); it != cache_.end()) {
      const auto* p = reinterpret_cast<const char*>(it->second.data());
      auto [end, ec] = std::from_chars(p, p + it->second.size(), cur);
      if (ec != std::errc{} || end != p + it->second.size()) {
        throw invalid_argument_error("file_store add('" + key + "'): the key holds a non-integer value");
      }
    }
    std::int64_t next = 0;
    if (__builtin_add_overflow(cur, delta, &next)) throw invalid_argument_error("file_store add('" + key + "'): int64 overflow");
    const std::string s = std::to_string(next);
    append(key, std::as_bytes(std::span(s.data(), s.size())), false);
    return next;
  }

  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    poll_until("store wait", timeout, [&] { return all_present(keys); }, [&] {
      std::string names;
      for (const auto& k : keys) {
        if (!cache_.contains(k)) names += (names.empty() ? "'" : ", '") + k + "'";
      }
      return "file_store wait on '" + path_ + "' timed out after " + std::to_string(timeout.count()) +
             " ms: still missing " + names;
    });
  }

  [[nodiscard]] bool check(const std::vector<std::string>& keys) override {
    std::lock_guard g(mutex_);
    file_lock lock(*this, F_RDLCK, "check");
    return all_present(keys);
  }

  bool delete_key(const std::string& key) {
    std::lock_guard g(mutex_);
    file_lock lock(*this, F_WRLCK, "delete_key('" + key + "')");
    if (!cache_.contains(key)) return false;
    append(key, {}, true);
    return true;
  }

  [[nodiscard]] std::int64_t num_keys() {
    std::lock_guard g(mutex_);
    file_lock lock(*this, F_RDLCK, "num_keys");
    return static_cast<std::int64_t>(cache_.size());
  }

 private:
  static constexpr std::uint32_t tombstone = 0xFFFFFFFFu;

  // Holds the whole-file lock and brings the cache up to date with the file.
  class file_lock {
   public:
    file_lock(file_store& s, short type, const std::string& op) : s_(s) {
      const auto deadline = detail::deadline_clock::now() + s.timeout_;
      auto pause = std::chrono::microseconds(200);
      for (;;) {
        struct flock fl {};
        fl.l_type = type;
        fl.l_whence = SEEK_SET;
        if (::fcntl(s.fd_.get(), F_OFD_SETLK, &fl) == 0) break;
        if (errno != EAGAIN && errno != EACCES && errno != EINTR) {
          throw communication_error("file_store " + op + ": cannot lock '" + s.path_ + "': " + detail::errno_text(errno) +
                                        " (the filesystem must support fcntl locks)",
                                    s.site("store lock"));
        }
        if (detail::deadline_clock::now() >= deadline) {
          throw timeout_error(s.who_ + "file_store " + op + ": timed out after " + std::to_string(s.timeout_.count()) +
                                  " ms waiting for the lock on '" + s.path_ + "'",
                              s.site("store lock", s.timeout_));
        }
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, std::chrono::microseconds(10'000));
      }
      try {
        s.refresh(type == F_WRLCK);
      } catch (...) {
        unlock();
        throw;
      }
    }
    file_lock(const file_lock&) = delete;
    file_lock& operator=(const file_lock&) = delete;
    ~file_lock() { unlock(); }

   private:
    void unlock() noexcept {
      struct flock fl {};
      fl.l_type = F_UNLCK;
      fl.l_whence = SEEK_SET;
      ::fcntl(s_.fd_.get(), F_OFD_SETLK, &fl);
    }
    file_store& s_;
  };

  // Reads the records appended since the last look. A writer (exclusive lock) also cuts off
  // a torn record left by a writer that died, so its own record starts on a boundary.
  void refresh(bool writer) {
    struct stat st {};
    if (::fstat(fd_.get(), &st) != 0) throw communication_error("file_store: fstat '" + path_ + "': " + detail::errno_text(errno));
    const auto size = static_cast<std::uint64_t>(st.st_size);
    if (size < offset_) {
      // The file was truncated or replaced under us: start over.
      offset_ = 0;
      cache_.clear();
    }
    std::vector<std::byte> buf(size - offset_);
    std::size_t got = 0;
    while (got < buf.size()) {
      const ssize_t n = ::pread(fd_.get(), buf.data() + got, buf.size() - got, static_cast<off_t>(offset_ + got));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw communication_error("file_store: read '" + path_ + "': " + detail::errno_text(errno));
      got += static_cast<std::size_t>(n);
    }
    std::size_t pos = 0;
    auto u32 = [&](std::uint32_t& v) {
      if (buf.size() - pos < 4) return false;
      v = 0;
      for (std::size_t i = 0; i < 4; ++i) v |= std::uint32_t(std::to_integer<std::uint8_t>(buf[pos + i])) << (8 * i);
      pos += 4;
      return true;
    };
    for (;;) {
      const std::size_t start = pos;
      std::uint32_t klen = 0, vlen = 0;
      if (!u32(klen) || buf.size() - pos < klen) {
        pos = start;
        break;
      }
      std::string key(reinterpret_cast<const char*>(buf.data() + pos), klen);
      pos += klen;
      if (!u32(vlen) || (vlen != tombstone && buf.size() - pos < vlen)) {
        pos = start;
        break;
      }
      if (vlen == tombstone) {
        cache_.erase(key);
      } else {
        cache_[std::move(key)].assign(buf.begin() + static_cast<std::ptrdiff_t>(pos),
                                      buf.begin() + static_cast<std::ptrdiff_t>(pos + vlen));
        pos += vlen;
      }
    }
    offset_ += pos;
    if (writer && offset_ < size && ::ftruncate(fd_.get(), static_cast<off_t>(offset_)) != 0) {
      throw communication_error("file_store: truncate '" + path_ + "': " + detail::errno_text(errno));
    }
  }

  // Under the exclusive lock, after refresh: offset_ is the end of the file.
  void append(const std::string& key, std::span<const std::byte> value, bool erase) {
    if (key.size() >= tombstone || value.size() >= tombstone) {
      throw invalid_argument_error("file_store: key or value of key '" + key + "' is too large (limit 4 GiB)");
    }
    std::vector<std::byte> rec;
    rec.reserve(8 + key.size() + value.size());
    auto put = [&](std::uint32_t v) {
      for (int i = 0; i < 4; ++i) rec.push_back(std::byte(static_cast<std::uint8_t>(v >> (8 * i))));
    };
    put(static_cast<std::uint32_t>(key.size()));
    const auto* k = reinterpret_cast<const std::byte*>(key.data());
    rec.insert(rec.end(), k, k + key.size());
    put(erase ? tombstone : static_cast<std::uint32_t>(value.size()));
    rec.insert(rec.end(), value.begin(), value.end());
    std::size_t done = 0;
    while (done < rec.size()) {
      const ssize_t n = ::pwrite(fd_.get(), rec.data() + done, rec.size() - done, static_cast<off_t>(offset_ + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw communication_error("file_store: write '" + path_ + "': " + detail::errno_text(errno));
      done += static_cast<std::size_t>(n);
    }
    // Not added to the cache here: the next refresh reads it back like any other writer's.
  }

  [[nodiscard]] bool all_present(const std::vector<std::string>& keys) const {
    return std::ranges::all_of(keys, [&](const std::string& k) { return cache_.contains(k); });
  }

  [[nodiscard]] error_site site(std::string operation, std::chrono::milliseconds timeout = {}) const {
    return {.rank = rank_, .operation = std::move(operation), .timeout = timeout};
  }

  // Re-reads the file (shared lock) until ready() or the timeout.
  template <class Ready, class Message>
  void poll_until(const char* operation, std::chrono::milliseconds timeout, Ready ready, Message message) {
    if (timeout.count() < 0) throw invalid_argument_error("file_store: negative timeout");
    const auto deadline = detail::deadline_clock::now() + timeout;
    auto pause = std::chrono::microseconds(500);
    for (;;) {
      {
        std::lock_guard g(mutex_);
        {
          file_lock lock(*this, F_RDLCK, "read");
        }
        if (ready()) return;
        if (detail::deadline_clock::now() >= deadline) throw timeout_error(who_ + message(), site(operation, timeout));
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(20'000));
    }
  }

  std::string path_;
  std::chrono::milliseconds timeout_;
  std::string who_;
  int rank_;
  detail::unique_fd fd_;
  std::mutex mutex_;  // one thread at a time uses the descriptor and the cache
  std::map<std::string, std::vector<std::byte>> cache_;
  std::uint64_t offset_ = 0;  // how much of the file the cache reflects
};

}  // namespace partrain::inline v0
