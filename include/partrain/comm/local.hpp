// partrain/comm/local.hpp: the `local` backend, a shared-memory group of threads in one
// process. data_parallel and the fast tests use it. Each rank's collectives run on that
// rank's own worker thread (or, with inline_collectives, on the calling thread); ranks meet at a
// barrier with a deadline, so a rank that never comes (or threw) makes the others fail with an
// error naming it, never a hang.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <system_error>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include <partrain/comm/detail/host_reduce.hpp>
#include <partrain/comm/process_group.hpp>
#include <partrain/config.hpp>
#include <partrain/core/affinity.hpp>
#include <partrain/core/executor.hpp>

namespace partrain::inline v0 {

namespace detail::local {

// State shared by the ranks of one local world.
class world_state {
 public:
  struct slot {
    const void* in = nullptr;  // what the rank contributes
    void* out = nullptr;       // where its result goes
    std::size_t count = 0;     // elements of in
    dtype type = dtype::float32;
    reduce_op op = reduce_op::sum;
    int root = -1;
    collective kind = collective::barrier;
    double divisor = 0;  // all_reduce_divided's; 0 for every other call
    bool exchange = false;  // local_group::exchange (matched only with another exchange)
  };

  world_state(int n, std::chrono::milliseconds timeout)
      : n_(n), timeout_(timeout), slots_(static_cast<std::size_t>(n)), arrivals_(static_cast<std::size_t>(n), 0) {}

  [[nodiscard]] int size() const noexcept { return n_; }

  // A member that leaves (destroys its group) aborts the world, so its peers fail at once instead
  // of at their timeout: groups made per quorum by local_group_registry.
  void abort_on_leave() noexcept { abort_on_leave_ = true; }
  [[nodiscard]] bool aborts_on_leave() const noexcept { return abort_on_leave_; }

  // Ranks that own a core (inline collectives, pinned) poll for up to d before sleeping at a
  // meeting: a peer a few microseconds behind then costs no sleep and wake-up, which on a
  // virtual machine means waking a halted CPU (a barrier of 2 ranks: 16 us asleep, 1.5 us polling).
  void spin_before_blocking(std::chrono::microseconds d) noexcept { spin_ = d; }
  [[nodiscard]] slot& at(int r) noexcept { return slots_[static_cast<std::size_t>(r)]; }

  // All ranks meet here. Throws timeout_error naming the ranks that never arrived, or
  // communication_error when the world was aborted (a rank failed).
  void arrive_and_wait(int rank, collective c, std::string_view phase) {
    std::unique_lock lock(mutex_);
    throw_if_aborted(rank, c);
    const std::uint64_t gen = generation_;
    arrivals_[static_cast<std::size_t>(rank)] = gen + 1;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++generation_;
      published_.store(generation_, std::memory_order_release);
      cv_.notify_all();
      return;
    }
    if (spin_.count() > 0) {
      lock.unlock();
      poll_until_next(gen);
      lock.lock();
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    if (!cv_.wait_until(lock, deadline, [&] { return generation_ != gen || aborted_; })) {
      std::string missing;
      int first_missing = -1;
      for (int q = 0; q < n_; ++q) {
        if (arrivals_[static_cast<std::size_t>(q)] == gen + 1) continue;
        missing += (missing.empty() ? "" : ", ") + std::to_string(q);
        if (first_missing < 0) first_missing = q;
      }
      std::string msg = "rank " + std::to_string(rank) + " " + std::string(to_string(c)) + " (local, " +
                        std::string(phase) + "): timed out after " + std::to_string(timeout_.count()) +
                        " ms waiting for rank(s) " + missing;
      abort_locked(msg);
      throw timeout_error(msg, {.rank = rank, .operation = std::string(to_string(c)), .peer = first_missing, .timeout = timeout_});
    }
    if (generation_ == gen) throw_if_aborted(rank, c);
  }

  void abort(const std::string& why, int origin = -1) {
    std::lock_guard lock(mutex_);
    abort_locked(why, origin);
  }

