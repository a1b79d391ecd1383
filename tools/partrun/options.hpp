// tools/partrun/options.hpp: partrun's command line, with torchrun's option names and defaults.
#pragma once

#include <unistd.h>

#include <charconv>
#include <cmath>
#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <partrain/core/error.hpp>

namespace partrun {

struct options {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;  // 0 = a free port (single node only)
  int max_restarts = 0;
  // Fault tolerance (replica_group): spares > 0 or min_replicas > 0 turn it on.
  int spares = 0;            // --spares: extra processes waiting to take a lost rank's slot
  int min_replicas = 0;      // --min-replicas: dynamic membership, at least this many
  int max_replacements = 0;  // --max-replacements: new processes started for lost ones
  std::chrono::milliseconds monitor_interval{100};
  std::chrono::milliseconds rdzv_timeout{300'000};  // how long nodes wait for each other
  std::chrono::milliseconds grace{5'000};           // SIGTERM to SIGKILL
  bool standalone = false;
  bool tee = false;
  std::filesystem::path log_dir = "partrun-logs";
  std::string token;  // multi-node: the same on every node (or PARTRAIN_JOB_TOKEN)
  std::string program;
  std::vector<std::string> args;
};

inline constexpr std::string_view usage = R"(usage: partrun [options] PROGRAM [ARGS...]

Starts PROGRAM once per local rank with the variables torchrun sets (RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT, ...), supervises the
group, and stops every rank when one fails.

options:
  --nproc-per-node N|cpu|gpu|auto  processes on this node (default 1)
  --nnodes N                        nodes in the job (default 1; "N:N" accepted)
  --node-rank R                     this node's rank (default 0)
  --master-addr HOST                node 0's address (default 127.0.0.1)
  --master-port PORT                node 0's store port (default 29500; 0 = free port, one node)
  --standalone                      one node, a free port, nothing else to set
  --max-restarts K                  restart the whole group up to K times (default 0)
  --spares N                        fault tolerance, fixed world: N more processes (per node) wait to
                                    take a lost rank's slot (healed from a live rank); the others go on
  --min-replicas M                  fault tolerance, dynamic world: the ranks present train (at
                                    least M); a lost rank does not stop the others
  --max-replacements K              with --spares or --min-replicas: start a new process (same
                                    RANK) for each of the first K that are lost on this node (default 0)
  --monitor-interval SECONDS        how often ranks are checked (default 0.1)
  --rdzv-timeout SECONDS            how long nodes wait for each other (default 300)
  --grace SECONDS                   SIGTERM to SIGKILL when stopping ranks (default 5)
  --tee                             also write each rank's output to LOG_DIR/attempt_K/rank_R.log
  --log-dir DIR                     where --tee writes (default partrun-logs)
  --token TOKEN                     the job token for a multi-node job (or PARTRAIN_JOB_TOKEN)
  -h, --help                        this text
)";

namespace detail {

inline int to_int(std::string_view flag, std::string_view v, int lo) {
  int x = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc{} || p != v.data() + v.size() || x < lo) {
    throw partrain::config_error("partrun: " + std::string(flag) + " '" + std::string(v) + "': expected an integer >= " +
                                 std::to_string(lo));
  }
  return x;
}

// A duration in seconds: finite, within [min_s, one week] (nan, inf and overflowing values would
// otherwise become nonsense durations: a busy loop, or a wait that never ends).
inline std::chrono::milliseconds to_seconds(std::string_view flag, std::string_view v, double min_s = 0) {
  constexpr double max_s = 7 * 24 * 3600.0;
  double s = 0;
  try {
    std::size_t used = 0;
    s = std::stod(std::string(v), &used);
    if (used != v.size() || !std::isfinite(s) || s < min_s || s > max_s) throw 0;
  } catch (...) {
    throw partrain::config_error("partrun: " + std::string(flag) + " '" + std::string(v) + "': expected a number of seconds " +
                                 (min_s > 0 ? "greater than 0" : "at least 0") + " and at most 604800 (a week)");
  }
  return std::chrono::milliseconds(static_cast<long long>(s * 1000.0 + 0.5));
}

inline int count_gpus() {
  int n = 0;
  for (int i = 0; i < 64; ++i) {
    if (std::filesystem::exists("/dev/nvidia" + std::to_string(i))) ++n;
  }
  return n;
}

inline int nproc_from(std::string_view v) {
  const int cpus = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (v == "cpu") return cpus;
  if (v == "gpu") {
    const int g = count_gpus();
    if (g == 0) throw partrain::config_error("partrun: --nproc-per-node gpu: no GPU found on this node");
    return g;
  }
  if (v == "auto") return count_gpus() > 0 ? count_gpus() : cpus;  // torchrun: GPUs if any, else CPUs
  return to_int("--nproc-per-node", v, 1);
}

}  // namespace detail

// Parses argv (without the program name). Options end at the first non-option: PROGRAM.
[[nodiscard]] inline std::optional<options> parse(const std::vector<std::string>& argv) {
  options o;
  bool port_given = false;
  std::size_t i = 0;
  auto value = [&](std::string_view flag, std::string_view inline_v, bool has_inline) -> std::string {
    if (has_inline) return std::string(inline_v);
    if (i + 1 >= argv.size()) throw partrain::config_error("partrun: " + std::string(flag) + " needs a value");
    return argv[++i];
  };
  for (; i < argv.size(); ++i) {
    std::string_view a = argv[i];
    if (a.size() < 2 || a[0] != '-') break;
    if (a == "--") {
      ++i;
      break;
    }
    std::string_view flag = a, inl;
    bool has_inline = false;
    if (auto eq = a.find('='); eq != std::string_view::npos) {
      flag = a.substr(0, eq);
      inl = a.substr(eq + 1);
      has_inline = true;
    }
    std::string f(flag);
    for (auto& c : f) c = (c == '_') ? '-' : c;  // torchrun accepts --nproc_per_node too
    if (f == "-h" || f == "--help") return std::nullopt;
    if (f == "--nproc-per-node") {
      o.nproc_per_node = detail::nproc_from(value(flag, inl, has_inline));
    } else if (f == "--nnodes") {
      auto v = value(flag, inl, has_inline);
      if (auto c = v.find(':'); c != std::string::npos) {
        if (v.substr(0, c) != v.substr(c + 1)) {
          throw partrain::config_error("partrun: --nnodes " + v + ": elastic MIN:MAX ranges are not supported; give N or N:N");
        }
        v = v.substr(0, c);
      }
      o.nnodes = detail::to_int("--nnodes", v, 1);
    } else if (f == "--node-rank") {
      o.node_rank = detail::to_int("--node-rank", value(flag, inl, has_inline), 0);
    } else if (f == "--master-addr") {
      o.master_addr = value(flag, inl, has_inline);
    } else if (f == "--master-port") {
      o.master_port = detail::to_int("--master-port", value(flag, inl, has_inline), 0);
      if (o.master_port > 65535) throw partrain::config_error("partrun: --master-port must be 0..65535");
      port_given = true;
    } else if (f == "--max-restarts") {
      o.max_restarts = detail::to_int("--max-restarts", value(flag, inl, has_inline), 0);
    } else if (f == "--spares") {
      o.spares = detail::to_int("--spares", value(flag, inl, has_inline), 1);
    } else if (f == "--min-replicas") {
      o.min_replicas = detail::to_int("--min-replicas", value(flag, inl, has_inline), 1);
    } else if (f == "--max-replacements") {
      o.max_replacements = detail::to_int("--max-replacements", value(flag, inl, has_inline), 0);
    } else if (f == "--monitor-interval") {
      o.monitor_interval = detail::to_seconds("--monitor-interval", value(flag, inl, has_inline));
      if (o.monitor_interval.count() == 0) o.monitor_interval = std::chrono::milliseconds(1);
    } else if (f == "--rdzv-timeout") {
      o.rdzv_timeout = detail::to_seconds("--rdzv-timeout", value(flag, inl, has_inline), 0.001);
    } else if (f == "--grace") {
      o.grace = detail::to_seconds("--grace", value(flag, inl, has_inline));
    } else if (f == "--standalone") {
      o.standalone = true;
    } else if (f == "--tee") {
      o.tee = true;
    } else if (f == "--log-dir") {
      o.log_dir = value(flag, inl, has_inline);
    } else if (f == "--token") {
      o.token = value(flag, inl, has_inline);
    } else {
      throw partrain::config_error("partrun: unknown option '" + std::string(a) + "' (see partrun --help)");
    }
  }
  if (i >= argv.size()) throw partrain::config_error("partrun: no PROGRAM given (see partrun --help)");
  o.program = argv[i];
  o.args.assign(argv.begin() + static_cast<std::ptrdiff_t>(i) + 1, argv.end());
  if (o.standalone) {
    if (o.nnodes != 1) throw partrain::config_error("partrun: --standalone is for one node; got --nnodes " + std::to_string(o.nnodes));
    if (!port_given) o.master_port = 0;
  }
  if (o.node_rank >= o.nnodes) {
    throw partrain::config_error("partrun: --node-rank " + std::to_string(o.node_rank) + " is out of range for --nnodes " +
                                 std::to_string(o.nnodes) + " (expected 0..nnodes-1)");
  }
  if (o.spares > 0 && o.min_replicas > 0) {
    throw partrain::config_error("partrun: --spares (a fixed world) and --min-replicas (a dynamic one) exclude each other; give one");
  }
  const bool ft = o.spares > 0 || o.min_replicas > 0;
  if (!ft && o.max_replacements > 0) {
    throw partrain::config_error("partrun: --max-replacements replaces lost ranks of a fault-tolerant job: give --spares or --min-replicas too");
  }
  if (ft && o.tee) {
    throw partrain::config_error("partrun: --tee is not offered with --spares or --min-replicas yet; redirect partrun's output instead");
  }
  if (ft && o.max_restarts > 0) {
    throw partrain::config_error("partrun: --max-restarts restarts every rank; a fault-tolerant job (--spares, --min-replicas) "
                                 "keeps its healthy ranks instead: give one or the other");
  }
  if (o.min_replicas > o.nproc_per_node * o.nnodes) {
    throw partrain::config_error("partrun: --min-replicas " + std::to_string(o.min_replicas) + " is more than the " +
                                 std::to_string(o.nproc_per_node * o.nnodes) + " processes --nproc-per-node starts on " +
                                 std::to_string(o.nnodes) + " node(s)");
  }
  if (o.nnodes > 1 && o.master_port == 0) {
    throw partrain::config_error("partrun: --master-port 0 (a free port) only works on one node; give every node the same port");
  }
  return o;
}

}  // namespace partrun
