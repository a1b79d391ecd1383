// partrain/parallel/lighthouse.hpp: the one place a fault-tolerant job's quorums are decided
// (torchft's lighthouse). It reads every replica's heartbeat from the job's store and publishes
// each new quorum there; the replicas (replica_group.hpp) only read them. One decider means two
// halves of a job can never each believe they are the job; its store's host is the single point of
// failure, as the lighthouse is torchft's, and losing it stays the clear error it is without one.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include <partrain/comm/store.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/log.hpp>
#include <partrain/parallel/detail/replica_protocol.hpp>
#include <partrain/parallel/quorum.hpp>

namespace partrain::inline v0 {

struct lighthouse_options {
  int replicas = 1;  // every replica the job starts, spares included: ids 0 .. replicas-1
  quorum_policy policy{};
  // A replica whose heartbeat has not moved for this long is lost (torchft's default is 5 s; the
  // replicas beat every 100 ms by default). Once a member's group has failed under its peers, a
  // quarter of it is enough: so the replicas' heartbeat interval must stay well under a quarter.
  std::chrono::milliseconds heartbeat_timeout{1000};
  // The first quorum waits for every replica this long, then forms from those present.
  std::chrono::milliseconds join_timeout{10000};
  // How often it reads the heartbeats: 2 store round trips per replica a tick.
  std::chrono::milliseconds tick{25};
  // A failed quorum that no new one can replace for this long (too few replicas left for the
  // policy), or a first quorum that cannot form for join_timeout plus this long, ends the job: the
  // reason goes to the store, and every waiting replica fails with it.
  std::chrono::milliseconds recovery_timeout{60000};
};

class lighthouse {
 public:
  lighthouse(std::shared_ptr<store> s, lighthouse_options opts) : store_(std::move(s)), opts_(opts) {
    if (!store_) throw invalid_argument_error("lighthouse: the store is null");
    if (opts_.replicas < 1) {
      throw invalid_argument_error("lighthouse: replicas is " + std::to_string(opts_.replicas) + ", expected >= 1");
    }
    if (opts_.policy.mode == world_size_mode::fixed_with_spares && opts_.policy.slots > opts_.replicas) {
      throw invalid_argument_error("lighthouse: " + std::to_string(opts_.policy.slots) + " slots but only " +
                                   std::to_string(opts_.replicas) + " replicas; every slot needs a replica");
    }
    seen_.resize(static_cast<std::size_t>(opts_.replicas));
    thread_ = std::jthread([this](std::stop_token st) { run(st); });
  }
  lighthouse(const lighthouse&) = delete;
  lighthouse& operator=(const lighthouse&) = delete;
  ~lighthouse() = default;  // the jthread stops and joins

  // The newest quorum published (id -1 before the first).
  [[nodiscard]] quorum current() const {
    std::lock_guard lock(mutex_);
    return current_;
  }
  // What ended the lighthouse's thread (the store lost), or null.
  [[nodiscard]] std::exception_ptr error() const {
    std::lock_guard lock(mutex_);
    return error_;
  }

 private:
  struct seen {
    bool known = false;
    std::int64_t counter = -1;
    std::chrono::steady_clock::time_point moved{};
    detail::ft::beat last{};
  };

  void run(std::stop_token st) {
    const auto start = std::chrono::steady_clock::now();
    try {
      while (!st.stop_requested()) {
        tick(start);
        std::this_thread::sleep_for(opts_.tick);
      }
    } catch (const std::exception&) {
      std::lock_guard lock(mutex_);
      error_ = std::current_exception();
      log_error("lighthouse stopped: " + detail::unprefixed(describe(error_)));
    }
  }

  [[nodiscard]] static std::string describe(const std::exception_ptr& e) {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      return x.what();
    }
  }