  // Point-to-point: eager, the sender's bytes are copied into a mailbox.
  void post(int src, int dst, int tag, const void* data, std::size_t bytes) {
    std::vector<std::byte> msg(bytes);
    if (bytes) std::memcpy(msg.data(), data, bytes);
    {
      std::lock_guard lock(mutex_);
      mail_[{src, dst, tag}].push_back(std::move(msg));
    }
    cv_.notify_all();
  }
  void take(int src, int dst, int tag, void* data, std::size_t bytes) {
    std::unique_lock lock(mutex_);
    auto& box = mail_[{src, dst, tag}];
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    if (!cv_.wait_until(lock, deadline, [&] { return !box.empty() || aborted_; })) {
      std::string msg = "rank " + std::to_string(dst) + " recv (local) from rank " + std::to_string(src) + " tag " +
                        std::to_string(tag) + ": timed out after " + std::to_string(timeout_.count()) + " ms";
      abort_locked(msg);
      throw timeout_error(msg, {.rank = dst, .operation = "recv", .peer = src, .timeout = timeout_});
    }
    if (box.empty()) throw_if_aborted(dst, collective::recv);
    auto msg = std::move(box.front());
    box.pop_front();
    if (msg.size() != bytes) {
      throw communication_error("rank " + std::to_string(dst) + " recv (local) from rank " + std::to_string(src) +
                                ": message has " + std::to_string(msg.size()) + " bytes, the receive buffer " +
                                std::to_string(bytes));
    }
    if (bytes) std::memcpy(data, msg.data(), bytes);
  }

  // The world of a split's group `color` (split number `seq` of this world): the first member to
  // ask makes it, the others get the same one; forgotten once all `size` members have it.
  [[nodiscard]] std::shared_ptr<world_state> subworld(std::uint64_t seq, int color, int size) {
    std::lock_guard lock(mutex_);
    auto& [w, handed] = subworlds_[{seq, color}];
    if (!w) {
      w = std::make_shared<world_state>(size, timeout_);
      w->spin_before_blocking(spin_);  // the same threads meet there
    }
    auto out = w;
    if (++handed == size) subworlds_.erase({seq, color});
    return out;
  }

 private:
  void throw_if_aborted(int rank, collective c) const {
    if (aborted_) throw aborted_error({.rank = rank, .operation = std::string(to_string(c)) + " (local)"}, abort_origin_, abort_reason_);
  }
  void abort_locked(const std::string& why, int origin = -1) {
    if (!aborted_) {
      aborted_ = true;
      abort_reason_ = why;
      abort_origin_ = origin;
      abort_published_.store(true, std::memory_order_release);
    }
    cv_.notify_all();
  }

  // Polls, without the lock, until generation `gen` ends, the world aborts or spin_ passes; the
  // caller then takes the lock and checks (or sleeps) as before.
  void poll_until_next(std::uint64_t gen) const noexcept {
    const auto until = std::chrono::steady_clock::now() + spin_;
    for (unsigned k = 1;; ++k) {
      if (published_.load(std::memory_order_acquire) != gen || abort_published_.load(std::memory_order_acquire)) return;
      if (k % 64 == 0 && std::chrono::steady_clock::now() >= until) return;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#elif defined(__aarch64__)
      asm volatile("yield");
#endif
    }
  }

