// partrain/rendezvous/liveness.hpp: a stalled or lost rank is noticed in seconds, not at the
// collective timeout. Beside each rank's process group, a thread of its own (on its own store
// connection) writes a heartbeat to the job's store every interval: a counter, the process, its
// host and the group's last operation (as of that heartbeat). It also reads the heartbeats of the ranks it watches (all
// of them up to 32 ranks, else its ring neighbour) and one job-wide stop key. A heartbeat that
// has not changed for `silence` means the whole process is stopped or gone (SIGSTOP, a hung
// machine, a lost node: a rank merely busy in a long step keeps beating, since the thread runs
// beside it). The watcher then sets the stop key with a message naming the silent rank, its host
// and last operation, prints it and ends its own process, and every other watcher does the same
// within an interval: blocked collectives cannot be interrupted, so ending the processes is what
// releases them (the launcher or spawn then reports the exit). A rank that finishes marks its
// heartbeat done, so ranks ending at different times are not mistaken for silent ones (rank 0's
// watch keeps the store it hosts open until rank 0's group ends); a store
// that cannot be reached for `silence` (its host, rank 0 or the launcher's agent, is stopped
// or gone) counts as silence of its host. Collective timeouts stay the last resort.
//   PARTRAIN_SILENCE_MS=n   silence that ends the job (default 5000; 0 turns the watch off)
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include <partrain/comm/process_group.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/log.hpp>
#include <partrain/rendezvous/rendezvous.hpp>

namespace partrain::inline v0 {

struct liveness_options {
  std::chrono::milliseconds silence{5000};  // no heartbeat for this long ends the job
  std::chrono::milliseconds interval{500};  // how often a rank beats and looks
};

// The shortest silence a job may be given: heartbeats come every 50 ms at the fastest, so a
// window shorter than five of them would stop a healthy job.
inline constexpr std::chrono::milliseconds min_silence{250};

// PARTRAIN_SILENCE_MS, validated; silence 0 means off.
[[nodiscard]] inline liveness_options liveness_options_from_env(const env_lookup& env = process_env) {
  liveness_options o;
  if (auto ms = detail::rdzv::int_var(env, "PARTRAIN_SILENCE_MS", 0, 3'600'000, "PARTRAIN_SILENCE_MS",
                                "milliseconds in [0, 3600000] (0 turns the liveness watch off)")) {
    if (*ms != 0 && *ms < min_silence.count()) {
      throw config_error("PARTRAIN_SILENCE_MS=" + std::to_string(*ms) + " is shorter than " +
                         std::to_string(min_silence.count()) + " ms: heartbeats come every 50 ms at the fastest, so "
                         "a healthy job would be stopped (expected 0, which turns the watch off, or " +
                         std::to_string(min_silence.count()) + " to 3600000)");
    }
    o.silence = std::chrono::milliseconds(*ms);
  }
  o.interval = std::clamp(o.silence / 5, std::chrono::milliseconds(50), std::chrono::milliseconds(1000));
  return o;
}

class liveness_watch {
 public:
  // Starts watching for `group`'s rank on the job's store (a connection of its own).
  liveness_watch(const rendezvous_info& info, const process_group& group, liveness_options o)
      : info_(info), group_(&group), o_(o) {
    // info_.store keeps the store alive (on rank 0 it owns the server, which init_process_group
    // would otherwise close once it returns); the watch talks through a connection of its own.
    const auto call_timeout = std::min<std::chrono::milliseconds>(o_.silence / 2, std::chrono::milliseconds(3000));
    store_ = detail::rdzv::open_store(info_, false, call_timeout, "rank " + std::to_string(info.rank) + " liveness watch");
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    host_ = host;
    const int n = info.world_size;
    for (int k = 1; k < n && (n <= 32 || k == 1); ++k) watched_.push_back((info.rank + k) % n);
    beat();
    thread_ = std::thread([this] { run(); });
    PARTRAIN_LOG(debug, "rank " + std::to_string(info.rank) + " liveness watch started: a heartbeat every " +
                            std::to_string(o_.interval.count()) + " ms, " + std::to_string(watched_.size()) +
                            " rank(s) watched, silence of " + std::to_string(o_.silence.count()) + " ms ends the job");
  }

