// partrain/rendezvous/launcher.hpp: the one place that knows whether and by what this process
// was launched, and as which rank: partrun, torchrun, RANK and WORLD_SIZE set by hand (or by any
// other tool), Slurm's srun, Open MPI's mpirun, or a PMI launcher. env:// (rendezvous.hpp),
// run_ranks and the examples all ask detect_launch, so they never disagree about it: a program
// under `srun -n 2` or `mpirun -np 2` forms one job of 2 ranks wherever it asks.
#pragma once

#include <algorithm>
#include <charconv>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>

#include <partrain/core/error.hpp>
#include <partrain/rendezvous/init_options.hpp>

namespace partrain::inline v0 {

namespace detail::rdzv {

[[nodiscard]] inline std::optional<long long> parse_integer(std::string_view s) {
  long long v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc{} || p != s.data() + s.size()) return std::nullopt;
  return v;
}

// Reads an integer variable within [lo, hi]; nullopt when it is not set.
[[nodiscard]] inline std::optional<int> int_var(const env_lookup& env, const std::string& name, long long lo, long long hi,
                                                std::string_view context, std::string_view expected) {
  auto v = env(name);
  if (!v) return std::nullopt;
  auto n = parse_integer(*v);
  if (!n) {
    throw config_error(std::string(context) + ": " + name + "='" + *v + "' is not an integer (expected " +
                       std::string(expected) + ")");
  }
  if (*n < lo || *n > hi) {
    throw config_error(std::string(context) + ": " + name + "=" + *v + " is out of range (expected " + std::string(expected) +
                       ")");
  }
  return static_cast<int>(*n);
}

[[nodiscard]] inline int require_int(const env_lookup& env, const std::string& name, long long lo, long long hi,
                                     std::string_view context, std::string_view expected, std::string_view how) {
  auto v = int_var(env, name, lo, hi, context, expected);
  if (!v) throw config_error(std::string(context) + ": " + name + " is not set (" + std::string(how) + ")");
  return *v;
}

// The first host of a Slurm hostlist: "node[03-05,9],gpu1" -> "node03".
[[nodiscard]] inline std::string first_slurm_host(std::string_view list) {
  const auto bracket = list.find('[');
  const auto comma = list.find(',');
  if (bracket == std::string_view::npos || (comma != std::string_view::npos && comma < bracket)) {
    return std::string(list.substr(0, comma));
  }
  const auto close = list.find(']', bracket);
  if (close == std::string_view::npos) return std::string(list.substr(0, bracket));
  auto range = list.substr(bracket + 1, close - bracket - 1);
  range = range.substr(0, std::min(range.find(','), range.find('-')));
  auto suffix = list.substr(close + 1);
  suffix = suffix.substr(0, suffix.find(','));
  return std::string(list.substr(0, bracket)) + std::string(range) + std::string(suffix);
}

// Tasks on node `node` from SLURM_STEP_TASKS_PER_NODE's "2(x3),1" form.
[[nodiscard]] inline std::optional<int> slurm_tasks_on_node(std::string_view spec, int node) {
  int seen = 0;
  while (!spec.empty()) {
    auto item = spec.substr(0, spec.find(','));
    spec.remove_prefix(std::min(spec.size(), item.size() + 1));
    int repeat = 1;
    if (auto paren = item.find("(x"); paren != std::string_view::npos && item.back() == ')') {
      auto r = parse_integer(item.substr(paren + 2, item.size() - paren - 3));
      if (!r || *r < 1) return std::nullopt;
      repeat = static_cast<int>(*r);
      item = item.substr(0, paren);
    }
    auto n = parse_integer(item);
    if (!n || *n < 1) return std::nullopt;
    if (node < seen + repeat) return static_cast<int>(*n);
    seen += repeat;
  }
  return std::nullopt;
}

inline void check_rank(std::string_view context, int rank, int world) {
  if (world < 1) {
    throw config_error(std::string(context) + ": world size must be at least 1, got " + std::to_string(world));
  }
  if (rank < 0 || rank >= world) {
    throw config_error(std::string(context) + ": rank " + std::to_string(rank) + " is out of range for world size " +
                       std::to_string(world) + " (expected 0 <= rank < world size)");
  }
}

}  // namespace detail::rdzv

// What the launch environment says about this process.
struct launch_env {
  // Who started it: "partrun", "torchrun", "env" (RANK and WORLD_SIZE set by hand or by another
  // tool), "slurm" (srun), "openmpi" (mpirun), "pmi"; empty when no launcher did.
  std::string launcher;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;

  [[nodiscard]] bool launched() const noexcept { return !launcher.empty(); }
  // "rank 1 of 2 (srun)".
  [[nodiscard]] std::string to_string() const {
    const std::string by = launcher == "slurm"   ? "srun"
                           : launcher == "openmpi" ? "mpirun"
                           : launcher == "env"     ? "RANK and WORLD_SIZE are set"
                                                   : launcher;
    return "rank " + std::to_string(rank) + " of " + std::to_string(world_size) + " (" + by + ")";
  }
};

// The variables detect_launch reads, for errors that say what was expected.
inline constexpr std::string_view launch_variables =
    "expected RANK and WORLD_SIZE as torchrun/partrun set them, or Slurm's SLURM_PROCID/SLURM_NTASKS, or Open MPI's "
    "OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE";