  int n_;
  std::chrono::milliseconds timeout_;
  std::vector<slot> slots_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0;
  std::uint64_t generation_ = 0;
  std::atomic<std::uint64_t> published_{0};  // generation_, readable without the lock
  std::atomic<bool> abort_published_{false};  // aborted_, readable without the lock
  std::chrono::microseconds spin_{0};         // set before the ranks start
  bool abort_on_leave_ = false;                // set before the ranks start
  std::vector<std::uint64_t> arrivals_;
  bool aborted_ = false;
  std::string abort_reason_;
  int abort_origin_ = -1;
  std::map<std::tuple<int, int, int>, std::deque<std::vector<std::byte>>> mail_;
  std::map<std::pair<std::uint64_t, int>, std::pair<std::shared_ptr<world_state>, int>> subworlds_;
};

// Reduces elements [first, last) of every rank's `in` (in rank order, so every run and every
// rank sees the same rounding) into each of outs (each receives element `first` at its start),
// a block at a time so the accumulator stays in cache. divisor > 0: a sum of each input divided
// by it (all_reduce_divided), the division done in the same pass.
inline void reduce_ranks_into(world_state& w, std::span<void* const> outs, std::size_t first,
                              std::size_t last, dtype t, reduce_op op, double divisor = 0) {
  constexpr std::size_t block = 4096;
  alignas(64) std::byte acc[block * 8];
  const std::size_t es = size_of(t);
  for (std::size_t b = first; b < last; b += block) {
    const std::size_t n = std::min(block, last - b);
    auto in = [&](int q) { return static_cast<const std::byte*>(w.at(q).in) + b * es; };
    if (divisor > 0) {
      auto input = [&](std::size_t q) -> const void* { return in(static_cast<int>(q)); };
      host_sum_divided(acc, input, static_cast<std::size_t>(w.size()), n, t, divisor);
    } else {
      std::memcpy(acc, in(0), n * es);
      for (int q = 1; q < w.size(); ++q) host_reduce(acc, in(q), n, t, op);
    }
    if (op == reduce_op::avg) host_divide(acc, n, t, w.size());
    for (void* out : outs) std::memcpy(static_cast<std::byte*>(out) + (b - first) * es, acc, n * es);
  }
}

}  // namespace detail::local

class local_group final : public process_group {
 public:
  local_group(std::shared_ptr<detail::local::world_state> world, int rank, process_group_options opts)
      : process_group(rank, world->size(), opts), world_(std::move(world)) {}
  local_group(const local_group&) = delete;
  local_group& operator=(const local_group&) = delete;
  ~local_group() override {
    if (world_->aborts_on_leave()) world_->abort("rank " + std::to_string(rank()) + " left the group", rank());
  }

  [[nodiscard]] std::string_view backend() const noexcept override { return "local"; }
  // One rank's buffers as exchange() shows them to every rank.
  struct peer_buffers {
    const void* in = nullptr;
    void* out = nullptr;
  };
  // A collective only ranks in one address space can offer: every rank publishes `in` (count
  // elements of type t) and `out`, the ranks meet, each runs body(peers) with every rank's pair
  // (in rank order), and they meet again, so nobody reuses a buffer a peer still touches. body may
  // read any rank's `in` and write any rank's `out` where the ranks agreed who writes what:
  // sharded_data_parallel's step over shared memory has each rank reduce its own block of every
  // rank's gradients, step it and write the result into every rank's parameters, one pass instead
  // of a reduce_scatter, a step and an all_gather. Matched like any collective (an exchange of
  // the same count and type on every rank); errors and timeouts name the operation as all_reduce,
  // and traffic() counts it as the all_reduce of `in` it stands for.
  work exchange(const void* in, void* out, std::size_t count, dtype t,
                std::function<void(std::span<const peer_buffers>)> body) {
    const raw_tensor shape{const_cast<void*>(in), count, t, false};
    count_traffic(collective::all_reduce, shape.bytes());
    return run(collective::all_reduce, in, out, shape, -1, reduce_op::sum,
               [this, body = std::move(body)](detail::local::world_state& w) {
                 std::vector<peer_buffers> peers;
                 peers.reserve(static_cast<std::size_t>(size()));
                 for (int q = 0; q < size(); ++q) peers.push_back({w.at(q).in, w.at(q).out});
                 body(peers);
               },
               false, 0, true);
  }

  // Marks the world failed, so peers blocked in a collective stop waiting (used when a rank throws).
  // `origin` is the rank whose failure this is (aborted_error::origin() in the peers).
  void abort(const std::string& why, int origin = -1) { world_->abort(why, origin); }

