// partrain/comm/nccl.hpp: the NCCL backend, one rank per GPU (link partrain::nccl).
//
// - Rendezvous: rank 0 makes the ncclUniqueId and publishes it through the store; the others
//   read it with the group's timeout. The communicator is created non-blocking, so even its
//   initialisation is bounded by the timeout.
// - Asynchrony: collectives are queued on the group's own stream, after an event that orders them
//   behind the input stream (the legacy default stream unless set_input_stream says otherwise).
//   A completion event is recorded after each; the returned work completes when the GPU has
//   finished it, not when the host has queued it. input_stream() tells device work that feeds
//   the collectives (DDP's buckets and hooks) which stream to queue on.
// - Watchdog: NCCL has no per-collective timeout. One thread per group polls the completion
//   events and ncclCommGetAsyncError; an operation running longer than the timeout (counted from
//   when the GPU started it, not from when it was queued behind compute), or an asynchronous NCCL
//   error, aborts the communicator (ncclCommAbort) and fails every pending work with an error
//   naming the rank and the operation. Later calls fail at once: make a new group to go on.
// - Threads: the watchdog makes the group's device current before its first CUDA call, and
//   work::then callbacks run on it with that device current.
// - Point to point: NCCL matches send/recv per peer in issue order; the tag is not used. Each
//   is issued inside ncclGroupStart/End. An exchange where both peers send first can still block
//   for large messages (each send waits for its receive): use send_recv, one group for both.
#pragma once

#include <partrain/config.hpp>

#if !PARTRAIN_HAS_CUDA
#error "partrain/comm/nccl.hpp needs the CUDA runtime and NCCL: link partrain::nccl"
#endif

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <partrain/comm/process_group.hpp>
#include <partrain/comm/store.hpp>
#include <partrain/core/device.hpp>
#include <partrain/core/error.hpp>
#include <partrain/core/tensor_view.hpp>
#include <partrain/core/work.hpp>
#include <partrain/cuda/check.hpp>
#include <partrain/cuda/device_buffer.hpp>
#include <partrain/cuda/device_guard.hpp>
#include <partrain/cuda/event.hpp>
#include <partrain/cuda/stream.hpp>

namespace partrain::inline v0 {

namespace detail::nccl {

[[nodiscard]] inline ncclDataType_t type_of(dtype t) {
  switch (t) {
    case dtype::float32: return ncclFloat32;
    case dtype::float64: return ncclFloat64;
    case dtype::int32: return ncclInt32;
    case dtype::int64: return ncclInt64;
    case dtype::uint8: return ncclUint8;
    case dtype::float16: return ncclFloat16;
    case dtype::bfloat16: return ncclBfloat16;
  }
  throw invalid_argument_error("nccl: dtype " + std::to_string(static_cast<int>(t)) + " has no NCCL type");
}

[[nodiscard]] inline ncclRedOp_t op_of(reduce_op op) {
  switch (op) {
    case reduce_op::sum: return ncclSum;
    case reduce_op::avg: return ncclAvg;  // NCCL divides by the world size itself
    case reduce_op::min: return ncclMin;
    case reduce_op::max: return ncclMax;
    case reduce_op::prod: return ncclProd;
  }
  throw invalid_argument_error("nccl: reduce_op " + std::to_string(static_cast<int>(op)) + " has no NCCL operator");
}

[[nodiscard]] inline std::string failure(ncclResult_t rc, ncclComm_t comm) {
  std::string s = std::string(ncclGetErrorString(rc));
  if (comm) {
    const char* last = ncclGetLastError(comm);
    if (last && *last) s += " (" + std::string(last) + ")";
  }
  return s;
}

// f() (ncclSend / ncclRecv calls) inside ncclGroupStart/End: NCCL launches the grouped
// point-to-point calls together, so a send and a receive of one group cannot wait on each other.
// On a non-blocking communicator ncclGroupEnd may answer ncclInProgress (the caller polls).
template <class F>
[[nodiscard]] ncclResult_t grouped(F&& f) {
  ncclResult_t rc = ncclGroupStart();
  if (rc != ncclSuccess) return rc;
  const ncclResult_t inner = f();
  const ncclResult_t end = ncclGroupEnd();
  if (inner != ncclSuccess && inner != ncclInProgress) return inner;
  return end;
}

// An owned NCCL communicator. Destroyed cleanly (finalize, then destroy) when healthy, aborted
// when it failed or finalizing does not finish in time.
class comm {
 public:
  comm() = default;
  explicit comm(ncclComm_t c) noexcept : comm_(c) {}
  comm(comm&& o) noexcept : comm_(std::exchange(o.comm_, nullptr)) {}
  comm& operator=(comm&& o) noexcept {
    if (this != &o) {
      abort();
      comm_ = std::exchange(o.comm_, nullptr);
    }
    return *this;
  }
  comm(const comm&) = delete;
  comm& operator=(const comm&) = delete;
  ~comm() { abort(); }

