// Logging: levels, rank prefix, whole lines under concurrency, and a clear error for a bad level.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <iostream>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <partrain/core/log.hpp>

using namespace partrain;

namespace {
// Points the log at a string for one test, and back at std::cerr after it.
struct capture {
  std::ostringstream out;
  capture() { set_log_stream(out); }
  ~capture() { set_log_stream(std::cerr); }
};
}  // namespace

TEST_CASE("lines carry the rank and respect the level", "[train][log]") {
  capture c;
  set_log_rank(3);
  set_log_level(log_level::info);
  log_info("hello");
  log_debug("hidden");
  log_warn("careful");
  int built = 0;
  PARTRAIN_LOG(debug, std::to_string(++built));  // the message is not even built
  CHECK(built == 0);
  PARTRAIN_LOG(error, "bad " + std::to_string(++built));
  CHECK(c.out.str() == "[partrain rank 3] info: hello\n[partrain rank 3] warn: careful\n[partrain rank 3] error: bad 1\n");
  set_log_level(log_level::error);
  CHECK_FALSE(log_enabled(log_level::warn));
  CHECK(log_enabled(log_level::error));
}

TEST_CASE("PARTRAIN_LOG_LEVEL is parsed, and a bad value is named", "[train][log]") {
  ::setenv("PARTRAIN_LOG_LEVEL", "debug", 1);
  CHECK(log_level_from_env() == log_level::debug);
  ::setenv("PARTRAIN_LOG_LEVEL", "", 1);
  CHECK(log_level_from_env() == log_level::warn);
  ::setenv("PARTRAIN_LOG_LEVEL", "verbose", 1);
  CHECK_THROWS_AS(log_level_from_env(), config_error);
  CHECK_THROWS_WITH(log_level_from_env(), Catch::Contains("'verbose'") && Catch::Contains("error, warn, info, debug"));
  ::unsetenv("PARTRAIN_LOG_LEVEL");
  CHECK(parse_log_level("warning") == log_level::warn);
  CHECK(parse_log_level("DEBUG") == log_level::debug);  // any case
  CHECK(parse_log_level("Info") == log_level::info);
}

TEST_CASE("lines from many threads never interleave", "[train][log][threads]") {
  capture c;
  set_log_rank(0);
  set_log_level(log_level::debug);
  {
    std::vector<std::jthread> ts;
    for (int t = 0; t < 4; ++t) {
      ts.emplace_back([t] {
        for (int i = 0; i < 200; ++i) log_debug("thread " + std::to_string(t) + " line " + std::to_string(i) + " end");
      });
    }
  }
  std::istringstream in(c.out.str());
  const std::regex re(R"(^\[partrain rank 0\] debug: thread [0-3] line \d+ end$)");
  int n = 0;
  for (std::string l; std::getline(in, l); ++n) {
    INFO(l);
    CHECK(std::regex_match(l, re));
  }
  CHECK(n == 800);
  set_log_level(log_level::warn);
}
