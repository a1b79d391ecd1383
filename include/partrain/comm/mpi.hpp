// partrain/comm/mpi.hpp: the `mpi` backend, processes launched by mpirun or srun (shared memory
// between the ranks of a host, TCP/InfiniBand/UCX between hosts, whatever Open MPI chooses).
// Every operation is posted at once as a non-blocking MPI call (MPI_Iallreduce, MPI_Isend, ...)
// by one progress thread per group, which then drives them with MPI_Test: it polls while an
// operation is young (MPI progresses only inside MPI calls), then backs off to short sleeps, and
// sleeps on a condition variable while nothing is pending, so a slow collective does not burn the
// core the compute needs. Collectives may be outstanding together (MPI matches them in issue
// order), so DDP's buckets overlap each other and the backward pass.
//
// MPI cannot cancel a collective that a peer never joins, and its communicator is unusable after
// one fails, so a timeout ends the job: the error (rank, operation, timeout) is printed and
// MPI_Abort tears every rank down, as mpirun does when a rank dies. abort_on_timeout = false
// throws a timeout_error instead and leaves the group unusable (for tests and callers that exit).
// MPI cannot say which peer a collective waits for either, so the group asks the others, on a
// communicator of its own answered by each rank's status thread (it runs beside the rank's own
// code and never runs a caller's callback, so a rank busy in its own code still answers):
// - while an operation has waited longer than the silence window (mpi_options::silence, 5 s), it
//   asks the peers it waits for, about once a second, whether they are alive; one that leaves
//   a query unanswered for two rounds (its whole process is stopped, hung or dead) fails the
//   operation at once, as its timeout would (abort_on_timeout), naming that rank;
// - before it reports a timeout, how many operations each issued and finished: the error names
//   the ranks that never reached the operation and those that did not answer at all.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <partrain/comm/detail/host_reduce.hpp>
#include <partrain/comm/detail/mpi_runtime.hpp>
#include <partrain/comm/process_group.hpp>
#include <partrain/core/error.hpp>

namespace partrain::inline v0 {

struct mpi_options {
  // How long the progress thread polls MPI_Test without sleeping after an operation is posted or
  // makes progress; then it sleeps, doubling from 10 us up to max_sleep. Env
  // PARTRAIN_MPI_SPIN_US and PARTRAIN_MPI_MAX_SLEEP_US override them.
  std::chrono::microseconds spin{200};
  std::chrono::microseconds max_sleep{200};
  // A timed-out operation aborts the MPI job (the only way no rank hangs); false throws
  // timeout_error and leaves this group unusable.
  bool abort_on_timeout = true;
  // While an operation has waited this long, the group asks its peers whether they are alive; a
  // silent one fails it about two seconds later, as a timeout does. 0 turns the watch off.
  // init_process_group takes it from PARTRAIN_SILENCE_MS, as Gloo's heartbeats do.
  std::chrono::milliseconds silence{5000};
};

namespace detail::mpi {

[[nodiscard]] inline std::chrono::microseconds env_us(const char* name, std::chrono::microseconds fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  if (*end != '\0' || n < 0 || n > 1'000'000) {
    throw config_error(std::string(name) + "='" + v + "' is not a number of microseconds in [0, 1000000]");
  }
  return std::chrono::microseconds(n);
}

// MPI_COMM_WORLD duplicated for one group (its collectives never meet another group's).
struct comm_handle {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  int size = 1;
  int tag_ub = 32767;

  static comm_handle duplicate_world() {
    auto& rt = runtime::instance();
    std::lock_guard lock(rt.mutex());
    comm_handle c;
    if (int rc = MPI_Comm_dup(MPI_COMM_WORLD, &c.comm); rc != MPI_SUCCESS) {
      throw communication_error("mpi_group: MPI_Comm_dup failed: " + error_string(rc));
    }
    c.describe();
    return c;
  }
  // MPI_Comm_split of `parent`: blocking, but split() calls it right after an all_gather over the
  // parent (bounded by its timeout) has shown every rank there.
  static comm_handle split(MPI_Comm parent, int color, int key) {
    auto& rt = runtime::instance();
    std::lock_guard lock(rt.mutex());
    comm_handle c;
    if (int rc = MPI_Comm_split(parent, color, key, &c.comm); rc != MPI_SUCCESS) {
      throw communication_error("mpi_group: MPI_Comm_split failed: " + error_string(rc));
    }
    c.describe();
    return c;
  }