  [[nodiscard]] ncclComm_t get() const noexcept { return comm_; }
  [[nodiscard]] explicit operator bool() const noexcept { return comm_ != nullptr; }

  // Ends in-flight kernels and frees the communicator; safe from another thread (the watchdog).
  void abort() noexcept {
    if (comm_) (void)ncclCommAbort(std::exchange(comm_, nullptr));
  }
  // Flushes outstanding work, then destroys; aborts instead if that fails or passes the deadline.
  void close(std::chrono::steady_clock::time_point deadline) noexcept {
    if (!comm_) return;
    const ncclResult_t rc = ncclCommFinalize(comm_);
    if (rc != ncclSuccess && rc != ncclInProgress) {
      abort();
      return;
    }
    ncclResult_t st = ncclInProgress;
    while (st == ncclInProgress) {
      if (ncclCommGetAsyncError(comm_, &st) != ncclSuccess || std::chrono::steady_clock::now() > deadline) {
        abort();
        return;
      }
      if (st == ncclInProgress) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    if (st != ncclSuccess) {
      abort();
      return;
    }
    (void)ncclCommDestroy(std::exchange(comm_, nullptr));
  }

 private:
  ncclComm_t comm_ = nullptr;
};

}  // namespace detail::nccl

class nccl_group final : public process_group {
 public:
  using clock = std::chrono::steady_clock;

  // key_prefix: where in the store the ranks meet (the unique id's key). Groups made on one store
  // under one prefix meet in the order each rank makes them; a prefix of its own per group (what
  // nccl_groups_by_id gives each quorum) keeps a group whose making failed on some rank from
  // shifting the next one.
  nccl_group(std::shared_ptr<store> s, int rank, int size, device dev, process_group_options opts = {},
             std::string key_prefix = "partrain/nccl/")
      : process_group(rank, size, opts),
        store_(std::move(s)),
        prefix_(std::move(key_prefix)),
        device_(checked_device(dev, rank)),
        stream_(device_.index),
        input_ready_(event_on(device_.index)) {
    if (!store_) throw config_error("nccl_group (rank " + std::to_string(rank) + "): the store is null");
    cuda_device_guard guard(device_.index);
    {
      std::unique_lock lock(mutex_);  // no other thread yet: wait_ready's protocol wants the lock
      comm_ = make_comm(lock);
    }
    scratch_ = device_buffer<float>(std::size_t{1}, device_.index);
    watchdog_ = std::jthread([this](std::stop_token st) { watch(st); });
  }
  nccl_group(const nccl_group&) = delete;
  nccl_group& operator=(const nccl_group&) = delete;

  ~nccl_group() override {
    {
      // Pending work finishes or is failed by the watchdog within the timeout.
      std::unique_lock lock(mutex_);
      cv_.wait(lock, [&] { return pending_.empty(); });
    }
    watchdog_.request_stop();
    cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    std::lock_guard lock(mutex_);
    comm_.close(clock::now() + timeout());
  }

  [[nodiscard]] std::string_view backend() const noexcept override { return "nccl"; }
  [[nodiscard]] bool accepts(device_kind k) const noexcept override { return k == device_kind::cuda; }
  [[nodiscard]] const partrain::device& device() const noexcept { return device_; }
  // The stream the collectives run on: a consumer of their results may wait on it.
  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_.get(); }
  // Collectives start after the work queued so far on this stream (where the inputs are made).
  // It must belong to device(); the legacy default stream (cudaStreamLegacy) until set.
  void set_input_stream(cudaStream_t s) { input_stream_.store(s); }
  [[nodiscard]] cudaStream_t cuda_input_stream() const noexcept { return input_stream_.load(); }
  [[nodiscard]] void* input_stream() const noexcept override { return static_cast<void*>(input_stream_.load()); }
  [[nodiscard]] int cuda_device_index() const noexcept override { return device_.index; }