 protected:
  work do_all_reduce(raw_tensor t, reduce_op op) override { return all_reduce_chunks(t, op, 0); }
  // The division folded into the reduction: each block of every input is divided as it is added.
  work do_all_reduce_divided(raw_tensor t, double divisor) override {
    return all_reduce_chunks(t, reduce_op::sum, divisor);
  }
  work do_broadcast(raw_tensor t, int root) override {
    return run(collective::broadcast, t.data, t.data, t, root, reduce_op::sum, [this, t, root](detail::local::world_state& w) {
      if (rank() != root && t.count) std::memcpy(t.data, w.at(root).in, t.bytes());
    });
  }
  work do_reduce(raw_tensor t, int root, reduce_op op) override {
    // The root reduces into scratch first: its own input must stay readable until all are done.
    return run(collective::reduce, t.data, nullptr, t, root, op, [this, t, root, op](detail::local::world_state& w) {
      if (rank() != root) return;
      std::vector<std::byte> result(t.bytes());
      void* out = result.data();
      detail::local::reduce_ranks_into(w, std::span(&out, 1), 0, t.count, t.type, op);
      w.arrive_and_wait(rank(), collective::reduce, "reduce");
      if (t.count) std::memcpy(t.data, result.data(), result.size());
    }, /*root_only_phase=*/true);
  }
  work do_all_gather(raw_tensor in, raw_tensor out) override {
    return run(collective::all_gather, in.data, out.data, in, -1, reduce_op::sum, [this, in, out](detail::local::world_state& w) {
      for (int q = 0; q < size(); ++q) {
        if (in.count) {
          std::memcpy(static_cast<std::byte*>(out.data) + static_cast<std::size_t>(q) * in.bytes(), w.at(q).in, in.bytes());
        }
      }
    });
  }
  work do_reduce_scatter(raw_tensor in, raw_tensor out, reduce_op op) override {
    return run(collective::reduce_scatter, in.data, out.data, out, -1, op, [this, out, op](detail::local::world_state& w) {
      const std::size_t lo = static_cast<std::size_t>(rank()) * out.count;
      detail::local::reduce_ranks_into(w, std::span(&out.data, 1), lo, lo + out.count, out.type, op);
    });
  }
  std::unique_ptr<process_group> do_split(const split_request& r) override {
    return std::make_unique<local_group>(world_->subworld(r.seq, r.color, static_cast<int>(r.members.size())), r.index,
                                         options());
  }
  work do_barrier() override {
    return run(collective::barrier, nullptr, nullptr, raw_tensor{nullptr, 0, dtype::uint8, false}, -1, reduce_op::sum,
               [](detail::local::world_state&) {});
  }
  work do_send(raw_tensor t, int dst, int tag) override {
    return worker_.submit([w = world_, src = rank(), t, dst, tag] { w->post(src, dst, tag, t.data, t.bytes()); });
  }
  work do_recv(raw_tensor t, int src, int tag) override {
    return worker_.submit([w = world_, dst = rank(), t, src, tag] { w->take(src, dst, tag, t.data, t.bytes()); });
  }

 private:
  work all_reduce_chunks(raw_tensor t, reduce_op op, double divisor) {
    return run(collective::all_reduce, t.data, t.data, t, -1, op, [this, t, op, divisor](detail::local::world_state& w) {
      // Rank r reduces chunk r of every input and writes the result into chunk r of every
      // rank's buffer: one pass, no second copy phase. Safe because nobody else reads or
      // writes chunk r, and each block is read from all ranks before it is overwritten.
      const auto [lo, hi] = chunk(t.count, rank());
      std::vector<void*> outs;
      for (int q = 0; q < size(); ++q) outs.push_back(static_cast<std::byte*>(w.at(q).out) + lo * size_of(t.type));
      detail::local::reduce_ranks_into(w, outs, lo, hi, t.type, op, divisor);
    }, false, divisor);
  }

  [[nodiscard]] std::pair<std::size_t, std::size_t> chunk(std::size_t n, int r) const noexcept {
    const auto p = static_cast<std::size_t>(size());
    const auto q = static_cast<std::size_t>(r);
    return {n * q / p, n * (q + 1) / p};
  }

