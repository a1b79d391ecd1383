// replica_event_sink (train/replica_events.hpp): a fault-tolerant run's events land in the metrics
// file (one JSON line each, the replicas sharing the file) and the trace (spans on the recovery
// track): two slots and a spare as threads, replica 1 lost before step 3.
#include <catch2/catch.hpp>

#include <partrain/comm/local.hpp>
#include <partrain/parallel/lighthouse.hpp>
#include <partrain/parallel/replica_group.hpp>
#include <partrain/train/replica_events.hpp>

#include "replica_toy.hpp"
#include "temp_dir.hpp"
#include "test_stores.hpp"

#include <chrono>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

using namespace partrain;
using namespace std::chrono_literals;
using partrain::testing::toy_model;

namespace {
struct lost {};
}  // namespace

TEST_CASE("replica_event_sink writes every replica's events to the metrics file and the trace", "[train][ft][threads]") {
  testing::temp_dir dir("partrain_replica_events");
  const auto metrics_path = dir.path / "metrics.jsonl";
  constexpr int slots = 2, replicas = 3, steps = 6;
  auto s = std::make_shared<testing::memory_store>();
  lighthouse lh(s, {.replicas = replicas, .policy = {.slots = slots}, .heartbeat_timeout = 400ms, .tick = 5ms});
  local_group_registry registry({.timeout = 3000ms});
  std::vector<trace_recorder> traces(replicas);
  for (int r = 0; r < replicas; ++r) traces[static_cast<std::size_t>(r)].enable(dir.path / ("trace" + std::to_string(r) + ".json"));
  std::vector<std::string> errors(replicas);
  {
    std::vector<std::jthread> threads;
    for (int r = 0; r < replicas; ++r) {
      threads.emplace_back([&, r] {
        toy_model m;
        metrics_writer metrics(metrics_path);  // each replica appends to the one file
        try {
          replica_group rg(s, [&](std::int64_t id, int rank, int size) { return registry.make(id, rank, size); }, m.io(),
                           {.replica = r,
                            .heartbeat_interval = 20ms,
                            .quorum_timeout = 10s,
                            .on_event = replica_event_sink(r, &metrics, &traces[static_cast<std::size_t>(r)])});
          while (rg.current_step() < steps) {
            const bool more = rg.step(
                [&](process_group& g, int slot, std::int64_t step) {
                  if (r == 1 && step == 3) throw lost{};
                  m.compute(g, slot, step);
                },
                [&] { m.apply(slots); });
            if (!more) break;
          }
          rg.finish();
        } catch (const lost&) {
        } catch (const std::exception& e) {
          errors[static_cast<std::size_t>(r)] = e.what();
        }
      });
    }
  }
  for (const auto& e : errors) CHECK(e.empty());

  std::ifstream in(metrics_path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  auto has = [&](const std::string& a, const std::string& b, const std::string& c) {
    for (const auto& l : lines)
      if (l.find(a) != std::string::npos && l.find(b) != std::string::npos && l.find(c) != std::string::npos) return true;
    return false;
  };
  INFO([&] {
    std::string all;
    for (const auto& l : lines) all += l + "\n";
    return all;
  }());
  for (const auto& l : lines) CHECK(l.starts_with("{\"kind\":\"replica_event\",\"step\":"));
  CHECK(has("\"event\":\"joined\"", "\"replica\":0", "\"step\":0"));
  CHECK(has("\"event\":\"left_as_spare\"", "\"replica\":2", "\"step\":0"));
  CHECK(has("\"event\":\"failed\"", "\"replica\":0", "\"step\":3"));  // replica 1's loss, seen by its peer
  CHECK(has("\"event\":\"healed\"", "\"replica\":2", "\"step\":3"));  // the spare, healed to step 3
  CHECK(has("\"event\":\"sent_state\"", "\"replica\":0", "\"bytes\":64"));

  // The spare's trace: left as a spare, healed, joined, on the recovery track.
  auto& spare = traces[2];
  CHECK(spare.event_count() == 3);
  local_group_registry alone({.timeout = 3000ms});
  const auto g = alone.make(0, 0, 1);
  REQUIRE(spare.finish(*g));
  std::ifstream t(dir.path / "trace2.json");
  const std::string text((std::istreambuf_iterator<char>(t)), std::istreambuf_iterator<char>());
  CHECK_THAT(text, Catch::Contains("\"name\":\"healed\"") && Catch::Contains("\"name\":\"left_as_spare\"") &&
                       Catch::Contains("recovery"));
}

TEST_CASE("metrics_writer::event refuses the kinds step() and epoch() write", "[train][metrics][errors]") {
  testing::temp_dir dir("partrain_replica_events_kind");
  metrics_writer w(dir.path / "m.jsonl");
  CHECK_THROWS_WITH(w.event("step", 1, {}), Catch::Contains("kind 'step' is step()'s or epoch()'s"));
  CHECK_THROWS_AS(w.event("epoch", 1, {}), invalid_argument_error);
  CHECK_NOTHROW(w.event("note", 1, {{"x", 1}}));
}
