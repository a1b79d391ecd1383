// A fresh folder per test, removed (with its contents) afterwards.
#pragma once

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>
#include <system_error>

namespace partrain::testing {

struct temp_dir {
  std::filesystem::path path;
  explicit temp_dir(const std::string& prefix = "partrain_test") {
    static std::atomic<int> n{0};
    path = std::filesystem::temp_directory_path() /
           (prefix + "_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
    std::filesystem::create_directories(path);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

}  // namespace partrain::testing