  // Publish the slot, meet, check that every rank called the same thing, run body, meet again
  // (nobody may reuse a buffer a peer still reads).
  template <class Body>
  work run(collective c, const void* in, void* out, raw_tensor t, int root, reduce_op op, Body body,
           bool root_only_phase = false, double divisor = 0, bool exchange = false) {
    auto meet = [this, c, in, out, t, root, op, body = std::move(body), root_only_phase, divisor, exchange] {
      auto& w = *world_;
      w.at(rank()) = {in, out, t.count, t.type, op, root, c, divisor, exchange};
      w.arrive_and_wait(rank(), c, "enter");
      check_matching(w, c);
      body(w);
      // reduce: the root met the others once more inside body; keep the count of meetings equal.
      if (root_only_phase && rank() != root) w.arrive_and_wait(rank(), c, "reduce");
      w.arrive_and_wait(rank(), c, "exit");
    };
    if (!options().inline_collectives.value_or(false)) return worker_.submit(std::move(meet));
    try {
      meet();
    } catch (...) {
      return work::completed(std::current_exception());
    }
    return work::completed();
  }

  void check_matching(detail::local::world_state& w, collective c) const {
    const auto& me = w.at(rank());
    for (int q = 0; q < size(); ++q) {
      const auto& o = w.at(q);
      if (o.kind != me.kind || o.count != me.count || o.type != me.type || o.root != me.root || o.op != me.op ||
          o.divisor != me.divisor || o.exchange != me.exchange) {
        auto describe = [](const detail::local::world_state::slot& s) {
          return std::string(s.exchange ? "exchange" : to_string(s.kind)) + "(" + std::string(to_string(s.type)) + " x " +
                 std::to_string(s.count) + ", root " + std::to_string(s.root) + ", op " +
                 std::string(to_string(s.op)) + (s.divisor > 0 ? ", divided by " + std::to_string(s.divisor) : "") + ")";
        };
        throw communication_error(where(c) + ": rank " + std::to_string(rank()) + " called " + describe(me) +
                                  " but rank " + std::to_string(q) + " called " + describe(o) +
                                  " (every rank must issue the same collectives with the same sizes)");
      }
    }
  }

  std::shared_ptr<detail::local::world_state> world_;
  detail::executor worker_;  // last: joined before world_ goes away
};

namespace detail::local {
[[nodiscard]] inline std::shared_ptr<world_state> make_world(int world_size, const process_group_options& opts) {
  if (world_size <= 0) throw config_error("world size must be at least 1, got " + std::to_string(world_size));
  return std::make_shared<world_state>(world_size, opts.timeout);
}
[[nodiscard]] inline std::vector<std::unique_ptr<local_group>> make_ranks(const std::shared_ptr<world_state>& state,
                                                                        const process_group_options& opts) {
  std::vector<std::unique_ptr<local_group>> ranks;
  for (int r = 0; r < state->size(); ++r) ranks.push_back(std::make_unique<local_group>(state, r, opts));
  return ranks;
}
}  // namespace detail::local

// Creates the ranks of a local world, for callers that manage their own threads.
[[nodiscard]] inline std::vector<std::unique_ptr<local_group>> make_local_world(int world_size,
                                                                               process_group_options opts = {}) {
  return detail::local::make_ranks(detail::local::make_world(world_size, opts), opts);
}

// Local groups made on demand by id, for callers whose groups change while their threads run
// (replica_group's quorums): the first thread to ask for group `id` makes its world, each member
// takes its own rank. A member that leaves such a group aborts it, so its peers fail at once.
class local_group_registry {
 public:
  explicit local_group_registry(process_group_options opts = {}) : opts_(std::move(opts)) {}

  [[nodiscard]] std::unique_ptr<process_group> make(std::int64_t id, int rank, int size) {
    std::lock_guard lock(mutex_);
    auto& ranks = worlds_[id];
    if (ranks.empty()) {
      auto world = detail::local::make_world(size, opts_);
      world->abort_on_leave();
      // Callers whose ranks each own a core (both flags set, as run_local sets them) meet there.
      if (opts_.inline_collectives.value_or(false) && opts_.pin_threads.value_or(false)) {
        world->spin_before_blocking(std::chrono::microseconds(50));
      }
      ranks = detail::local::make_ranks(world, opts_);
    }
    const std::string what = "local_group_registry: group " + std::to_string(id) + " rank " + std::to_string(rank);
    if (static_cast<int>(ranks.size()) != size) {
      throw invalid_argument_error(what + " asked with size " + std::to_string(size) + ", but the group was made with " +
                                   std::to_string(ranks.size()));
    }
    if (rank < 0 || rank >= size || !ranks[static_cast<std::size_t>(rank)]) {
      throw invalid_argument_error(what + ": out of range or taken twice (size " + std::to_string(size) + ")");
    }
    std::unique_ptr<process_group> g = std::move(ranks[static_cast<std::size_t>(rank)]);
    if (std::ranges::all_of(ranks, [](const auto& p) { return p == nullptr; })) worlds_.erase(id);
    return g;
  }