  [[nodiscard]] bool alive(int r, std::chrono::steady_clock::time_point now) const {
    const auto& s = seen_[static_cast<std::size_t>(r)];
    using detail::ft::replica_phase;
    return s.known && now - s.moved < opts_.heartbeat_timeout && s.last.phase != replica_phase::dead &&
           s.last.phase != replica_phase::done;
  }
  [[nodiscard]] const detail::ft::beat& beat_of(int r) const { return seen_[static_cast<std::size_t>(r)].last; }

  void tick(std::chrono::steady_clock::time_point start) {
    using detail::ft::replica_phase;
    const auto now = std::chrono::steady_clock::now();
    store_->set(std::string(detail::ft::lighthouse_key), std::to_string(++ticks_));  // replicas watch it
    for (int r = 0; r < opts_.replicas; ++r) {
      const auto text = detail::ft::peek(*store_, detail::ft::beat_key(r));
      if (!text) continue;
      const auto b = detail::ft::beat::decode(*text);
      if (!b) throw data_error("lighthouse: replica " + std::to_string(r) + "'s heartbeat is '" + *text + "'");
      auto& s = seen_[static_cast<std::size_t>(r)];
      if (!s.known || b->counter != s.counter) s.moved = now;
      s.known = true;
      s.counter = b->counter;
      s.last = *b;
    }
    int heartbeating = 0;
    for (int r = 0; r < opts_.replicas; ++r) heartbeating += alive(r, now) ? 1 : 0;
    const quorum cur = current();
    std::vector<int> ready;
    if (cur.id < 0) {
      for (int r = 0; r < opts_.replicas; ++r)
        if (alive(r, now) && beat_of(r).phase == replica_phase::joining) ready.push_back(r);
      if (static_cast<int>(ready.size()) == opts_.replicas || now - start >= opts_.join_timeout) {
        const auto first = compute_quorum(cur, ready, heartbeating, opts_.policy);
        if (!first && now - start >= opts_.join_timeout + opts_.recovery_timeout) {
          give_up("the first quorum could not form in " +
                  std::to_string((opts_.join_timeout + opts_.recovery_timeout).count()) + " ms: " + shortfall(ready.size(), heartbeating));
        }
        publish(first, "first quorum");
      }
      return;
    }
    bool broken = false;
    std::vector<int> pending;  // alive members that have not (yet) left a broken group
    std::string why;
    std::string failed;  // members whose collectives failed
    for (int m : cur.members) {
      const auto& b = beat_of(m);
      const bool failed_here = b.phase == replica_phase::failed && b.quorum == cur.id;
      if (b.phase == replica_phase::done) continue;
      if (alive(m, now) && b.phase == replica_phase::joining && b.quorum >= cur.id) {
        // A process of this id that started after the quorum was published: the member the
        // quorum counted is gone, replaced.
        broken = true;
        why += (why.empty() ? "" : ", ") + std::string("replica ") + std::to_string(m) + " restarted";
      } else if (!alive(m, now)) {
        broken = true;
        why += (why.empty() ? "" : ", ") + std::string("replica ") + std::to_string(m) +
               (b.phase == replica_phase::dead ? " gave up" : " lost (no heartbeat)");
      } else if (failed_here) {
        broken = true;
        failed += (failed.empty() ? "" : ", ") + std::to_string(m);
      } else {
        pending.push_back(m);
      }
    }
    // Finished: a replica is done and none trains or forms a group any more; a replica still
    // waiting (a spare, a joiner, one whose last step failed after a peer committed it) learns
    // that the job ended without it.
    bool any_done = false;
    bool training = false;
    for (int r = 0; r < opts_.replicas; ++r) {
      const auto& b = beat_of(r);
      any_done = any_done || b.phase == replica_phase::done;
      training = training || (alive(r, now) && (b.phase == replica_phase::member || b.phase == replica_phase::forming));
    }
    if (any_done && !training) {
      if (!finished_) store_->set(std::string(detail::ft::finished_key), std::string("1"));
      finished_ = true;
      return;
    }
    if (broken) {
      // Members still inside the failed group's collectives leave them within their timeout; one
      // that beats but has not left within a heartbeat timeout is stalled outside them: evicted.
      // A pending member whose heartbeat has been quiet for a quarter of the timeout while its
      // group is broken is gone (killed or stopped): its peers' errors are the evidence, so
      // recovery need not wait out the whole timeout.
      if (!broken_since_) broken_since_ = now;
      std::erase_if(pending, [&](int m) {
        if (now - seen_[static_cast<std::size_t>(m)].moved < opts_.heartbeat_timeout / 4) return false;
        why += (why.empty() ? "" : ", ") + std::string("replica ") + std::to_string(m) + " silent since its group broke";
        return true;
      });
      if (!pending.empty() && now - *broken_since_ < opts_.heartbeat_timeout) return;
      // Ready: the members that left the broken group, and the waiting replicas outside it.
      for (int r = 0; r < opts_.replicas; ++r) {
        if (!alive(r, now)) continue;
        const auto& b = beat_of(r);
        const bool ready_here = b.phase == replica_phase::joining ||
                                (cur.slot_of(r) >= 0 && b.phase == replica_phase::failed && b.quorum == cur.id);
        if (ready_here) ready.push_back(r);
      }
      if (!failed.empty()) why += (why.empty() ? "" : "; ") + std::string("the group failed under replica(s) ") + failed;
      const auto next = compute_quorum(cur, ready, heartbeating, opts_.policy);
      if (!next && now - *broken_since_ >= opts_.recovery_timeout) {
        give_up("no quorum could replace quorum " + std::to_string(cur.id) + " for " +
                std::to_string(opts_.recovery_timeout.count()) + " ms (" + why + "): " + shortfall(ready.size(), heartbeating));
      }
      publish(next, why);
      return;
    }
    if (opts_.policy.mode != world_size_mode::dynamic) return;
    // Dynamic: admit healthy joiners once every member trains in the current quorum.
    bool joiners = false;
    for (int r = 0; r < opts_.replicas; ++r) {
      if (!alive(r, now)) continue;
      const auto& b = beat_of(r);
      const bool in = cur.slot_of(r) >= 0;
      if (in && !(b.phase == replica_phase::member && b.quorum == cur.id)) return;
      if (in) ready.push_back(r);
      if (!in && b.phase == replica_phase::joining) {
        ready.push_back(r);
        joiners = true;
      }
    }
    if (joiners) publish(compute_quorum(cur, ready, heartbeating, opts_.policy), "replicas joined");
  }

