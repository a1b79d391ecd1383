// Small partrain::store implementations for tests: memory_store (threads of one process) and
// directory_store (processes of one host: one file per key, written atomically). The real
// tcp_store/file_store live in comm/; these keep backend tests independent of them.
#pragma once

#include <partrain/comm/store.hpp>
#include <partrain/core/error.hpp>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

namespace partrain::testing {

class memory_store final : public store {
 public:
  using store::set;
  void set(const std::string& key, std::span<const std::byte> value) override {
    {
      std::lock_guard lock(m_);
      data_[key].assign(value.begin(), value.end());
    }
    cv_.notify_all();
  }
  std::vector<std::byte> get(const std::string& key, std::chrono::milliseconds timeout) override {
    std::unique_lock lock(m_);
    if (!cv_.wait_for(lock, timeout, [&] { return data_.contains(key); })) {
      throw timeout_error("memory_store get: key '" + key + "' did not appear within " +
                          std::to_string(timeout.count()) + " ms");
    }
    return data_[key];
  }
  std::int64_t add(const std::string& key, std::int64_t delta) override {
    std::lock_guard lock(m_);
    auto& v = data_[key];
    std::int64_t cur = 0;
    if (!v.empty()) cur = std::stoll(std::string(reinterpret_cast<const char*>(v.data()), v.size()));
    cur += delta;
    const auto s = std::to_string(cur);
    v.assign(reinterpret_cast<const std::byte*>(s.data()), reinterpret_cast<const std::byte*>(s.data()) + s.size());
    cv_.notify_all();
    return cur;
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    std::unique_lock lock(m_);
    if (!cv_.wait_for(lock, timeout, [&] { return check_locked(keys); })) {
      std::string missing;
      for (const auto& k : keys) {
        if (!data_.contains(k)) missing += (missing.empty() ? "" : ", ") + k;
      }
      throw timeout_error("memory_store wait: keys still missing after " + std::to_string(timeout.count()) +
                          " ms: " + missing);
    }
  }
  bool check(const std::vector<std::string>& keys) override {
    std::lock_guard lock(m_);
    return check_locked(keys);
  }

 private:
  bool check_locked(const std::vector<std::string>& keys) const {
    for (const auto& k : keys) {
      if (!data_.contains(k)) return false;
    }
    return true;
  }
  std::mutex m_;
  std::condition_variable cv_;
  std::map<std::string, std::vector<std::byte>> data_;
};

// One file per key under dir; readers poll. Good enough for a handful of forked ranks.
class directory_store final : public store {
 public:
  explicit directory_store(std::filesystem::path dir) : dir_(std::move(dir)) { std::filesystem::create_directories(dir_); }

  using store::set;
  void set(const std::string& key, std::span<const std::byte> value) override {
    const auto final_path = path_of(key);
    const auto tmp = final_path.string() + ".tmp" + std::to_string(::getpid());
    {
      std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
      f.write(reinterpret_cast<const char*>(value.data()), static_cast<std::streamsize>(value.size()));
      if (!f) throw communication_error("directory_store: cannot write " + tmp);
    }
    std::filesystem::rename(tmp, final_path);
  }
  std::vector<std::byte> get(const std::string& key, std::chrono::milliseconds timeout) override {
    wait({key}, timeout);
    return read(path_of(key));
  }
  std::int64_t add(const std::string& key, std::int64_t delta) override {
    const auto lock_path = (dir_ / "add.lock").string();
    const int fd = ::open(lock_path.c_str(), O_CREAT | O_RDWR, 0600);
    if (fd < 0) throw communication_error("directory_store: cannot open " + lock_path);
    ::flock(fd, LOCK_EX);
    std::int64_t cur = 0;
    if (std::filesystem::exists(path_of(key))) {
      auto v = read(path_of(key));
      cur = std::stoll(std::string(reinterpret_cast<const char*>(v.data()), v.size()));
    }
    cur += delta;
    set(key, std::to_string(cur));
    ::flock(fd, LOCK_UN);
    ::close(fd);
    return cur;
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!check(keys)) {
      if (std::chrono::steady_clock::now() > deadline) {
        std::string missing;
        for (const auto& k : keys) {
          if (!std::filesystem::exists(path_of(k))) missing += (missing.empty() ? "" : ", ") + k;
        }
        throw timeout_error("directory_store wait: keys still missing after " + std::to_string(timeout.count()) +
                            " ms: " + missing);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  bool check(const std::vector<std::string>& keys) override {
    for (const auto& k : keys) {
      if (!std::filesystem::exists(path_of(k))) return false;
    }
    return true;
  }

 private:
  [[nodiscard]] std::filesystem::path path_of(const std::string& key) const {
    std::string name;
    for (char c : key) name += (c == '/' ? '#' : c);
    return dir_ / name;
  }
  static std::vector<std::byte> read(const std::filesystem::path& p) {
    std::ifstream f(p, std::ios::binary);
    std::vector<char> chars((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    std::vector<std::byte> out(chars.size());
    for (std::size_t i = 0; i < chars.size(); ++i) out[i] = static_cast<std::byte>(chars[i]);
    return out;
  }
  std::filesystem::path dir_;
};

}  // namespace partrain::testing
