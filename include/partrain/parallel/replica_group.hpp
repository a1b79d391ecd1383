// partrain/parallel/replica_group.hpp: data-parallel training that survives a lost replica without
// a restart (torchft's Manager, for any backend). Each replica heartbeats into the job's store; the
// lighthouse (lighthouse.hpp) publishes quorums; a replica trains a step in its quorum's group and
// commits it only when every collective of the step completed on it. A replica whose group fails
// drops the step, waits for the next quorum, and the new group first brings every member to the
// highest committed step by sending a healthy member's state to those behind (a replacement, a
// spare, or a survivor whose last collective failed after a peer's completed), all live over the
// backend, no checkpoint file. With world_size_mode::fixed_with_spares the slots keep their data,
// so the run's result is bit-identical to one without failures.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <partrain/comm/process_group.hpp>
#include <partrain/comm/reduce_op.hpp>
#include <partrain/comm/store.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/log.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/core/weighted_shares.hpp>
#include <partrain/parallel/detail/replica_protocol.hpp>
#include <partrain/parallel/quorum.hpp>

namespace partrain::inline v0 {

// An event of the replica's life, logged (info) and kept for metrics and tests.
struct replica_event {
  enum class kind { joined, healed, sent_state, failed, left_as_spare } what{};
  std::int64_t step = 0;
  std::int64_t quorum = -1;
  std::string reason{};
  std::chrono::steady_clock::time_point at{};  // when it was recorded
  double seconds = 0;                          // healed, sent_state: how long the transfer took
  std::int64_t bytes = 0;                      // healed, sent_state: the state's size
};

// The event's name in logs, metrics records and traces.
[[nodiscard]] constexpr std::string_view replica_event_name(replica_event::kind k) noexcept {
  switch (k) {
    case replica_event::kind::joined: return "joined";
    case replica_event::kind::healed: return "healed";
    case replica_event::kind::sent_state: return "sent_state";
    case replica_event::kind::failed: return "failed";
    case replica_event::kind::left_as_spare: return "left_as_spare";
  }
  return "unknown";
}

struct replica_group_options {
  int replica = 0;  // this replica's id (its launch rank), 0 <= replica < the lighthouse's replicas
  std::chrono::milliseconds heartbeat_interval{100};
  // The longest a member whose group failed waits for a quorum that takes it in. A spare waits as
  // long as the job runs (each of its polls is a bounded store call, so a lost store ends it).
  std::chrono::milliseconds quorum_timeout{30000};
  // Steps between the rounds (one 8-byte all-reduce) in which the members agree on the newest
  // quorum: a replica that joins a running job waits at most this many steps.
  int quorum_round_every = 8;
  // Called with each event as it happens (on the thread that calls step()), besides the info log
  // line and events(): where a program records them in its metrics file or trace.
  std::function<void(const replica_event&)> on_event{};
};

// What a joining replica receives from a healthy one: everything a step depends on (parameters,
// optimizer and gradient-scaler state, the sampler's position, random state). save() runs on the
// sender, load() on each receiver, between steps.
struct replica_state_io {
  std::function<std::vector<std::byte>()> save;
  std::function<void(std::span<const std::byte>)> load;
};

// Makes quorum `quorum_id`'s group: rank `rank` of `size`, every member calling with the same id.
// Gloo: a gloo_group under a store prefix of the id's own; threads: local_group_registry::make.
using replica_group_factory = std::function<std::unique_ptr<process_group>(std::int64_t quorum_id, int rank, int size)>;

// The rows of a global batch that the member in `slot` of `members` trains: the batch is fixed
// and shared out afresh at every membership (weighted_shares' rule, equal weights), so in dynamic
// mode every row of every step is trained exactly once whoever is present. Normalize the loss by
// the global batch (sum over rows / global_batch): the step's gradient is then the same sum
// whatever the membership, only its rounding differs.
struct replica_rows_range {
  std::size_t first = 0;
  std::size_t count = 0;
};
[[nodiscard]] inline replica_rows_range replica_rows(std::size_t global_batch, int slot, int members) {
  if (members < 1 || slot < 0 || slot >= members) {
    throw invalid_argument_error("replica_rows: slot " + std::to_string(slot) + " of " + std::to_string(members) +
                                 " members, expected 0 <= slot < members");
  }
  const std::vector<double> equal(static_cast<std::size_t>(members), 1.0);
  const auto shares = weighted_shares(global_batch, equal, "replica_rows");
  replica_rows_range r;
  for (int k = 0; k < slot; ++k) r.first += shares[static_cast<std::size_t>(k)];
  r.count = shares[static_cast<std::size_t>(slot)];
  return r;
}


class replica_group {
 public:
  // control: a store connection of this replica's own (its heartbeat thread polls it; the group
  // factory's rendezvous should use another, so a long rendezvous never delays a heartbeat).
  replica_group(std::shared_ptr<store> control, replica_group_factory make_group, replica_state_io state,
                replica_group_options opts)
      : store_(std::move(control)), make_group_(std::move(make_group)), state_(std::move(state)), opts_(opts) {
    if (!store_) throw invalid_argument_error("replica_group: the control store is null");
    if (!make_group_) throw invalid_argument_error("replica_group: the group factory is empty");
    if (!state_.save || !state_.load) throw invalid_argument_error("replica_group: state save and load are both required");
    if (opts_.replica < 0) throw invalid_argument_error("replica_group: replica is " + std::to_string(opts_.replica) + ", expected >= 0");
    if (opts_.quorum_round_every < 1) {
      throw invalid_argument_error("replica_group: quorum_round_every is " + std::to_string(opts_.quorum_round_every) +
                                   ", expected >= 1");
    }
    // A quorum published before this process first beat cannot have counted it in: if it names this
    // replica, it means an earlier process of the same id (this one replaces it). The first beat
    // says which quorums this process has seen, so the lighthouse can tell the two apart.
    const auto seen = detail::ft::latest_quorum(*store_);
    want_ = seen + 1;
    beat_.quorum = seen;
    beat_now();
    heart_ = std::jthread([this](std::stop_token st) { beat_loop(st); });
  }
  replica_group(const replica_group&) = delete;
  replica_group& operator=(const replica_group&) = delete;
  // Without finish(), the replica says it gave up, so the lighthouse does not wait for its heartbeat
  // to go stale.
  ~replica_group() {
    heart_.request_stop();
    if (heart_.joinable()) heart_.join();
    group_.reset();
    try {
      set_phase(finished_ ? detail::ft::replica_phase::done : detail::ft::replica_phase::dead, quorum_.id);
    } catch (const std::exception&) {
      // The store is gone: the lighthouse sees the heartbeat stop instead.
    }
  }

