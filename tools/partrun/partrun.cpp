// partrun: launches, supervises and restarts a distributed job, like torchrun.
// The agent on node 0 hosts the job's rendezvous store (token-protected); every agent starts
// its local ranks with the torchrun variables, prefixes their output with the rank, and when a
// rank fails stops every rank of the job (on all nodes) and restarts while restarts remain.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <partrain/launch/process.hpp>
#include <partrain/parallel/detail/replica_protocol.hpp>
#include <partrain/parallel/lighthouse.hpp>
#include <partrain/rendezvous/job.hpp>
#include <partrain/rendezvous/prefix_store.hpp>
#include <partrain/rendezvous/tcp_store.hpp>

#include "options.hpp"

extern char** environ;

namespace {

std::atomic<bool> g_stop{false};
volatile std::sig_atomic_t g_signal = 0;
// A --tee log could not be written (a full disk, a folder in its place): the job goes on, its
// output still reaches the terminal, but partrun's exit status says so.
std::atomic<bool> g_tee_failed{false};

extern "C" void on_signal(int sig) {
  g_signal = sig;
  g_stop.store(true);
}

void install_signal_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
}


void log(const std::string& line) {
  std::fprintf(stderr, "partrun: %s\n", line.c_str());
  std::fflush(stderr);
}

// A rank's output line on partrun's stdout, prefixed with the rank (the caller holds `out_mutex`,
// which keeps the ranks' lines whole).
void print_rank_line(int rank, std::string_view line) {
  std::printf("[rank %d] %.*s\n", rank, static_cast<int>(line.size()), line.data());
  std::fflush(stdout);
}

// How long another node's agent may be silent (its beats in the store, or the store's answers when
// it is node 0, which hosts the store) before this agent takes it for lost.
std::chrono::milliseconds agent_silence_of(const partrun::options& o) {
  return std::max<std::chrono::milliseconds>(std::chrono::seconds(5), 10 * o.monitor_interval);
}

std::string key(int attempt, const std::string& rest) { return "partrun/attempt_" + std::to_string(attempt) + "/" + rest; }