 private:
  void describe() {
    comm_handle& c = *this;
    MPI_Comm_set_errhandler(c.comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(c.comm, &c.rank);
    MPI_Comm_size(c.comm, &c.size);
    void* ub = nullptr;
    int found = 0;
    MPI_Comm_get_attr(c.comm, MPI_TAG_UB, &ub, &found);
    if (found && ub) c.tag_ub = *static_cast<int*>(ub);
  }
};

}  // namespace detail::mpi

class mpi_group final : public process_group {
 public:
  explicit mpi_group(process_group_options opts = {}, mpi_options mopts = {})
      : mpi_group(detail::mpi::comm_handle::duplicate_world(), opts, mopts) {}

  ~mpi_group() override {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (progress_.joinable()) progress_.join();  // pending operations end by completion or timeout
    status_.request_stop();
    if (status_.joinable()) status_.join();
    std::lock_guard lock(detail::mpi::runtime::instance().mutex());
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && status_comm_ != MPI_COMM_NULL) {
      auto cancel = [](MPI_Request& r) {
        if (r == MPI_REQUEST_NULL) return;
        MPI_Cancel(&r);
        MPI_Request_free(&r);
      };
      cancel(query_req_);
      for (auto& w : watched_) cancel(w.second.reply);
      for (auto& r : replies_) MPI_Request_free(&r.second);
      if (!abandoned_) MPI_Comm_free(&status_comm_);
    }
    // A request MPI never finished (abort_on_timeout = false) still uses the communicator.
    if (!finalized && !abandoned_) MPI_Comm_free(&comm_.comm);
  }

  [[nodiscard]] std::string_view backend() const noexcept override { return "mpi"; }
  // The group's own communicator (a duplicate of MPI_COMM_WORLD), for code that calls MPI itself.
  [[nodiscard]] MPI_Comm native_handle() const noexcept { return comm_.comm; }
  // Empty while the group is usable; else why it is not.
  [[nodiscard]] std::string failure() const {
    std::lock_guard lock(mutex_);
    return failure_;
  }

 protected:
  std::unique_ptr<process_group> do_split(const split_request& r) override {
    return std::unique_ptr<mpi_group>(
        new mpi_group(detail::mpi::comm_handle::split(comm_.comm, r.color, rank()), options(), mopts_));
  }
  work do_all_reduce(raw_tensor t, reduce_op op) override {
    if (t.count == 0) return work::completed();
    const int n = count_of(collective::all_reduce, t);
    return post(collective::all_reduce, "", [this, t, op, n](MPI_Request* r) {
      return MPI_Iallreduce(MPI_IN_PLACE, t.data, n, type(t), rt_->op_of(t.type, op), comm_.comm, r);
    }, [this, t, op] { if (op == reduce_op::avg) detail::host_divide(t.data, t.count, t.type, size()); });
  }

  work do_broadcast(raw_tensor t, int root) override {
    if (t.count == 0) return work::completed();
    const int n = count_of(collective::broadcast, t);
    return post(collective::broadcast, "root " + std::to_string(root), [this, t, root, n](MPI_Request* r) {
      return MPI_Ibcast(t.data, n, type(t), root, comm_.comm, r);
    });
  }

  work do_reduce(raw_tensor t, int root, reduce_op op) override {
    if (t.count == 0) return work::completed();
    const int n = count_of(collective::reduce, t);
    const bool is_root = rank() == root;
    return post(collective::reduce, "root " + std::to_string(root), [this, t, root, op, n, is_root](MPI_Request* r) {
      // Non-roots only send: their buffers stay as they were (our contract, and torch's).
      return MPI_Ireduce(is_root ? MPI_IN_PLACE : t.data, is_root ? t.data : nullptr, n, type(t),
                         rt_->op_of(t.type, op), root, comm_.comm, r);
    }, [this, t, op, is_root] {
      if (op == reduce_op::avg && is_root) detail::host_divide(t.data, t.count, t.type, size());
    });
  }