  // For a collective timeout of this rank's operation #op: the ranks whose last heartbeat shows
  // fewer operations issued (they never reached it), up to 16 of them.
  [[nodiscard]] std::string behind(std::uint64_t op) {
    std::string names;
    int count = 0;
    for (int r = 0; r < info_.world_size; ++r) {
      if (r == info_.rank) continue;
      std::string v;
      try {
        v = store_->get_string(key(r), std::chrono::milliseconds(200));
      } catch (const std::exception&) {
        v = "no heartbeat";
      }
      const auto hash = v.rfind('#');
      const std::uint64_t theirs = hash == std::string::npos ? 0 : std::strtoull(v.c_str() + hash + 1, nullptr, 10);
      if (v == "done" || theirs >= op) continue;
      if (++count <= 16) names += (names.empty() ? "" : "; ") + ("rank " + std::to_string(r) + " (heartbeat " + v + ")");
    }
    if (count == 0) {
      return "every rank's heartbeat shows it reached operation #" + std::to_string(op) +
             ", so none is missing: if they all wait there, their calls differ (kind, size, element type or root; "
             "PARTRAIN_DEBUG=DETAIL names both calls)";
    }
    return std::to_string(count) + " rank(s) had not reached operation #" + std::to_string(op) +
           " by their heartbeats: " + names + (count > 16 ? "; ..." : "");
  }
  liveness_watch(const liveness_watch&) = delete;
  liveness_watch& operator=(const liveness_watch&) = delete;
  ~liveness_watch() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
    if (store_host_done_) return;  // its host ended first: nobody is left to tell
    try {
      store_->set(key(info_.rank), std::string("done"));  // finished, not silent
    } catch (const std::exception&) {
    }
    PARTRAIN_LOG(debug, "rank " + std::to_string(info_.rank) + " liveness watch ended (" + std::to_string(beats_) +
                            " heartbeats)");
  }

 private:
  static std::string key(int rank) { return "partrain/live/" + std::to_string(rank); }
  static constexpr const char* stop_key = "partrain/live/stop";

  void beat() {
    store_->set(key(info_.rank), std::to_string(++beats_) + " pid " + std::to_string(::getpid()) + " on " + host_ +
                                     ", last operation " + group_->last_operation());
  }

  // `tell`: the store still answers, so the other ranks learn why at once.
  [[noreturn]] void end_job(const std::string& msg, bool tell = true) {
    if (tell) {
      try {
        store_->set(stop_key, msg);
      } catch (const std::exception&) {
      }
    }
    std::fprintf(stderr, "partrain: %s\npartrain: rank %d stops (its collectives cannot be interrupted)\n", msg.c_str(),
                 info_.rank);
    std::fflush(stderr);
    std::_Exit(1);
  }

  void run() {
    struct seen {
      std::string value;
      std::chrono::steady_clock::time_point since;
    };
    std::map<int, seen> last;
    const auto start = std::chrono::steady_clock::now();
    auto store_ok = start;
    std::unique_lock lock(mutex_);
    while (!cv_.wait_for(lock, o_.interval, [&] { return stopping_; })) {
      lock.unlock();
      const auto now = std::chrono::steady_clock::now();
      try {
        beat();
        if (store_->check({stop_key})) end_job(store_->get_string(stop_key, o_.silence));
        for (int r : watched_) {
          if (!store_->check({key(r)})) continue;  // not started yet: init_process_group's own timeout covers it
          const std::string v = store_->get_string(key(r), o_.silence);
          if (v == "done") {
            if (r == 0 && !info_.agent_store) store_host_done_ = true;
            last.erase(r);
            continue;
          }
          auto& s = last[r];
          if (s.value != v) {
            s = {v, now};
          } else if (now - s.since > o_.silence) {
            end_job("rank " + std::to_string(r) + " has been silent for " +
                    std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(now - s.since).count()) +
                    " ms (stopped, hung or lost; its last heartbeat: " + v + "); noticed by rank " +
                    std::to_string(info_.rank));
          }
        }
        store_ok = now;
      } catch (const std::exception& e) {
        // The store's host is gone: after a normal end of rank 0 that is expected; otherwise it
        // is the silence of rank 0 (or of the launcher's agent hosting the store).
        if (store_host_done_) return;
        const auto failed_at = std::chrono::steady_clock::now();
        if (failed_at - store_ok > o_.silence) {
          end_job("the job's store at " + info_.master_addr + ":" + std::to_string(info_.port) + " (hosted by " +
                  (info_.agent_store ? std::string("the launcher's agent") : std::string("rank 0")) +
                  ") has not answered for " +
                  std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(failed_at - store_ok).count()) +
                  " ms: its host is stopped, hung or lost (" + e.what() + "); noticed by rank " +
                  std::to_string(info_.rank),
                  false);
        }
      }
      lock.lock();
    }
  }

  rendezvous_info info_;
  const process_group* group_;
  liveness_options o_;
  std::shared_ptr<store> store_;
  std::string host_;
  std::vector<int> watched_;
  std::uint64_t beats_ = 0;
  std::atomic<bool> store_host_done_ = false;  // rank 0, the store's host, finished normally
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace partrain::inline v0