  // Sends `out` to dst and receives `in` from src in one NCCL group, so two peers that exchange
  // (both sending first) cannot block each other. dst == src == rank() copies to itself.
  template <element_type T>
  [[nodiscard]] work send_recv(tensor_view<const T, cuda> out, int dst, tensor_view<T, cuda> in, int src) {
    for (const auto& [peer, what] : {std::pair{dst, "dst"}, std::pair{src, "src"}}) {
      if (peer < 0 || peer >= size()) {
        throw invalid_argument_error("rank " + std::to_string(rank()) + " nccl send_recv: " + what + " " +
                                     std::to_string(peer) + " is out of range (expected 0 <= " + what + " < " +
                                     std::to_string(size()) + ")");
      }
    }
    return issue(collective::send, [&](ncclComm_t c, cudaStream_t s) {
      return detail::nccl::grouped([&] {
        const ncclResult_t a = ncclSend(out.data(), out.size(), detail::nccl::type_of(dtype_of<T>), dst, c, s);
        if (a != ncclSuccess && a != ncclInProgress) return a;
        return ncclRecv(in.data(), in.size(), detail::nccl::type_of(dtype_of<T>), src, c, s);
      });
    });
  }
  // Aborts the communicator now; pending and later operations fail naming `why`.
  void abort(const std::string& why) { fail_all(why, false); }

 protected:
  work do_all_reduce(raw_tensor t, reduce_op op) override {
    return issue(collective::all_reduce, [&](ncclComm_t c, cudaStream_t s) {
      return ncclAllReduce(t.data, t.data, t.count, detail::nccl::type_of(t.type), detail::nccl::op_of(op), c, s);
    });
  }
  work do_broadcast(raw_tensor t, int root) override {
    return issue(collective::broadcast, [&](ncclComm_t c, cudaStream_t s) {
      return ncclBroadcast(t.data, t.data, t.count, detail::nccl::type_of(t.type), root, c, s);
    });
  }
  work do_reduce(raw_tensor t, int root, reduce_op op) override {
    return issue(collective::reduce, [&](ncclComm_t c, cudaStream_t s) {
      return ncclReduce(t.data, t.data, t.count, detail::nccl::type_of(t.type), detail::nccl::op_of(op), root, c, s);
    });
  }
  work do_all_gather(raw_tensor in, raw_tensor out) override {
    return issue(collective::all_gather, [&](ncclComm_t c, cudaStream_t s) {
      return ncclAllGather(in.data, out.data, in.count, detail::nccl::type_of(in.type), c, s);
    });
  }
  work do_reduce_scatter(raw_tensor in, raw_tensor out, reduce_op op) override {
    return issue(collective::reduce_scatter, [&](ncclComm_t c, cudaStream_t s) {
      return ncclReduceScatter(in.data, out.data, out.count, detail::nccl::type_of(out.type), detail::nccl::op_of(op), c, s);
    });
  }
  // NCCL has no barrier: an all_reduce of one float, as torch does.
  work do_barrier() override {
    return issue(collective::barrier, [&](ncclComm_t c, cudaStream_t s) {
      return ncclAllReduce(scratch_.data(), scratch_.data(), 1, ncclFloat32, ncclSum, c, s);
    });
  }
  work do_send(raw_tensor t, int dst, int /*tag: NCCL matches per peer in order*/) override {
    return issue(collective::send, [&](ncclComm_t c, cudaStream_t s) {
      return detail::nccl::grouped([&] { return ncclSend(t.data, t.count, detail::nccl::type_of(t.type), dst, c, s); });
    }, dst);
  }
  work do_recv(raw_tensor t, int src, int /*tag*/) override {
    return issue(collective::recv, [&](ncclComm_t c, cudaStream_t s) {
      return detail::nccl::grouped([&] { return ncclRecv(t.data, t.count, detail::nccl::type_of(t.type), src, c, s); });
    }, src);
  }

  // Checking mode: the fingerprints travel through device memory (NCCL takes no host buffers).
  std::vector<std::int64_t> gather_fingerprints(std::span<const std::int64_t> mine) override {
    const std::size_t n = mine.size();
    std::vector<std::int64_t> all(n * static_cast<std::size_t>(size()));
    // Zero-filled and finished before the copies below (queued on the NCCL stream) run.
    device_buffer<std::int64_t> in(n, device_.index);
    device_buffer<std::int64_t> out(all.size(), device_.index);
    in.copy_from(tensor_view<const std::int64_t>(mine.data(), n), stream_.get());
    work w = issue(collective::all_gather, [&](ncclComm_t c, cudaStream_t s) {
      return ncclAllGather(in.data(), out.data(), n, ncclInt64, c, s);
    });
    w.wait();
    out.copy_to(tensor_view<std::int64_t>(all), stream_.get());
    stream_.synchronize();
    return all;
  }