  [[nodiscard]] std::string shortfall(std::size_t ready, int heartbeating) const {
    return std::to_string(ready) + " replica(s) ready of " + std::to_string(heartbeating) + " alive, " +
           (opts_.policy.mode == world_size_mode::fixed_with_spares
                ? std::to_string(opts_.policy.slots) + " slots to fill"
                : "at least " + std::to_string(opts_.policy.min_replicas) + " needed") +
           ", and more than half of the live replicas";
  }
  // Ends the job: the reason goes to the store, where every waiting replica reads it.
  void give_up(const std::string& reason) {
    if (abandoned_) return;
    abandoned_ = true;
    store_->set(std::string(detail::ft::abandoned_key), reason);
    log_error("lighthouse: " + reason);
  }

  void publish(const std::optional<quorum>& next, const std::string& why) {
    if (!next) return;
    store_->set(detail::ft::quorum_key(next->id), next->encode());
    store_->set(std::string(detail::ft::latest_key), std::to_string(next->id));
    log_info("lighthouse: quorum " + next->encode() + " (" + why + ")");
    broken_since_.reset();
    std::lock_guard lock(mutex_);
    current_ = *next;
  }

  std::shared_ptr<store> store_;
  lighthouse_options opts_;
  std::vector<seen> seen_;
  bool finished_ = false;
  bool abandoned_ = false;
  std::int64_t ticks_ = 0;
  std::optional<std::chrono::steady_clock::time_point> broken_since_{};
  mutable std::mutex mutex_;
  quorum current_{};
  std::exception_ptr error_{};
  std::jthread thread_;
};

}  // namespace partrain::inline v0
