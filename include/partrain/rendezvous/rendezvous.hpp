// partrain/rendezvous/rendezvous.hpp: where a job's processes meet, as torch.distributed's
// rendezvous handlers: a URL and the environment give rank, world size and a store.
//   env://           MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE (+ LOCAL_RANK, LOCAL_WORLD_SIZE),
//                    as torchrun and partrun set them; else Slurm's (SLURM_PROCID, SLURM_NTASKS,
//                    SLURM_LOCALID, ...), Open MPI's (OMPI_COMM_WORLD_*) or PMI's (PMI_RANK, PMI_SIZE)
//   tcp://host:port  rank and world size from the options (or ?rank=R&world_size=N)
//   file://path      a file_store at path; rank and world size as for tcp://
// Rank 0 hosts the TCP store (bound to the master address) unless PARTRAIN_USE_AGENT_STORE=1
// says a launcher (partrun) hosts it, or TORCHELASTIC_USE_AGENT_STORE=True that torchrun's agent
// hosts a PyTorch TCPStore (rendezvous/torch_store.hpp is its client); then every rank is a
// client and keys live under the attempt's prefix (PARTRAIN_RESTART_COUNT, else
// TORCHELASTIC_RESTART_COUNT), so a restarted group never reads the last attempt's keys.
// The parsing is separate (parse_rendezvous, rendezvous_from_env) for launchers and examples;
// init_process_group (rendezvous/init.hpp) is this plus a backend.
#pragma once

#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <partrain/comm/process_group.hpp>
#include <partrain/comm/store.hpp>
#include <partrain/core/device.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/log.hpp>
#include <partrain/rendezvous/file_store.hpp>
#include <partrain/rendezvous/init_options.hpp>
#include <partrain/rendezvous/launcher.hpp>
#include <partrain/rendezvous/prefix_store.hpp>
#include <partrain/rendezvous/tcp_store.hpp>
#include <partrain/rendezvous/torch_store.hpp>