 private:
  struct pending_op {
    cuda_event started;  // recorded just before the NCCL kernel: the GPU reached it
    cuda_event done;
    std::shared_ptr<detail::work_state> state;
    collective op;
    std::optional<clock::time_point> deadline;  // set once `started` completed
    int peer = -1;                              // send/recv: the other rank
  };

  // An error's fields: this rank, the operation, its peer (send/recv), the deadline (timeouts).
  [[nodiscard]] error_site sited(collective c, int peer = -1, std::chrono::milliseconds timeout = {}) const {
    return {.rank = rank(), .operation = std::string(to_string(c)), .peer = peer, .timeout = timeout};
  }

  [[nodiscard]] static partrain::device checked_device(partrain::device dev, int rank) {
    if (!dev.is_cuda()) {
      throw config_error("nccl_group (rank " + std::to_string(rank) + "): device " + dev.to_string() +
                         " is not a CUDA device (expected cuda:N, one GPU per rank)");
    }
    const int devices = cuda_device_count();
    if (dev.index < 0 || dev.index >= devices) {
      throw config_error("nccl_group (rank " + std::to_string(rank) + "): device " + dev.to_string() +
                         " does not exist (this process sees " + std::to_string(devices) + " CUDA devices)");
    }
    return dev;
  }
  // Events belong to the device current when they are made.
  [[nodiscard]] static cuda_event event_on(int device_index) {
    cuda_device_guard guard(device_index);
    return cuda_event();
  }

  [[nodiscard]] detail::nccl::comm make_comm(std::unique_lock<std::mutex>& lock) {
    // Each rank counts the groups it made on this store; every rank makes them in the same order,
    // so the n-th group of each rank meets under the n-th key (threads or processes alike).
    const std::int64_t n = store_->add(prefix_ + "groups_made_by_rank_" + std::to_string(rank()), 1);
    const std::string key = prefix_ + std::to_string(n) + "/unique_id";
    ncclUniqueId id{};
    if (rank() == 0) {
      const ncclResult_t rc = ncclGetUniqueId(&id);
      if (rc != ncclSuccess) {
        throw communication_error({.rank = 0, .operation = "nccl init"},
                                  "ncclGetUniqueId failed: " + detail::nccl::failure(rc, nullptr));
      }
      store_->set(key, std::span(reinterpret_cast<const std::byte*>(&id), sizeof(id)));
    } else {
      std::vector<std::byte> bytes;
      try {
        bytes = store_->get(key, timeout());
      } catch (const timeout_error& e) {
        throw timeout_error({.rank = rank(), .operation = "nccl init", .timeout = timeout()},
                            "rank 0's unique id ('" + key + "') did not arrive within " +
                                std::to_string(timeout().count()) + " ms: " + detail::unprefixed(e.what()));
      }
      if (bytes.size() != sizeof(id)) {
        throw communication_error({.rank = rank(), .operation = "nccl init"},
                                  "the unique id under '" + key + "' has " + std::to_string(bytes.size()) +
                                      " bytes, expected " + std::to_string(sizeof(id)));
      }
      std::memcpy(&id, bytes.data(), sizeof(id));
    }

    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;  // so the wait below, not NCCL, decides how long init may take
    ncclComm_t raw = nullptr;
    const ncclResult_t rc = ncclCommInitRankConfig(&raw, size(), id, rank(), &config);
    detail::nccl::comm comm(raw);
    if (rc != ncclSuccess && rc != ncclInProgress) {
      throw communication_error({.rank = rank(), .operation = "nccl init"},
                                "ncclCommInitRankConfig failed: " + detail::nccl::failure(rc, raw));
    }
    wait_ready(lock, comm.get(), clock::now() + timeout(),
               {.rank = rank(), .operation = "nccl init (ncclCommInitRankConfig)"});
    return comm;
  }