  // Runs one step until a quorum commits it. compute(group, slot, step) computes this slot's
  // gradients for `step` from scratch (zeroing what an earlier try left) and reduces them over
  // `group`; apply() then steps the optimizer. A collective that fails (a member died, stalled or
  // left) drops the step here; the replica waits for the next quorum, heals if it is behind, and
  // runs the step again. Returns true when the step committed, or when this replica healed forward
  // to a later step (current_step() says which runs next); false when the job finished without
  // this replica: it waited as a spare, or its last step failed after a peer committed it (its
  // state is then not the job's).
  bool step(const std::function<void(process_group&, int slot, std::int64_t step)>& compute,
            const std::function<void()>& apply) {
    for (;;) {
      if (!group_) {
        const auto before = step_;
        if (!join()) return false;
        if (step_ != before) return true;  // healed forward: the caller's loop sees the new step first
      }
      try {
        compute(*group_, group_->rank(), step_);  // the group's rank is this replica's slot
        // Every quorum_round_every steps (all members count the same steps), the members agree on
        // the newest quorum any of them has seen, so they all switch at the same boundary.
        std::int64_t vote = quorum_.id;
        if ((step_ + 1) % opts_.quorum_round_every == 0) {
          vote = latest_seen_.load();
          group_->all_reduce(tensor_view<std::int64_t>(&vote, 1), reduce_op::max).wait();
        }
        apply();
        ++step_;
        set_phase(detail::ft::replica_phase::member, quorum_.id);
        if (vote > quorum_.id) {
          want_ = vote;
          group_.reset();
          switching_ = true;
        }
        return true;
      } catch (const communication_error& e) {
        fail(e.what());
      }
    }
  }

