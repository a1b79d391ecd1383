#include <catch2/catch.hpp>

#include <partrain/core/error.hpp>

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