  // A non-blocking communicator answers ncclInProgress until the call has been taken in. `lock`
  // (on mutex_) is released between polls, so the watchdog and abort() are not held up for the
  // whole timeout; issuing_ keeps other issuers out meanwhile. An abort while waiting ends it.
  // `site`: the rank and operation waited for, named in the errors.
  void wait_ready(std::unique_lock<std::mutex>& lock, ncclComm_t comm, clock::time_point deadline, error_site site) {
    for (;;) {
      if (!failure_.empty()) {
        throw aborted_error(std::move(site), -1, "the NCCL communicator was aborted meanwhile: " + failure_);
      }
      ncclResult_t st = ncclSuccess;
      const ncclResult_t rc = ncclCommGetAsyncError(comm, &st);
      if (rc != ncclSuccess) st = rc;
      if (st == ncclSuccess) return;
      if (st != ncclInProgress) throw communication_error(std::move(site), detail::nccl::failure(st, comm));
      if (clock::now() > deadline) {
        site.timeout = timeout();
        throw timeout_error(std::move(site), "not done after " + std::to_string(timeout().count()) + " ms (are all " +
                                                 std::to_string(size()) + " ranks running, one GPU each?)");
      }
      cv_.wait_for(lock, std::chrono::microseconds(100));
    }
  }

  // `peer`: the other rank of a send or recv, for the errors' fields.
  template <class Launch>
  work issue(collective c, Launch&& launch, int peer = -1) {
    std::unique_lock lock(mutex_);
    // One issuer at a time, also while wait_ready has released the lock.
    cv_.wait(lock, [&] { return !issuing_; });
    issuing_ = true;
    struct issuing_reset {
      explicit issuing_reset(nccl_group* group) noexcept : g(group) {}
      issuing_reset(const issuing_reset&) = delete;
      issuing_reset& operator=(const issuing_reset&) = delete;
      nccl_group* g;
      ~issuing_reset() {
        g->issuing_ = false;  // under the lock: every exit path below holds it or re-took it
        g->cv_.notify_all();
      }
    };
    std::optional<issuing_reset> reset_issuing(std::in_place, this);
    // An echo: the failure (or abort()) that aborted the communicator is reported where it happened.
    if (!failure_.empty()) throw aborted_error(sited(c, peer), -1, "the NCCL communicator was aborted: " + failure_);
    cuda_device_guard guard(device_.index);
    input_ready_.record(input_stream_.load());
    input_ready_.block(stream_.get());
    pending_op p{cuda_event(), cuda_event(), std::make_shared<detail::work_state>(), c, std::nullopt, peer};
    p.started.record(stream_.get());
    const ncclResult_t rc = launch(comm_.get(), stream_.get());
    if (rc == ncclInProgress) {
      try {
        wait_ready(lock, comm_.get(), clock::now() + timeout(), sited(c, peer));
      } catch (const error& e) {
        reset_issuing.reset();
        lock.unlock();
        fail_all(detail::unprefixed(e.what()), true);
        throw;
      }
    } else if (rc != ncclSuccess) {
      const std::string why = where(c) + ": " + detail::nccl::failure(rc, comm_.get());
      reset_issuing.reset();
      lock.unlock();
      fail_all(why, true);
      throw communication_error(why, sited(c, peer));
    }
    p.done.record(stream_.get());
    work w(p.state);
    pending_.push_back(std::move(p));
    reset_issuing.reset();
    lock.unlock();
    cv_.notify_all();
    return w;
  }

  // Aborts the communicator and fails every pending work (echoes of `why`: aborted_error);
  // from_error: an NCCL call failed.
  void fail_all(const std::string& why, bool from_error) {
    std::deque<pending_op> failed;
    {
      std::lock_guard lock(mutex_);
      if (failure_.empty()) failure_ = why;
      comm_.abort();
      failed.swap(pending_);
    }
    cv_.notify_all();
    for (auto& p : failed) {
      const std::string reason = (from_error ? "an NCCL call failed: " : "") + why;
      p.state->complete(std::make_exception_ptr(aborted_error(sited(p.op, p.peer), -1, reason)));
    }
  }

