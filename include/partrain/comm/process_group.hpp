// partrain/comm/process_group.hpp: the polymorphic base of the backends (local, gloo, nccl).
// The typed front checks arguments and, in checking mode, that every rank issues the same
// collective with the same size and dtype; the backend implements the type-erased hooks.
#pragma once

#include <array>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <partrain/comm/detail/host_reduce.hpp>
#include <partrain/comm/reduce_op.hpp>
#include <partrain/config.hpp>
#include <partrain/core/device.hpp>
#include <partrain/core/dtype.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/core/work.hpp>

namespace partrain::inline v0 {

inline constexpr std::chrono::milliseconds default_timeout{300'000};

struct process_group_options {
  // Bound on every blocking operation; a missing or stalled peer fails within it.
  std::chrono::milliseconds timeout = default_timeout;
  // Verify op, dtype, size and root across ranks before each collective (like
  // TORCH_DISTRIBUTED_DEBUG=DETAIL). Also switched on by PARTRAIN_DEBUG=detail.
  bool check_collectives = false;
  // The local backend only (ranks as threads of one process). Run each collective on the calling
  // thread, as a blocking MPI collective does: the call returns a finished work once the ranks have
  // met, instead of handing the collective to the rank's worker thread. Where the ranks fill the
  // cores the worker has no core of its own to overlap on; it only adds a hand-off and a wake-up
  // to every collective (docs/performance.md). Send and recv stay asynchronous.
  // Unset (the default): run_local, and run_ranks' local backend, turn it on when the ranks do not
  // outnumber the CPUs the process may use, and leave it off when they do (then a rank waiting in
  // a collective would hold a core another rank needs); make_local_world leaves it off.
  std::optional<bool> inline_collectives{};
  // The local backend only: run_local pins rank r's thread to the r-th CPU its caller may run
  // on when the ranks are exactly as many as those CPUs (otherwise nothing is pinned; threads a
  // rank starts share its CPU, which would leave spare CPUs idle). Linux. Unset (the default):
  // on, where that rule allows it.
  std::optional<bool> pin_threads{};
};

// PARTRAIN_DEBUG, TORCH_DISTRIBUTED_DEBUG's values in any case: OFF (or unset, or empty), INFO
// (nothing more yet), DETAIL (every collective's fingerprint compared across ranks). Anything else
// is refused by name rather than ignored.
[[nodiscard]] inline bool debug_detail(std::string_view v) {
  std::string t(v);
  for (char& c : t) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (t.empty() || t == "off" || t == "info") return false;
  if (t == "detail") return true;
  throw config_error("PARTRAIN_DEBUG is '" + std::string(v) + "', expected OFF, INFO or DETAIL (any case)");
}
[[nodiscard]] inline bool debug_detail_from_env() {
  const char* v = std::getenv("PARTRAIN_DEBUG");
  return v && debug_detail(v);
}

enum class collective { all_reduce, broadcast, reduce, all_gather, reduce_scatter, barrier, send, recv };

[[nodiscard]] constexpr std::string_view to_string(collective c) noexcept {
  switch (c) {
    case collective::all_reduce: return "all_reduce";
    case collective::broadcast: return "broadcast";
    case collective::reduce: return "reduce";
    case collective::all_gather: return "all_gather";
    case collective::reduce_scatter: return "reduce_scatter";
    case collective::barrier: return "barrier";
    case collective::send: return "send";
    case collective::recv: return "recv";
  }
  return "unknown";
}

// A type-erased contiguous buffer: what backends see.
struct raw_tensor {
  void* data = nullptr;
  std::size_t count = 0;
  partrain::dtype type = dtype::float32;
  bool on_cuda = false;

  [[nodiscard]] std::size_t bytes() const noexcept { return count * size_of(type); }
};

template <class T, memory_space S>
[[nodiscard]] raw_tensor erase(tensor_view<T, S> t) noexcept {
  return {const_cast<std::remove_const_t<T>*>(t.data()), t.size(), dtype_of<T>, std::same_as<S, cuda>};
}

// What a group's collectives moved from this rank since the last reset: `bytes_sent` counts the
// bytes a bandwidth-optimal (ring) algorithm sends per rank, whatever the engine really does, so
// that policies compare by the same measure: an all_reduce of N bytes sends 2(n-1)/n N, a
// reduce_scatter or all_gather (n-1)/n of its whole buffer, a broadcast or reduce N (a pipelined
// chain), a send N; a recv or barrier nothing. `calls` counts the calls that move data (not recv
// or barrier). No bytes are counted on a group of one.
struct comm_traffic {
  std::uint64_t calls = 0;
  std::uint64_t bytes_sent = 0;
};

class process_group {
 public:
  process_group(int rank, int size, process_group_options opts) : rank_(rank), size_(size), opts_(opts) {
    if (size <= 0) throw config_error("world size must be at least 1, got " + std::to_string(size));
    if (rank < 0 || rank >= size) {
      throw config_error("rank " + std::to_string(rank) + " is out of range for world size " + std::to_string(size) +
                         " (expected 0 <= rank < world size)");
    }
    if (debug_detail_from_env()) opts_.check_collectives = true;
  }
  process_group(const process_group&) = delete;
  process_group& operator=(const process_group&) = delete;
  virtual ~process_group() = default;

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }
  [[nodiscard]] std::chrono::milliseconds timeout() const noexcept { return opts_.timeout; }
  [[nodiscard]] const process_group_options& options() const noexcept { return opts_; }
  [[nodiscard]] comm_traffic traffic() const noexcept {
    return {calls_.load(std::memory_order_relaxed), bytes_sent_.load(std::memory_order_relaxed)};
  }
  void reset_traffic() noexcept {
    calls_.store(0, std::memory_order_relaxed);
    bytes_sent_.store(0, std::memory_order_relaxed);
  }
  // The last operation issued on this group and how many came before it ("all_reduce #42";
  // "none" before the first), for errors that name what a rank was doing (liveness.hpp).
  [[nodiscard]] std::string last_operation() const {
    const auto v = last_op_.load(std::memory_order_relaxed);
    if (v == 0) return "none";
    return std::string(to_string(static_cast<collective>(v & 0xff))) + " #" + std::to_string(v >> 8);
  }
  // Keeps p alive as long as the group (what init_process_group starts beside it: the liveness
  // watch). Destroyed after the backend's own members.
  void attach(std::shared_ptr<void> p) { attachments_.push_back(std::move(p)); }
  // Who had not issued operation #op (this rank's numbering, issued_operations()) yet, as the
  // job's heartbeats tell; liveness.hpp installs it. Backends append it to a collective timeout,
  // so the error names the peers that did not arrive. Set before first use.
  void set_arrival_report(std::function<std::string(std::uint64_t op)> f) { arrival_report_ = std::move(f); }
  [[nodiscard]] std::string arrival_report(std::uint64_t op) const noexcept {
    if (!arrival_report_ || op == 0) return {};
    try {
      return arrival_report_(op);
    } catch (...) {
      return {};  // the report is a hint on an error path: never a second error
    }
  }
  // Operations issued so far; inside a backend's do_* call, the number of the one being issued.
  [[nodiscard]] std::uint64_t issued_operations() const noexcept { return ops_.load(std::memory_order_relaxed); }
  [[nodiscard]] virtual std::string_view backend() const noexcept = 0;
  // Which memory the backend's collectives take (host for local and gloo, cuda for nccl).
  [[nodiscard]] virtual bool accepts(device_kind k) const noexcept { return k == device_kind::cpu; }
  // Backends whose collectives run on a CUDA device (nccl): the device's index, and the stream
  // (a cudaStream_t, type-erased so this header needs no CUDA) that device work feeding a
  // collective must be queued on, since the collective starts after the work queued on it.
  // -1 and nullptr (the default stream) for the host backends.
  [[nodiscard]] virtual int cuda_device_index() const noexcept { return -1; }
  [[nodiscard]] virtual void* input_stream() const noexcept { return nullptr; }

  template <element_type T, memory_space S>
  [[nodiscard]] work all_reduce(tensor_view<T, S> t, reduce_op op = reduce_op::sum) {
    auto r = prepare(collective::all_reduce, t, -1, op);
    count(collective::all_reduce, r.bytes());
    return do_all_reduce(r, op);
  }
  // The same all_reduce on a dtype-tagged buffer (what DDP's gradient buckets hold): the one type
  // erasure between a bucket and the backend, with the same checks as the typed call.
  [[nodiscard]] work all_reduce(raw_tensor t, reduce_op op = reduce_op::sum) {
    check_space(collective::all_reduce, t.on_cuda);
    if (opts_.check_collectives) check_across_ranks(collective::all_reduce, t.type, t.count, -1, op);
    count(collective::all_reduce, t.bytes());
    return do_all_reduce(t, op);
  }
  // Each rank's elements divided by `divisor`, then summed over the ranks, in place: what DDP's
  // built-in hook does to a bucket (PyTorch's PREMUL_SUM, dividing where it multiplies by
  // 1/divisor, so any divisor gives the division's bits). Floating-point elements in host
  // memory. The result is bit for bit that of dividing each rank's buffer, then all_reduce(sum);
  // a backend may fold the division into its reduction (local does: one pass fewer).
  [[nodiscard]] work all_reduce_divided(raw_tensor t, double divisor);
  template <element_type T>
  [[nodiscard]] work all_reduce_divided(tensor_view<T> t, double divisor) {
    return all_reduce_divided(erase(t), divisor);
  }
  template <element_type T, memory_space S>
  [[nodiscard]] work broadcast(tensor_view<T, S> t, int root = 0) {
    auto r = prepare(collective::broadcast, t, root, reduce_op::sum);
    count(collective::broadcast, r.bytes());
    return do_broadcast(r, root);
  }
  // The result lands in root's buffer; other ranks' buffers are left as they were.
  template <element_type T, memory_space S>
  [[nodiscard]] work reduce(tensor_view<T, S> t, int root = 0, reduce_op op = reduce_op::sum) {
    auto r = prepare(collective::reduce, t, root, op);
    count(collective::reduce, r.bytes());
    return do_reduce(r, root, op);
  }
  // out holds size() blocks of in.size() elements, rank q's input in block q.
  template <element_type T, memory_space S>
  [[nodiscard]] work all_gather(tensor_view<const T, S> in, tensor_view<T, S> out) {
    check_blocks(collective::all_gather, in.size(), out.size(), "out", "in");
    auto r = prepare(collective::all_gather, in, -1, reduce_op::sum);
    count(collective::all_gather, r.bytes() * static_cast<std::size_t>(size_));
    return do_all_gather(r, erase(out));
  }
  // in holds size() blocks of out.size() elements; rank r gets the reduction of block r.
  template <element_type T, memory_space S>
  [[nodiscard]] work reduce_scatter(tensor_view<const T, S> in, tensor_view<T, S> out, reduce_op op = reduce_op::sum) {
    check_blocks(collective::reduce_scatter, out.size(), in.size(), "in", "out");
    auto r = prepare(collective::reduce_scatter, out, -1, op);
    count(collective::reduce_scatter, r.bytes() * static_cast<std::size_t>(size_));
    return do_reduce_scatter(erase(in), r, op);
  }
  [[nodiscard]] work barrier() {
    note(collective::barrier);
    if (opts_.check_collectives) check_across_ranks(collective::barrier, dtype::uint8, 0, -1, reduce_op::sum);
    return do_barrier();
  }
  template <element_type T, memory_space S>
  [[nodiscard]] work send(tensor_view<const T, S> t, int dst, int tag = 0) {
    check_peer(collective::send, dst, "dst");
    check_space(collective::send, std::same_as<S, cuda>);
    count(collective::send, t.size_bytes());
    return do_send(erase(t), dst, tag);
  }
  template <element_type T, memory_space S>
  [[nodiscard]] work recv(tensor_view<T, S> t, int src, int tag = 0) {
    check_peer(collective::recv, src, "src");
    check_space(collective::recv, std::same_as<S, cuda>);
    note(collective::recv);
    return do_recv(erase(t), src, tag);
  }

  // Forwarding overloads so a non-const view can be passed where a const one is expected.
  template <element_type T, memory_space S>
  [[nodiscard]] work all_gather(tensor_view<T, S> in, tensor_view<T, S> out)
    requires(!std::is_const_v<T>)
  {
    return all_gather(tensor_view<const T, S>(in), out);
  }
  template <element_type T, memory_space S>
  [[nodiscard]] work reduce_scatter(tensor_view<T, S> in, tensor_view<T, S> out, reduce_op op = reduce_op::sum)
    requires(!std::is_const_v<T>)
  {
    return reduce_scatter(tensor_view<const T, S>(in), out, op);
  }
  template <element_type T, memory_space S>
  [[nodiscard]] work send(tensor_view<T, S> t, int dst, int tag = 0)
    requires(!std::is_const_v<T>)
  {
    return send(tensor_view<const T, S>(t), dst, tag);
  }

  // torch.distributed.new_group / MPI_Comm_split. Collective over this group: the ranks that pass
  // the same color (>= 0) form a new group of this backend, ranked in their order here, with this
  // group's options; each rank gets its own. comm/subgroups.hpp has the typed forms
  // (split_group, new_subgroups). Backends: local, gloo, mpi.
  [[nodiscard]] std::unique_ptr<process_group> split(int color);

  [[nodiscard]] std::string where(collective c) const;

 protected:
  // What split() agreed on: this rank's color, the ranks (here) that share it in order, this
  // rank's index among them, and how many splits this group made before (the same on every rank).
  struct split_request {
    int color = 0;
    std::vector<int> members;
    int index = 0;
    std::uint64_t seq = 0;
  };
  // The backend's new group for r; every member calls it with the same members and seq.
  virtual std::unique_ptr<process_group> do_split(const split_request& r) {
    (void)r;
    throw split_refusal();
  }
  [[nodiscard]] config_error split_refusal() const {
    return config_error("rank " + std::to_string(rank_) + " split: the " + std::string(backend()) +
                        " backend cannot split groups yet (expected local, gloo or mpi)");
  }
  virtual work do_all_reduce(raw_tensor t, reduce_op op) = 0;
  // all_reduce_divided's arguments are checked. The default divides on the calling thread, then
  // sums through do_all_reduce.
  virtual work do_all_reduce_divided(raw_tensor t, double divisor) {
    detail::host_add_divided(t.data, t.data, t.count, t.type, divisor, true);
    return do_all_reduce(t, reduce_op::sum);
  }
  virtual work do_broadcast(raw_tensor t, int root) = 0;
  virtual work do_reduce(raw_tensor t, int root, reduce_op op) = 0;
  virtual work do_all_gather(raw_tensor in, raw_tensor out) = 0;
  virtual work do_reduce_scatter(raw_tensor in, raw_tensor out, reduce_op op) = 0;
  virtual work do_barrier() = 0;
  virtual work do_send(raw_tensor t, int dst, int tag) = 0;
  virtual work do_recv(raw_tensor t, int src, int tag) = 0;

  // A backend's own collective beyond this interface (local_group::exchange), counted in
  // traffic() as the collective c over `bytes` would be.
  void count_traffic(collective c, std::size_t bytes) noexcept { count(c, bytes); }

  // Checking mode: exchange a fingerprint of the call and compare. The default all_gathers
  // host int64s through the backend; a backend without host collectives overrides it.
  virtual std::vector<std::int64_t> gather_fingerprints(std::span<const std::int64_t> mine) {
    std::vector<std::int64_t> all(mine.size() * static_cast<std::size_t>(size_));
    raw_tensor in{const_cast<std::int64_t*>(mine.data()), mine.size(), dtype::int64, false};
    raw_tensor out{all.data(), all.size(), dtype::int64, false};
    do_all_gather(in, out).wait();
    return all;
  }

 private:
  // Ring-algorithm bytes this rank sends for a collective over `bytes` (see comm_traffic).
  void note(collective c) noexcept {
    const auto n = ops_.fetch_add(1, std::memory_order_relaxed) + 1;
    last_op_.store((n << 8) | static_cast<std::uint64_t>(c), std::memory_order_relaxed);
  }
  void count(collective c, std::size_t bytes) noexcept {
    note(c);
    calls_.fetch_add(1, std::memory_order_relaxed);
    if (size_ == 1) return;
    const auto n = static_cast<std::uint64_t>(size_);
    const auto b = static_cast<std::uint64_t>(bytes);
    std::uint64_t sent = 0;
    switch (c) {
      case collective::all_reduce: sent = 2 * (n - 1) * b / n; break;
      case collective::all_gather:
      case collective::reduce_scatter: sent = (n - 1) * b / n; break;
      case collective::broadcast:
      case collective::reduce:
      case collective::send: sent = b; break;
      case collective::barrier:
      case collective::recv: break;
    }
    bytes_sent_.fetch_add(sent, std::memory_order_relaxed);
  }

  template <class T, memory_space S>
  raw_tensor prepare(collective c, tensor_view<T, S> t, int root, reduce_op op) {
    check_space(c, std::same_as<S, cuda>);
    if (root != -1) check_peer(c, root, "root");
    if (opts_.check_collectives) check_across_ranks(c, dtype_of<T>, t.size(), root, op);
    return erase(t);
  }
  // The checks every call makes; their errors are built out of line (compiled once in the
  // compiled mode).
  void check_space(collective c, bool on_cuda) const {
    if (!accepts(on_cuda ? device_kind::cuda : device_kind::cpu)) refuse_space(c, on_cuda);
  }
  void check_peer(collective c, int peer, const char* what) const {
    if (peer < 0 || peer >= size_) refuse_peer(c, peer, what);
  }
  void check_blocks(collective c, std::size_t block, std::size_t total, const char* big, const char* small) const {
    if (block * static_cast<std::size_t>(size_) != total) refuse_blocks(c, block, total, big, small);
  }
  [[noreturn]] void refuse_space(collective c, bool on_cuda) const;
  [[noreturn]] void refuse_peer(collective c, int peer, const char* what) const;
  [[noreturn]] void refuse_blocks(collective c, std::size_t block, std::size_t total, const char* big, const char* small) const;
  void check_across_ranks(collective c, dtype t, std::size_t count, int root, reduce_op op);

  int rank_;
  int size_;
  process_group_options opts_;
  std::uint64_t seq_ = 0;
  std::uint64_t splits_ = 0;
  std::atomic<std::uint64_t> calls_{0};
  std::atomic<std::uint64_t> bytes_sent_{0};
  std::atomic<std::uint64_t> ops_{0};
  std::atomic<std::uint64_t> last_op_{0};
  std::function<std::string(std::uint64_t)> arrival_report_;
  std::vector<std::shared_ptr<void>> attachments_;
};

// What a communicator offers, whatever its engine: the process_group backends meet it, and so
// can a user's own type (a mock in a test, a wrapper that records a trace).
template <class C>
concept communicator = requires(C& c, tensor_view<float> t, tensor_view<const float> ct) {
  { c.rank() } -> std::convertible_to<int>;
  { c.size() } -> std::convertible_to<int>;
  { c.all_reduce(t, reduce_op::sum) } -> awaitable_work;
  { c.broadcast(t, 0) } -> awaitable_work;
  { c.reduce(t, 0, reduce_op::sum) } -> awaitable_work;
  { c.all_gather(ct, t) } -> awaitable_work;
  { c.reduce_scatter(ct, t, reduce_op::sum) } -> awaitable_work;
  { c.barrier() } -> awaitable_work;
  { c.send(ct, 0, 0) } -> awaitable_work;
  { c.recv(t, 0, 0) } -> awaitable_work;
};

static_assert(communicator<process_group>);

// process_group's out-of-line members: the rare paths (errors, checking mode, split), compiled once
// in the compiled mode (partrain/config.hpp).
#if PARTRAIN_DEFINITIONS
PARTRAIN_LINKAGE work process_group::all_reduce_divided(raw_tensor t, double divisor) {
  check_space(collective::all_reduce, t.on_cuda);
  if (t.on_cuda || !detail::is_floating(t.type)) {
    throw invalid_argument_error(where(collective::all_reduce) + ": all_reduce_divided takes floating-point elements "
                                 "in host memory, got " + std::string(to_string(t.type)) + " in " +
                                 (t.on_cuda ? "CUDA" : "host") + " memory");
  }
  if (!(divisor > 0) || !std::isfinite(divisor)) {
    throw invalid_argument_error(where(collective::all_reduce) + ": all_reduce_divided needs a finite divisor > 0, got " +
                                 std::to_string(divisor));
  }
  if (opts_.check_collectives) check_across_ranks(collective::all_reduce, t.type, t.count, -1, reduce_op::sum);
  count(collective::all_reduce, t.bytes());
  return do_all_reduce_divided(t, divisor);
}

PARTRAIN_LINKAGE std::unique_ptr<process_group> process_group::split(int color) {
  const std::string site = "rank " + std::to_string(rank_) + " split (" + std::string(backend()) + ")";
  if (color < 0) throw invalid_argument_error(site + ": color must be >= 0, got " + std::to_string(color));
  if (!accepts(device_kind::cpu)) throw split_refusal();  // the colors travel in host memory
  const std::int64_t mine = color;
  std::vector<std::int64_t> colors(static_cast<std::size_t>(size_));
  try {
    all_gather(tensor_view<const std::int64_t>(&mine, shape{1}), tensor_view<std::int64_t>(colors)).wait();
  } catch (const timeout_error& e) {
    throw timeout_error({.rank = rank_, .operation = "split", .timeout = opts_.timeout},
                        "not every rank of the group reached it (every rank must call split, in the same order "
                        "as its other collectives): " + std::string(e.what()));
  }
  split_request r;
  r.color = color;
  r.seq = splits_++;
  for (int q = 0; q < size_; ++q) {
    if (colors[static_cast<std::size_t>(q)] != color) continue;
    if (q == rank_) r.index = static_cast<int>(r.members.size());
    r.members.push_back(q);
  }
  return do_split(r);
}

PARTRAIN_LINKAGE std::string process_group::where(collective c) const {
  return "rank " + std::to_string(rank_) + " " + std::string(to_string(c)) + " (" + std::string(backend()) +
         ", world size " + std::to_string(size_) + ")";
}

PARTRAIN_LINKAGE void process_group::refuse_space(collective c, bool on_cuda) const {
  throw invalid_argument_error(where(c) + ": the " + std::string(backend()) + " backend does not take " +
                               (on_cuda ? "CUDA" : "host") + " tensors");
}
PARTRAIN_LINKAGE void process_group::refuse_peer(collective c, int peer, const char* what) const {
  throw invalid_argument_error(where(c) + ": " + what + " " + std::to_string(peer) +
                               " is out of range (expected 0 <= " + what + " < " + std::to_string(size_) + ")");
}
PARTRAIN_LINKAGE void process_group::refuse_blocks(collective c, std::size_t block, std::size_t total, const char* big,
                                                   const char* small) const {
  throw invalid_argument_error(where(c) + ": '" + big + "' has " + std::to_string(total) + " elements, expected " +
                               std::to_string(size_) + " x " + std::to_string(block) + " (world size x '" + small +
                               "')");
}

PARTRAIN_LINKAGE void process_group::check_across_ranks(collective c, dtype t, std::size_t count, int root, reduce_op op) {
  const std::array<std::int64_t, 6> mine{static_cast<std::int64_t>(seq_++), static_cast<std::int64_t>(c),
                                         static_cast<std::int64_t>(t), static_cast<std::int64_t>(count), root,
                                         static_cast<std::int64_t>(op)};
  const auto all = gather_fingerprints(mine);
  for (int q = 0; q < size_; ++q) {
    const auto* theirs = all.data() + static_cast<std::size_t>(q) * mine.size();
    if (!std::equal(mine.begin(), mine.end(), theirs)) {
      auto describe = [](const std::int64_t* f) {
        return "#" + std::to_string(f[0]) + " " + std::string(to_string(static_cast<collective>(f[1]))) + "(" +
               std::string(to_string(static_cast<dtype>(f[2]))) + " x " + std::to_string(f[3]) +
               ", root " + std::to_string(f[4]) + ", op " + std::string(to_string(static_cast<reduce_op>(f[5]))) + ")";
      };
      throw communication_error("collective mismatch: rank " + std::to_string(rank_) + " called " +
                                describe(mine.data()) + " but rank " + std::to_string(q) + " called " +
                                describe(theirs));
    }
  }
}
#endif

}  // namespace partrain::inline v0
