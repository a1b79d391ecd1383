// partrun: launches, supervises and restarts a distributed job, like torchrun.
// The agent on node 0 hosts the job's rendezvous store (token-protected); every agent starts
// its local ranks with the torchrun variables, prefixes their output with the rank, and when a
// rank fails stops every rank of the job (on all nodes) and restarts while restarts remain.
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <partrain/launch/process.hpp>
#include <partrain/rendezvous/job.hpp>
#include <partrain/rendezvous/tcp_store.hpp>

#include "options.hpp"

extern char** environ;

namespace {

std::atomic<bool> g_stop{false};
volatile std::sig_atomic_t g_signal = 0;

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

std::string key(int attempt, const std::string& rest) { return "partrun/attempt_" + std::to_string(attempt) + "/" + rest; }

// The environment of every rank: ours, with the torchrun variables set on top.
std::vector<std::string> child_env(const partrun::options& o, int rank, int local_rank, int world_size, int attempt,
                                   std::uint16_t port, const std::string& token) {
  const std::vector<std::pair<std::string, std::string>> ours = {
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
  if (o.tee) std::filesystem::create_directories(o.log_dir / ("attempt_" + std::to_string(attempt)));
  for (int l = 0; l < o.nproc_per_node; ++l) {
    const int rank = layout.first_rank + l;
    std::shared_ptr<std::ofstream> tee;
    if (o.tee) {
      tee = std::make_shared<std::ofstream>(o.log_dir / ("attempt_" + std::to_string(attempt)) /
                                            ("rank_" + std::to_string(rank) + ".log"));
    }
    partrain::child_options co;
    co.capture_output = true;
    co.keep_lines = 10;
    co.on_line = [rank, tee, &out_mutex](std::string_view line) {
      std::lock_guard lock(out_mutex);
      std::printf("[rank %d] %.*s\n", rank, static_cast<int>(line.size()), line.data());
      std::fflush(stdout);
      if (tee) *tee << line << '\n' << std::flush;
    };
    children.push_back(partrain::child_process::exec(
        o.program, o.args, child_env(o, rank, l, layout.world_size, attempt, port, token), std::move(co)));
  }

  // Another node's failure (or the end of the whole job) reaches us through the store.
  const std::string failed_key = key(attempt, "failed");
  std::atomic<bool> remote_failure{false};
  std::atomic<bool> stop{false};
  std::jthread watcher([&](std::stop_token st) {
    while (!st.stop_requested()) {
      if (g_stop.load()) stop = true;
      try {
        if (o.nnodes > 1 && watch_store.check({failed_key})) {
          remote_failure = true;
          stop = true;
        }
      } catch (const std::exception&) {
        remote_failure = true;  // the store (node 0) is gone: the job cannot go on
        stop = true;
      }
      std::this_thread::sleep_for(o.monitor_interval);
    }
  });

  partrain::supervise_options so;
  so.grace = o.grace;
  so.poll_interval = o.monitor_interval;
  so.stop = &stop;
  auto outcome = partrain::supervise(children, so);
  watcher.request_stop();
  watcher.join();

  if (outcome.ok()) {
    if (o.nnodes == 1) return attempt_result::success;
    // Every node waits for the job's outcome: a node whose ranks finished must still restart
    // with the others if another node fails. Node 0 hosts the store, so it announces success
    // only when all nodes are done and leaves only after every node has read it.
    store.add(key(attempt, "done"), 1);
    const std::string success_key = key(attempt, "success");
    for (;;) {
      if (store.check({failed_key})) break;
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
  auto client = [&](const std::string& who) {
    return partrain::tcp_store_options{
        .host = o.master_addr, .port = port, .token = token, .timeout = o.rdzv_timeout, .who = who};
  };
  const std::string node = "partrun node " + std::to_string(o.node_rank);
  partrain::tcp_store store(client(node));
  partrain::tcp_store watch_store(client(node + " (watcher)"));
  for (int attempt = 0;; ++attempt) {
    const auto r = run_attempt(store, watch_store, o, attempt, port, token);
    if (r == attempt_result::success) return 0;
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