  // Says this replica finished the job (every member calls it after its last step). The members
  // first agree that each committed the last step (one 8-byte all-reduce): a member whose last step
  // failed where this one's committed has left the group, so the agreement fails here; this
  // replica then joins the next quorum, where that member heals from it, and they agree again. When
  // no quorum forms any more (the lighthouse gave the job up, or only this replica is left), this
  // replica ends as it is: it committed the last step, so its state is the job's.
  void finish() {
    // The members agreed on a newer quorum at the job's last round: form it still, so a replica
    // it admits receives the final state instead of waiting for peers that are done.
    if (!group_ && switching_) {
      if (const auto text = detail::ft::peek(*store_, detail::ft::quorum_key(want_))) {
        if (const auto q = quorum::decode(*text); q.slot_of(opts_.replica) >= 0) (void)form(q);
      }
    }
    while (group_) {
      try {
        std::int64_t last = step_;
        group_->all_reduce(tensor_view<std::int64_t>(&last, 1), reduce_op::min).wait();
        break;
      } catch (const communication_error& e) {
        fail("the last step's agreement: " + std::string(e.what()));
      }
      try {
        if (!join()) break;
      } catch (const communication_error& e) {
        log_info("replica " + std::to_string(opts_.replica) + " ends at step " + std::to_string(step_) +
                 " without the last step's agreement: " + detail::unprefixed(e.what()));
        break;
      }
    }
    finished_ = true;
    set_phase(detail::ft::replica_phase::done, quorum_.id);
  }

  [[nodiscard]] std::int64_t current_step() const noexcept { return step_; }
  [[nodiscard]] int slot() const noexcept { return quorum_.slot_of(opts_.replica); }  // -1 outside a quorum
  // The newest quorum id this replica's heartbeat has seen published (-1: none yet).
  [[nodiscard]] std::int64_t newest_quorum_seen() const noexcept { return latest_seen_.load(); }
  [[nodiscard]] const quorum& current_quorum() const noexcept { return quorum_; }
  [[nodiscard]] const std::vector<replica_event>& events() const noexcept { return events_; }
  [[nodiscard]] int failures() const noexcept { return count(replica_event::kind::failed); }
  [[nodiscard]] int heals() const noexcept { return count(replica_event::kind::healed); }

 private:
  using phase = detail::ft::replica_phase;

  [[nodiscard]] int count(replica_event::kind k) const noexcept {
    return static_cast<int>(std::ranges::count(events_, k, &replica_event::what));
  }
  void record(replica_event::kind k, std::string reason, double seconds = 0, std::int64_t bytes = 0) {
    log_info("replica " + std::to_string(opts_.replica) + " " + std::string(replica_event_name(k)) + " at step " +
             std::to_string(step_) + " in quorum " + std::to_string(quorum_.id) + (reason.empty() ? "" : ": ") + reason);
    events_.push_back({k, step_, quorum_.id, std::move(reason), std::chrono::steady_clock::now(), seconds, bytes});
    if (opts_.on_event) opts_.on_event(events_.back());
  }

