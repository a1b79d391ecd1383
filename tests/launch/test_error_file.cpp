// torchrun's error file (launch/error_file.hpp): the JSON torchrun's summary reads, the error's
// type, text and site fields in it, written whole (a temporary, then a rename), and nothing where
// torchrun named no file. tests/rendezvous/torch_interop.sh checks it under the real torchrun.
#include <catch2/catch.hpp>

#include <partrain/core/error.hpp>
#include <partrain/launch/error_file.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>

#include "temp_dir.hpp"

using namespace partrain;

namespace {

std::string read(const std::filesystem::path& p) {
  std::ifstream in(p);
  return {std::istreambuf_iterator<char>(in), {}};
}

}  // namespace

TEST_CASE("write_error_file writes torchrun's error JSON, sited fields included", "[launch][error_file]") {
  testing::temp_dir dir;
  const auto path = dir.path / "error.json";
  std::map<std::string, std::string> vars{{"TORCHELASTIC_ERROR_FILE", path.string()}};
  const env_lookup env = [&](const std::string& k) -> std::optional<std::string> {
    auto it = vars.find(k);
    return it == vars.end() ? std::nullopt : std::optional(it->second);
  };
  const timeout_error e({.rank = 3, .operation = "all_reduce", .peer = 1, .timeout = std::chrono::milliseconds(2500)},
                        "no reply \"quoted\"\nsecond line");
  REQUIRE(write_error_file(e, env));
  const std::string json = read(path);
  CHECK(json.starts_with("{\"message\": {\"message\": \"partrain::timeout_error: partrain: rank 3 all_reduce (peer 1)"));
  CHECK_THAT(json, Catch::Contains("no reply \\\"quoted\\\"\\nsecond line"));  // escaped, one JSON string
  CHECK_THAT(json, Catch::Contains("\"extraInfo\": {\"py_callstack\": \"partrain::timeout_error: "));
  CHECK_THAT(json, Catch::Contains("\\n  rank: 3\\n  operation: all_reduce\\n  peer: 1\\n  timeout: 2500 ms"));
  CHECK_THAT(json, Catch::Matches(".*\"timestamp\": \"[0-9]{10}\"\\}\\}\\}\n"));
  CHECK_FALSE(std::filesystem::exists(path.string() + ".partrain.tmp"));

  // A plain std::exception: its type and text, no site lines.
  REQUIRE(write_error_file(std::runtime_error("disk full"), env));
  CHECK_THAT(read(path), Catch::StartsWith("{\"message\": {\"message\": \"std::runtime_error: disk full\"") &&
                             !Catch::Contains("rank:"));

  // Not under torchrun (or torchrun sent its logs nowhere): nothing is written.
  vars["TORCHELASTIC_ERROR_FILE"] = "";
  CHECK_FALSE(write_error_file(e, env));
  vars.erase("TORCHELASTIC_ERROR_FILE");
  CHECK_FALSE(write_error_file(e, env));
  // A directory that does not exist: false, and no exception while an error is on its way out.
  vars["TORCHELASTIC_ERROR_FILE"] = (dir.path / "missing" / "error.json").string();
  CHECK_FALSE(write_error_file(e, env));
}
