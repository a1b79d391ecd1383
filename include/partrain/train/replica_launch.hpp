// partrain/train/replica_launch.hpp: what `partrun --spares N` (or `--min-replicas M`) tells each
// process it starts, read from the environment: this replica's id, the job's replicas, the
// quorum policy, and the job's store (partrun hosts it and runs the lighthouse on it). A process
// started this way builds a replica_group (parallel/replica_group.hpp) instead of calling
// init_process_group: its groups change with the quorums.
#pragma once

#include <charconv>
#include <memory>
#include <optional>
#include <string>

#include <partrain/comm/store.hpp>
#include <partrain/core/error.hpp>
#include <partrain/parallel/quorum.hpp>
#include <partrain/rendezvous/init_options.hpp>
#include <partrain/rendezvous/rendezvous.hpp>

namespace partrain::inline v0 {

struct replica_launch {
  int replica = 0;   // RANK: this process's replica id (a replacement keeps the lost one's)
  int replicas = 1;  // WORLD_SIZE: every process of the job, spares included
  quorum_policy policy{};
  rendezvous_info where{};  // the job's store, not yet connected

  // A new connection to the job's store: replica_group takes one for its heartbeats, the group
  // factory's rendezvous another.
  [[nodiscard]] std::shared_ptr<store> connect() const {
    auto info = where;
    connect_store(info);
    return info.store;
  }
};

// The launch of a fault-tolerant job's process, or nullopt when this process was not started as
// one (neither PARTRAIN_FT_SLOTS nor PARTRAIN_FT_MIN_REPLICAS is set). Values that cannot work are
// refused by name.
[[nodiscard]] inline std::optional<replica_launch> replica_launch_from_env(const env_lookup& env = process_env) {
  const auto slots = env("PARTRAIN_FT_SLOTS");
  const auto min_replicas = env("PARTRAIN_FT_MIN_REPLICAS");
  if (!slots && !min_replicas) return std::nullopt;
  auto positive = [](const std::string& name, const std::string& v) {
    int x = 0;
    const auto r = std::from_chars(v.data(), v.data() + v.size(), x);
    if (r.ec != std::errc{} || r.ptr != v.data() + v.size() || x < 1) {
      throw config_error(name + " is '" + v + "', expected an integer >= 1");
    }
    return x;
  };
  if (slots && min_replicas) {
    throw config_error("PARTRAIN_FT_SLOTS and PARTRAIN_FT_MIN_REPLICAS are both set; a job is either a fixed world with "
                       "spares or a dynamic one");
  }
  replica_launch l;
  l.where = parse_rendezvous("env://", {}, env);
  if (!l.where.agent_store) {
    throw config_error("a fault-tolerant process needs the launcher's store (PARTRAIN_USE_AGENT_STORE=1), where the "
                       "lighthouse runs: start it with partrun --spares or --min-replicas");
  }
  l.replica = l.where.rank;
  l.replicas = l.where.world_size;
  if (slots) {
    l.policy = {.mode = world_size_mode::fixed_with_spares, .slots = positive("PARTRAIN_FT_SLOTS", *slots)};
    if (l.policy.slots > l.replicas) {
      throw config_error("PARTRAIN_FT_SLOTS is " + *slots + " but WORLD_SIZE (every process, spares included) is " +
                         std::to_string(l.replicas));
    }
  } else {
    l.policy = {.mode = world_size_mode::dynamic, .min_replicas = positive("PARTRAIN_FT_MIN_REPLICAS", *min_replicas)};
  }
  return l;
}

}  // namespace partrain::inline v0