  // A change of phase or quorum is published at once (the lighthouse must never act on a stale
  // one); the step alone rides on the next heartbeat.
  void set_phase(phase p, std::int64_t q) {
    std::lock_guard lock(beat_mutex_);
    const bool changed = beat_.phase != p || beat_.quorum != q;
    beat_.phase = p;
    beat_.quorum = q;
    beat_.step = step_;
    if (changed) publish_locked();
  }
  void beat_now() {
    std::lock_guard lock(beat_mutex_);
    publish_locked();
  }
  void publish_locked() {
    ++beat_.counter;
    store_->set(detail::ft::beat_key(opts_.replica), beat_.encode());
  }
  void beat_loop(std::stop_token st) {
    while (!st.stop_requested()) {
      try {
        beat_now();
        const auto latest = detail::ft::latest_quorum(*store_);
        latest_seen_.store(std::max(latest_seen_.load(), latest));
      } catch (const std::exception& e) {
        // The store's host is gone: the main thread meets the same error at its next store call.
        log_warn("replica " + std::to_string(opts_.replica) + " heartbeat: " + detail::unprefixed(e.what()));
      }
      std::unique_lock lock(sleep_mutex_);
      sleep_.wait_for(lock, st, opts_.heartbeat_interval, [] { return false; });
    }
  }

  void fail(const std::string& why) {
    record(replica_event::kind::failed, detail::unprefixed(why));
    group_.reset();  // closes this replica's side of the group, so its peers fail fast too
    want_ = quorum_.id + 1;
    set_phase(phase::failed, quorum_.id);
  }

  // Waits for a quorum at or after want_ that gives this replica a slot, forms its group and heals.
  // False when the job finished first (a spare). Bounded: a member waits quorum_timeout; a spare as
  // long as the lighthouse ticks (quorum_timeout of silence ends it), and any replica stops when the
  // lighthouse gives the job up.
  bool join() {
    auto deadline = std::chrono::steady_clock::now() + opts_.quorum_timeout;
    bool spare = false;
    std::string lighthouse_ticks;
    auto lighthouse_moved = std::chrono::steady_clock::now();
    for (;;) {
      if (const auto why = detail::ft::peek(*store_, std::string(detail::ft::abandoned_key))) {
        throw communication_error("replica " + std::to_string(opts_.replica) + ": the lighthouse gave the job up: " + *why,
                                  {.rank = opts_.replica, .operation = "quorum"});
      }
      if (auto ticks = detail::ft::peek(*store_, std::string(detail::ft::lighthouse_key)).value_or("");
          ticks != lighthouse_ticks) {
        lighthouse_ticks = std::move(ticks);
        lighthouse_moved = std::chrono::steady_clock::now();
      } else if (std::chrono::steady_clock::now() - lighthouse_moved > opts_.quorum_timeout) {
        throw timeout_error("replica " + std::to_string(opts_.replica) + ": the lighthouse has been silent for " +
                                std::to_string(opts_.quorum_timeout.count()) +
                                " ms while this replica waited for a quorum; is it running on the job's store?",
                            {.rank = opts_.replica, .operation = "quorum", .timeout = opts_.quorum_timeout});
      }
      const auto latest = detail::ft::latest_quorum(*store_);
      if (latest >= want_) {
        const auto next = quorum::decode(detail::ft::peek(*store_, detail::ft::quorum_key(latest)).value_or(""));
        want_ = latest + 1;  // if this one does not take us in (or fails), the next one
        if (next.slot_of(opts_.replica) >= 0) {
          if (form(next)) return true;
          deadline = std::chrono::steady_clock::now() + opts_.quorum_timeout;  // the wait starts again
          continue;
        }
        if (!spare) record(replica_event::kind::left_as_spare, "quorum " + next.encode());
        spare = true;
        quorum_ = next;
        set_phase(phase::joining, next.id);
      }
      if (store_->check({std::string(detail::ft::finished_key)})) return false;
      if (!spare && quorum_.id >= 0 && std::chrono::steady_clock::now() > deadline) {
        throw timeout_error("replica " + std::to_string(opts_.replica) + " waited " +
                                std::to_string(opts_.quorum_timeout.count()) + " ms for a quorum after quorum " +
                                std::to_string(quorum_.id) + " failed; is the lighthouse running, and are enough replicas alive?",
                            {.rank = opts_.replica, .operation = "quorum", .timeout = opts_.quorum_timeout});
      }
      std::this_thread::sleep_for(opts_.heartbeat_interval / 10);
    }
  }

