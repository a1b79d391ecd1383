// The JSON-lines metrics writer: escaping, numbers (NaN/inf -> null), appending, and fields
// reduced across ranks (mean loss, total samples/s) written once by rank 0.
#include <catch2/catch.hpp>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <partrain/comm/local.hpp>
#include <partrain/train/metrics.hpp>

#include "fifo.hpp"
#include "mini_json.hpp"
#include "temp_dir.hpp"

using namespace partrain;
namespace fs = std::filesystem;

namespace {

fs::path temp_path(const std::string& name) {
  return fs::temp_directory_path() / ("partrain_obs_" + std::to_string(::getpid()) + "_" + name);
}

std::vector<mini_json::value> read_lines(const fs::path& p) {
  std::ifstream in(p);
  std::vector<mini_json::value> out;
  for (std::string line; std::getline(in, line);) out.push_back(mini_json::parse(line));
  return out;
}

}  // namespace

TEST_CASE("a metrics record is one line of valid JSON with escaped strings and null for non-finite numbers",
          "[train][metrics]") {
  const std::vector<metric_field> fields{
      {"loss", 0.1},
      {"nan", std::numeric_limits<double>::quiet_NaN()},
      {"inf", std::numeric_limits<double>::infinity()},
      {"neg_inf", -std::numeric_limits<float>::infinity()},
      {"big", std::numeric_limits<std::int64_t>::max()},
      {"tiny", 5e-324},
      {"ok", true},
      {"note", "quote \" backslash \\ newline \n tab \t bell \x07 caf\xc3\xa9"},
      {"key \"odd\"", std::size_t{7}},
  };
  const std::string line = metrics_record("step", "step", 12, 1700000000.25, fields);
  REQUIRE(line.back() == '\n');
  CHECK(line.find('\n') == line.size() - 1);  // one line: the newline in the note is escaped
  CHECK(line.find("\\u0007") != std::string::npos);
  const auto rec = mini_json::parse(line);
  CHECK(rec["kind"].str() == "step");
  CHECK(rec["step"].num() == 12);
  CHECK(rec["time"].num() == 1700000000.25);
  CHECK(rec["loss"].num() == 0.1);  // shortest text that reads back to the same double
  CHECK(line.find("\"loss\":0.1,") != std::string::npos);
  CHECK(rec["nan"].is_null());
  CHECK(rec["inf"].is_null());
  CHECK(rec["neg_inf"].is_null());
  CHECK(line.find("\"big\":9223372036854775807") != std::string::npos);
  CHECK(rec["tiny"].num() == 5e-324);
  CHECK(rec["ok"].boolean());
  CHECK(rec["note"].str() == "quote \" backslash \\ newline \n tab \t bell \x07 caf\xc3\xa9");
  CHECK(rec["key \"odd\""].num() == 7);
}

TEST_CASE("the metrics file is appended to, one record per line, never truncated", "[train][metrics]") {
  const auto path = temp_path("metrics.jsonl");
  fs::remove(path);
  {
    metrics_writer w(path);
    w.step(1, {{"loss", 2.5}});
    w.step(2, {{"loss", 2.0}, {"lr", 0.1}});
    w.epoch(0, {{"accuracy", 0.75}, {"phase", "train"}});
    // Flushed per record: readable before the writer closes.
    CHECK(read_lines(path).size() == 3);
  }
  {
    metrics_writer again(path);  // a restarted run appends
    again.step(3, {{"loss", 1.5}});
  }
  const auto recs = read_lines(path);
  REQUIRE(recs.size() == 4);
  CHECK(recs[0]["kind"].str() == "step");
  CHECK(recs[1]["lr"].num() == 0.1);
  CHECK(recs[2]["kind"].str() == "epoch");
  CHECK(recs[2]["epoch"].num() == 0);
  CHECK(recs[2]["phase"].str() == "train");
  CHECK(recs[3]["step"].num() == 3);
  fs::remove(path);
}

TEST_CASE("reduced fields are combined across ranks and only rank 0 writes", "[train][metrics][threads]") {
  const auto path = temp_path("metrics_ranks.jsonl");
  fs::remove(path);
  constexpr int world = 4;
  run_local(world, [&](local_group& pg) {
    metrics_writer w(path, pg.rank());
    CHECK(w.writes() == (pg.rank() == 0));
    const double r = pg.rank();
    for (int s = 0; s < 3; ++s) {
      w.step(pg, s, {{"loss", r + s, across_ranks::mean},
                     {"samples_per_s", 100.0 * (r + 1), across_ranks::sum},
                     {"samples", std::int64_t{10}, across_ranks::sum},
                     {"worst", r, across_ranks::max},
                     {"best", r, across_ranks::min},
                     {"lr", 0.5 + r}});
    }
    w.epoch(pg, 0, {{"accuracy", 0.5 + 0.1 * r, across_ranks::mean}});
  }, {std::chrono::milliseconds(10'000)});

  const auto recs = read_lines(path);
  REQUIRE(recs.size() == 4);
  for (int s = 0; s < 3; ++s) {
    const auto& rec = recs[static_cast<std::size_t>(s)];
    CHECK(rec["step"].num() == s);
    CHECK(rec["loss"].num() == Approx(1.5 + s));  // mean of 0..3 plus s
    CHECK(rec["samples_per_s"].num() == Approx(1000.0));
    CHECK(rec["samples"].num() == 40);
    CHECK(rec["worst"].num() == 3);
    CHECK(rec["best"].num() == 0);
    CHECK(rec["lr"].num() == 0.5);  // not reduced: rank 0's value
  }
  CHECK(recs[3]["accuracy"].num() == Approx(0.65));
  fs::remove(path);
}

TEST_CASE("bad metrics input is reported clearly", "[train][metrics]") {
  CHECK_THROWS_WITH(metrics_writer(fs::path{}), Catch::Contains("path is empty"));
  CHECK_THROWS_WITH(metrics_writer(fs::path("/nonexistent_dir_partrain/m.jsonl")), Catch::Contains("cannot open"));
  run_local(1, [&](local_group& pg) {
    metrics_writer w(temp_path("unused.jsonl"), 1);  // rank 1 of a job: opens nothing
    CHECK_FALSE(w.writes());
    metric_field phase{"phase", "train"};
    phase.reduce = across_ranks::mean;  // a string cannot be averaged
    CHECK_THROWS_WITH(w.step(pg, 0, {phase}), Catch::Contains("'phase'") && Catch::Contains("not a number"));
  });
}

TEST_CASE("a resumed run refuses a metrics path that is a FIFO or a device, by name", "[train][metrics][hostile]") {
  using namespace std::chrono_literals;
  partrain::testing::temp_dir dir("partrain_obs_fifo");
  // Resuming reads the metrics file back (to drop what a killed attempt wrote after the checkpoint).
  const auto fifo = partrain::testing::make_fifo(dir.path / "metrics.jsonl");
  CHECK_THAT(partrain::testing::error_within(5s, fifo, [&] { truncate_metrics_after(fifo, 0, 0); }),
             Catch::Contains("metrics file '" + fifo.string() + "' is a FIFO, expected a regular file"));
  CHECK_THROWS_WITH(truncate_metrics_after("/dev/zero", 0, 0),
                    Catch::Contains("metrics file '/dev/zero' is a character device, expected a regular file"));
}
