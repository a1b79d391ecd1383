// partrain/train/replica_events.hpp: a fault-tolerant replica's events (replica_group's joins,
// heals, state sent, failures, waits as a spare) into the metrics file and the trace, where the
// rest of the run's records are:
//
//   metrics_writer metrics("metrics.jsonl");   // every replica appends its own events
//   replica_group rg(store, groups, io, {.replica = r, .on_event = replica_event_sink(r, &metrics, &trace)});
//
// A metrics record per event: {"kind":"replica_event","step":S,"time":...,"event":"healed",
// "replica":r,"quorum":q,"seconds":x,"bytes":b,"reason":"..."}; each is one O_APPEND write, so
// the replicas of a host can share one file. A trace span per event on trace_track::recovery:
// a heal or a sent state spans its transfer, the others are instants.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include <partrain/parallel/replica_group.hpp>
#include <partrain/train/metrics.hpp>
#include <partrain/train/trace.hpp>

namespace partrain::inline v0 {

// replica_group_options::on_event writing each event to `metrics` and `trace` (either may be null;
// both must outlive the replica_group).
[[nodiscard]] inline std::function<void(const replica_event&)> replica_event_sink(int replica, metrics_writer* metrics,
                                                                                   trace_recorder* trace) {
  return [replica, metrics, trace](const replica_event& e) {
    const auto name = replica_event_name(e.what);
    if (metrics) {
      metrics->event("replica_event", e.step, {{"event", std::string(name)},
                              {"replica", replica},
                              {"quorum", e.quorum},
                              {"seconds", e.seconds},
                              {"bytes", e.bytes},
                              {"reason", e.reason}});
    }
    if (trace && trace->enabled()) {
      const auto end = std::chrono::duration_cast<std::chrono::nanoseconds>(e.at.time_since_epoch()).count();
      const auto took = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(e.seconds)).count();
      trace->record(name, trace_track::recovery, end - took, end, "step", e.step);
    }
  };
}

}  // namespace partrain::inline v0