  bool form(const quorum& q) {
    const int rank = q.slot_of(opts_.replica);
    set_phase(phase::forming, q.id);
    quorum_ = q;
    try {
      group_ = make_group_(q.id, rank, static_cast<int>(q.members.size()));
      if (!group_) throw invalid_argument_error("replica_group: the group factory returned no group for quorum " + std::to_string(q.id));
      refuse_backend(*group_);
      heal();
    } catch (const communication_error& e) {
      fail(e.what());
      return false;
    }
    set_phase(phase::member, q.id);
    switching_ = false;
    record(replica_event::kind::joined, "slot " + std::to_string(rank) + " of " + std::to_string(q.members.size()));
    return true;
  }

  // A quorum's group carries host bytes (the step agreement, the state a joining replica receives)
  // and is rebuilt after every loss.
  static void refuse_backend(const process_group& g) {
    if (g.backend().starts_with("mpi")) {
      throw config_error("replica_group: an mpi group cannot be a quorum's group: Open MPI cannot rebuild a communicator "
                         "after a rank dies (that needs ULFM); use gloo, or local groups for threads");
    }
    if (!g.accepts(device_kind::cpu)) {
      throw config_error("replica_group: the " + std::string(g.backend()) +
                         " backend carries device memory only, and a quorum's group also carries host bytes (the step "
                         "agreement, the state sent to a joining replica); use gloo, or a hybrid_group of gloo and "
                         "nccl (hybrid_groups_by_id(gloo_groups_by_id(...), nccl_groups_by_id(...)))");
    }
  }

  // Brings every member to the highest committed step: the lowest-ranked member that has it
  // broadcasts its state; the others (at that step already) keep theirs.
  void heal() {
    auto& g = *group_;
    std::int64_t steps[2] = {step_, -step_};
    g.all_reduce(tensor_view<std::int64_t>(steps, 2), reduce_op::max).wait();
    const std::int64_t newest = steps[0];
    const std::int64_t oldest = -steps[1];
    if (oldest == newest) return;
    const auto t0 = std::chrono::steady_clock::now();
    std::int64_t source = step_ == newest ? g.rank() : g.size();
    g.all_reduce(tensor_view<std::int64_t>(&source, 1), reduce_op::min).wait();
    std::vector<std::byte> blob;
    if (g.rank() == source) blob = state_.save();
    std::int64_t bytes = static_cast<std::int64_t>(blob.size());
    g.broadcast(tensor_view<std::int64_t>(&bytes, 1), static_cast<int>(source)).wait();
    blob.resize(static_cast<std::size_t>(bytes));
    g.broadcast(tensor_view<std::uint8_t>(reinterpret_cast<std::uint8_t*>(blob.data()), blob.size()),
                static_cast<int>(source))
        .wait();
    const auto took = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
    if (g.rank() == source) {
      record(replica_event::kind::sent_state, std::to_string(bytes) + " bytes at step " + std::to_string(newest), took(),
             bytes);
    } else if (step_ < newest) {
      state_.load(blob);
      const auto from = step_;
      step_ = newest;
      record(replica_event::kind::healed,
             "from step " + std::to_string(from) + ", " + std::to_string(bytes) + " bytes from slot " + std::to_string(source),
             took(), bytes);
    }
  }

  std::shared_ptr<store> store_;
  replica_group_factory make_group_;
  replica_state_io state_;
  replica_group_options opts_;
  std::unique_ptr<process_group> group_{};
  quorum quorum_{};
  std::int64_t step_ = 0;
  std::int64_t want_ = 0;  // the lowest quorum id this replica may still join
  bool finished_ = false;
  bool switching_ = false;  // left its group at a round for a newer quorum, not yet formed
  std::atomic<std::int64_t> latest_seen_{-1};
  std::vector<replica_event> events_{};
  std::mutex beat_mutex_;
  detail::ft::beat beat_{};
  std::mutex sleep_mutex_;
  std::condition_variable_any sleep_;
  std::jthread heart_{};
};

}  // namespace partrain::inline v0
