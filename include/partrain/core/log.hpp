// partrain/core/log.hpp: leveled logging. The level comes from PARTRAIN_LOG_LEVEL (error, warn,
// info, debug; default warn, like torch.distributed's default), the rank is set once per process,
// and every line is prefixed with it. Each line is formatted first and written whole under a lock,
// so lines from several threads never interleave.
#pragma once

#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <ostream>
#include <string>
#include <string_view>

#include <partrain/core/error.hpp>

namespace partrain::inline v0 {

enum class log_level : int { error = 0, warn = 1, info = 2, debug = 3 };

[[nodiscard]] constexpr std::string_view to_string(log_level l) noexcept {
  switch (l) {
    case log_level::error: return "error";
    case log_level::warn: return "warn";
    case log_level::info: return "info";
    case log_level::debug: return "debug";
  }
  return "unknown";
}

// Any case ("DEBUG" too); throws config_error naming the text and the accepted values.
[[nodiscard]] inline log_level parse_log_level(std::string_view text) {
  std::string t(text);
  for (char& c : t) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (t == "error") return log_level::error;
  if (t == "warn" || t == "warning") return log_level::warn;
  if (t == "info") return log_level::info;
  if (t == "debug") return log_level::debug;
  throw config_error("PARTRAIN_LOG_LEVEL is '" + std::string(text) +
                     "', expected one of error, warn, info, debug (any case)");
}

// The level PARTRAIN_LOG_LEVEL asks for; warn when unset or empty.
[[nodiscard]] inline log_level log_level_from_env() {
  const char* v = std::getenv("PARTRAIN_LOG_LEVEL");
  if (!v || !*v) return log_level::warn;
  return parse_log_level(v);
}

namespace detail {

struct log_state {
  std::atomic<int> level{-1};  // -1: not read from the environment yet
  std::atomic<int> rank{-1};   // -1: unknown, lines say "rank ?"
  std::mutex mutex;
  std::ostream* out = &std::cerr;
};

[[nodiscard]] inline log_state& log_globals() {
  static log_state s;
  return s;
}

[[nodiscard]] inline int current_log_level() {
  auto& s = log_globals();
  int l = s.level.load(std::memory_order_relaxed);
  if (l < 0) {
    // A malformed variable is reported once by the first log call, then the default applies,
    // so a typo never turns logging itself into a crash loop.
    log_level parsed = log_level::warn;
    std::string complaint;
    try {
      parsed = log_level_from_env();
    } catch (const config_error& e) {
      complaint = e.what();
    }
    int expected = -1;
    if (s.level.compare_exchange_strong(expected, static_cast<int>(parsed)) && !complaint.empty()) {
      std::lock_guard lock(s.mutex);
      *s.out << "[partrain] warn: " << complaint << "; using warn\n" << std::flush;
    }
    l = s.level.load(std::memory_order_relaxed);
  }
  return l;
}

}  // namespace detail

// The rank every line is prefixed with. Call once, after rendezvous (launchers know it earlier).
inline void set_log_rank(int rank) noexcept { detail::log_globals().rank.store(rank, std::memory_order_relaxed); }
[[nodiscard]] inline int log_rank() noexcept { return detail::log_globals().rank.load(std::memory_order_relaxed); }

// Overrides PARTRAIN_LOG_LEVEL (tests, or a --verbose flag).
inline void set_log_level(log_level l) noexcept {
  detail::log_globals().level.store(static_cast<int>(l), std::memory_order_relaxed);
}
[[nodiscard]] inline log_level current_log_level() {
  return static_cast<log_level>(detail::current_log_level());
}

// Where lines go (std::cerr by default). The stream must outlive every later log call.
inline void set_log_stream(std::ostream& out) {
  auto& s = detail::log_globals();
  std::lock_guard lock(s.mutex);
  s.out = &out;
}

[[nodiscard]] inline bool log_enabled(log_level l) { return static_cast<int>(l) <= detail::current_log_level(); }

// One line: "[partrain rank 3] info: message". The message is built by the caller only when the
// level is on if it uses log_enabled() or the PARTRAIN_LOG macro.
inline void log(log_level l, std::string_view message) {
  if (!log_enabled(l)) return;
  const int r = log_rank();
  std::string line = "[partrain rank ";
  line += r < 0 ? std::string("?") : std::to_string(r);
  line += "] ";
  line += to_string(l);
  line += ": ";
  line += message;
  line += '\n';
  auto& s = detail::log_globals();
  std::lock_guard lock(s.mutex);
  s.out->write(line.data(), static_cast<std::streamsize>(line.size()));
  s.out->flush();
}

inline void log_error(std::string_view m) { log(log_level::error, m); }
inline void log_warn(std::string_view m) { log(log_level::warn, m); }
inline void log_info(std::string_view m) { log(log_level::info, m); }
inline void log_debug(std::string_view m) { log(log_level::debug, m); }

}  // namespace partrain::inline v0

// Skips building the message when the level is off: PARTRAIN_LOG(debug, "bucket " + std::to_string(i)).
#define PARTRAIN_LOG(level, ...)                                                         \
  do {                                                                                   \
    if (::partrain::log_enabled(::partrain::log_level::level))                           \
      ::partrain::log(::partrain::log_level::level, __VA_ARGS__);                        \
  } while (false)