namespace partrain::inline v0 {

namespace detail::rdzv {

// "host:port" or "[v6]:port" -> (host, port); the URL's query is already cut off.
inline void parse_host_port(std::string_view url, std::string_view hp, std::string& host, std::uint16_t& port) {
  const std::string expected = " (expected tcp://host:port, e.g. tcp://10.0.0.1:29500 or tcp://[::1]:29500)";
  std::string_view port_text;
  if (hp.starts_with('[')) {
    const auto close = hp.find(']');
    if (close == std::string_view::npos || close + 1 >= hp.size() || hp[close + 1] != ':') {
      throw config_error("malformed URL '" + std::string(url) + "': bad IPv6 address" + expected);
    }
    host = std::string(hp.substr(1, close - 1));
    port_text = hp.substr(close + 2);
  } else {
    const auto colon = hp.rfind(':');
    if (colon == std::string_view::npos) throw config_error("malformed URL '" + std::string(url) + "': no port" + expected);
    host = std::string(hp.substr(0, colon));
    port_text = hp.substr(colon + 1);
  }
  if (host.empty()) throw config_error("malformed URL '" + std::string(url) + "': empty host" + expected);
  auto p = parse_integer(port_text);
  if (!p || *p < 1 || *p > 65535) {
    throw config_error("malformed URL '" + std::string(url) + "': port '" + std::string(port_text) +
                       "' is not in 1..65535" + expected);
  }
  port = static_cast<std::uint16_t>(*p);
}

// "?rank=1&world_size=4" into info (only those two keys are known).
inline void parse_query(std::string_view url, std::string_view query, int& rank, int& world) {
  while (!query.empty()) {
    auto item = query.substr(0, query.find('&'));
    query.remove_prefix(std::min(query.size(), item.size() + 1));
    const auto eq = item.find('=');
    const auto key = item.substr(0, eq);
    // value_or keeps GCC 12 at -O3 from a false "may be used uninitialized" on the optional.
    const long long value =
        eq == std::string_view::npos ? -1 : parse_integer(item.substr(eq + 1)).value_or(-1);
    if ((key != "rank" && key != "world_size") || value < 0 || value > std::numeric_limits<int>::max()) {
      throw config_error("malformed URL '" + std::string(url) + "': bad query item '" + std::string(item) +
                         "' (expected rank=<int> and/or world_size=<int>)");
    }
    (key == "rank" ? rank : world) = static_cast<int>(value);
  }
}


// The rank variables of env://: detect_launch's (rendezvous/launcher.hpp), or a clear error when
// no launcher set any.
inline void read_rank_env(rendezvous_info& info, const env_lookup& env) {
  const launch_env l = detect_launch(env);
  if (!l.launched()) throw config_error("env://: RANK is not set (" + std::string(launch_variables) + ")");
  info.rank = l.rank;
  info.world_size = l.world_size;
  info.local_rank = l.local_rank;
  info.local_world_size = l.local_world_size;
  info.source = l.launcher;
}

}  // namespace detail::rdzv

namespace detail::rdzv {

// A job identity a batch system gives every rank of one job (and no rank of another): the token
// when the launcher set none. Empty when there is none.
[[nodiscard]] inline std::string launcher_job_id(const env_lookup& env) {
  if (auto job = env("SLURM_JOB_ID")) return "slurm-" + *job + "." + env("SLURM_STEP_ID").value_or("0");
  for (const char* v : {"OMPI_MCA_ess_base_jobid", "OMPI_MCA_orte_ess_jobid"}) {
    if (auto job = env(v)) return "ompi-" + *job;
  }
  if (auto job = env("PMIX_NAMESPACE")) return "pmix-" + *job;
  if (auto run = env("TORCHELASTIC_RUN_ID"); run && *run != "none") return "torchelastic-" + *run;
  return {};
}

// The token a rank presents to its store when neither init_options::token nor
// PARTRAIN_STORE_TOKEN gave one: the batch system's job id (empty when there is none;
// connect_store then refuses a job of several ranks over env://).
inline void default_job_token(rendezvous_info& info, const env_lookup& env) {
  if (!info.token.empty() || info.agent_store || info.scheme == "file") return;
  info.token = launcher_job_id(env);
}

// Two env:// jobs on one MASTER_PORT whose ranks share no identity would merge: job B's rank 1
// joins job A's rank 0, and both train together. Nothing in the environment tells them apart
// (same address, same port), so a job of several ranks without one does not start.
inline void refuse_anonymous_job(const rendezvous_info& info) {
  if (info.scheme != "env" || info.world_size < 2 || !info.token.empty() || info.agent_store) return;
  throw config_error("env://: rank " + std::to_string(info.rank) + " of " + std::to_string(info.world_size) +
                     " (" + (info.source == "env" ? std::string("RANK and WORLD_SIZE set by hand")
                                                 : "from " + info.source) +
                     ") has no job identity, so another job started on MASTER_PORT " + std::to_string(info.port) +
                     " could join it; set PARTRAIN_STORE_TOKEN to the same random value on every rank of this job "
                     "(e.g. PARTRAIN_STORE_TOKEN=$(od -An -N8 -tx8 /dev/urandom | tr -d ' ')), or start it with "
                     "partrun, torchrun, srun or mpirun, whose job ids serve");
}

// init_options::timeout, else PARTRAIN_TIMEOUT_MS, else `fallback`.
[[nodiscard]] inline std::chrono::milliseconds timeout_option(const init_options& opts, const env_lookup& env,
                                                              std::chrono::milliseconds fallback) {
  if (opts.timeout) {
    if (opts.timeout->count() <= 0) {
      throw config_error("init_process_group: timeout must be positive, got " + std::to_string(opts.timeout->count()) + " ms");
    }
    return *opts.timeout;
  }
  // At least a second: no rendezvous completes faster, and a shorter bound only turns a healthy
  // start into "cannot connect to the store".
  if (auto t = int_var(env, "PARTRAIN_TIMEOUT_MS", 1000, std::numeric_limits<int>::max(), "init_process_group",
                       "milliseconds, at least 1000")) {
    return std::chrono::milliseconds(*t);
  }
  return fallback;
}

}  // namespace detail::rdzv

// Parses url and the environment; connects nothing. Throws config_error naming what is
// wrong and what was expected.
[[nodiscard]] inline rendezvous_info parse_rendezvous(std::string_view url, const init_options& opts = {},
                                                      const env_lookup& env = process_env) {
  rendezvous_info info;
  constexpr long long big = std::numeric_limits<int>::max();
  const auto sep = url.find("://");
  if (sep == std::string_view::npos) {
    throw config_error("malformed URL '" + std::string(url) + "' (expected env://, tcp://host:port or file://path)");
  }
  info.scheme = std::string(url.substr(0, sep));
  std::string_view rest = url.substr(sep + 3);

  // Timeout and token: options, then the environment.
  info.timeout = detail::rdzv::timeout_option(opts, env, info.timeout);
  info.token = !opts.token.empty() ? opts.token : env("PARTRAIN_STORE_TOKEN").value_or("");
  info.bind_address = env("PARTRAIN_STORE_BIND").value_or("");
  info.agent_store = env("PARTRAIN_USE_AGENT_STORE").value_or("0") == "1";
  // torchrun's agent hosts a PyTorch TCPStore on MASTER_ADDR:MASTER_PORT and says so with the
  // Python string "True" (as torch's own _create_c10d_store reads it); partrun's flag wins.
  if (!info.agent_store && env("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True") {
    info.agent_store = info.torch_agent_store = true;
  }
  const char* restarts = env("PARTRAIN_RESTART_COUNT") ? "PARTRAIN_RESTART_COUNT" : "TORCHELASTIC_RESTART_COUNT";
  info.restart_count =
      detail::rdzv::int_var(env, restarts, 0, big, "init_process_group", "a non-negative integer").value_or(0);

  if (info.scheme == "env") {
    if (!rest.empty()) {
      throw config_error("malformed URL '" + std::string(url) + "': env:// takes nothing after '//' (the environment says it all)");
    }
    detail::rdzv::read_rank_env(info, env);
    if (opts.rank >= 0 && opts.rank != info.rank) {
      throw config_error("env://: options.rank " + std::to_string(opts.rank) + " disagrees with the environment's rank " +
                         std::to_string(info.rank));
    }
    if (opts.world_size >= 0 && opts.world_size != info.world_size) {
      throw config_error("env://: options.world_size " + std::to_string(opts.world_size) +
                         " disagrees with the environment's world size " + std::to_string(info.world_size));
    }
    auto addr = env("MASTER_ADDR");
    if (!addr && info.source == "slurm") {
      if (auto nodes = env("SLURM_STEP_NODELIST") ? env("SLURM_STEP_NODELIST") : env("SLURM_JOB_NODELIST")) {
        addr = detail::rdzv::first_slurm_host(*nodes);
      }
    }
    if (!addr && info.source == "openmpi" && info.local_world_size == info.world_size) {
      addr = "127.0.0.1";  // mpirun on one host: every rank is here
    }
    if (!addr || addr->empty()) {
      throw config_error("env://: MASTER_ADDR is not set (expected the address or host name of the rank 0 host, e.g. "
                         "MASTER_ADDR=127.0.0.1 on one machine)");
    }
    info.master_addr = *addr;
    auto port = detail::rdzv::int_var(env, "MASTER_PORT", 0, 65535, "env://", "a port number in 1..65535");
    if (!port && info.source == "slurm") {
      // Every rank of the job derives the same port from the job id (torch users usually
      // compute one this way in their sbatch script).
      if (auto job = detail::rdzv::int_var(env, "SLURM_JOB_ID", 0, big, "env://", "an integer")) port = 20000 + *job % 20000;
    }
    if (!port && info.source == "openmpi") {  // likewise from Open MPI's job id
      if (auto job = detail::rdzv::parse_integer(env("OMPI_MCA_ess_base_jobid").value_or("")); job && *job >= 0) {
        port = static_cast<int>(20000 + *job % 20000);
      }
    }
    if (!port) {
      throw config_error("env://: MASTER_PORT is not set (expected a free TCP port on the master, e.g. MASTER_PORT=29500)");
    }
    if (*port == 0 && (info.world_size > 1 || info.agent_store)) {
      throw config_error("env://: MASTER_PORT=0 only works for a world of one rank (expected 1..65535)");
    }
    info.port = static_cast<std::uint16_t>(*port);
  } else if (info.scheme == "tcp" || info.scheme == "file") {
    const auto q = rest.find('?');
    int rank = -1, world = -1;
    if (q != std::string_view::npos) detail::rdzv::parse_query(url, rest.substr(q + 1), rank, world);
    rest = rest.substr(0, q);
    if (info.scheme == "tcp") {
      detail::rdzv::parse_host_port(url, rest, info.master_addr, info.port);
    } else {
      if (rest.empty()) {
        throw config_error("malformed URL '" + std::string(url) + "': empty path (expected file:///path/on/a/shared/filesystem)");
      }
      info.path = std::string(rest);
    }
    auto pick = [&](int from_opts, int from_url, const char* what) {
      if (from_opts >= 0 && from_url >= 0 && from_opts != from_url) {
        throw config_error(info.scheme + "://: options." + what + " " + std::to_string(from_opts) + " disagrees with the URL's " +
                           std::to_string(from_url));
      }
      const int v = from_opts >= 0 ? from_opts : from_url;
      if (v < 0) {
        throw config_error(info.scheme + "://: " + what + " is not given (expected init_options::" + what + " or ?" + what +
                           "=N in the URL)");
      }
      return v;
    };
    info.world_size = pick(opts.world_size, world, "world_size");
    info.rank = pick(opts.rank, rank, "rank");
    detail::rdzv::check_rank(info.scheme + "://", info.rank, info.world_size);
    info.source = opts.rank >= 0 ? "options" : "url";
    info.local_rank = detail::rdzv::int_var(env, "LOCAL_RANK", 0, big, info.scheme + "://", "a non-negative integer").value_or(info.rank);
    info.local_world_size =
        detail::rdzv::int_var(env, "LOCAL_WORLD_SIZE", 1, big, info.scheme + "://", "a positive integer").value_or(info.world_size);
    if (info.local_rank >= info.local_world_size) {
      throw config_error(info.scheme + "://: local rank " + std::to_string(info.local_rank) + " is out of range for local world size " +
                         std::to_string(info.local_world_size));
    }
  } else {
    throw config_error("malformed URL '" + std::string(url) + "': unknown scheme '" + info.scheme +
                       "' (expected env://, tcp://host:port or file://path)");
  }
  detail::rdzv::default_job_token(info, env);
  return info;
}

// The environment's rendezvous (what torchrun, partrun, Slurm or mpirun set).
[[nodiscard]] inline rendezvous_info rendezvous_from_env(const init_options& opts = {}) {
  return parse_rendezvous("env://", opts, process_env);
}

namespace detail::rdzv {

// A connection to the job's store: rank 0's hosts the TCP server when `host` (unless a
// launcher's agent does), the others connect with retries until the timeout; or the file store.
// `port`, when given, receives the TCP port (the one the server bound when rank 0 asked for 0).
// Where a launcher's agent store keeps attempt N's keys (torchrun's layout, partrun's too): the
// prefix of a prefix_store, which joins it to each key with '/'.
[[nodiscard]] inline std::string agent_attempt_prefix(int attempt) { return "/worker/attempt_" + std::to_string(attempt); }

[[nodiscard]] inline std::shared_ptr<store> open_store(const rendezvous_info& info, bool host,
                                                      std::chrono::milliseconds timeout, const std::string& who,
                                                      std::uint16_t* port = nullptr) {
  std::shared_ptr<store> s;
  if (info.scheme == "file") {
    s = std::make_shared<file_store>(info.path, timeout, who, info.rank);
  } else if (info.torch_agent_store) {
    s = std::make_shared<torch_tcp_store>(
        torch_store_options{.host = info.master_addr, .port = info.port, .timeout = timeout, .who = who, .rank = info.rank});
  } else {
    tcp_store_options o;
    o.host = info.master_addr;
    o.port = info.port;
    o.is_server = host && info.rank == 0 && !info.agent_store;
    o.bind_address = info.bind_address;
    o.token = info.token;
    o.timeout = timeout;
    o.who = who;
    o.rank = info.rank;
    auto tcp = std::make_shared<tcp_store>(o);
    if (port) *port = tcp->port();
    s = std::move(tcp);
  }
  if (info.agent_store) {
    s = std::make_shared<prefix_store>(agent_attempt_prefix(info.restart_count), std::move(s));
  }
  return s;
}

}  // namespace detail::rdzv

// Creates info.store: rank 0 hosts the TCP server (unless a launcher's agent does), the
// others connect to it with retries until the timeout; or opens the file store.
inline void connect_store(rendezvous_info& info) {
  detail::rdzv::refuse_anonymous_job(info);
  info.store = detail::rdzv::open_store(info, true, info.timeout, "rank " + std::to_string(info.rank), &info.port);
}

// parse_rendezvous + connect_store.
[[nodiscard]] inline rendezvous_info rendezvous(std::string_view url, const init_options& opts = {},
                                                const env_lookup& env = process_env) {
  auto info = parse_rendezvous(url, opts, env);
  connect_store(info);
  // Log lines carry the rank from here on (the process's latest: threads that each join as a rank
  // of their own share one prefix, so the lines below also name the rank in their text).
  set_log_rank(info.rank);
  PARTRAIN_LOG(debug, "rank " + std::to_string(info.rank) + " of " + std::to_string(info.world_size) + ": " +
                          info.scheme + ":// rendezvous done, store " +
                          (info.scheme == "file" ? "file " + info.path
                                                 : info.master_addr + ":" + std::to_string(info.port) + " hosted by " +
                                                       (info.agent_store || info.torch_agent_store
                                                            ? std::string("the launcher's agent")
                                                            : std::string("rank 0"))));
  return info;
}

namespace detail::rdzv {

// The store dies with init_process_group's rendezvous_info; when rank 0 hosts it, rank 0 must
// not close it while a peer may still be using it. Each other rank reports that it is done with
// the store (its last store call), and rank 0 leaves only after all have.
inline void release_store_host(const rendezvous_info& info) {
  if (info.world_size == 1 || info.agent_store || info.scheme == "file") return;
  if (info.rank != 0) {
    if (info.store->add("partrain/init/done", 1) == info.world_size - 1) info.store->set("partrain/init/all_done", "1");
    return;
  }
  try {
    info.store->wait({"partrain/init/all_done"}, info.timeout);
  } catch (const timeout_error&) {
    throw timeout_error({.rank = 0, .operation = "init_process_group", .timeout = info.timeout},
                        "not every rank finished initialising within " + std::to_string(info.timeout.count()) +
                            " ms (" + std::to_string(info.store->add("partrain/init/done", 0)) + " of " +
                            std::to_string(info.world_size - 1) + " other ranks did)");
  }
}

}  // namespace detail::rdzv

}  // namespace partrain::inline v0