// The environment of every rank: ours, with the torchrun variables set on top.
std::vector<std::string> child_env(const partrun::options& o, int rank, int local_rank, int world_size, int attempt,
                                   std::uint16_t port, const std::string& token,
                                   const std::vector<std::pair<std::string, std::string>>& extra = {}) {
  std::vector<std::pair<std::string, std::string>> ours = {
      {"RANK", std::to_string(rank)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"WORLD_SIZE", std::to_string(world_size)},
      {"LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node)},
      {"GROUP_RANK", std::to_string(o.node_rank)},
      {"GROUP_WORLD_SIZE", std::to_string(o.nnodes)},
      {"ROLE_RANK", std::to_string(rank)},
      {"ROLE_WORLD_SIZE", std::to_string(world_size)},
      {"MASTER_ADDR", o.master_addr},
      {"MASTER_PORT", std::to_string(port)},
      {"PARTRAIN_RESTART_COUNT", std::to_string(attempt)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(attempt)},
      {"PARTRAIN_MAX_RESTARTS", std::to_string(o.max_restarts)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(o.max_restarts)},
      // Ranks are clients of the agent's store; init_process_group keys each attempt apart
      // by PARTRAIN_RESTART_COUNT.
      {"PARTRAIN_USE_AGENT_STORE", "1"},
      {"PARTRAIN_STORE_TOKEN", token},
  };
  for (const auto& [k, v] : extra) {
    auto same = std::ranges::find(ours, k, &std::pair<std::string, std::string>::first);
    if (same != ours.end()) {
      same->second = v;
    } else {
      ours.emplace_back(k, v);
    }
  }
  std::vector<std::string> env;
  bool omp_set = false;
  for (char** e = environ; *e; ++e) {
    std::string_view kv(*e);
    const auto name = kv.substr(0, kv.find('='));
    if (name == "OMP_NUM_THREADS") omp_set = true;
    bool replaced = false;
    for (const auto& [k, v] : ours) replaced |= (name == k);
    if (!replaced) env.emplace_back(kv);
  }
  for (const auto& [k, v] : ours) env.push_back(k + "=" + v);
  // As torchrun: several ranks on a node each get one OpenMP thread unless told otherwise.
  if (!omp_set && o.nproc_per_node > 1) env.emplace_back("OMP_NUM_THREADS=1");
  return env;
}

struct node_layout {
  int world_size = 0;
  int first_rank = 0;  // global rank of this node's local rank 0
};

// Every agent claims its node rank, announces its process count and --nnodes, and waits for all
// nodes (bounded by --rdzv-timeout). Disagreements (two agents with one --node-rank, different
// --nnodes) are refused at once on every node, naming both sides, instead of surfacing later as
// a collective timeout that names only a store key.
node_layout rendezvous(partrain::tcp_store& store, const partrun::options& o, int attempt) {
  const std::string me = "node " + std::to_string(o.node_rank);
  const std::string refused_key = key(attempt, "rdzv_refused");
  const std::string agents_key = key(attempt, "rdzv_agents");       // agents that came
  const std::string informed_key = key(attempt, "rdzv_informed");   // agents that read the refusal
  // Node 0 hosts the store: after a refusal it stays until every other agent that came has read
  // why (bounded), so none of them meets a closed store instead of the reason.
  auto linger_if_host = [&] {
    if (o.node_rank != 0) return;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    try {
      while (store.add(informed_key, 0) < store.add(agents_key, 0) - 1 && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    } catch (const std::exception&) {
    }
  };
  auto refuse = [&](const std::string& why) {
    try {
      store.set(refused_key, why);
      if (o.node_rank != 0) store.add(informed_key, 1);  // it knows why
    } catch (const std::exception&) {
    }
    linger_if_host();
    throw partrain::config_error(why);
  };
  auto node_key = [&](int n) { return key(attempt, "node_" + std::to_string(n)); };
  store.add(agents_key, 1);
  if (store.add(key(attempt, "claim_node_" + std::to_string(o.node_rank)), 1) != 1) {
    refuse(me + " was claimed by two agents: every agent needs its own --node-rank (0.." + std::to_string(o.nnodes - 1) + ")");
  }
  store.set(node_key(o.node_rank), std::to_string(o.nproc_per_node) + " " + std::to_string(o.nnodes));
  // A node's announcement: its process count and its --nnodes.
  auto announced = [&](int n) {
    const auto v = store.get_string(node_key(n), o.rdzv_timeout);
    int np = 0, nn = 0;
    if (std::sscanf(v.c_str(), "%d %d", &np, &nn) != 2) refuse("node " + std::to_string(n) + " announced '" + v + "'");
    return std::pair{np, nn};
  };
  std::vector<bool> seen(static_cast<std::size_t>(o.nnodes), false);
  const auto deadline = std::chrono::steady_clock::now() + o.rdzv_timeout;
  for (;;) {
    if (store.check({refused_key})) {
      const std::string why = store.get_string(refused_key, o.rdzv_timeout);
      if (o.node_rank != 0) store.add(informed_key, 1);  // the host waits for the others only
      linger_if_host();
      throw partrain::config_error(me + " stops: " + why);
    }
    int missing_count = 0;
    std::string missing;
    for (int n = 0; n < o.nnodes; ++n) {
      if (seen[static_cast<std::size_t>(n)]) continue;
      if (!store.check({node_key(n)})) {
        ++missing_count;
        missing += (missing.empty() ? "" : ", ") + std::to_string(n);
        continue;
      }
      seen[static_cast<std::size_t>(n)] = true;
      if (const int nn = announced(n).second; nn != o.nnodes) {
        refuse("node " + std::to_string(n) + " was started with --nnodes " + std::to_string(nn) + ", but " + me +
               " with --nnodes " + std::to_string(o.nnodes) + ": give every agent the same --nnodes");
      }
    }
    // A node beyond our --nnodes (started with a larger one) joins under a rank we never wait for.
    if (store.check({node_key(o.nnodes)})) {
      refuse("node " + std::to_string(o.nnodes) + " joined with --nnodes " + std::to_string(announced(o.nnodes).second) +
             ", but " + me + " was started with --nnodes " + std::to_string(o.nnodes) + ": give every agent the same --nnodes");
    }
    if (missing_count == 0) break;
    if (std::chrono::steady_clock::now() >= deadline || g_stop.load()) {
      throw partrain::timeout_error(me + " rendezvous: node(s) " + missing + " never joined within " +
                                    std::to_string(o.rdzv_timeout.count() / 1000) +
                                    " s (check --nnodes, --master-addr/--master-port and that every node was started)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  node_layout l;
  for (int n = 0; n < o.nnodes; ++n) {
    const int np = announced(n).first;
    if (n < o.node_rank) l.first_rank += np;
    l.world_size += np;
  }
  return l;
}

enum class attempt_result { success, failed, interrupted };

// watch_store is a second connection for the watcher thread, so a call that blocks on one
// (the main thread's, or a reconnect to a vanished store) never holds up the other.
attempt_result run_attempt(partrain::tcp_store& store, partrain::tcp_store& watch_store, const partrun::options& o,
                           int attempt, std::uint16_t port, const std::string& token) {
  node_layout layout;
  try {
    layout = rendezvous(store, o, attempt);
  } catch (const partrain::timeout_error&) {
    throw;  // a node that never came: rendezvous names it
  } catch (const partrain::communication_error& e) {
    if (o.node_rank == 0) throw;
    // The store is node 0's: when it breaks off, node 0 is what ended (or refused the job).
    throw partrain::communication_error("node " + std::to_string(o.node_rank) +
                                        " rendezvous: node 0, which hosts the job's store, is unreachable (it ended or "
                                        "refused the job; see its output): " + e.what());
  }
  std::mutex out_mutex;
  std::vector<partrain::child_process> children;
  children.reserve(static_cast<std::size_t>(o.nproc_per_node));
  // Every --tee log is opened before any rank starts: one that cannot be (a folder in its place,
  // no permission) stops the job here, naming it, instead of leaving an empty file behind.
  std::vector<std::shared_ptr<std::ofstream>> tees(static_cast<std::size_t>(o.nproc_per_node));
  const auto tee_dir = o.log_dir / ("attempt_" + std::to_string(attempt));
  if (o.tee) {
    std::error_code ec;
    std::filesystem::create_directories(tee_dir, ec);
    if (ec) throw partrain::config_error("partrun: --tee: cannot create the log folder " + tee_dir.string() + ": " + ec.message());
    for (int l = 0; l < o.nproc_per_node; ++l) {
      const auto path = tee_dir / ("rank_" + std::to_string(layout.first_rank + l) + ".log");
      auto f = std::make_shared<std::ofstream>(path);
      if (!*f) {
        const int err = errno;
        throw partrain::config_error("partrun: --tee: cannot write rank " + std::to_string(layout.first_rank + l) +
                                     "'s log " + path.string() + ": " +
                                     (std::filesystem::is_directory(path) ? std::string("it is a folder")
                                                                          : std::string(std::strerror(err))));
      }
      tees[static_cast<std::size_t>(l)] = std::move(f);
    }
  }
  for (int l = 0; l < o.nproc_per_node; ++l) {
    const int rank = layout.first_rank + l;
    std::shared_ptr<std::ofstream> tee = tees[static_cast<std::size_t>(l)];
    partrain::child_options co;
    co.capture_output = true;
    co.keep_lines = 10;
    co.on_line = [rank, tee, &out_mutex, path = tee_dir / ("rank_" + std::to_string(rank) + ".log")](std::string_view line) {
      std::lock_guard lock(out_mutex);
      print_rank_line(rank, line);
      if (!tee || !*tee) return;  // a log that failed once is reported once
      errno = 0;
      *tee << line << '\n' << std::flush;
      if (!*tee) {
        const int err = errno;
        g_tee_failed = true;
        log("--tee: writing rank " + std::to_string(rank) + "'s log " + path.string() + " failed (" +
            (err ? std::string(std::strerror(err)) : std::string("write error")) +
            "); its output goes on to this terminal only, and partrun will exit with status 1");
      }
    };
    children.push_back(partrain::child_process::exec(
        o.program, o.args, child_env(o, rank, l, layout.world_size, attempt, port, token), std::move(co)));
  }

  // Another node's failure (or the end of the whole job) reaches us through the store, and so
  // does the life of the other agents: each beats a counter there for as long as it runs (through
  // the outcome's wait below), so an agent killed, stopped or lost before it reported is noticed
  // in seconds, not waited for forever.
  const std::string failed_key = key(attempt, "failed");
  std::atomic<bool> remote_failure{false};
  std::atomic<bool> stop{false};
  std::atomic<bool> awaiting_outcome{false};
  std::mutex silent_mutex;
  std::string silent_node;  // why another agent is taken for lost; empty while none is
  const auto agent_silence = agent_silence_of(o);
  auto agent_key = [&](int n) { return key(attempt, "agent_" + std::to_string(n)); };
  auto done_key = [&](int n) { return key(attempt, "done_" + std::to_string(n)); };
  std::jthread watcher([&](std::stop_token st) {
    std::uint64_t beats = 0;
    const auto started = std::chrono::steady_clock::now();
    std::vector<std::pair<std::string, std::chrono::steady_clock::time_point>> seen(
        static_cast<std::size_t>(o.nnodes), {std::string(), started});
    while (!st.stop_requested()) {
      if (g_stop.load()) stop = true;
      try {
        if (o.nnodes > 1) {
          watch_store.set(agent_key(o.node_rank), std::to_string(++beats));
          if (watch_store.check({failed_key})) {
            remote_failure = true;
            stop = true;
          }
          const auto now = std::chrono::steady_clock::now();
          // While ranks run, their own failures (and their heartbeats) tell of a lost node; once
          // they finished, only the agents' beats can.
          for (int n = 0; n < o.nnodes && awaiting_outcome.load(); ++n) {
            if (n == o.node_rank || watch_store.check({done_key(n)})) continue;
            const std::string v = watch_store.check({agent_key(n)}) ? watch_store.get_string(agent_key(n), o.rdzv_timeout) : "";
            auto& [last, since] = seen[static_cast<std::size_t>(n)];
            if (v != last) {
              last = v;
              since = now;
            } else if (now - since > agent_silence) {
              std::lock_guard lock(silent_mutex);
              if (silent_node.empty()) {
                silent_node = "node " + std::to_string(n) + "'s agent has been silent for " +
                              std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(now - since).count()) +
                              " ms before reporting its ranks' outcome (killed, stopped or lost; noticed by node " +
                              std::to_string(o.node_rank) + ")";
              }
              remote_failure = true;
              stop = true;
            }
          }
        }
      } catch (const std::exception&) {
        remote_failure = true;  // the store (node 0) is gone: the job cannot go on
        stop = true;
      }
      std::this_thread::sleep_for(o.monitor_interval);
    }
  });
  auto silent = [&] {
    std::lock_guard lock(silent_mutex);
    return silent_node;
  };
  // A lost agent's failure, told to the other nodes as any failure is.
  auto report_silent = [&](const std::string& why) {
    log("node " + std::to_string(o.node_rank) + ": " + why);
    try {
      store.set(failed_key, "node " + std::to_string(o.node_rank) + ": " + why);
    } catch (const std::exception&) {
    }
  };

  partrain::supervise_options so;
  so.grace = o.grace;
  so.poll_interval = o.monitor_interval;
  so.stop = &stop;
  // A rank that ends, even with status 0, before it joined the job's rendezvous leaves the others
  // waiting there for the whole rendezvous timeout: partrun saw it end, so it tells them through
  // the key init_process_group's join check (rendezvous/job.hpp) watches, under the ranks' prefix.
  so.on_exit = [&](std::size_t i, const partrain::exit_status& st) {
    if (!st.ok()) return;  // a failure stops the whole job anyway
    const int rank = layout.first_rank + static_cast<int>(i);
    const std::string ranks_prefix = partrain::detail::rdzv::agent_attempt_prefix(attempt) + "/";
    try {
      if (store.check({ranks_prefix + partrain::detail::rdzv::join_claim_key(rank)})) return;  // it had joined
      const std::string why = "rank " + std::to_string(rank) + " (local rank " + std::to_string(i) + " on node " +
                              std::to_string(o.node_rank) + ", pid " + std::to_string(children[i].pid()) + ") " +
                              st.describe() + " before it joined the job's rendezvous (partrun saw it end); the job "
                              "cannot form without it";
      store.set(ranks_prefix + std::string(partrain::detail::rdzv::join_failed_key), why);
      log(why);
    } catch (const std::exception&) {
    }
  };
  auto outcome = partrain::supervise(children, so);

  if (outcome.ok()) {
    if (o.nnodes == 1) return attempt_result::success;
    // Every node waits for the job's outcome: a node whose ranks finished must still restart
    // with the others if another node fails. Node 0 hosts the store, so it announces success
    // only when all nodes are done and leaves only after every node has read it. The watcher
    // goes on beating meanwhile, and names an agent that stops before it reported.
    store.set(done_key(o.node_rank), "1");
    store.add(key(attempt, "done"), 1);
    awaiting_outcome = true;
    const std::string success_key = key(attempt, "success");
    for (;;) {
      if (store.check({failed_key})) break;
      if (const auto why = silent(); !why.empty()) {
        report_silent(why);
        return attempt_result::failed;
      }
      if (o.node_rank == 0) {
        if (store.add(key(attempt, "done"), 0) >= o.nnodes) {
          store.set(success_key, "1");
          const auto until = std::chrono::steady_clock::now() + o.rdzv_timeout;
          while (store.add(key(attempt, "acked"), 0) < o.nnodes - 1 && std::chrono::steady_clock::now() < until &&
                 !g_stop.load()) {
            std::this_thread::sleep_for(o.monitor_interval);
          }
          return attempt_result::success;
        }
      } else if (store.check({success_key})) {
        store.add(key(attempt, "acked"), 1);
        return attempt_result::success;
      }
      if (g_stop.load()) return attempt_result::interrupted;
      std::this_thread::sleep_for(o.monitor_interval);
    }
    log("node " + std::to_string(o.node_rank) + ": another node failed: " + store.get_string(failed_key, o.rdzv_timeout));
    return attempt_result::failed;
  }
  watcher.request_stop();
  watcher.join();
  if (outcome.how == partrain::supervise_outcome::result::failed) {
    // Report every rank that ended on its own: the one noticed first is not always the cause
    // (a rank that exits makes its peers' collectives fail a moment later).
    std::string summary;
    for (std::size_t i = 0; i < children.size(); ++i) {
      if (outcome.statuses[i].ok() || outcome.stopped_by_us[i]) continue;
      const int rank = layout.first_rank + static_cast<int>(i);
      std::string msg = "rank " + std::to_string(rank) + " (local rank " + std::to_string(i) + " on node " +
                        std::to_string(o.node_rank) + ", pid " + std::to_string(children[i].pid()) + ") " +
                        outcome.statuses[i].describe();
      summary += (summary.empty() ? "" : "; ") + msg;
      std::string report = msg;
      if (!children[i].last_lines().empty()) {
        report += "; its last lines:";
        for (const auto& l : children[i].last_lines()) report += "\n    " + l;
      }
      log(report);
    }
    log("the other ranks were stopped");
    if (o.nnodes > 1) {
      try {
        store.set(failed_key, "node " + std::to_string(o.node_rank) + ": " + summary);
      } catch (const std::exception& e) {
        // Node 0 hosts the store: when it cannot be reached, node 0 itself is what was lost.
        log("node " + std::to_string(o.node_rank) + ": could not tell the other nodes: node 0, which hosts the job's "
            "store, is unreachable (it has probably died): " + e.what());
      }
    }
    return attempt_result::failed;
  }
  if (remote_failure && !g_stop.load()) {
    std::string why = "node 0, which hosts the job's store, is unreachable (it has probably died)";
    try {
      why = store.get_string(failed_key, std::chrono::milliseconds(2000));
    } catch (const std::exception&) {
    }
    log("node " + std::to_string(o.node_rank) + ": stopped local ranks because " + why);
    return attempt_result::failed;
  }
  return attempt_result::interrupted;
}

// A fault-tolerant job (--spares, --min-replicas). Node 0's partrun runs the lighthouse on its
// store; every node's partrun starts its replicas (RANK = replica id, node n holding ids
// n * P .. n * P + P - 1 with P = --nproc-per-node + --spares; WORLD_SIZE = every process of the
// job, spares included; PARTRAIN_FT_SLOTS or PARTRAIN_FT_MIN_REPLICAS say the policy). A replica
// that is lost does not stop the others: its node's partrun marks it gone in the store at once
// (the lighthouse need not wait for its heartbeat to go stale) and, while --max-replacements
// allows (per node), starts a new process with its RANK, which heals in from a live replica. The
// job succeeds when the lighthouse saw it finish.
int run_fault_tolerant(const partrun::options& o, std::uint16_t port, const std::string& token,
                       const std::function<partrain::tcp_store_options(const std::string&)>& client) {
  const int per_node = o.nproc_per_node + o.spares;
  const int replicas = per_node * o.nnodes;
  const int first_id = per_node * o.node_rank;
  partrain::quorum_policy policy;
  std::vector<std::pair<std::string, std::string>> extra = {{"LOCAL_WORLD_SIZE", std::to_string(per_node)}};
  if (o.spares > 0) {
    policy = {.mode = partrain::world_size_mode::fixed_with_spares, .slots = o.nproc_per_node * o.nnodes};
    extra.emplace_back("PARTRAIN_FT_SLOTS", std::to_string(policy.slots));
  } else {
    policy = {.mode = partrain::world_size_mode::dynamic, .min_replicas = o.min_replicas};
    extra.emplace_back("PARTRAIN_FT_MIN_REPLICAS", std::to_string(o.min_replicas));
  }
  // The ranks see the agent store under attempt 0's prefix (rendezvous.hpp), so partrun does too.
  auto under_prefix = [&](const std::string& who) {
    return std::make_shared<partrain::prefix_store>(partrain::detail::rdzv::agent_attempt_prefix(0),
                                                    std::make_shared<partrain::tcp_store>(client(who)));
  };
  const std::string node = "partrun node " + std::to_string(o.node_rank);
  auto store_ptr = under_prefix(node);
  partrain::store& store = *store_ptr;
  // Node 0 says the job's shape; every other node must have been started for the same one.
  const std::string shape = std::to_string(o.nnodes) + " node(s) of " + std::to_string(o.nproc_per_node) + " rank(s)" +
                            (o.spares > 0 ? " and " + std::to_string(o.spares) + " spare(s)"
                                          : ", at least " + std::to_string(o.min_replicas) + " training");
  const std::string shape_key = "partrun/ft_shape";
  std::optional<partrain::lighthouse> lh;
  if (o.node_rank == 0) {
    lh.emplace(under_prefix("partrun lighthouse"), partrain::lighthouse_options{.replicas = replicas, .policy = policy});
    store.set(shape_key, shape);
  } else {
    const std::string theirs = store.get_string(shape_key, o.rdzv_timeout);
    if (theirs != shape) {
      throw partrain::config_error("partrun: node 0 runs a fault-tolerant job of " + theirs + ", this node (" +
                                   std::to_string(o.node_rank) + ") was started for " + shape +
                                   ": give every node the same --nnodes, --nproc-per-node and --spares or --min-replicas");
    }
  }
  std::mutex out_mutex;
  std::vector<partrain::child_process> children;  // a replacement is appended; replica_of says whose
  std::vector<int> replica_of;
  auto start = [&](int r) {
    partrain::child_options co;
    co.capture_output = true;
    co.keep_lines = 10;
    co.on_line = [r, &out_mutex](std::string_view line) {
      std::lock_guard lock(out_mutex);
      print_rank_line(r, line);
    };
    children.push_back(partrain::child_process::exec(
        o.program, o.args, child_env(o, r, r - first_id, replicas, 0, port, token, extra), std::move(co)));
    replica_of.push_back(r);
  };
  children.reserve(static_cast<std::size_t>(per_node + o.max_replacements));
  for (int r = first_id; r < first_id + per_node; ++r) start(r);
  log(o.nnodes == 1 ? "fault-tolerant job: " + std::to_string(replicas) + " processes, " +
                         (o.spares > 0 ? std::to_string(o.nproc_per_node) + " ranks and " + std::to_string(o.spares) + " spare(s)"
                                       : "at least " + std::to_string(o.min_replicas) + " training") +
                         ", up to " + std::to_string(o.max_replacements) + " replacement(s)"
                   : "fault-tolerant job of " + shape + ": node " + std::to_string(o.node_rank) + " starts replicas " +
                         std::to_string(first_id) + ".." + std::to_string(first_id + per_node - 1) + " of " +
                         std::to_string(replicas) + ", up to " + std::to_string(o.max_replacements) + " replacement(s)");
  int absorbed = 0, replaced = 0;
  bool failed_after_finish = false;
  try {
    for (;;) {
      if (g_stop.load()) {
        partrain::stop_all(children, o.grace);
        log("interrupted by " + partrain::signal_name(g_signal) + "; every rank was stopped");
        return 128 + (g_signal ? static_cast<int>(g_signal) : SIGTERM);
      }
      if (lh && lh->error()) {
        partrain::stop_all(children, o.grace);
        log("the lighthouse stopped (see above); every rank was stopped");
        return 1;
      }
      bool running = false;
      for (std::size_t i = 0; i < children.size(); ++i) {
        const bool was_running = children[i].running();
        const auto st = children[i].poll();
        if (!st) {
          running = true;
          continue;
        }
        if (!was_running) continue;
        const int r = replica_of[i];
        if (st->ok()) continue;  // a member done, or a spare the job did not need
        if (store.check({std::string(partrain::detail::ft::finished_key)})) {
          failed_after_finish = true;
          log("rank " + std::to_string(r) + " (pid " + std::to_string(children[i].pid()) + ") " + st->describe() +
              " after the job finished");
          continue;
        }
        ++absorbed;
        // Gone now, whatever its last heartbeat said.
        partrain::detail::ft::beat gone{.counter = -1, .phase = partrain::detail::ft::replica_phase::dead};
        store.set(partrain::detail::ft::beat_key(r), gone.encode());
        std::string line = "rank " + std::to_string(r) + " (pid " + std::to_string(children[i].pid()) + ") " + st->describe() +
                           "; the others go on (failure " + std::to_string(absorbed) + " absorbed)";
        if (replaced < o.max_replacements) {
          ++replaced;
          start(r);
          running = true;
          line += "; started a replacement, pid " + std::to_string(children.back().pid());
        }
        log(line);
      }
      if (!running) break;
      partrain::pump_output(children, o.monitor_interval);
    }
  } catch (const std::exception& e) {  // the job's store is gone (node 0 died): stop ours, say why
    partrain::stop_all(children, o.grace);
    for (auto& c : children) c.finish_output();
    log(node + ": " + partrain::detail::unprefixed(e.what()) + "; every local rank was stopped");
    return 1;
  }
  for (auto& c : children) c.finish_output();
  const std::string tally = std::to_string(absorbed) + " failure(s) absorbed, " + std::to_string(replaced) + " replacement(s) started";
  bool finished = false;
  try {
    finished = store.check({std::string(partrain::detail::ft::finished_key)});
    // Node 0 hosts the store: it stays until every other node has read the verdict (bounded).
    const std::string done_key = "partrun/ft_nodes_done";
    if (o.node_rank != 0) {
      (void)store.add(done_key, 1);
    } else if (o.nnodes > 1) {
      const auto limit = std::min<std::chrono::milliseconds>(o.rdzv_timeout, std::chrono::seconds(60));
      const auto deadline = std::chrono::steady_clock::now() + limit;
      while (store.add(done_key, 0) < o.nnodes - 1) {
        if (std::chrono::steady_clock::now() > deadline) {
          log("node 0: " + std::to_string(o.nnodes - 1 - store.add(done_key, 0)) + " other node(s) did not report their end within " +
              std::to_string(limit.count()) + " ms; closing the store");
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
  } catch (const std::exception& e) {
    log(node + ": could not read the job's end from node 0's store: " + partrain::detail::unprefixed(e.what()));
    return 1;
  }
  if (!finished) {
    log("the job did not finish: every process ended first (" + tally + ")");
    return 1;
  }
  if (failed_after_finish) {
    log("the job finished, but a process failed after it (" + tally + ")");
    return 1;
  }
  log("the job finished (" + tally + ")");
  return 0;
}

int run(const partrun::options& o) {
  install_signal_handlers();
  std::string token = o.token;
  if (token.empty()) {
    if (const char* t = std::getenv("PARTRAIN_JOB_TOKEN")) token = t;
  }
  if (token.empty()) {
    if (o.nnodes > 1) {
      throw partrain::config_error(
          "partrun: a multi-node job needs the same job token on every node: set PARTRAIN_JOB_TOKEN or --token "
          "(e.g. to the output of `openssl rand -hex 16`)");
    }
    token = partrain::detail::rdzv::random_token();
  }
  // Node 0 hosts the store; binding to the master address (loopback unless told otherwise).
  std::unique_ptr<partrain::tcp_store_server> server;
  auto port = static_cast<std::uint16_t>(o.master_port);
  if (o.node_rank == 0) {
    server = std::make_unique<partrain::tcp_store_server>(
        partrain::tcp_store_server_options{.host = o.master_addr, .port = port, .token = token});
    port = server->port();
  }
  // A call the store does not answer (node 0's agent stopped, not gone) fails in the time an agent
  // may be silent, not the rendezvous timeout: the agents then stop their ranks and say why.
  const auto agent_silence = agent_silence_of(o);
  auto client = [&](const std::string& who) {
    return partrain::tcp_store_options{.host = o.master_addr,
                                       .port = port,
                                       .token = token,
                                       .timeout = o.rdzv_timeout,
                                       .io_timeout = agent_silence,
                                       .who = who};
  };
  if (o.spares > 0 || o.min_replicas > 0) return run_fault_tolerant(o, port, token, client);
  const std::string node = "partrun node " + std::to_string(o.node_rank);
  partrain::tcp_store store(client(node));
  partrain::tcp_store watch_store(client(node + " (watcher)"));
  for (int attempt = 0;; ++attempt) {
    const auto r = run_attempt(store, watch_store, o, attempt, port, token);
    if (r == attempt_result::success) {
      if (g_tee_failed) {
        log("the job succeeded, but a --tee log is incomplete (see above)");
        return 1;
      }
      return 0;
    }
    if (r == attempt_result::interrupted) {
      log("interrupted by " + partrain::signal_name(g_signal) + "; every rank was stopped");
      return 128 + (g_signal ? static_cast<int>(g_signal) : SIGTERM);
    }
    if (attempt >= o.max_restarts) {
      log(o.max_restarts ? "no restarts left (--max-restarts " + std::to_string(o.max_restarts) + "); giving up"
                         : "the job failed");
      return 1;
    }
    log("restarting every rank (restart " + std::to_string(attempt + 1) + " of " + std::to_string(o.max_restarts) + ")");
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    auto o = partrun::parse(std::vector<std::string>(argv + 1, argv + argc));
    if (!o) {
      std::fputs(partrun::usage.data(), stdout);
      return 0;
    }
    return run(*o);
  } catch (const partrain::config_error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "partrun: %s\n", e.what());
    return 1;
  }
}