  work do_all_gather(raw_tensor in, raw_tensor out) override {
    if (in.count == 0) return work::completed();
    const int n = count_of(collective::all_gather, out) / size();
    return post(collective::all_gather, "", [this, in, out, n](MPI_Request* r) {
      return MPI_Iallgather(in.data, n, type(in), out.data, n, type(out), comm_.comm, r);
    });
  }

  work do_reduce_scatter(raw_tensor in, raw_tensor out, reduce_op op) override {
    if (out.count == 0) return work::completed();
    (void)count_of(collective::reduce_scatter, in);
    const int n = count_of(collective::reduce_scatter, out);
    return post(collective::reduce_scatter, "", [this, in, out, op, n](MPI_Request* r) {
      return MPI_Ireduce_scatter_block(in.data, out.data, n, type(out), rt_->op_of(out.type, op), comm_.comm, r);
    }, [this, out, op] { if (op == reduce_op::avg) detail::host_divide(out.data, out.count, out.type, size()); });
  }

  work do_barrier() override {
    return post(collective::barrier, "", [this](MPI_Request* r) { return MPI_Ibarrier(comm_.comm, r); });
  }

  work do_send(raw_tensor t, int dst, int tag) override { return post_p2p(collective::send, t, dst, tag); }
  work do_recv(raw_tensor t, int src, int tag) override { return post_p2p(collective::recv, t, src, tag); }

 private:
  using poster = std::function<int(MPI_Request*)>;

  struct op {
    collective what;
    std::string peers;
    int peer = -1;
    poster start;
    std::function<void()> finish;  // on the progress thread, after MPI completed it
    std::shared_ptr<detail::work_state> state;
    MPI_Request request = MPI_REQUEST_NULL;
    std::chrono::steady_clock::time_point deadline{};
    std::exception_ptr error{};
    std::uint64_t number = 0;  // this rank's operation number (issued_operations() when posted)
    std::chrono::steady_clock::time_point started{};
  };

  mpi_group(detail::mpi::comm_handle c, process_group_options opts, mpi_options mopts)
      : process_group(c.rank, c.size, opts), comm_(c), rt_(&detail::mpi::runtime::instance()) {
    if (opts.timeout.count() <= 0) {
      throw config_error("mpi_group: timeout must be positive, got " + std::to_string(opts.timeout.count()) + " ms");
    }
    mopts.spin = detail::mpi::env_us("PARTRAIN_MPI_SPIN_US", mopts.spin);
    mopts.max_sleep = detail::mpi::env_us("PARTRAIN_MPI_MAX_SLEEP_US", mopts.max_sleep);
    if (mopts.spin.count() < 0 || mopts.max_sleep.count() < 0) {
      throw config_error("mpi_options: spin and max_sleep must be >= 0 microseconds");
    }
    if (mopts.silence.count() < 0) {
      throw config_error("mpi_options: silence must be >= 0 ms (0 turns the watch off), got " +
                         std::to_string(mopts.silence.count()));
    }
    mopts_ = mopts;
    {
      std::lock_guard lock(rt_->mutex());
      if (int rc = MPI_Comm_dup(comm_.comm, &status_comm_); rc != MPI_SUCCESS) {
        throw communication_error("mpi_group: MPI_Comm_dup (the status communicator) failed: " +
                                  detail::mpi::error_string(rc));
      }
      MPI_Comm_set_errhandler(status_comm_, MPI_ERRORS_RETURN);
      post_query_recv();
    }
    progress_ = std::thread([this] { progress_loop(); });
    status_ = std::jthread([this](std::stop_token stop) {  // answers every 50 ms; woken at once to stop
      std::mutex m;
      std::condition_variable_any cv;
      std::unique_lock lock(m);
      while (!cv.wait_for(lock, stop, std::chrono::milliseconds(50), [&] { return stop.stop_requested(); })) {
        std::lock_guard mpi_lock(rt_->mutex());
        serve_queries();
      }
    });
  }