  void watch(std::stop_token st) {
    // This thread's current device is 0 until set: without this, cudaEventQuery below and the
    // work::then callbacks run here (hook kernels) would use, and create, a context on GPU 0.
    std::string setup_failure;
    if (const cudaError_t rc = cudaSetDevice(device_.index); rc != cudaSuccess) {
      (void)cudaGetLastError();
      setup_failure = "the watchdog thread could not make " + device_.to_string() + " current: " +
                      std::string(cudaGetErrorString(rc));
    }
    std::unique_lock lock(mutex_);
    for (;;) {
      cv_.wait(lock, st, [&] { return !pending_.empty(); });
      if (pending_.empty()) {
        if (st.stop_requested()) return;
        continue;
      }
      pending_op& front = pending_.front();
      bool ready = false;
      std::string failure;
      bool timed_out = false;
      if (!setup_failure.empty()) {
        failure = where(front.op) + ": " + setup_failure;
      } else {
        try {
          ready = front.done.query();
          // The deadline counts from when the GPU reached the collective (observed within one
          // polling interval), not from when it was queued, possibly behind long compute.
          if (!ready && !front.deadline && front.started.query()) front.deadline = clock::now() + timeout();
        } catch (const error& e) {
          failure = where(front.op) + ": the GPU work failed: " + e.what();
        }
      }
      if (!ready && failure.empty() && comm_) {
        ncclResult_t async = ncclSuccess;
        if (ncclCommGetAsyncError(comm_.get(), &async) == ncclSuccess && async != ncclSuccess &&
            async != ncclInProgress) {
          failure = where(front.op) + ": NCCL reported an asynchronous error: " +
                    detail::nccl::failure(async, comm_.get());
        }
      }
      if (!ready && failure.empty() && front.deadline && clock::now() > *front.deadline) {
        timed_out = true;
        failure = where(front.op) + ": not finished " + std::to_string(timeout().count()) +
                  " ms after the GPU started it (a peer is missing, dead or stalled); the NCCL communicator was aborted";
      }
      if (ready) {
        auto state = std::move(front.state);
        pending_.pop_front();
        lock.unlock();
        cv_.notify_all();
        state->complete();
        lock.lock();
        continue;
      }
      if (!failure.empty()) {
        if (failure_.empty()) failure_ = failure;
        comm_.abort();
        std::deque<pending_op> failed;
        failed.swap(pending_);
        lock.unlock();
        cv_.notify_all();
        // The front operation is the failure; the ones queued behind it are its echoes.
        bool first = true;
        for (auto& p : failed) {
          std::exception_ptr e;
          if (!first) {
            e = std::make_exception_ptr(aborted_error(sited(p.op, p.peer), -1, "an earlier operation failed: " + failure));
          } else if (timed_out) {
            e = std::make_exception_ptr(timeout_error(failure, sited(p.op, p.peer, timeout())));
          } else {
            e = std::make_exception_ptr(communication_error(failure, sited(p.op, p.peer)));
          }
          first = false;
          p.state->complete(e);
        }
        lock.lock();
        continue;
      }
      // GPU work in flight: poll again shortly (events have no host callback we could wait on).
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(20));
      lock.lock();
    }
  }

  std::shared_ptr<store> store_;
  std::string prefix_;
  partrain::device device_;
  cuda_stream stream_;
  cuda_event input_ready_;
  std::atomic<cudaStream_t> input_stream_{cudaStreamLegacy};
  detail::nccl::comm comm_;
  device_buffer<float> scratch_;

  std::mutex mutex_;
  std::condition_variable_any cv_;
  std::deque<pending_op> pending_;
  std::string failure_;
  bool issuing_ = false;  // an issue() is between its NCCL call and its pending_op (see wait_ready)
  std::jthread watchdog_;
};

// A factory of nccl_groups keyed by an id, each meeting under a store key prefix of its own
// (prefix + id + "/"): a new communicator per quorum for replica_group, beside a host group
// (hybrid_groups_by_id in hybrid_group.hpp), since a quorum also carries host bytes.
[[nodiscard]] inline std::function<std::unique_ptr<process_group>(std::int64_t id, int rank, int size)>
nccl_groups_by_id(std::shared_ptr<store> rendezvous, device dev, process_group_options opts = {},
                  std::string prefix = "ft/nccl") {
  if (!rendezvous) throw invalid_argument_error("nccl_groups_by_id: the rendezvous store is null");
  return [rendezvous = std::move(rendezvous), dev, opts, prefix = std::move(prefix)](std::int64_t id, int rank, int size) {
    return std::unique_ptr<process_group>(
        std::make_unique<nccl_group>(rendezvous, rank, size, dev, opts, prefix + std::to_string(id) + "/"));
  };
}

}  // namespace partrain::inline v0