// The first launcher whose variables are present: RANK and WORLD_SIZE (partrun's and torchrun's,
// or a user's), then srun's, mpirun's, PMI's. Only one of RANK and WORLD_SIZE set is an error
// unless a batch system's variables give the rank (`WORLD_SIZE=2 srun -n 2 ...`); then they must
// agree. Malformed or out-of-range values are errors naming the variable.
[[nodiscard]] inline launch_env detect_launch(const env_lookup& env = process_env) {
  constexpr long long big = std::numeric_limits<int>::max();
  const std::string ctx = "env://";
  launch_env l;
  auto read = [&](const char* rank, const char* size, const char* local_rank, const char* local_size, const char* who) {
    l.world_size = detail::rdzv::require_int(env, size, 1, big, ctx, std::string(size) + " >= 1", launch_variables);
    l.rank = detail::rdzv::require_int(env, rank, 0, big, ctx, "0 <= " + std::string(rank) + " < " + size, launch_variables);
    detail::rdzv::check_rank(ctx + " (" + rank + ", " + size + ")", l.rank, l.world_size);
    l.launcher = who;
    auto lr = local_rank ? detail::rdzv::int_var(env, local_rank, 0, big, ctx, "a non-negative integer") : std::nullopt;
    auto lws = local_size ? detail::rdzv::int_var(env, local_size, 1, big, ctx, "a positive integer") : std::nullopt;
    // Without local variables assume one node (what mp.spawn-style single-node runs mean).
    l.local_rank = lr.value_or(l.rank);
    l.local_world_size = lws.value_or(lr ? l.local_rank + 1 : l.world_size);
    if (lr && !lws) l.local_world_size = std::max(l.local_world_size, l.local_rank + 1);
  };
  const bool rank_set = env("RANK").has_value(), size_set = env("WORLD_SIZE").has_value();
  if (rank_set && size_set) {
    const char* who = env("PARTRAIN_USE_AGENT_STORE").value_or("0") == "1"                       ? "partrun"
                      : env("TORCHELASTIC_RUN_ID") || env("TORCHELASTIC_USE_AGENT_STORE") ? "torchrun"
                                                                                            : "env";
    read("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", who);
  } else if (env("SLURM_PROCID")) {
    read("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr, "slurm");
    const int node = detail::rdzv::int_var(env, "SLURM_NODEID", 0, big, ctx, "a non-negative integer").value_or(0);
    std::optional<int> local;
    for (const char* v : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
      if (auto per = env(v); per && !local) local = detail::rdzv::slurm_tasks_on_node(*per, node);
    }
    if (auto per = env("SLURM_NTASKS_PER_NODE"); per && !local) local = detail::rdzv::slurm_tasks_on_node(*per, 0);
    if (local) l.local_world_size = *local;
  } else if (env("OMPI_COMM_WORLD_RANK")) {
    read("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
         "openmpi");
  } else if (env("PMI_RANK")) {
    read("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "pmi");
  } else if (rank_set || size_set) {
    throw config_error(ctx + ": " + (rank_set ? "WORLD_SIZE" : "RANK") + " is not set, but " +
                       (rank_set ? "RANK" : "WORLD_SIZE") + " is (" + std::string(launch_variables) + ")");
  } else {
    return l;
  }
  // RANK or WORLD_SIZE alone beside a batch system's rank: it must say the same.
  for (const auto& [var, set, value] : {std::tuple{"RANK", rank_set, l.rank}, std::tuple{"WORLD_SIZE", size_set, l.world_size}}) {
    if (!set) continue;
    const int said = detail::rdzv::require_int(env, var, 0, big, ctx, "a non-negative integer", launch_variables);
    if (said != value) {
      throw config_error(ctx + ": " + var + "=" + std::to_string(said) + " disagrees with " + l.to_string() + " (unset " +
                         var + ", or make it match the launcher's)");
    }
  }
  if (l.local_rank >= l.local_world_size) {
    throw config_error(ctx + ": local rank " + std::to_string(l.local_rank) + " is out of range for local world size " +
                       std::to_string(l.local_world_size) + " (expected 0 <= LOCAL_RANK < LOCAL_WORLD_SIZE)");
  }
  return l;
}

// The mpi backend under srun needs a PMI plugin to tell MPI its rank: without one (no --mpi=pmix)
// each task would start as an MPI job of one, or abort with Open MPI's "not built with SLURM's
// PMI support", which misleads. Refused first, saying what to add.
inline void check_mpi_launch(const env_lookup& env = process_env) {
  const launch_env l = detect_launch(env);
  if (l.launcher != "slurm" || l.world_size < 2) return;
  for (const char* v : {"PMIX_RANK", "PMI_RANK", "PMI_FD", "OMPI_COMM_WORLD_RANK"}) {
    if (env(v)) return;
  }
  throw config_error("backend 'mpi': this process is " + l.to_string() +
                     " but srun started it without a PMI plugin, so MPI cannot learn its rank; run `srun --mpi=pmix "
                     "...` (or set MpiDefault=pmix in slurm.conf), or use the gloo backend under plain srun");
}

}  // namespace partrain::inline v0