  // The status protocol: a query (tag 1, one int64: the tag to answer with) asks a rank for
  // {operations issued, operations finished}, answered with tag 2 (a timeout's report) or 3 (the
  // silence watch). Called under the MPI lock by the status thread, and by the progress thread
  // while it reports a timeout.
  static constexpr int kQueryTag = 1, kReplyTag = 2, kWatchReplyTag = 3;
  void post_query_recv() {
    if (MPI_Irecv(&query_in_, 1, MPI_INT64_T, MPI_ANY_SOURCE, kQueryTag, status_comm_, &query_req_) != MPI_SUCCESS) {
      query_req_ = MPI_REQUEST_NULL;  // no answers from this rank: its peers' reports say so
    }
  }
  void serve_queries() {
    for (int flag = 0;;) {
      MPI_Status st;
      if (query_req_ == MPI_REQUEST_NULL || MPI_Test(&query_req_, &flag, &st) != MPI_SUCCESS || !flag) break;
      auto& r = replies_.emplace_back();
      r.first = {static_cast<std::int64_t>(issued_operations()), static_cast<std::int64_t>(finished_.load())};
      const int tag = query_in_ == kWatchReplyTag ? kWatchReplyTag : kReplyTag;
      if (MPI_Isend(r.first.data(), 2, MPI_INT64_T, st.MPI_SOURCE, tag, status_comm_, &r.second) != MPI_SUCCESS) {
        replies_.pop_back();
      }
      post_query_recv();
    }
    while (!replies_.empty()) {
      int flag = 0;
      if (MPI_Test(&replies_.front().second, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || flag) {
        replies_.pop_front();
      } else {
        break;
      }
    }
  }
  // Asks every other rank where it is, waiting up to a second (answering their questions
  // meanwhile: they time out too): what a timeout of operation #number can say about its peers.
  std::string ask_peers(std::uint64_t number) {
    const int n = size();
    std::vector<std::array<std::int64_t, 2>> answers(static_cast<std::size_t>(n));
    std::vector<MPI_Request> recvs(static_cast<std::size_t>(n), MPI_REQUEST_NULL), sends;
    for (int r = 0; r < n; ++r) {
      if (r == rank()) continue;
      const auto i = static_cast<std::size_t>(r);
      MPI_Request q = MPI_REQUEST_NULL;
      if (MPI_Irecv(answers[i].data(), 2, MPI_INT64_T, r, kReplyTag, status_comm_, &recvs[i]) != MPI_SUCCESS ||
          MPI_Isend(&query_out_, 1, MPI_INT64_T, r, kQueryTag, status_comm_, &q) != MPI_SUCCESS) {
        continue;
      }
      sends.push_back(q);
    }
    const auto wait = std::min<std::chrono::milliseconds>(std::chrono::seconds(1), timeout());
    const auto until = std::chrono::steady_clock::now() + wait;
    std::vector<bool> answered(static_cast<std::size_t>(n), false);
    for (int left = n - 1; left > 0 && std::chrono::steady_clock::now() < until;) {
      serve_queries();
      for (int r = 0; r < n; ++r) {
        const auto i = static_cast<std::size_t>(r);
        int flag = 0;
        if (r == rank() || answered[i] || recvs[i] == MPI_REQUEST_NULL) continue;
        if (MPI_Test(&recvs[i], &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag) {
          answered[i] = true;
          --left;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::string behind, silent;
    int n_behind = 0, n_silent = 0;
    for (int r = 0; r < n; ++r) {
      const auto i = static_cast<std::size_t>(r);
      if (r == rank()) continue;
      if (!answered[i]) {
        if (recvs[i] != MPI_REQUEST_NULL) {
          MPI_Cancel(&recvs[i]);
          MPI_Request_free(&recvs[i]);
        }
        if (++n_silent <= 16) silent += (silent.empty() ? "" : ", ") + std::to_string(r);
      } else if (answers[i][0] < static_cast<std::int64_t>(number)) {
        if (++n_behind <= 16) {
          behind += (behind.empty() ? "" : "; ") + ("rank " + std::to_string(r) + " (issued " +
                                                    std::to_string(answers[i][0]) + ", finished " +
                                                    std::to_string(answers[i][1]) + ")");
        }
      }
    }
    for (auto& q : sends) MPI_Request_free(&q);
    std::string out;
    if (n_silent > 0) {
      out += "rank(s) " + silent + (n_silent > 16 ? ", ..." : "") + " did not answer within " +
             std::to_string(wait.count()) + " ms (stopped, hung or dead)";
    }
    if (n_behind > 0) {
      out += (out.empty() ? "" : "; ") + std::to_string(n_behind) + " rank(s) never issued operation #" +
             std::to_string(number) + ": " + behind + (n_behind > 16 ? "; ..." : "");
    }
    if (out.empty()) {
      out = "every rank answered and had issued operation #" + std::to_string(number) +
            ", so none is missing: their calls differ (kind, size, element type or root; PARTRAIN_DEBUG=DETAIL names both)";
    }
    return "this rank's operation #" + std::to_string(number) + "; " + out;
  }

  // The silence watch, on the progress thread under the MPI lock: while an operation has waited
  // longer than the silence window, a round about once a second asks the peers it waits for (a
  // collective: every other rank up to 32, else the ring neighbour; a send or recv: its peer
  // alone, so a rank that finished early is not asked), one query outstanding per peer. Returns a
  // peer whose query went unanswered for two rounds, or -1.
  int watch_peers(const std::vector<op>& active, std::chrono::steady_clock::time_point now) {
    for (auto& [peer, w] : watched_) {
      int flag = 0;
      if (w.reply != MPI_REQUEST_NULL && MPI_Test(&w.reply, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && flag) {
        w.missed = 0;
      }
    }
    if (now < next_round_) return -1;
    std::vector<int> peers;
    bool collective = false;
    for (const op& o : active) {
      if (now - o.started <= mopts_.silence) continue;
      if (o.peer >= 0) {
        peers.push_back(o.peer);
      } else {
        collective = true;
      }
    }
    const int n = size();
    for (int k = 1; collective && k < n && (n <= 32 || k == 1); ++k) peers.push_back((rank() + k) % n);
    if (peers.empty()) return -1;
    next_round_ = now + std::chrono::seconds(1);
    std::ranges::sort(peers);
    const auto [first, last] = std::ranges::unique(peers);
    peers.erase(first, last);
    for (const int r : peers) {
      peer_watch& w = watched_[r];
      if (w.reply != MPI_REQUEST_NULL) {
        if (++w.missed >= 2) return r;
        continue;
      }
      MPI_Request q = MPI_REQUEST_NULL;
      w.asked = now;
      if (MPI_Irecv(w.answer.data(), 2, MPI_INT64_T, r, kWatchReplyTag, status_comm_, &w.reply) == MPI_SUCCESS &&
          MPI_Isend(&watch_query_, 1, MPI_INT64_T, r, kQueryTag, status_comm_, &q) == MPI_SUCCESS) {
        MPI_Request_free(&q);
      }
    }
    return -1;
  }

  [[nodiscard]] static MPI_Datatype type(raw_tensor t) noexcept { return detail::mpi::runtime::type_of(t.type); }

  [[nodiscard]] std::string describe(collective c, const std::string& peers) const {
    return where(c) + (peers.empty() ? "" : " " + peers);
  }

  // MPI counts are ints.
  [[nodiscard]] int count_of(collective c, raw_tensor t) const {
    if (t.count > static_cast<std::size_t>(INT_MAX)) {
      throw invalid_argument_error(describe(c, "") + ": " + std::to_string(t.count) +
                                   " elements is more than MPI's int count takes (at most " +
                                   std::to_string(INT_MAX) + "); split the buffer");
    }
    return static_cast<int>(t.count);
  }

  work post_p2p(collective c, raw_tensor t, int peer, int tag) {
    const std::string peers = (c == collective::send ? "to rank " : "from rank ") + std::to_string(peer) + " tag " +
                              std::to_string(tag);
    if (tag < 0 || tag > comm_.tag_ub) {
      throw invalid_argument_error(describe(c, peers) + ": tag must be in [0, " + std::to_string(comm_.tag_ub) +
                                   "] (MPI_TAG_UB), got " + std::to_string(tag));
    }
    if (t.count == 0) return work::completed();
    const int n = count_of(c, t);
    poster start = c == collective::send
                       ? poster([this, t, n, peer, tag](MPI_Request* r) {
                           return MPI_Isend(t.data, n, type(t), peer, tag, comm_.comm, r);
                         })
                       : poster([this, t, n, peer, tag](MPI_Request* r) {
                           return MPI_Irecv(t.data, n, type(t), peer, tag, comm_.comm, r);
                         });
    return post(c, peers, std::move(start), {}, peer);
  }

  work post(collective c, std::string peers, poster start, std::function<void()> finish = {}, int peer = -1) {
    auto state = std::make_shared<detail::work_state>();
    {
      std::lock_guard lock(mutex_);
      if (!failure_.empty()) {
        return work::completed(std::make_exception_ptr(communication_error(
            describe(c, peers) + ": the MPI communicator is unusable after an earlier failure (" + failure_ + ")",
            error_site{.rank = rank(), .operation = std::string(to_string(c)), .peer = peer})));
      }
      queue_.push_back(op{c, std::move(peers), peer, std::move(start), std::move(finish), state});
      queue_.back().number = issued_operations();
    }
    cv_.notify_one();
    return work(state);
  }

  // The progress thread: posts queued operations in issue order, tests the active ones, completes
  // the finished ones (collectives in issue order) outside the MPI lock (their callbacks may issue
  // more operations).
  void progress_loop() {
    std::vector<op> active;
    std::vector<op> done;
    auto last_progress = std::chrono::steady_clock::now();
    std::chrono::microseconds sleep{10};
    for (;;) {
      std::deque<op> fresh;
      {
        std::unique_lock lock(mutex_);
        if (active.empty()) {
          cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        } else if (std::chrono::steady_clock::now() - last_progress > mopts_.spin) {
          cv_.wait_for(lock, sleep, [&] { return stopping_ || !queue_.empty(); });
          sleep = std::min<std::chrono::microseconds>(sleep * 2, std::max(mopts_.max_sleep, std::chrono::microseconds{1}));
        }
        if (stopping_ && queue_.empty() && active.empty()) return;
        fresh.swap(queue_);
      }
      const auto now = std::chrono::steady_clock::now();
      {
        std::lock_guard mpi_lock(rt_->mutex());
        for (auto& o : fresh) {
          o.started = now;
          o.deadline = now + timeout();
          if (int rc = o.start(&o.request); rc != MPI_SUCCESS) {
            fail(o, "MPI failed to start it: " + detail::mpi::error_string(rc), false);
            done.push_back(std::move(o));
          } else {
            active.push_back(std::move(o));
          }
        }
        bool collective_open = false;  // an earlier collective has not finished yet
        for (auto it = active.begin(); it != active.end();) {
          const bool is_collective = it->what != collective::send && it->what != collective::recv;
          int flag = 0;
          const int rc = MPI_Test(&it->request, &flag, MPI_STATUS_IGNORE);
          if (rc == MPI_SUCCESS && flag && is_collective && collective_open) {
            // Finished before an earlier one: held so that collectives complete in issue order,
            // as on the other backends. Its request is now null, so the next test says done.
            ++it;
            continue;
          }
          if (rc != MPI_SUCCESS) {
            fail(*it, "MPI failed (a peer died or its connection broke): " + detail::mpi::error_string(rc), false);
          } else if (!flag && now > it->deadline) {
            fail(*it, "timed out after " + std::to_string(timeout().count()) +
                          " ms (a peer is stalled, died, or never joined this operation)", true);
          } else if (!flag) {
            collective_open = collective_open || is_collective;
            ++it;
            continue;
          }
          done.push_back(std::move(*it));
          it = active.erase(it);
        }
        if (mopts_.silence.count() > 0 && size() > 1) {
          if (const int silent = watch_peers(active, now); silent >= 0) fail_waiting(active, done, silent, now);
        }
      }
      if (!fresh.empty() || !done.empty()) {
        last_progress = now;
        sleep = std::chrono::microseconds{10};
      }
      finished_ += done.size();
      for (auto& o : done) {
        std::exception_ptr err = o.error;
        if (!err && o.finish) {
          try {
            o.finish();
          } catch (...) {
            err = std::current_exception();
          }
        }
        o.state->complete(err);
      }
      done.clear();
    }
  }

  // The silence watch found `silent`: fails the operations that waited for it longer than the
  // window (the others keep their own deadlines).
  void fail_waiting(std::vector<op>& active, std::vector<op>& done, int silent,
                    std::chrono::steady_clock::time_point now) {
    const auto ms = [](auto d) {
      return std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(d).count()) + " ms";
    };
    const std::string who = "rank " + std::to_string(silent);
    for (auto it = active.begin(); it != active.end();) {
      if (now - it->started <= mopts_.silence || (it->peer >= 0 && it->peer != silent)) {
        ++it;
        continue;
      }
      fail(*it, who + " is silent: this operation waited " + ms(now - it->started) + ", and " + who +
                    " left a status query unanswered for " + ms(now - watched_[silent].asked) +
                    " (its process is stopped, hung or dead, or it destroyed this group; a rank busy in its own code "
                    "still answers; peers are asked after " + ms(mopts_.silence) + ", PARTRAIN_SILENCE_MS)",
           true, silent);
      done.push_back(std::move(*it));
      it = active.erase(it);
    }
  }

  // Called by the progress thread, under the MPI lock: records why `o` failed (timed out: its
  // deadline passed, or, when silent_peer >= 0, that peer went silent). The request, if any,
  // stays with MPI (nothing can cancel a collective), so the communicator is never freed.
  void fail(op& o, const std::string& why, bool timed_out, int silent_peer = -1) {
    std::string msg = describe(o.what, o.peers) + ": " + why;
    if (timed_out && silent_peer < 0 && size() > 1) msg += "; " + ask_peers(o.number);
    error_site site{.rank = rank(), .operation = std::string(to_string(o.what)),
                    .peer = silent_peer >= 0 ? silent_peer : o.peer};
    if (timed_out) {
      if (mopts_.abort_on_timeout) detail::mpi::runtime::abort_job(msg);
      site.timeout = silent_peer >= 0 ? mopts_.silence : timeout();
      o.error = std::make_exception_ptr(timeout_error(msg, std::move(site)));
    } else {
      o.error = std::make_exception_ptr(communication_error(msg, std::move(site)));
    }
    std::lock_guard lock(mutex_);
    if (failure_.empty()) failure_ = msg;
    if (o.request != MPI_REQUEST_NULL) abandoned_ = true;
  }

  mpi_options mopts_{};
  detail::mpi::comm_handle comm_;
  // The status protocol's own communicator (queries never meet the group's operations), the
  // posted query receive and its buffer, answers in flight, and what the progress thread finished.
  MPI_Comm status_comm_ = MPI_COMM_NULL;
  MPI_Request query_req_ = MPI_REQUEST_NULL;
  std::int64_t query_in_ = 0;
  std::int64_t query_out_ = kReplyTag;
  std::int64_t watch_query_ = kWatchReplyTag;
  std::deque<std::pair<std::array<std::int64_t, 2>, MPI_Request>> replies_;
  std::atomic<std::uint64_t> finished_{0};
  // The silence watch's peers (the progress thread's alone): the outstanding query, when it was
  // sent, how many rounds it has gone unanswered. A map: the answers MPI writes never move.
  struct peer_watch {
    MPI_Request reply = MPI_REQUEST_NULL;
    std::array<std::int64_t, 2> answer{};
    std::chrono::steady_clock::time_point asked{};
    int missed = 0;
  };
  std::map<int, peer_watch> watched_;
  std::chrono::steady_clock::time_point next_round_{};
  detail::mpi::runtime* rt_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<op> queue_;
  bool stopping_ = false;
  bool abandoned_ = false;
  std::string failure_;
  std::thread progress_;
  std::jthread status_;  // answers the other ranks' status queries
};

static_assert(communicator<mpi_group>);

}  // namespace partrain::inline v0