 private:
  std::mutex mutex_;
  process_group_options opts_;
  std::map<std::int64_t, std::vector<std::unique_ptr<local_group>>> worlds_;
};

namespace detail::local {
// run_local's body, for any fn: one definition (compiled once in PARTRAIN_COMPILED mode).
PARTRAIN_LINKAGE void run_threads(int world_size, const std::function<void(local_group&)>& fn, process_group_options opts);
}  // namespace detail::local

// Runs fn(group) on world_size threads, one rank each, and waits for all. If a rank throws, the
// world is aborted (peers stop waiting) and the first failure is rethrown, naming its rank.
// opts.pin_threads: when the ranks are as many as the allowed CPUs, rank r's thread (and the
// threads it starts) runs on the r-th of them.
template <class F>
  requires std::invocable<F&, local_group&>
void run_local(int world_size, F fn, process_group_options opts = {}) {
  detail::local::run_threads(world_size, [&fn](local_group& g) { fn(g); }, std::move(opts));
}

#if PARTRAIN_DEFINITIONS
PARTRAIN_LINKAGE void detail::local::run_threads(int world_size, const std::function<void(local_group&)>& fn,
                                                 process_group_options opts) {
  // The fastest safe defaults: ranks that each have a CPU meet on their own threads, pinned.
  const std::vector<int> allowed = allowed_cpus();
  const bool fits = !allowed.empty() && world_size <= static_cast<int>(allowed.size());
  if (!opts.inline_collectives) opts.inline_collectives = fits;
  if (!opts.pin_threads) opts.pin_threads = fits;
  auto state = make_world(world_size, opts);
  std::vector<int> cpus;
  if (*opts.pin_threads) cpus = allowed;
  // Only a world that fills the CPUs: the threads a rank starts (its loader's, its worker) inherit
  // its one CPU, which costs nothing when no CPU is idle and would leave the spare ones unused.
  const bool pin = world_size == static_cast<int>(cpus.size());
  // A rank alone on its core meets its peers on that core: polling there takes nobody's turn.
  if (pin && *opts.inline_collectives) state->spin_before_blocking(std::chrono::microseconds(50));
  auto ranks = make_ranks(state, opts);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(world_size));
  std::string not_started;  // why a rank's thread could not be created
  {
    std::vector<std::jthread> threads;
    threads.reserve(static_cast<std::size_t>(world_size));
    auto rank_body = [&](int r) {
      if (pin) pin_this_thread(cpus[static_cast<std::size_t>(r)]);
      auto& g = *ranks[static_cast<std::size_t>(r)];
      try {
        fn(g);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
        g.abort("rank " + std::to_string(r) + " failed: " + e.what(), r);
      } catch (...) {
        errors[static_cast<std::size_t>(r)] = std::current_exception();
        g.abort("rank " + std::to_string(r) + " failed", r);
      }
    };
    for (int r = 0; r < world_size && not_started.empty(); ++r) {
      try {
        threads.emplace_back(rank_body, r);
      } catch (const std::system_error& e) {
        // The started ranks would wait for this one until their timeout: they stop now.
        not_started = "run_local: could not start rank " + std::to_string(r) + "'s thread (" + e.what() + "); " +
                      std::to_string(r) + " of " + std::to_string(world_size) +
                      " ranks started. Use fewer ranks, or raise the limit that stopped it (tasks: ulimit -u or the "
                      "cgroup's pids.max; memory for thread stacks: ulimit -v)";
        state->abort(not_started);
      }
    }
  }
  if (!not_started.empty()) throw config_error(not_started);
  // Prefer the root cause: a rank whose error is not an aborted_error echo of another's.
  if (auto first = root_cause(errors)) std::rethrow_exception(first);
}
#endif

}  // namespace partrain::inline v0
