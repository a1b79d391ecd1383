#include <catch2/catch.hpp>

#include <partrain/core/error.hpp>

#include <chrono>
#include <exception>
#include <string>
#include <vector>

using namespace partrain;

TEST_CASE("errors form one hierarchy with kinds", "[core][error]") {
  try {
    throw timeout_error("rank 1 all_reduce: timed out");
  } catch (const communication_error& e) {
    CHECK(e.kind() == error_kind::timeout);
    CHECK(std::string(e.what()) == "partrain: rank 1 all_reduce: timed out");
  }
  CHECK_THROWS_AS(throw data_error("x"), error);
  CHECK(to_string(error_kind::checkpoint) == "checkpoint");
}

TEST_CASE("a sited error keeps rank, operation, peer and timeout as fields", "[core][error]") {
  try {
    throw timeout_error({.rank = 2, .operation = "all_reduce", .peer = 1, .timeout = std::chrono::milliseconds(500)},
                        "timed out after 500 ms");
  } catch (const communication_error& e) {
    CHECK(e.kind() == error_kind::timeout);
    CHECK(e.rank() == 2);
    CHECK(e.operation() == "all_reduce");
    CHECK(e.peer() == 1);
    CHECK(dynamic_cast<const timeout_error&>(e).timeout() == std::chrono::milliseconds(500));
    CHECK(std::string(e.what()) == "partrain: rank 2 all_reduce (peer 1): timed out after 500 ms");
  }
  const config_error unsited("bad URL");
  CHECK(unsited.rank() == -1);
  CHECK(unsited.operation().empty());
}

TEST_CASE("root_cause prefers a failure over the aborted_error echoes it caused", "[core][error]") {
  const auto echo = std::make_exception_ptr(aborted_error({.rank = 0, .operation = "barrier"}, 1, "rank 1 failed"));
  const auto cause = std::make_exception_ptr(data_error("rank 1: bad sample"));
  std::vector<std::exception_ptr> errors{echo, cause, nullptr};
  CHECK(detail::root_cause(errors) == cause);
  std::vector<std::exception_ptr> only_echoes{nullptr, echo};
  CHECK(detail::root_cause(only_echoes) == echo);
  CHECK(detail::root_cause(std::vector<std::exception_ptr>(3)) == nullptr);
  try {
    std::rethrow_exception(echo);
  } catch (const aborted_error& e) {
    CHECK(e.origin() == 1);
    CHECK(e.rank() == 0);
    CHECK(std::string(e.what()) == "partrain: rank 0 barrier: group aborted: rank 1 failed");
  }
}
