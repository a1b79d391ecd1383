// partrain/launch/error_file.hpp: a failing rank's error where torchrun looks for it. torchrun
// gives each worker a path in TORCHELASTIC_ERROR_FILE; a worker that fails writes JSON there
// ({"message": {"message": ..., "extraInfo": {"py_callstack": ..., "timestamp": ...}}}, the form
// of torch.distributed.elastic's record()), and torchrun's failure summary then shows it as the
// root cause instead of "error_file: <N/A>". run_ranks writes it for a rank's failure; a program
// that fails before run_ranks (its data, its options) calls write_error_file in its own catch.
#pragma once

#include <cxxabi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <typeinfo>

#include <partrain/core/detail/json_text.hpp>
#include <partrain/core/error.hpp>
#include <partrain/rendezvous/init_options.hpp>

namespace partrain::inline v0 {

namespace detail::launch {

// "partrain::timeout_error" for the exception's dynamic type (the mangled name if demangling fails).
[[nodiscard]] inline std::string type_name(const std::exception& e) {
  const char* mangled = typeid(e).name();
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> name(abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  std::string out = status == 0 && name ? name.get() : mangled;
  for (const std::string inline_ns : {"::v0::", "::v0"}) {
    if (const auto at = out.find(inline_ns); at != std::string::npos) out.erase(at, inline_ns.size() - 2);
  }
  return out;
}

// The error file's text: the type and message, and (where torchrun's summary shows a Python
// traceback, the only field it prints) the same with a partrain error's site fields.
[[nodiscard]] inline std::string error_file_json(const std::exception& e, std::int64_t unix_seconds) {
  std::string site = type_name(e) + ": " + e.what();
  if (const auto* pe = dynamic_cast<const partrain::error*>(&e)) {
    const error_site& s = pe->site();
    if (s.rank >= 0) site += "\n  rank: " + std::to_string(s.rank);
    if (!s.operation.empty()) site += "\n  operation: " + s.operation;
    if (s.peer >= 0) site += "\n  peer: " + std::to_string(s.peer);
    if (s.timeout.count() > 0) site += "\n  timeout: " + std::to_string(s.timeout.count()) + " ms";
  }
  std::string out = "{\"message\": {\"message\": ";
  json::append_string(out, type_name(e) + ": " + e.what());
  out += ", \"extraInfo\": {\"py_callstack\": ";
  json::append_string(out, site);
  out += ", \"timestamp\": ";
  json::append_string(out, std::to_string(unix_seconds));
  out += "}}}\n";
  return out;
}

}  // namespace detail::launch

// Writes e to the file torchrun named in TORCHELASTIC_ERROR_FILE (whole or not at all: a
// temporary beside it, then renamed). Returns whether it wrote; false where torchrun set no file
// or the file cannot be written. Never throws: it runs while an error is already on its way out.
inline bool write_error_file(const std::exception& e, const env_lookup& env = process_env) noexcept {
  try {
    const auto path = env("TORCHELASTIC_ERROR_FILE");
    if (!path || path->empty()) return false;
    const auto now = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch());
    const std::string text = detail::launch::error_file_json(e, now.count());
    const std::string tmp = *path + ".partrain.tmp";
    std::FILE* f = std::fopen(tmp.c_str(), "w");
    if (!f) return false;
    const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
    if (std::fclose(f) != 0 || !written) {
      std::remove(tmp.c_str());
      return false;
    }
    std::error_code ec;
    std::filesystem::rename(tmp, *path, ec);
    if (ec) std::remove(tmp.c_str());
    return !ec;
  } catch (...) {
    return false;
  }
}

}  // namespace partrain::inline v0
